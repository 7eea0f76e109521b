"""Readable axes for plotly figures: log axes labelled at the values that matter, not at plotly's minor ticks."""
from __future__ import annotations

import math
from typing import Any, Sequence

MAX_TICKS = 10


def log_ticks(values: Sequence[float], max_ticks: int = MAX_TICKS) -> list[float]:
    """Tick positions for a log axis over positive `values`: the values themselves for a sweep (at most
    3 * max_ticks distinct values, e.g. capacities 4, 8, ..., 16384), else 1, 2 and 5 per decade over their
    range; never more than `max_ticks` (every other one is dropped until they fit)."""
    positive = sorted({float(value) for value in values if value is not None and value > 0})
    if not positive:
        raise ValueError("values must hold at least one positive number for a log axis")
    if len(positive) > 3 * max_ticks:
        low, high = math.floor(math.log10(positive[0])), math.ceil(math.log10(positive[-1]))
        for mantissas in ((1, 2, 5), (1,)):
            steps = [mantissa * 10.0 ** power for power in range(low, high + 1) for mantissa in mantissas]
            steps = [step for step in steps if positive[0] <= step <= positive[-1]] or positive[:1]
            if len(steps) <= max_ticks:
                break
        positive = steps
    while len(positive) > max_ticks:
        positive = positive[::2]
    return positive


def tick_label(value: float) -> str:
    """A tick value as a reader writes it: 64, 16384, 2M, 1.5G, 0.25 (no exponent, no trailing zeros)."""
    for threshold, suffix in ((1e9, "G"), (1e6, "M")):
        if abs(value) >= threshold:
            return f"{value / threshold:.3g}{suffix}"
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"


def readable_log_axis(figure: Any, axis: str = "x", values: Sequence[float] | None = None) -> Any:
    """Make `figure`'s log axis ("x", "y", "x2", ...) show labelled ticks at `log_ticks(values)` only
    (values: default, every value drawn on that axis). Returns the figure."""
    if values is None:
        values = [value for trace in figure.data for value in (getattr(trace, axis[0]) or ())
                  if isinstance(value, (int, float))]
    ticks = log_ticks(values)
    figure.update_layout({f"{axis[0]}axis{axis[1:]}": {"type": "log", "tickmode": "array", "tickvals": ticks,
                                                      "ticktext": [tick_label(tick) for tick in ticks]}})
    return figure
