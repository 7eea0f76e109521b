"""Figures and a widget panel for serialized attention: attention windows drawn on the grid, the
exact locality metrics per ordering, and the trained accuracies with their 95% intervals."""
from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hilbert_lab.viz.panels import Panel, clamp, guarded, replace_figure, show_message

__all__ = [
    "accuracy_figure",
    "conclusion_markdown",
    "locality_figure",
    "serialization_panel",
    "window_groups",
    "windows_figure",
]

METRIC_LABELS = {
    "recall@4": "4-NN recall", "recall@8": "8-NN recall", "recall@26": "26-NN recall",
    "diameter_mean": "mean group diameter", "diameter_max": "max group diameter",
    "unmet_adjacent": "adjacent pairs never meeting",
}
MAX_PANEL_SIDE = 128


def window_groups(grid_shape: Sequence[int], ordering: str, segment_length: int, dilation_rate: int = 1) -> np.ndarray:
    """(H, W) int64: the attention group (segment * r + dilation offset) of every cell of a 2D grid."""
    from hilbert_lab.curves import serialize  # noqa: PLC0415

    height, width = (int(s) for s in grid_shape)
    _, inverse = serialize((height, width), ordering)
    n = height * width
    w = min(int(segment_length), n)
    slot = np.asarray(inverse)
    return ((slot // w) * int(dilation_rate) + (slot % w) % int(dilation_rate)).reshape(height, width)


def windows_figure(grid_shape: Sequence[int], ordering: str, segment_length: int, dilation_rate: int = 1, *,
                   show_path: bool = True, title: str | None = None):
    """Heatmap of the attention groups of a 2D grid (one colour per group) with the serialization path."""
    import plotly.graph_objects as go  # noqa: PLC0415

    from hilbert_lab.curves import serialize  # noqa: PLC0415

    height, width = (int(s) for s in grid_shape)
    groups = window_groups((height, width), ordering, segment_length, dilation_rate)
    count = int(groups.max()) + 1
    # scatter the colours so neighbouring groups differ: a fixed pseudo-random relabelling
    shuffle = np.random.default_rng(0).permutation(count)
    figure = go.Figure(go.Heatmap(z=shuffle[groups], colorscale="Turbo", showscale=False,
                                  customdata=groups, hovertemplate="x %{x}, y %{y}: group %{customdata}<extra></extra>",
                                  name="groups"))
    if show_path:
        perm, _ = serialize((height, width), ordering)
        perm = np.asarray(perm)
        figure.add_trace(go.Scatter(x=perm % width, y=perm // width, mode="lines", name="serialization",
                                    line=dict(color="rgba(0,0,0,0.45)", width=1), hoverinfo="skip"))
    figure.update_layout(
        title=title or f"{ordering}: {count} attention groups (segment {segment_length}, dilation {dilation_rate}) "
                       f"on {height} x {width}",
        xaxis=dict(title="x", constrain="domain"), yaxis=dict(title="y", autorange="reversed", scaleanchor="x"),
        width=560, height=560, margin=dict(l=40, r=10, t=50, b=40), showlegend=False,
    )
    return figure


def locality_figure(table: Any, metric: str = "recall@8", *, title: str | None = None):
    """Grouped bars: one group per (data set, setting), one bar per ordering, height = `metric`."""
    import plotly.graph_objects as go  # noqa: PLC0415

    if metric not in table.columns:
        raise ValueError(f"metric must be one of the table's columns {list(table.columns)}, got {metric!r}")
    frame = table.copy()
    frame["setting"] = [f"{d} | w={s} r={r}" for d, s, r in zip(frame["data"], frame["segment_lengths"],
                                                               frame["dilation_rates"])]
    figure = go.Figure()
    for ordering, rows in frame.groupby("ordering", sort=False):
        figure.add_trace(go.Bar(x=rows["setting"], y=rows[metric], name=str(ordering)))
    figure.update_layout(barmode="group", title=title or f"{METRIC_LABELS.get(metric, metric)} per ordering",
                         yaxis_title=METRIC_LABELS.get(metric, metric), xaxis_tickangle=-30, height=480,
                         legend_title="ordering")
    return figure


def accuracy_figure(tasks: Sequence[Mapping[str, Any]], *, title: str | None = None, chance: float | None = None):
    """Mean accuracy per ordering with 95% interval bars, one group per task (train_serialization JSON)."""
    import plotly.graph_objects as go  # noqa: PLC0415

    figure = go.Figure()
    orderings: list[str] = []
    for task in tasks:
        for row in task["summary"]:
            if row["ordering"] not in orderings:
                orderings.append(row["ordering"])
    for ordering in orderings:
        xs, ys, up, down = [], [], [], []
        for task in tasks:
            row = next((r for r in task["summary"] if r["ordering"] == ordering), None)
            if row is None:
                continue
            xs.append(task["name"])
            ys.append(row["mean"])
            up.append(row["high"] - row["mean"])
            down.append(row["mean"] - row["low"])
        figure.add_trace(go.Scatter(x=xs, y=ys, name=ordering, mode="markers",
                                    error_y=dict(type="data", array=up, arrayminus=down, visible=True),
                                    marker=dict(size=10)))
    if chance is not None:
        figure.add_hline(y=chance, line_dash="dash", annotation_text="chance")
    figure.update_layout(title=title or "token accuracy per ordering (mean over seeds, 95% t interval)",
                         yaxis_title="eval accuracy", scattermode="group", height=480, legend_title="ordering")
    return figure


def serialization_panel(size: int = 32, ordering: str = "hilbert", segment_length: int = 64,
                        dilation_rate: int = 1) -> Panel:
    """Pick image size, ordering, segment length and dilation; see the windows on the grid and the metrics."""
    import ipywidgets as widgets  # noqa: PLC0415
    import plotly.graph_objects as go  # noqa: PLC0415

    from hilbert_lab.curves import SERIALIZATIONS  # noqa: PLC0415
    from hilbert_lab.locality.serialization import serialization_metrics  # noqa: PLC0415

    if ordering not in SERIALIZATIONS:
        raise ValueError(f"ordering must be one of {SERIALIZATIONS}, got {ordering!r}")
    controls = {
        "size": widgets.IntText(value=size, description="image side"),
        "ordering": widgets.Dropdown(options=list(SERIALIZATIONS), value=ordering, description="ordering"),
        "segment_length": widgets.IntText(value=segment_length, description="segment"),
        "dilation_rate": widgets.IntText(value=dilation_rate, description="dilation"),
        "show_path": widgets.Checkbox(value=True, description="draw the curve"),
    }
    message = widgets.HTML()
    metrics_html = widgets.HTML()
    figure = go.FigureWidget()
    state: dict = {}

    def refresh() -> None:
        notes: list[str] = []
        side = clamp(controls["size"].value, 2, MAX_PANEL_SIDE, "image side", notes)
        cells = side * side
        segment = clamp(controls["segment_length"].value, 1, cells, "segment", notes)
        dilation = clamp(controls["dilation_rate"].value, 1, segment, "dilation", notes)
        chosen = controls["ordering"].value
        plain = windows_figure((side, side), chosen, segment, dilation, show_path=controls["show_path"].value)
        replace_figure(figure, plain)
        metrics = serialization_metrics((side, side), chosen, [segment], [dilation], ks=(4, 8, 26))
        baseline = serialization_metrics((side, side), "rowmajor", [segment], [dilation], ks=(4, 8, 26))
        state.update(metrics=metrics, baseline=baseline,
                     parameters={"size": side, "ordering": chosen, "segment_length": segment, "dilation_rate": dilation})
        rows = "".join(
            f"<tr><td>{html.escape(METRIC_LABELS.get(name, name))}</td><td>{value:.3f}</td>"
            f"<td>{baseline[name]:.3f}</td></tr>" for name, value in metrics.items())
        metrics_html.value = (f"<b>locality (exact)</b><table><tr><th></th><th>{html.escape(chosen)}</th>"
                              f"<th>rowmajor</th></tr>{rows}</table>")
        show_message(message, notes)

    observer = guarded(refresh, message)
    for control in controls.values():
        control.observe(observer, names="value")
    layout = widgets.VBox([
        widgets.HBox([controls["size"], controls["ordering"]]),
        widgets.HBox([controls["segment_length"], controls["dilation_rate"], controls["show_path"]]),
        message,
        widgets.HBox([figure, metrics_html]),
    ])
    observer()
    return Panel(widget=layout, figures={"windows": figure}, controls=controls, message=message, refresh=refresh,
                 state=state)


def conclusion_markdown(table: Any, trained: Sequence[Mapping[str, Any]] = (), *, metric: str = "recall@8",
                        tie: float = 0.02) -> str:
    """A data-driven paragraph from the locality table and the trained summaries (train_serialization JSON tasks).

    Names the ordering with the highest `metric` per (data, setting), the settings where all orderings
    are within `tie` of each other (no difference), and per trained task the ranking with intervals.
    """
    parts = []
    wins: dict[str, int] = {}
    flat = []
    settings = 0
    for (data, segments, rates), rows in table.groupby(
            [table["data"], table["segment_lengths"].astype(str), table["dilation_rates"].astype(str)], sort=False):
        settings += 1
        spread = rows[metric].max() - rows[metric].min()
        if spread < tie:
            flat.append(f"{data} w={segments} r={rates}")
            continue
        best = rows.loc[rows[metric] == rows[metric].max(), "ordering"].tolist()
        for name in best:
            wins[name] = wins.get(name, 0) + 1
    if wins:
        ranked = sorted(wins.items(), key=lambda item: -item[1])
        parts.append(f"**Locality ({METRIC_LABELS.get(metric, metric)}, exact).** Best ordering per setting (ties "
                     "counted for each): " + ", ".join(f"{name} {count}/{settings}" for name, count in ranked) + ".")
    if flat:
        parts.append(f"All orderings are within {tie:g} of each other on {len(flat)}/{settings} settings "
                     f"(the ordering makes no difference there): " + "; ".join(flat[:8])
                     + ("; ..." if len(flat) > 8 else "") + ".")
    for task in trained:
        summary = sorted(task["summary"], key=lambda row: -row["mean"])
        best = summary[0]
        base = next((row for row in summary if row["ordering"] == "rowmajor"), None)
        text = (f"**Trained, {task['name']}** ({task.get('label', '')}): "
                + ", ".join(f"{row['ordering']} {row['mean']:.3f} [{row['low']:.3f}, {row['high']:.3f}]"
                            for row in summary))
        if base is not None and best["ordering"] != "rowmajor":
            separated = best["low"] > base["high"]
            text += (f". {best['ordering']} beats rowmajor by {best['mean'] - base['mean']:.3f}"
                     + (" (intervals disjoint)." if separated else " (intervals overlap: not resolved at these seeds)."))
        else:
            text += "."
        parts.append(text)
    return "\n\n".join(parts)
