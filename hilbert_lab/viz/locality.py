"""Plotly figures for locality tables: access-order heatmaps, miss curves, metric/density bars, claims."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "access_order_heatmap",
    "claims_figure",
    "metric_bars",
    "miss_curve_figure",
    "miss_curves_from_table",
]


def access_order_heatmap(index_grid, *, title: str = "sequence index of each grid cell", show_path: bool = True):
    """Heatmap of a 2D (H, W) int array holding each cell's sequence slot; optional path through the cells.

    Trace 0 is the heatmap (z = index_grid); trace 1, when show_path, is the path (x = column,
    y = row) in sequence order.
    """
    import plotly.graph_objects as go

    index_grid = np.asarray(index_grid)
    if index_grid.ndim != 2:
        raise ValueError(f"index_grid must be a 2D (H, W) array of sequence slots, got shape {index_grid.shape}")
    figure = go.Figure(go.Heatmap(z=index_grid, colorscale="Viridis", colorbar={"title": "slot"}, name="slot"))
    if show_path:
        order = np.argsort(index_grid, axis=None, kind="stable")
        rows, columns = np.unravel_index(order, index_grid.shape)
        figure.add_trace(go.Scatter(x=columns, y=rows, mode="lines", line={"color": "white", "width": 1},
                                    name="path", hoverinfo="skip"))
    figure.update_layout(title=title, xaxis_title="column", yaxis_title="row",
                         yaxis={"autorange": "reversed", "scaleanchor": "x"})
    return figure


def miss_curve_figure(
    capacities: Sequence[int],
    misses_by_ordering: Mapping[str, Sequence[float]],
    *,
    accesses: int | None = None,
    title: str = "LRU misses vs cache capacity",
):
    """One line per ordering: misses (or miss ratio when `accesses` is given) against capacity in lines."""
    import plotly.graph_objects as go

    capacities = np.asarray(capacities)
    figure = go.Figure()
    for ordering, misses in misses_by_ordering.items():
        misses = np.asarray(misses, dtype=float)
        if misses.shape != capacities.shape:
            raise ValueError(f"misses_by_ordering[{ordering!r}] must have {capacities.size} values, got {misses.size}")
        figure.add_trace(go.Scatter(x=capacities, y=misses / accesses if accesses else misses,
                                    mode="lines+markers", name=ordering))
    figure.update_layout(title=title, xaxis_title="capacity (lines)", xaxis_type="log",
                         yaxis_title="miss ratio" if accesses else "misses")
    return figure


def miss_curves_from_table(frame, configuration: str, *, title: str | None = None):
    """miss_curve_figure from the `misses` rows of a compare_orderings table for one configuration."""
    rows = frame[(frame["metric"] == "misses") & (frame["configuration"] == configuration)]
    if rows.empty:
        raise ValueError(f"configuration must name a configuration with misses rows, got {configuration!r}")
    capacities = sorted(int(value) for value in rows["parameter"].unique())
    misses = {}
    for ordering, group in rows.groupby("ordering", sort=False):
        by_capacity = dict(zip(group["parameter"].astype(int), group["value"]))
        misses[ordering] = [by_capacity[capacity] for capacity in capacities]
    return miss_curve_figure(capacities, misses, title=title or f"LRU misses: {configuration}")


def metric_bars(frame, metric: str, *, parameter: int | None = None, title: str | None = None):
    """Grouped bars of one metric from a compare_orderings table: x = ordering, one bar group per configuration.

    Use metric="tile_mean_density" / "tile_nonempty_share" for density bars.
    """
    import plotly.graph_objects as go

    rows = frame[frame["metric"] == metric]
    if parameter is not None:
        rows = rows[rows["parameter"] == parameter]
    if rows.empty:
        raise ValueError(f"metric must name a metric present in the table, got {metric!r} (parameter={parameter})")
    figure = go.Figure()
    for configuration, group in rows.groupby("configuration", sort=False):
        figure.add_trace(go.Bar(x=list(group["ordering"]), y=list(group["value"]), name=configuration))
    suffix = "" if parameter is None else f" ({parameter})"
    figure.update_layout(title=title or f"{metric}{suffix}", barmode="group", xaxis_title="ordering",
                         yaxis_title=metric)
    return figure


def claims_figure(claims, *, title: str = "claimed vs measured reduction (%)"):
    """Bars of measured % reduction per claim row, with the claimed range as error-bar-free markers."""
    import plotly.graph_objects as go

    rows = claims[np.isfinite(claims["measured"].astype(float))]
    labels = [f"{claim}: {metric}" for claim, metric in zip(rows["claim"], rows["metric"])]
    low = [float(str(text).split("-")[0]) for text in rows["claimed"]]
    high = [float(str(text).split("-")[-1]) for text in rows["claimed"]]
    figure = go.Figure()
    figure.add_trace(go.Bar(x=labels, y=list(rows["measured"]), name="measured",
                            hovertext=list(rows["configuration"])))
    figure.add_trace(go.Scatter(x=labels, y=low, mode="markers", name="claimed (low)", marker={"symbol": "line-ew-open", "size": 18}))
    figure.add_trace(go.Scatter(x=labels, y=high, mode="markers", name="claimed (high)", marker={"symbol": "line-ew-open", "size": 18}))
    figure.update_layout(title=title, yaxis_title="% fewer with Hilbert (negative = more)")
    return figure
