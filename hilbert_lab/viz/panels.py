"""Shared widget-panel plumbing: a Panel record, clamping with a visible message, figure replacement."""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Panel:
    """An interactive panel: `widget` to display, `figures` it redraws, named `controls`, `message` line.

    `refresh()` recomputes everything from the controls (observers call it on every change); errors in
    a refresh are shown in `message`, never raised into the notebook.
    """

    widget: Any
    figures: dict[str, Any]
    controls: dict[str, Any]
    message: Any
    refresh: Callable[[], None]
    state: dict[str, Any] = field(default_factory=dict)


def clamp(value: Any, low: float, high: float, name: str, notes: list[str], *, integer: bool = True) -> Any:
    """`value` clamped to [low, high]; appends a note naming `name` when it had to change."""
    try:
        number = int(value) if integer else float(value)
    except (TypeError, ValueError):
        notes.append(f"{name}={value!r} is not a number; using {low}")
        return low
    clamped = min(max(number, low), high)
    if clamped != number:
        notes.append(f"{name}={number} is outside [{low}, {high}]; clamped to {clamped}")
    return clamped


def show_message(message_widget: Any, notes: list[str], *, error: bool = False) -> None:
    """Write notes into an HTML widget (orange for clamping notes, red for refused input)."""
    if not notes:
        message_widget.value = ""
        return
    colour = "#b00020" if error else "#a15c00"
    items = "<br>".join(html.escape(note) for note in notes)
    message_widget.value = f"<div style='color:{colour}'>{items}</div>"


def replace_figure(target: Any, source: Any) -> None:
    """Make FigureWidget `target` show plain figure `source` (traces and layout).

    The layout goes over as whole top-level entries (never `xaxis2` together with `xaxis2.anchor`,
    which plotly.js refuses), after clearing the entries that `source` no longer has.
    """
    layout = source.layout.to_plotly_json()
    with target.batch_update():
        target.data = []
        target.add_traces(list(source.data))
    stale = [key for key in target.layout.to_plotly_json() if key not in layout]
    if stale:
        target.plotly_relayout({key: None for key in stale})
    target.layout = layout


def guarded(refresh: Callable[[], None], message_widget: Any) -> Callable[..., None]:
    """Observer wrapper: any exception from `refresh` becomes a visible message instead of a traceback."""

    def observer(*_args: Any) -> None:
        try:
            refresh()
        except Exception as error:  # shown to the user; the panel stays usable
            show_message(message_widget, [f"{type(error).__name__}: {error}"], error=True)

    return observer
