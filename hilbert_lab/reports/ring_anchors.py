"""The ring page's two anchors timed in interleaved rounds (bench_ring.py's context_parallel and causal_layouts
sections): our ring against PyTorch's context parallelism on dense causal attention, and zigzag against
contiguous shards on the causal spanning pattern; per GPU count, medians with 95% bootstrap intervals. Rows of
the run's `anchors` table, each section (table, figure) and its finding.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from hilbert_lab.bench.stats import VERDICTS, verdict_sentence
from hilbert_lab.reports.provenance import ZIGZAG_CODE, older_code

ANCHOR_COLUMNS = ["section", "gpus", "variant", "seq_len", "median_ms", "low_ms", "high_ms", "speedup_of_reference",
                  "speedup_low", "speedup_high", "verdict", "revision"]
# the reference of each section: bench_ring's speed is time(reference) / time(variant), its verdict of that ratio
_REFERENCES = {"causal_layouts": "contiguous", "context_parallel": "ring_zigzag"}


def anchor_rows(data: Mapping[str, Any], gpus: int) -> list[dict[str, Any]]:
    """ANCHOR_COLUMNS rows of one bench_ring.py file's causal_layouts and context_parallel sections: per variant
    timed, its median and interval, its speed against the section's reference with interval and bench_ring's
    verdict ('reference' on the reference itself); the one-GPU SDPA time, where recorded, as a row without an
    interval. revision: the commit the file was measured at."""
    rows = []
    revision = ((data.get("environment") or {}).get("git") or {}).get("commit")
    for section, reference in _REFERENCES.items():
        block = data.get(section) or {}
        for variant, entry in block.items():
            if not isinstance(entry, Mapping) or "median_ms" not in entry:
                continue
            versus = entry.get(f"speed_vs_{reference}") or {}
            low, high = versus.get("ci") or [None, None]
            rows.append({"section": section, "gpus": gpus, "variant": variant, "seq_len": block.get("seq_len"),
                         "median_ms": entry["median_ms"], "low_ms": entry["ci_ms"][0], "high_ms": entry["ci_ms"][1],
                         "speedup_of_reference": versus.get("ratio"), "speedup_low": low, "speedup_high": high,
                         "verdict": versus.get("verdict", "reference"), "revision": revision})
    single = (data.get("context_parallel") or {}).get("sdpa_cudnn_seconds")
    if single:
        rows.append({"section": "context_parallel", "gpus": gpus, "variant": "one GPU: SDPA cuDNN",
                     "seq_len": data["context_parallel"].get("seq_len"), "median_ms": single * 1e3,
                     "verdict": "ideal on P GPUs: this / P", "revision": revision})
    return rows


def _verdict_text(verdict: Any) -> Any:
    """A row's verdict as the table reads it: a bench verdict against 'the reference', any other text as it is."""
    return verdict_sentence(verdict, "the reference") if verdict in VERDICTS else verdict


def implementation_name(variant: str) -> str:
    """'context_parallel_cudnn_attention_allgather' -> 'PyTorch context parallel (cuDNN, allgather)', 'ring_zigzag'
    -> 'our ring, zigzag shards', 'contiguous' -> 'contiguous shards'."""
    kernel = re.fullmatch(r"context_parallel_(\w+?)_attention_(\w+)", variant)
    if kernel:
        name = {"cudnn": "cuDNN"}.get(kernel[1], kernel[1])
        return f"PyTorch context parallel ({name}, {kernel[2]})"
    layout = variant.removeprefix("ring_")
    if layout in ("zigzag", "contiguous"):
        return f"{'our ring, ' if variant.startswith('ring_') else ''}{layout} shards"
    return variant.replace("_", " ")


def anchor_table(frame: Any) -> Any:
    """Interleaved A/B rows, labelled for reading: time with its interval, speed against the reference."""
    import pandas as pd

    from hilbert_lab.reports.page import fmt, fmt_interval

    return pd.DataFrame({
        "GPUs": frame["gpus"], "implementation": frame["variant"].map(implementation_name), "tokens": frame["seq_len"],
        "step ms [95%]": [fmt_interval(r.median_ms, r.low_ms, r.high_ms) if r.low_ms == r.low_ms else fmt(r.median_ms)
                          for r in frame.itertuples()],
        "speed vs reference [95%]": [f"{r.speedup_of_reference:.3f} [{r.speedup_low:.3f}, {r.speedup_high:.3f}]"
                                     if r.speedup_low == r.speedup_low and r.speedup_low is not None else "-"
                                     for r in frame.itertuples()],
        "verdict": frame["verdict"].map(_verdict_text)})


def context_parallel_section(cp: Any) -> tuple[Any, str]:
    """(Section, finding): our ring (zigzag shards) against PyTorch's context parallelism at its fastest, per GPU
    count, with the speed ratio's interval; the one-GPU SDPA time for reference."""
    import plotly.graph_objects as go

    from hilbert_lab.reports.page import Section, fmt, style_axes, tokens

    timed = cp[cp["low_ms"].notna()]
    fig = go.Figure()
    for count, group in timed.groupby("gpus"):
        fig.add_trace(go.Bar(x=group["variant"].map(implementation_name).tolist(), y=group["median_ms"].tolist(),
                             name=f"{int(count)} GPUs", error_y=dict(
                                 type="data", symmetric=False, array=(group["high_ms"] - group["median_ms"]).tolist(),
                                 arrayminus=(group["median_ms"] - group["low_ms"]).tolist())))
    style_axes(fig, "implementation", "forward+backward step (ms, lower is better)")
    fig.update_layout(title=f"dense causal attention, {tokens(cp.seq_len.iloc[0])} tokens: our ring vs PyTorch "
                            "context parallelism", height=440, barmode="group", yaxis_rangemode="tozero")

    def against(count: int) -> str:
        group = timed[timed.gpus == count]
        theirs = group[group.variant.str.startswith("context_parallel")].sort_values("median_ms")
        ours = group[group.variant == "ring_zigzag"]
        if not len(theirs) or not len(ours):
            return f"on {count} GPUs PyTorch's context parallelism did not run"
        best = theirs.iloc[0]
        kernel = implementation_name(best.variant).removeprefix("PyTorch context parallel ")
        return (f"on {count} GPUs ours {fmt(float(ours.median_ms.iloc[0]))} ms, PyTorch's at its fastest "
                f"{kernel} {fmt(float(best.median_ms))} ms, its speed relative to ours "
                f"{best.speedup_of_reference:.3f} [{best.speedup_low:.3f}, {best.speedup_high:.3f}] "
                f"(PyTorch {verdict_sentence(best.verdict, 'ours')})")

    single = cp[cp.low_ms.isna()]
    conclusion = (f"Dense causal attention at {tokens(cp.seq_len.iloc[0])} tokens, forward+backward, our ring (zigzag "
                  "shards) against PyTorch's context parallelism: "
                  + "; ".join(against(int(count)) for count in sorted(set(timed.gpus)))
                  + (f"; one GPU (SDPA cuDNN) {fmt(float(single.median_ms.iloc[0]))} ms" if len(single) else "") + ".")
    return (Section("Against PyTorch's context parallelism (dense causal)", conclusion, figure=fig,
                    table=anchor_table(cp)), conclusion)


def layouts_section(layouts: Any, page_label: str = "") -> tuple[Any, str | None]:
    """(Section, finding): zigzag against contiguous shards on the causal spanning pattern, per GPU count; a run
    without ZIGZAG_CODE gets the older-code label and no finding (unless `page_label` puts the whole page under
    one)."""
    from hilbert_lab.reports.page import Section, fmt, tokens

    zig = layouts[layouts.variant == "zigzag"].sort_values("gpus")

    def pair(row: Any) -> str:
        contiguous = layouts[(layouts.variant == "contiguous") & (layouts.gpus == row.gpus)].median_ms.iloc[0]
        return (f"on {int(row.gpus)} GPUs zigzag {fmt(row.median_ms)} ms vs contiguous {fmt(float(contiguous))} ms "
                f"per step, zigzag speed-up {row.speedup_of_reference:.3f} [{row.speedup_low:.3f}, "
                f"{row.speedup_high:.3f}] (zigzag {verdict_sentence(row.verdict, 'contiguous')})")

    conclusion = (f"Causal spanning pattern at {tokens(zig.seq_len.iloc[0])} tokens, zigzag against contiguous "
                  f"shards: {'; '.join(pair(row) for row in zig.itertuples())}.")
    older = "" if page_label else "; ".join(sorted({label for label in (
        older_code({"commit": r}, since=ZIGZAG_CODE) for r in zig.get("revision", [])) if label}))
    if older:  # the zigzag path changed since: labelled, and quoted by no finding
        return Section(f"Causal load balance: {older}", conclusion + " The zigzag path has changed since.",
                       table=anchor_table(layouts)), None
    return Section("Causal load balance", conclusion, table=anchor_table(layouts)), conclusion


__all__ = ["ANCHOR_COLUMNS", "anchor_rows", "anchor_table", "context_parallel_section",
           "implementation_name", "layouts_section"]
