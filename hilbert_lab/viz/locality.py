"""Plotly figures for locality tables: access-order heatmaps, miss curves, metric/density bars, claims."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hilbert_lab.viz.style import ordering_colour, ordering_name, readable_log_axes

__all__ = [
    "METRIC_LABELS",
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
    figure.update_layout(title=title, xaxis_title="column (cells)", yaxis_title="row (cells)",
                         yaxis={"autorange": "reversed", "scaleanchor": "x"})
    return figure


def miss_curve_figure(
    capacities: Sequence[int],
    misses_by_ordering: Mapping[str, Sequence[float]],
    *,
    accesses: int | None = None,
    title: str = "LRU misses vs cache capacity",
):
    """One line per ordering: misses (or miss ratio when `accesses` is given) against capacity in lines; the
    log axis has labelled ticks (viz.style.readable_log_axes)."""
    import plotly.graph_objects as go

    capacities = np.asarray(capacities)
    figure = go.Figure()
    dashes = ("solid", "dash", "dot", "dashdot", "longdash")  # orderings with equal misses stay distinguishable
    for number, (ordering, misses) in enumerate(misses_by_ordering.items()):
        misses = np.asarray(misses, dtype=float)
        if misses.shape != capacities.shape:
            raise ValueError(f"misses_by_ordering[{ordering!r}] must have {capacities.size} values, got {misses.size}")
        figure.add_trace(go.Scatter(x=capacities, y=misses / accesses if accesses else misses,
                                    mode="lines+markers", name=ordering_name(ordering),
                                    line={"dash": dashes[number % len(dashes)], "color": ordering_colour(ordering)}))
    figure.update_layout(title=title, xaxis_title="LRU cache capacity (lines, log scale)", xaxis_type="log",
                         yaxis_title="miss ratio (misses per access, lower is better)" if accesses
                         else "LRU misses (lines loaded, lower is better)", legend_title_text="ordering")
    return readable_log_axes(figure)


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


# metric -> (axis title with unit and direction, what its `parameter` column means)
METRIC_LABELS = {
    "step_mean": ("mean step between consecutive tokens (cells, lower is better)", None),
    "step_max": ("largest step between consecutive tokens (cells, lower is better)", None),
    "stretch_max": ("worst-case stretch (cells² per slot, lower is better)", None),
    "compactness_aligned": ("neighbour pairs in one segment, aligned (share, higher is better)", "segment"),
    "compactness_shifted": ("neighbour pairs in one segment, shifted (share, higher is better)", "segment"),
    "clustering_mean": ("mean clustering number (runs per box, lower is better)", "box"),
    "clustering_max": ("largest clustering number (runs per box, lower is better)", "box"),
    "lines_per_box_mean": ("cache lines per box (lines, lower is better)", "box"),
    "tiles_per_box_mean": ("tiles per box (tiles, lower is better)", "box"),
    "tile_nonempty_share": ("non-empty tiles (share of all tiles, lower is better)", "tile"),
    "tile_mean_density": ("fill of non-empty tiles (share, higher is better)", "tile"),
    "misses": ("LRU misses (lines loaded, lower is better)", "capacity"),
    "line_accesses": ("cache-line accesses (lines)", None),
    "distinct_lines": ("distinct cache lines (lines)", None),
    "rows_needed": ("K/V rows needed (rows)", None),
    "rows_loaded": ("K/V rows loaded (rows, lower is better)", None),
}


def metric_bars(frame, metric: str, *, parameter: int | None = None, title: str | None = None):
    """Grouped bars of one metric from a compare_orderings table: x = ordering, one bar per (configuration, parameter).

    Without `parameter`, every parameter value (box side, tile size, ...) gets its own bar series, so
    values of different parameters are never stacked into one bar. Use metric="tile_mean_density" /
    "tile_nonempty_share" for density bars.
    """
    import pandas as pd
    import plotly.graph_objects as go

    rows = frame[frame["metric"] == metric]
    if parameter is not None:
        rows = rows[rows["parameter"] == parameter]
    if rows.empty:
        raise ValueError(f"metric must name a metric present in the table, got {metric!r} (parameter={parameter})")
    label, parameter_name = METRIC_LABELS.get(metric, (metric.replace("_", " "), "parameter"))
    parameter_name = parameter_name or "parameter"
    figure = go.Figure()
    patterns = ("", "/", "x", ".", "\\", "+", "-", "|")  # a bar's colour is its ordering's; its pattern the series
    for number, ((configuration, value), group) in enumerate(rows.groupby(["configuration", "parameter"], sort=False,
                                                                          dropna=False)):
        if group["ordering"].duplicated().any():
            raise ValueError(f"frame has several {metric!r} rows per ordering for {configuration!r}")
        name = configuration if pd.isna(value) else f"{configuration}, {parameter_name} {int(value)}"
        colours = [ordering_colour(o) for o in group["ordering"]]
        marker = {"pattern": {"shape": patterns[number % len(patterns)]}}
        if all(colours):
            marker["color"] = colours
        figure.add_trace(go.Bar(x=[ordering_name(o) for o in group["ordering"]], y=list(group["value"]), name=name,
                                marker=marker))
    suffix = "" if parameter is None else f" ({parameter_name} {parameter})"
    figure.update_layout(title=title or f"{label.split(' (')[0]} by ordering{suffix}", barmode="group",
                         xaxis_title="token ordering", yaxis_title=label, legend_title_text="configuration")
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
    figure.update_layout(title=title, xaxis_title="claim: metric",
                          yaxis_title="reduction with Hilbert (% fewer, higher is better; negative = more)")
    return figure
