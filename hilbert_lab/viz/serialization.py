"""Figures and a widget panel for serialized attention: attention windows drawn on the grid, the
exact locality metrics per ordering, and the trained accuracies with their 95% intervals."""
from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hilbert_lab.viz.panels import FigureView, Panel, clamp, guarded, replace_figure, show_message
from hilbert_lab.viz.style import ordering_colour, ordering_name

__all__ = [
    "accuracy_figure",
    "locality_figure",
    "setting_label",
    "serialization_panel",
    "window_groups",
    "windows_figure",
    "windows_grid_figure",
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
        xaxis=dict(title="x (cell)", constrain="domain"),
        yaxis=dict(title="y (cell)", autorange="reversed", scaleanchor="x"),
        width=560, height=560, margin=dict(l=40, r=10, t=50, b=40), showlegend=False,
    )
    return figure


METRIC_AXES = {
    "recall@4": "share of the 4 nearest neighbours met (higher is better)",
    "recall@8": "share of the 8 nearest neighbours met (higher is better)",
    "recall@26": "share of the 26 nearest neighbours met (higher is better)",
    "diameter_mean": "cells or unit-cube units (lower is better)",
    "diameter_max": "cells or unit-cube units (lower is better)",
    "unmet_adjacent": "share of adjacent pairs (lower is better)",
}


def setting_label(segment_lengths: Any, dilation_rates: Any) -> str:
    """'w=64' for one branch without dilation, 'w=256 r=4', 'w=64,256 r=1,4' for several branches."""
    segments = [int(s) for s in (segment_lengths if isinstance(segment_lengths, (list, tuple)) else [segment_lengths])]
    rates = [int(r) for r in (dilation_rates if isinstance(dilation_rates, (list, tuple)) else [dilation_rates])]
    text = "w=" + ",".join(map(str, segments))
    return text if all(rate == 1 for rate in rates) else text + " r=" + ",".join(map(str, rates))


def locality_figure(table: Any, metric: str = "recall@8", *, title: str | None = None):
    """Grouped bars, one row of bars per data set: x = attention setting, one bar per ordering, height = `metric`.

    table: serialization_table's frame (columns data, segment_lengths, dilation_rates, ordering, metrics).
    """
    import plotly.graph_objects as go  # noqa: PLC0415
    from plotly.colors import qualitative  # noqa: PLC0415
    from plotly.subplots import make_subplots  # noqa: PLC0415

    if metric not in table.columns:
        raise ValueError(f"metric must be one of the table's columns {list(table.columns)}, got {metric!r}")
    frame = table.copy()
    frame["setting"] = [setting_label(s, r) for s, r in zip(frame["segment_lengths"], frame["dilation_rates"])]
    datasets = list(dict.fromkeys(frame["data"]))
    orderings = list(dict.fromkeys(frame["ordering"]))
    colours = {name: ordering_colour(name) or qualitative.Plotly[i % len(qualitative.Plotly)]
               for i, name in enumerate(orderings)}
    figure = make_subplots(rows=len(datasets), cols=1, vertical_spacing=min(0.35 / max(len(datasets), 1), 0.12))
    for row, data in enumerate(datasets, start=1):
        rows = frame[frame["data"] == data]
        for ordering in orderings:
            part = rows[rows["ordering"] == ordering]
            if part.empty:
                continue
            figure.add_trace(go.Bar(x=part["setting"], y=part[metric], name=ordering_name(ordering),
                                    legendgroup=str(ordering), marker_color=colours[ordering], showlegend=row == 1,
                                    hovertemplate=f"{ordering_name(ordering)}, %{{x}}: %{{y:.4g}}<extra>{data}</extra>"),
                             row=row, col=1)
        name = str(data).replace(" (", "<br>(")
        figure.update_yaxes(title_text=f"<b>{name}</b><br>{METRIC_LABELS.get(metric, metric)}", row=row, col=1)
        figure.update_xaxes(title_text="attention setting (segment length w, dilation r)" if row == len(datasets)
                            else "setting (w, r)", title_standoff=2, title_font_size=11, row=row, col=1)
    figure.update_layout(barmode="group", height=250 * len(datasets) + 120, legend_title="ordering",
                         title=title or f"{METRIC_LABELS.get(metric, metric)} per ordering: "
                                        f"{METRIC_AXES.get(metric, metric)}")
    return figure


def windows_grid_figure(examples: Sequence[Sequence[Any]], *, title: str | None = None):
    """The attention groups of several (side, ordering, segment_length, dilation_rate) examples side by side."""
    from plotly.subplots import make_subplots  # noqa: PLC0415

    examples = [(int(side), str(ordering), int(segment), int(dilation))
                for side, ordering, segment, dilation in examples]
    figure = make_subplots(rows=1, cols=len(examples), horizontal_spacing=0.04,
                           subplot_titles=[f"{ordering_name(o)}, {setting_label([w], [r])}" for _, o, w, r in examples])
    for col, (side, ordering, segment, dilation) in enumerate(examples, start=1):
        single = windows_figure((side, side), ordering, segment, dilation)
        for trace in single.data:
            figure.add_trace(trace, row=1, col=col)
        figure.update_xaxes(title_text="x (cell)", constrain="domain", row=1, col=col)
        figure.update_yaxes(title_text="y (cell)" if col == 1 else "y", autorange="reversed", row=1, col=col,
                            scaleanchor=f"x{col if col > 1 else ''}")
    figure.update_layout(height=360, showlegend=False, margin=dict(l=50, r=10, t=70, b=50),
                         title=title or "attention groups on the grid (one colour per group; line: the serialization)")
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
        figure.add_trace(go.Scatter(x=xs, y=ys, name=ordering_name(ordering), mode="markers",
                                    error_y=dict(type="data", array=up, arrayminus=down, visible=True),
                                    marker=dict(size=10, color=ordering_colour(ordering))))
    if chance is not None:
        figure.add_hline(y=chance, line_dash="dash", annotation_text="chance")
    lows = [row["low"] for task in tasks for row in task["summary"]] + ([chance] if chance is not None else [])
    highs = [row["high"] for task in tasks for row in task["summary"]]
    if lows and highs:  # zoom on the intervals (and chance) so that the differences show
        pad = 0.05 * (max(highs) - min(lows)) or 0.01
        figure.update_yaxes(range=[min(lows) - pad, max(highs) + pad])
    figure.update_layout(title=title or "token accuracy per ordering (mean over seeds, 95% t interval)",
                         xaxis_title="task", yaxis_title="eval accuracy (fraction, higher is better)",
                         scattermode="group", height=480, legend_title="ordering")
    return figure


def serialization_panel(size: int = 32, ordering: str = "hilbert", segment_length: int = 64,
                        dilation_rate: int = 1) -> Panel:
    """Pick image size, ordering, segment length and dilation; see the windows on the grid and the metrics."""
    import ipywidgets as widgets  # noqa: PLC0415

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
    figure = FigureView()
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
        baseline = metrics if chosen == "rowmajor" else serialization_metrics((side, side), "rowmajor", [segment],
                                                                               [dilation], ks=(4, 8, 26))
        state.update(metrics=metrics, baseline=baseline,
                     parameters={"size": side, "ordering": chosen, "segment_length": segment, "dilation_rate": dilation})
        # row-major is the baseline column; chosen itself, it is shown once
        columns = [(chosen, metrics)] + ([("rowmajor", baseline)] if chosen != "rowmajor" else [])
        rows = "".join(f"<tr><td>{html.escape(METRIC_LABELS.get(name, name))}</td>"
                       + "".join(f"<td>{values[name]:.3f}</td>" for _, values in columns) + "</tr>" for name in metrics)
        header = "".join(f"<th>{html.escape(name)}</th>" for name, _ in columns)
        metrics_html.value = f"<b>locality (exact)</b><table><tr><th></th>{header}</tr>{rows}</table>"
        show_message(message, notes)

    observer = guarded(refresh, message)
    for control in controls.values():
        control.observe(observer, names="value")
    layout = widgets.VBox([
        widgets.HBox([controls["size"], controls["ordering"]]),
        widgets.HBox([controls["segment_length"], controls["dilation_rate"], controls["show_path"]]),
        message,
        widgets.HBox([figure.widget, metrics_html]),
    ])
    observer()
    return Panel(widget=layout, figures={"windows": figure}, controls=controls, message=message, refresh=refresh,
                 state=state)
