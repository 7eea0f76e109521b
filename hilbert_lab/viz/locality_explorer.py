"""Locality explorer: ordering x grid/sequence size x query box/segment x cache -> heatmaps and miss curves."""
from __future__ import annotations

import html
from typing import Any, Sequence

import numpy as np

from hilbert_lab.viz.panels import FigureView, Panel, clamp, guarded, replace_figure, show_message

MAX_GRID_SIDE = 64
MAX_SEQUENCE_TOKENS = 8192
LINE_SIZES = (32, 64, 128, 256)
KIND_DEFAULTS = {"grid": (16, 4), "sequence": (1024, 256)}  # (side or tokens, box or segment)
CACHE_LINE_CHOICES = tuple(2 ** power for power in range(2, 15))  # 4 .. 16384 lines, one slider step per doubling


def capacity_points(max_lines: int) -> list[int]:
    """Cache capacities (in lines) for a miss curve: powers of two from 4 up to max_lines (included)."""
    if max_lines < 4:
        raise ValueError(f"max_lines must be >= 4, got {max_lines}")
    points = [2 ** power for power in range(2, int(np.log2(max_lines)) + 1)]
    return points if points[-1] == max_lines else points + [int(max_lines)]


def locality_study(kind: str, *, size: int, box_or_segment: int, dilation_rate: int = 1,
                   orderings: Sequence[str] | None = None, max_cache_lines: int = 1024, line_bytes: int = 128,
                   head_dim: int = 64, element_bytes: int = 2, tile_size: int = 64) -> dict[str, Any]:
    """Per ordering: the slot of every cell (index grid), the K/V line trace's LRU misses per capacity.

    kind="grid": a size x size grid, window attention with a box_or_segment box; orderings from
    locality.GRID_ORDERINGS. kind="sequence": `size` tokens, dilated attention with segment
    box_or_segment and `dilation_rate`; orderings from curves.LAYOUTS; the index grid has one
    row per segment. Orderings a size does not support are returned in `unsupported` with the reason.
    """
    from hilbert_lab import curves, locality

    if kind not in ("grid", "sequence"):
        raise ValueError(f"kind must be 'grid' or 'sequence', got {kind!r}")
    capacities = capacity_points(max_cache_lines)
    orderings = list(orderings or (locality.GRID_ORDERINGS if kind == "grid" else curves.LAYOUTS))
    trace_options = dict(tile_size=tile_size, head_dim=head_dim, element_bytes=element_bytes, line_bytes=line_bytes)
    results: dict[str, Any] = {"capacities": capacities, "index_grids": {}, "misses": {}, "accesses": {},
                               "unsupported": {}}
    for ordering in orderings:
        try:
            if kind == "grid":
                shape = (size, size)
                perm, inverse = curves.grid_permutation(shape, ordering)
                trace = locality.attention_trace(locality.window_groups(shape, box_or_segment), perm, **trace_options)
                index_grid = np.asarray(inverse).reshape(shape)
            else:
                inverse = curves.layout_permutation(size, box_or_segment, ordering, dilation_rate=dilation_rate)[1]
                trace = locality.dilated_attention_trace(size, box_or_segment, dilation_rate, ordering, **trace_options)
                index_grid = inverse.numpy().reshape(-1, box_or_segment).copy()
        except ValueError as error:
            results["unsupported"][ordering] = str(error)
            continue
        results["index_grids"][ordering] = index_grid
        results["misses"][ordering] = [int(value) for value in locality.miss_curve(trace.lines, capacities)]
        results["accesses"][ordering] = int(trace.lines.size)
    return results


def misses_table(study: dict[str, Any]) -> Any:
    """pandas DataFrame of a locality_study's LRU misses: one row per capacity (lines), one column per ordering."""
    import pandas as pd

    return pd.DataFrame(study["misses"], index=pd.Index(study["capacities"], name="capacity (lines)"))


def coinciding_curves(study: dict[str, Any]) -> list[str]:
    """One line per group of orderings whose miss curves are identical (drawn over one another)."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for ordering, misses in study["misses"].items():
        groups.setdefault(tuple(misses), []).append(ordering)
    return [f"{', '.join(names[:-1])} and {names[-1]} have the same misses at every capacity: their curves coincide"
            for names in groups.values() if len(names) > 1]


def access_heatmaps_figure(index_grids: dict[str, np.ndarray], title: str, *, kind: str = "grid") -> Any:
    """Access-order heatmaps of all orderings side by side (built from viz.locality.access_order_heatmap).

    kind="grid": x = column, y = row of the grid; kind="sequence": x = position in segment, y = segment.
    The figure has no fixed width: it takes the width of the output it is drawn in (every panel stays in view
    in a narrow notebook).
    """
    from plotly.subplots import make_subplots

    from hilbert_lab.viz.locality import access_order_heatmap

    names = list(index_grids)
    x_title, y_title = ("column (cells)", "row (cells)") if kind == "grid" else ("position in segment (tokens)",
                                                                                 "segment")
    # one x title under the whole row: a title per panel is wider than a panel and overlaps its neighbours
    fig = make_subplots(rows=1, cols=max(1, len(names)), subplot_titles=names, horizontal_spacing=0.03,
                        x_title=f"{x_title}, one panel per ordering")
    for column, name in enumerate(names, start=1):
        grid = index_grids[name]
        single = access_order_heatmap(grid, show_path=grid.size <= 4096)
        for trace in single.data:
            if trace.type == "heatmap":
                trace.showscale = column == 1
            fig.add_trace(trace, row=1, col=column)
        fig.update_yaxes(autorange="reversed", row=1, col=column)
    fig.update_yaxes(title_text=y_title, row=1, col=1)
    fig.update_layout(title=title, height=380, autosize=True, showlegend=False)
    return fig


def locality_explorer(kind: str = "grid", size: int = 16, box_or_segment: int = 4, dilation_rate: int = 2,
                      max_cache_lines: int = 256, line_bytes: int = 128) -> Panel:
    """Build the locality explorer; figures 'heatmaps' and 'misses' (FigureView), under them the misses table.

    max_cache_lines: the largest LRU capacity of the miss curves, one of CACHE_LINE_CHOICES (powers of two).
    """
    import ipywidgets as widgets

    from hilbert_lab.viz.style import log_axis_at
    from hilbert_lab.viz.locality import miss_curve_figure

    if max_cache_lines not in CACHE_LINE_CHOICES:
        raise ValueError(f"max_cache_lines must be one of {CACHE_LINE_CHOICES}, got {max_cache_lines!r}")
    labelled = {"style": {"description_width": "initial"}}  # descriptions shown in full, never cut off
    controls = {
        "kind": widgets.ToggleButtons(options=[("2D grid, window attention", "grid"),
                                               ("1D sequence, dilated attention", "sequence")],
                                      value=kind, description="study",
                                      style={"description_width": "initial", "button_width": "auto"}),
        "size": widgets.IntText(value=size, description="side / tokens", **labelled),
        "box_or_segment": widgets.IntText(value=box_or_segment, description="box / segment", **labelled),
        "dilation_rate": widgets.IntSlider(value=dilation_rate, min=1, max=16, description="dilation",
                                           continuous_update=False, **labelled),
        "max_cache_lines": widgets.SelectionSlider(options=list(CACHE_LINE_CHOICES), value=max_cache_lines,
                                                   description="largest cache (lines)", continuous_update=False,
                                                   **labelled),
        "line_bytes": widgets.Dropdown(options=list(LINE_SIZES), value=line_bytes, description="line bytes",
                                       **labelled),
    }
    message = widgets.HTML()
    table_html = widgets.HTML()
    figures = {"heatmaps": FigureView(responsive=True), "misses": FigureView()}
    state: dict = {}

    def refresh() -> None:
        notes: list[str] = []
        chosen = controls["kind"].value
        controls["dilation_rate"].disabled = chosen == "grid"  # window attention on a grid has no dilation
        if chosen == "grid":
            size_value = clamp(controls["size"].value, 2, MAX_GRID_SIDE, "side", notes)
            box = clamp(controls["box_or_segment"].value, 1, size_value, "box", notes)
            rate = 1
        else:
            size_value = clamp(controls["size"].value, 16, MAX_SEQUENCE_TOKENS, "tokens", notes)
            box = clamp(controls["box_or_segment"].value, 2, size_value, "segment", notes)
            if size_value % box:
                box = max(divisor for divisor in range(2, box + 1) if size_value % divisor == 0)
                notes.append(f"segment must divide tokens={size_value}; using {box}")
            rate = clamp(controls["dilation_rate"].value, 1, box, "dilation", notes)
        study = locality_study(chosen, size=size_value, box_or_segment=box, dilation_rate=rate,
                               max_cache_lines=controls["max_cache_lines"].value,
                               line_bytes=controls["line_bytes"].value)
        notes += [f"{name}: {reason}" for name, reason in study["unsupported"].items()]
        label = (f"{size_value}x{size_value} grid, window {box}" if chosen == "grid"
                 else f"{size_value} tokens, segment {box}, dilation {rate}")
        replace_figure(figures["heatmaps"], access_heatmaps_figure(study["index_grids"], f"access order: {label}",
                                                                   kind=chosen))
        misses = miss_curve_figure(study["capacities"], study["misses"],
                                   title=f"LRU misses of the K/V line trace: {label}")
        replace_figure(figures["misses"], log_axis_at(misses, "x", study["capacities"]))
        table = misses_table(study)
        table_html.value = (f"<b>LRU misses at each capacity: {html.escape(label)}</b> (lower is better)"
                            + "".join(f"<div>{html.escape(line)}</div>" for line in coinciding_curves(study))
                            + table.to_html(border=0))
        state.update(study=study, label=label, misses_table=table)
        show_message(message, notes)

    observer = guarded(refresh, message)

    def kind_changed(change: dict) -> None:
        """Switching study resets the sizes to that study's defaults, then redraws once."""
        state["suspended"] = True
        try:
            size_default, box_default = KIND_DEFAULTS[change["new"]]
            controls["size"].value, controls["box_or_segment"].value = size_default, box_default
        finally:
            state["suspended"] = False
        observer()

    def on_change(change: dict) -> None:
        if not state.get("suspended"):
            observer()

    for name, control in controls.items():
        control.observe(kind_changed if name == "kind" else on_change, names="value")
    layout = widgets.VBox([
        controls["kind"],
        widgets.HBox([controls["size"], controls["box_or_segment"], controls["dilation_rate"]]),
        widgets.HBox([controls["max_cache_lines"], controls["line_bytes"]]),
        message, figures["heatmaps"].widget, figures["misses"].widget, table_html,
    ])
    observer()
    return Panel(widget=layout, figures=figures, controls=controls, message=message, refresh=refresh, state=state)
