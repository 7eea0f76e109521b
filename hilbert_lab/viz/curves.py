"""Curve traversals as coordinates, their locality metrics, and plotly figures of them."""
from __future__ import annotations

from typing import Any

import numpy as np

from hilbert_lab.curves.coordinates import CURVE_FAMILIES, ORDER_FAMILIES, curve_coordinates  # noqa: F401 (the viz home of them)

CURVE_LABELS = {
    "hilbert": "Hilbert (order n, side 2^n)",
    "gilbert": "generalized Hilbert (any width x height)",
    "morton": "Morton / Z-order (side 2^n)",
    "snake": "snake (boustrophedon)",
    "rowmajor": "row-major",
}


def traversal_metrics(coords: np.ndarray, window: int = 16) -> dict[str, float]:
    """Locality of a traversal (N, ndim): step lengths and how compact runs of `window` cells are.

    cells: N (an int); mean_step / max_step: Euclidean distance between consecutive cells (1 for a continuous curve);
    unit_step_fraction: share of steps to a face neighbour; window_spread: mean over non-overlapping
    runs of `window` cells of (largest bounding-box side) / window**(1/ndim), 1 for a perfect cube-like
    run, window**(1-1/ndim) for a straight line.
    """
    coords = np.asarray(coords, dtype=np.float64)
    if coords.ndim != 2 or coords.shape[0] < 2:
        raise ValueError(f"coords must be (N>=2, ndim), got shape {coords.shape}")
    if window < 2:
        raise ValueError(f"window must be >= 2, got {window}")
    from hilbert_lab.locality.metrics import step_distances

    euclid = step_distances(coords)
    manhattan = np.abs(np.diff(coords, axis=0)).sum(axis=1)
    count, ndim = coords.shape
    usable = (count // window) * window
    if usable:
        runs = coords[:usable].reshape(-1, window, ndim)
        extent = (runs.max(axis=1) - runs.min(axis=1) + 1).max(axis=1)
        spread = float(extent.mean() / window ** (1.0 / ndim))
    else:
        spread = float("nan")
    return {
        "cells": int(count),
        "mean_step": float(euclid.mean()),
        "max_step": float(euclid.max()),
        "unit_step_fraction": float((manhattan == 1).mean()),
        "window_spread": spread,
    }


def curve_figure(coords: np.ndarray, *, title: str = "", color_by_index: bool = True,
                 visible_cells: int | None = None) -> Any:
    """Plain plotly figure of a traversal: a line through the cells, markers coloured by index.

    `visible_cells` draws only the first that many cells (one animation step).
    """
    import plotly.graph_objects as go

    coords = np.asarray(coords)
    total = coords.shape[0]
    count = total if visible_cells is None else max(1, min(int(visible_cells), total))
    shown = coords[:count]
    index = np.arange(count)
    # the colour scale spans the whole traversal, so a partly drawn curve keeps its colours and colour bar
    marker = dict(size=4 if total > 1024 else 6, color=index if color_by_index else "#1f77b4",
                  colorscale="Viridis", showscale=color_by_index, cmin=0, cmax=max(1, total - 1),
                  colorbar=dict(title="index in traversal") if color_by_index else None)
    if coords.shape[1] == 2:
        trace = go.Scatter(x=shown[:, 0], y=shown[:, 1], mode="lines+markers", marker=marker,
                           line=dict(color="rgba(80,80,80,0.6)", width=1.5), text=index, name="traversal",
                           hovertemplate="index %{text}<br>x %{x}, y %{y}<extra></extra>")
        fig = go.Figure(trace)
        # whole cells are shown: half a cell of margin around the outermost cell centres
        pad = 0.5
        fig.update_xaxes(title="x (column)", range=[coords[:, 0].min() - pad, coords[:, 0].max() + pad],
                         constrain="domain")
        fig.update_yaxes(title="y (row, downwards)", range=[coords[:, 1].max() + pad, coords[:, 1].min() - pad],
                         scaleanchor="x", scaleratio=1, constrain="domain")
    else:
        trace = go.Scatter3d(x=shown[:, 0], y=shown[:, 1], z=shown[:, 2], mode="lines+markers",
                             marker=dict(marker, size=3), line=dict(color="rgba(80,80,80,0.6)", width=2),
                             text=index, name="traversal")
        fig = go.Figure(trace)
        fig.update_scenes(xaxis_title="x", yaxis_title="y", zaxis_title="z", aspectmode="data")
    fig.update_layout(title=title, height=520, margin=dict(l=50, r=30, t=50, b=40))
    return fig


def curve_animation_figure(coords: np.ndarray, *, title: str = "", frames: int = 16) -> Any:
    """Figure with a play button and slider that draws the traversal in `frames` steps (2D or 3D)."""
    import plotly.graph_objects as go

    if frames < 2:
        raise ValueError(f"frames must be >= 2, got {frames}")
    coords = np.asarray(coords)
    total = coords.shape[0]
    stops = np.unique(np.linspace(1, total, num=min(frames, total)).round().astype(int))
    # shown in full until played: the axes, colours and colour bar are those of the whole traversal
    fig = curve_figure(coords, title=title)
    fig.frames = [go.Frame(data=curve_figure(coords, visible_cells=int(stop)).data, name=str(stop)) for stop in stops]
    fig.update_layout(
        updatemenus=[dict(type="buttons", showactive=False, x=0.0, y=-0.08, xanchor="left",
                          buttons=[dict(label="play", method="animate",
                                        args=[None, dict(frame=dict(duration=120, redraw=True), fromcurrent=False,
                                                         mode="immediate")])])],
        sliders=[dict(active=len(stops) - 1, currentvalue=dict(prefix="cells drawn: "), x=0.1, len=0.9,
                      steps=[dict(label=str(stop), method="animate",
                                  args=[[str(stop)], dict(mode="immediate", frame=dict(duration=0, redraw=True))])
                             for stop in stops])],
    )
    return fig


TRAVERSAL_METRIC_LABELS = {
    "mean_step": "mean step (cells, lower is better)",
    "max_step": "largest step (cells, lower is better)",
    "unit_step_fraction": "steps to a neighbour (share, higher is better)",
    "window_spread": "spread of runs (1 = compact block, lower is better)",
}


def format_metric(value: float) -> str:
    """A metric as shown in a table: counts as integers (64), measures with three decimals (1.557)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    return "-" if value != value else f"{value:.3f}"


def traversal_metrics_table(metrics_by_family: dict[str, dict[str, float]]) -> Any:
    """pandas DataFrame of traversal_metrics per curve family (rows), columns named with unit and direction;
    cell counts stay integers."""
    import pandas as pd

    table = pd.DataFrame(metrics_by_family).T
    table["cells"] = table["cells"].astype(int)
    return table.rename(columns=TRAVERSAL_METRIC_LABELS).round(3)


def metrics_figure(metrics_by_family: dict[str, dict[str, float]]) -> Any:
    """One panel per traversal metric (its unit and better direction on the y axis), one bar per curve family."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    names = list(TRAVERSAL_METRIC_LABELS)
    fig = make_subplots(rows=1, cols=len(names), horizontal_spacing=0.09)
    families = list(metrics_by_family)
    for column, name in enumerate(names, start=1):
        fig.add_trace(go.Bar(x=families, y=[metrics_by_family[family][name] for family in families], name=name,
                             marker_color="#4c78a8", showlegend=False,
                             hovertemplate="%{x}: %{y:.3f}<extra>" + name + "</extra>"), row=1, col=column)
        fig.update_yaxes(title_text=TRAVERSAL_METRIC_LABELS[name], title_font_size=11, row=1, col=column)
    fig.update_xaxes(title_text="curve", tickangle=-40)
    fig.update_layout(title="traversal locality by curve", height=430, margin=dict(l=60, r=20, t=50, b=90))
    return fig
