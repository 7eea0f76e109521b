"""Readability helpers shared by every plotly figure of the pages and notebooks: log axes with labelled
ticks, series that coincide drawn so that each stays visible, one colour per run across figures."""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["ORDERING_COLOURS", "ORDERING_NAMES", "PALETTE", "check_rows", "compact_number", "log_ticks",
           "ordering_colour", "ordering_figure_problems", "ordering_table_problems", "ordering_trace",
           "ordering_name", "readable_log_axes", "run_colours", "separate_overlapping"]

# plotly's default qualitative palette
PALETTE = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA", "#FFA15A", "#19D3F3", "#FF6692", "#B6E880", "#FF97FF",
           "#FECB52")
# one colour and one display name per token ordering on every page and notebook (row-major and identity are
# the same order of tokens, so they share the baseline's grey)
ORDERING_COLOURS = {"rowmajor": "#7f7f7f", "identity": "#7f7f7f", "snake": "#8c564b", "hilbert": "#1f77b4",
                    "morton": "#ff7f0e", "dilation_major": "#9467bd", "rowmajor-trans": "#c7c7c7",
                    "snake-trans": "#c49c94", "hilbert-trans": "#aec7e8", "morton-trans": "#ffbb78",
                    "hilbert/hilbert-trans": "#17becf", "morton/morton-trans": "#bcbd22",
                    "snake/snake-trans": "#e377c2", "rowmajor/rowmajor-trans": "#2ca02c"}
ORDERING_NAMES = {"rowmajor": "row-major", "identity": "identity", "snake": "snake", "hilbert": "Hilbert",
                  "morton": "Morton", "dilation_major": "dilation-major"}
_TRANSPOSED = "-trans"
_MANTISSAS = ((1,), (1, 3), (1, 2, 5), (1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9))
_DASHES = ("dash", "dot", "dashdot", "longdash")
_SYMBOLS = ("circle-open", "square-open", "diamond-open", "triangle-up-open")


def ordering_name(ordering: str) -> str:
    """The display name of an ordering id: 'rowmajor' -> 'row-major', 'hilbert-trans' -> 'Hilbert (transposed)',
    'hilbert/hilbert-trans' -> 'Hilbert alternating with its transpose'; an unknown id is returned as it is."""
    ordering = str(ordering)
    if "/" in ordering:
        first, second = ordering.split("/", 1)
        if second == first + _TRANSPOSED:
            return f"{ordering_name(first)} alternating with its transpose"
        return " / ".join(ordering_name(part) for part in ordering.split("/"))
    if ordering.endswith(_TRANSPOSED):
        return f"{ordering_name(ordering[:-len(_TRANSPOSED)])} (transposed)"
    return ORDERING_NAMES.get(ordering, ordering)


def ordering_colour(ordering: str) -> str | None:
    """The colour of an ordering id on every page; None for an unknown id (plotly's cycle then picks one)."""
    return ORDERING_COLOURS.get(str(ordering))


def compact_number(value: float) -> str:
    """A tick label: 1500 -> '1.5K', 2e6 -> '2M', 3e9 -> '3G', 0.25 -> '0.25', 10 -> '10'."""
    value = float(value)
    size = abs(value)
    for threshold, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if size >= threshold:
            return f"{value / threshold:.3g}{suffix}"
    return f"{value:.3g}"


def log_ticks(values: Iterable[float], *, most: int = 9) -> list[float]:
    """Tick positions for a log axis over positive `values`: 1-2-5 style steps per decade, dense enough
    for 4 ticks in the range where possible and at most `most` of them; [] without a positive value."""
    finite = [float(v) for v in values if v is not None and np.isfinite(v) and float(v) > 0]
    if not finite:
        return []
    low, high = min(finite), max(finite)
    pad = 1.12 if high / low > 1.5 else 1.02
    low, high = low / pad, high * pad
    best: list[float] = []
    for mantissas in _MANTISSAS:
        ticks = [m * 10.0**e for e in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
                 for m in mantissas if low <= m * 10.0**e <= high]
        if len(ticks) > most:
            break
        best = ticks
        if len(ticks) >= 4:
            break
    if len(best) < 2:  # a narrow range: its ends
        best = sorted({float(f"{low * pad:.2g}"), float(f"{high / pad:.2g}")})
    return best


def _axis_values(fig: Any, axis: str) -> list[float]:
    """Every value drawn on layout axis `axis` ('xaxis', 'yaxis2', ...), error bars included."""
    letter, suffix = axis[0], axis[5:]
    reference = letter + suffix  # trace attribute value: 'x', 'y2'
    values: list[float] = []
    for trace in fig.data:
        if (getattr(trace, f"{letter}axis", None) or letter) != reference:
            continue
        data = getattr(trace, letter, None)
        if data is None:
            continue
        numbers = np.asarray([v for v in data if isinstance(v, (int, float, np.number))], dtype=float)
        values += numbers.tolist()
        error = getattr(trace, f"error_{letter}", None)
        if error is not None and error.array is not None and len(numbers) == len(error.array):
            minus = error.arrayminus if error.arrayminus is not None else error.array
            values += (numbers + np.asarray(error.array, dtype=float)).tolist()
            values += (numbers - np.asarray(minus, dtype=float)).tolist()
    return values


def readable_log_axes(fig: Any) -> Any:
    """Every log axis of `fig` without explicit ticks gets 1-2-5 ticks labelled '2', '50', '1K', '10M'
    (plotly's default labels its minor ticks with bare digits: '9 10 2 3 4'); returns `fig`."""
    layout = fig.to_plotly_json().get("layout", {})
    for name, axis in layout.items():
        if not name.startswith(("xaxis", "yaxis")) or not isinstance(axis, dict):
            continue
        if axis.get("type") != "log" or axis.get("tickvals") is not None:
            continue
        ticks = log_ticks(_axis_values(fig, name))
        if ticks:
            fig.update_layout({name: {"tickvals": ticks, "ticktext": [compact_number(t) for t in ticks]}})
    return fig


def log_axis_at(fig: Any, axis: str, values: Iterable[float], *, most: int = 9) -> Any:
    """Log axis `axis` ("x", "y", "x2", ...) of `fig` labelled at `values` (a sweep's points, such as cache
    capacities 4, 8, ..., 256; every other one dropped until at most `most` remain); returns `fig`."""
    ticks = sorted({float(v) for v in values if v is not None and np.isfinite(v) and float(v) > 0})
    while len(ticks) > most:
        ticks = ticks[::2]
    fig.update_layout({f"{axis[0]}axis{axis[1:]}": {"type": "log", "tickmode": "array", "tickvals": ticks,
                                                   "ticktext": [compact_number(t) for t in ticks]}})
    return fig


def _points(trace: Any) -> tuple[tuple[Any, ...], np.ndarray] | None:
    if getattr(trace, "type", None) != "scatter" or trace.x is None or trace.y is None:
        return None
    try:
        y = np.asarray(trace.y, dtype=float)
    except (TypeError, ValueError):
        return None
    return tuple(trace.x), y


def separate_overlapping(fig: Any, tolerance: float = 0.004) -> Any:
    """Scatter traces whose points coincide with an earlier trace's (same x, y within `tolerance` of the
    axis span) get a dashed line, open markers and '(on top of <name>)' in the legend, so that both stay
    visible; returns `fig`."""
    seen: list[tuple[str, tuple[Any, ...], np.ndarray, str]] = []
    spans: dict[str, float] = {}
    for trace in fig.data:
        points = _points(trace)
        if points is not None and np.isfinite(points[1]).any():
            axis = getattr(trace, "yaxis", None) or "y"
            finite = points[1][np.isfinite(points[1])]
            low, high = spans.get(axis + "lo", np.inf), spans.get(axis + "hi", -np.inf)
            spans[axis + "lo"], spans[axis + "hi"] = min(low, finite.min()), max(high, finite.max())
    count = 0
    for trace in fig.data:
        points = _points(trace)
        if points is None:
            continue
        x, y = points
        axis = getattr(trace, "yaxis", None) or "y"
        if " (on top of " in str(trace.name):  # already drawn apart
            seen.append((str(trace.name), x, y, axis))
            continue
        span = max(spans.get(axis + "hi", 0) - spans.get(axis + "lo", 0), 1e-12)
        twin = next((name for name, other_x, other_y, other_axis in seen if other_axis == axis and other_x == x
                     and np.allclose(other_y, y, rtol=0, atol=tolerance * span, equal_nan=True)), None)
        if twin is not None and trace.name:
            style = _DASHES[count % len(_DASHES)]
            trace.update(line={"dash": style, "width": 3}, name=f"{trace.name} (on top of {twin})",
                         marker={"symbol": _SYMBOLS[count % len(_SYMBOLS)], "size": 10})
            if "markers" not in (trace.mode or "lines"):
                trace.update(mode=(trace.mode or "lines") + "+markers")
            count += 1
        seen.append((str(trace.name), x, y, axis))
    return fig


def check_rows(rows: Sequence[Mapping[str, Any]], needed: tuple[str, ...], what: str) -> None:
    """ValueError unless `rows` (a figure's data) holds at least one row and every row has the keys `needed`
    (`what` names the rows in the message)."""
    if not rows:
        raise ValueError(f"rows must hold at least one {what} row")
    for row in rows:
        missing = [key for key in needed if key not in row]
        if missing:
            raise ValueError(f"{what} rows need keys {needed}; a row lacks {missing}: {dict(row)!r}")


def run_colours(names: Sequence[str] | Iterable[str], given: Mapping[str, str] | None = None) -> dict[str, str]:
    """{name: colour}, one palette colour per distinct name in order (names in `given` keep theirs), so a run
    keeps its colour in every figure it appears in."""
    colours = dict(given or {})
    for name in dict.fromkeys(names):
        if name not in colours:
            colours[name] = PALETTE[len(colours) % len(PALETTE)]
    return colours


_VARIANT_DASHES = ("solid", "dash", "dot", "dashdot", "longdash")


def ordering_trace(ordering: str, variant: int = 0) -> dict[str, Any]:
    """Trace properties of one ordering's series: its colour (ORDERING_COLOURS) on line and markers, and a dash
    per `variant` (0, 1, ...) to tell apart series of one ordering, such as its backends."""
    colour = ordering_colour(ordering)
    return {"line": {"color": colour, "dash": _VARIANT_DASHES[variant % len(_VARIANT_DASHES)]},
            "marker": {"color": colour}}


def ordering_figure_problems(figure: Any) -> list[str]:
    """Traces of `figure` that name an ordering by its id ('rowmajor', 'hilbert-trans') instead of its display
    name, or draw an ordering named by its display name in another colour than ORDERING_COLOURS gives it. A
    trace name's ' / '-separated parts are matched ('auto / Hilbert / fwd+bwd'); [] when every one is right."""
    names = {ordering_name(ordering): ordering for ordering in ORDERING_COLOURS}
    problems = []
    for trace in figure.data:
        name = str(trace.name or "").split(" (on top of ")[0]
        for part in name.split(" / "):
            if part in ORDERING_COLOURS and part not in names:
                problems.append(f"{trace.name!r}: ordering id {part!r}, not its display name")
            elif part in names:
                want = ORDERING_COLOURS[names[part]].lower()
                drawn = [c for c in (getattr(getattr(trace, "line", None), "color", None),
                                     getattr(getattr(trace, "marker", None), "color", None)) if isinstance(c, str)]
                if not drawn or any(c.lower() != want for c in drawn):
                    problems.append(f"{trace.name!r}: drawn in {drawn or 'the default colour'}, not {part}'s {want}")
    return problems


def ordering_table_problems(table: Any) -> list[str]:
    """Cells of a pandas table that show an ordering by its id ('rowmajor', 'hilbert/hilbert-trans') where the
    pages use its display name: a cell, or a ' / '- or ', '-separated part of one, equal to such an id."""
    ids = {ordering for ordering in ORDERING_COLOURS if ordering_name(ordering) != ordering}
    problems = []
    for column in table.columns:
        for value in table[column]:
            parts = {str(value), *str(value).split(" / "), *str(value).split(", ")}
            if parts & ids:
                problems.append(f"column {column!r}: {value!r} shows the id {sorted(parts & ids)[0]!r}")
    return problems
