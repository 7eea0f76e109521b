"""Plotly figures of decoding runs: ms per token against the context, one line per model through the median of its
runs with the fastest and slowest run as whiskers and the memory-bandwidth limit dotted beneath; and the ratio to
that limit, one line per run."""
from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from hilbert_lab.viz.style import check_rows, readable_log_axes, run_colours

__all__ = ["limit_ratio_figure", "per_token_figure"]

_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x")
_LIMIT_COLOUR = "#7f7f7f"


def _by(rows: Sequence[Mapping[str, Any]], *keys: str) -> dict[tuple, list[Mapping[str, Any]]]:
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[key] for key in keys), []).append(row)
    return {key: sorted(mine, key=lambda row: row["context"]) for key, mine in groups.items()}


def per_token_figure(rows: Sequence[Mapping[str, Any]], *, title: str = "ms per token"):
    """ms per token (log) against tokens of context (log): one line per label through the median over its runs at
    each context, whiskers from the fastest run to the slowest (each run's own median step); the memory-bandwidth
    limit (median over the runs' limit_ms, where given) dotted grey. `rows` need keys label, run, context,
    ms_per_token."""
    import plotly.graph_objects as go

    check_rows(rows, ("label", "run", "context", "ms_per_token"), "per-token")
    colours = run_colours(row["label"] for row in rows)
    figure = go.Figure()
    for index, ((label,), mine) in enumerate(_by(rows, "label").items()):
        contexts = sorted({row["context"] for row in mine})
        times = [[row["ms_per_token"] for row in mine if row["context"] == context] for context in contexts]
        middle = [statistics.median(values) for values in times]
        figure.add_trace(go.Scatter(
            x=contexts, y=middle, mode="lines+markers", name=label,
            error_y=dict(type="data", symmetric=False, array=[max(v) - m for v, m in zip(times, middle)],
                         arrayminus=[m - min(v) for v, m in zip(times, middle)], thickness=1),
            customdata=[[len(values), min(values), max(values)] for values in times],
            hovertemplate="%{x} tokens: %{y:.3f} ms (median of %{customdata[0]} runs, %{customdata[1]:.3f}-"
                          "%{customdata[2]:.3f})<extra>" + label + "</extra>",
            line=dict(color=colours[label]), marker=dict(color=colours[label], symbol=_SYMBOLS[index % len(_SYMBOLS)],
                                                         size=8)))
    limited = [row for row in rows if row.get("limit_ms") is not None]
    if limited:
        contexts = sorted({row["context"] for row in limited})
        figure.add_trace(go.Scatter(
            x=contexts, y=[statistics.median(row["limit_ms"] for row in limited if row["context"] == context)
                           for context in contexts],
            mode="lines", name="memory-bandwidth limit", line=dict(color=_LIMIT_COLOUR, dash="dot")))
    figure.update_xaxes(type="log")
    figure.update_yaxes(type="log")
    figure.update_layout(title=title, height=460, legend=dict(orientation="h", yanchor="top", y=-0.18))
    return readable_log_axes(figure)


def limit_ratio_figure(rows: Sequence[Mapping[str, Any]], *, target: float | None = None,
                       title: str = "ms per token over the memory-bandwidth limit"):
    """x_limit (ms per token over the limit) against tokens of context (log), one line per run; a dashed line at
    `target` where given. `rows` need keys run, context, x_limit."""
    import plotly.graph_objects as go

    check_rows(rows, ("run", "context", "x_limit"), "limit-ratio")
    colours = run_colours(row["run"] for row in rows)
    figure = go.Figure()
    for (run,), mine in _by(rows, "run").items():
        figure.add_trace(go.Scatter(x=[row["context"] for row in mine], y=[row["x_limit"] for row in mine],
                                    mode="lines+markers", name=run, line=dict(color=colours[run])))
    if target is not None:
        figure.add_hline(y=target, line_dash="dash", line_color=_LIMIT_COLOUR, annotation_text=f"{target:g}x")
    figure.update_xaxes(type="log")
    figure.update_layout(title=title, height=380)
    return figure
