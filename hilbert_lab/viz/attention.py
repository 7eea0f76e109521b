"""Attention-pattern figures: per-branch / per-head masks, multiplicity, token coverage, tile density."""
from __future__ import annotations

import textwrap
from typing import Any, Sequence

import numpy as np
import torch

from hilbert_lab.attention.pattern import DilatedPattern, is_selected

MAX_DENSE_TOKENS = 1024  # dense (H, N, N) masks above this are too big to draw


def _check_seq_len(seq_len: int) -> int:
    if isinstance(seq_len, bool) or not isinstance(seq_len, (int, np.integer)) or not 1 <= seq_len <= MAX_DENSE_TOKENS:
        raise ValueError(f"seq_len must be an integer in [1, {MAX_DENSE_TOKENS}] for dense figures, got {seq_len!r}")
    return int(seq_len)


def branch_masks(pattern: DilatedPattern, seq_len: int, num_heads: int) -> np.ndarray:
    """bool (num_branches, H, N, N): where query n attends key m through each branch alone."""
    seq_len = _check_seq_len(seq_len)
    masks = np.zeros((pattern.num_branches, num_heads, seq_len, seq_len), dtype=bool)
    position = np.arange(seq_len)
    for group in pattern.groups(seq_len, num_heads):
        width = group.segment_length
        selected = is_selected(position, width, group.dilation_rate, group.offset)
        allowed = selected[:, None] & selected[None, :] & ((position // width)[:, None] == (position // width)[None, :])
        if pattern.causal:
            allowed &= position[None, :] <= position[:, None]
        masks[group.branch, list(group.heads)] |= allowed
    return masks


def token_coverage(pattern: DilatedPattern, seq_len: int, num_heads: int) -> dict[str, np.ndarray]:
    """Per head and token: keys each query attends (H, N), times each key is attended (H, N).

    A query with 0 keys gets no attention output at all (the predecessor's patterns skipped tokens
    this way); `covered_share` (H,) is the share of queries with at least one key.
    """
    multiplicity = pattern.multiplicity(_check_seq_len(seq_len), num_heads).numpy()
    allowed = multiplicity > 0
    keys_per_query = allowed.sum(axis=2)
    return {"keys_per_query": keys_per_query, "queries_per_key": allowed.sum(axis=1),
            "covered_share": (keys_per_query > 0).mean(axis=1)}


def _heatmap_grid(mats: Sequence[np.ndarray], titles: Sequence[str], title: str, colorscale: str = "Blues",
                  zmax: float | None = None) -> Any:
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    columns = min(4, len(mats))
    rows = -(-len(mats) // columns)
    fig = make_subplots(rows=rows, cols=columns, subplot_titles=list(titles), horizontal_spacing=0.05,
                        vertical_spacing=0.1)
    for index, (mat, name) in enumerate(zip(mats, titles)):
        fig.add_trace(go.Heatmap(z=np.asarray(mat, dtype=np.int64), colorscale=colorscale, zmin=0, zmax=zmax,
                                 showscale=index == 0, name=name,
                                 hovertemplate="query %{y}, key %{x}: %{z}<extra>" + name + "</extra>"),
                      row=index // columns + 1, col=index % columns + 1)
    fig.update_xaxes(title_text="key position (token)")
    fig.update_yaxes(autorange="reversed")
    fig.update_yaxes(title_text="query position (token)", col=1)
    # about 200 x 200 px of plot per panel: square masks without tying the axes together
    fig.update_layout(title=title, height=270 * rows + 100, width=230 * columns + 130)
    return fig


def empty_branch_reason(pattern: DilatedPattern, seq_len: int, num_heads: int, head: int, branch: int) -> str:
    """Why `head` attends no pair through `branch` (its mask is empty), in words."""
    heads = sorted({h for group in pattern.groups(seq_len, num_heads) if group.branch == branch for h in group.heads})
    if head not in heads:
        runs_on = ", ".join(str(h) for h in heads) or "none"
        return (f"head {head} does not run this branch: {pattern.mode} gives branch {branch} "
                f"head{'s' if len(heads) != 1 else ''} {runs_on} of {num_heads}")
    return f"head {head} selects no pair of this branch at N={seq_len} (its dilation offset lies past the tokens)"


def branch_mask_figure(pattern: DilatedPattern, seq_len: int, num_heads: int, head: int = 0) -> Any:
    """One heatmap per branch: which keys (x) each query (y) of `head` attends through that branch; an empty
    panel says why (in head_groups mode a branch runs on some heads only)."""
    if not 0 <= head < num_heads:
        raise ValueError(f"head must be in [0, {num_heads - 1}], got {head}")
    masks = branch_masks(pattern, seq_len, num_heads)[:, head]
    titles = [f"branch {b}: w={pattern.segment_lengths[b]}, r={pattern.dilation_rates[b]}" for b in range(len(masks))]
    fig = _heatmap_grid(masks, titles, f"per-branch masks, head {head} (N={seq_len}, mode={pattern.mode})", zmax=1)
    for branch, mask in enumerate(masks):
        if not mask.any():
            reason = "<br>".join(textwrap.wrap(empty_branch_reason(pattern, seq_len, num_heads, head, branch), 26))
            # the middle of the panel, in the panel's own axis coordinates (0..1 of its domain)
            axis = "" if branch == 0 else str(branch + 1)
            fig.add_annotation(text=f"<b>empty</b><br>{reason}", xref=f"x{axis} domain", yref=f"y{axis} domain", x=0.5,
                               y=0.5, showarrow=False, font={"size": 11, "color": "#a15c00"},
                               bgcolor="rgba(255,255,255,0.85)")
    return fig


def head_mask_figure(pattern: DilatedPattern, seq_len: int, num_heads: int) -> Any:
    """One heatmap per head: the merged mask (any branch) of that head."""
    mask = pattern.dense_mask(_check_seq_len(seq_len), num_heads).numpy()
    return _heatmap_grid(list(mask), [f"head {h}" for h in range(num_heads)],
                         f"per-head merged masks (N={seq_len}, mode={pattern.mode}, causal={pattern.causal})", zmax=1)


def multiplicity_figure(pattern: DilatedPattern, seq_len: int, num_heads: int, head: int = 0) -> Any:
    """Heatmap of how many branches let each query attend each key (the softmax weight factor)."""
    if not 0 <= head < num_heads:
        raise ValueError(f"head must be in [0, {num_heads - 1}], got {head}")
    multiplicity = pattern.multiplicity(_check_seq_len(seq_len), num_heads)[head].numpy()
    return _heatmap_grid([multiplicity], [f"head {head}"], f"multiplicity (max {int(multiplicity.max())})",
                         colorscale="Viridis", zmax=max(1, int(multiplicity.max())))


def coverage_figure(pattern: DilatedPattern, seq_len: int, num_heads: int) -> Any:
    """Heatmap heads x tokens of keys attended per query; title gives each head's covered share."""
    import plotly.graph_objects as go

    coverage = token_coverage(pattern, seq_len, num_heads)
    shares = ", ".join(f"{share:.0%}" for share in coverage["covered_share"])
    fig = go.Figure(go.Heatmap(z=coverage["keys_per_query"], colorscale="Viridis", name="keys per query",
                               colorbar={"title": "keys"},
                               hovertemplate="head %{y}, query %{x}: %{z} keys<extra></extra>"))
    fig.update_layout(title=f"token coverage: keys per query (queries covered per head: {shares})",
                      xaxis_title="query position (token)", yaxis_title="head", yaxis_dtick=1, height=300)
    return fig


def _tile_layout(pattern: DilatedPattern, seq_len: int, ordering: str) -> np.ndarray:
    """perm (N,) of the layout a block-sparse kernel would store for `ordering`: the curves layout
    (hilbert_lab.curves.layout_permutation) with blocks of the shortest branch's segment, and that
    branch's dilation rate for "dilation_major"."""
    from hilbert_lab.curves.layouts import layout_permutation

    branch = int(np.argmin([pattern.effective_segment(b, seq_len) for b in range(pattern.num_branches)]))
    block = pattern.effective_segment(branch, seq_len)
    return layout_permutation(seq_len, block, ordering, dilation_rate=pattern.dilation_rates[branch])[0].numpy()


def tile_density_table(pattern: DilatedPattern, seq_len: int, num_heads: int, block_size: int,
                       orderings: Sequence[str]) -> Any:
    """pandas DataFrame (ordering, head, nonempty_share, mean_density, nonempty_blocks, total_blocks):
    the block x block tiles a block-sparse kernel must visit for each head's mask in each layout.

    Attention is permutation-equivariant, so every ordering computes the same outputs; only the
    tile structure (work skipped by a block-sparse kernel) differs. An unsupported ordering (e.g.
    morton on a non-power-of-two segment) gives NaN values and the reason in `note`.
    """
    import pandas as pd

    from hilbert_lab.locality import mask_tile_density

    mask = pattern.dense_mask(_check_seq_len(seq_len), num_heads).numpy()
    rows = []
    for ordering in orderings:
        try:
            perm = _tile_layout(pattern, seq_len, ordering)
        except ValueError as error:
            rows.append({"ordering": ordering, "head": -1, "nonempty_share": np.nan, "mean_density": np.nan,
                         "nonempty_blocks": np.nan, "total_blocks": np.nan, "note": str(error)})
            continue
        for head in range(num_heads):
            summary = mask_tile_density(mask[head][np.ix_(perm, perm)], block_size)
            rows.append({"ordering": ordering, "head": head, **summary, "note": ""})
    return pd.DataFrame(rows)


def tile_density_figure(table: Any, block_size: int) -> Any:
    """Bars: share of non-empty tiles and fill of the non-empty tiles per ordering (mean over heads).

    When every ordering gives the same values the title says so and why (the orderings then only
    permute tokens inside tiles the mask fills the same way).
    """
    import plotly.graph_objects as go

    summary = table[table["head"] >= 0].groupby("ordering", sort=False)[["nonempty_share", "mean_density"]].mean()
    fig = go.Figure([
        go.Bar(name="non-empty tiles (share of all tiles, lower is better)", x=list(summary.index),
               y=summary["nonempty_share"].tolist()),
        go.Bar(name="fill of non-empty tiles (share, higher is better)", x=list(summary.index),
               y=summary["mean_density"].tolist()),
    ])
    title = f"{block_size}x{block_size} tile structure by ordering (mean over heads)"
    if len(summary) > 1 and (summary.nunique() == 1).all():
        title += ("<br><sub>the same for every ordering here: the layouts only reorder tokens within segments of the "
                  "shortest branch, which these tiles see alike; try larger segments, a dilation > 1 on the "
                  "shortest branch, or smaller tiles</sub>")
    fig.update_layout(barmode="group", title=title, xaxis_title="token ordering", yaxis_title="share (0 to 1)",
                      yaxis_range=[0, 1.05], height=380, legend={"orientation": "h", "y": -0.25})
    return fig


def reference_check(pattern: DilatedPattern, seq_len: int, num_heads: int, head_dim: int = 16,
                    backend: str = "auto", seed: int = 0) -> dict[str, Any]:
    """Run the engine at float64 against the dense reference: max |out| and |LSE| errors, backend used."""
    from hilbert_lab.attention.engine import dilated_attention
    from hilbert_lab.attention.reference import reference_attention

    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, _check_seq_len(seq_len), num_heads, head_dim, dtype=torch.float64, generator=generator)
               for _ in range(3))
    expected_out, expected_lse = reference_attention(q, k, v, pattern)
    out, lse = dilated_attention(q, k, v, segment_lengths=list(pattern.segment_lengths),
                                 dilation_rates=list(pattern.dilation_rates), causal=pattern.causal,
                                 mode=pattern.mode, backend=backend, return_lse=True)
    finite = torch.isfinite(expected_lse)
    lse_matches_empty = bool(torch.equal(torch.isfinite(lse.to(torch.float64)), finite))
    return {
        "backend": backend,
        "max_abs_out_error": float((out.to(torch.float64) - expected_out).abs().max()),
        "max_abs_lse_error": float((lse.to(torch.float64)[finite] - expected_lse[finite]).abs().max())
        if finite.any() else 0.0,
        "empty_rows_agree": lse_matches_empty,
    }
