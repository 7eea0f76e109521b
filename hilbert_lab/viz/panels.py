"""Shared widget-panel plumbing: a Panel record, clamping with a visible message, figure replacement."""
from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Panel:
    """An interactive panel: `widget` to display, `figures` it redraws (FigureView), named `controls`,
    `message` line.

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


SLIDER_MIN_WIDTH = "340px"  # the label, the readout and a track wide enough to drag


def slider_layout() -> Any:
    """Layout of a slider in a row of controls: it never shrinks below SLIDER_MIN_WIDTH (a narrow notebook
    squeezes the track, not the label or readout, down to a dot)."""
    import ipywidgets as widgets

    return widgets.Layout(min_width=SLIDER_MIN_WIDTH)


def wrapping_row() -> Any:
    """Layout of a row of controls: controls that do not fit the notebook's width go on to the next line
    instead of being squeezed."""
    import ipywidgets as widgets

    return widgets.Layout(flex_flow="row wrap")


def show_message(message_widget: Any, notes: list[str], *, error: bool = False) -> None:
    """Write notes into an HTML widget (orange for clamping notes, red for refused input)."""
    if not notes:
        message_widget.value = ""
        return
    colour = "#b00020" if error else "#a15c00"
    items = "<br>".join(html.escape(note) for note in notes)
    message_widget.value = f"<div style='color:{colour}'>{items}</div>"


class FigureView:
    """A plotly figure shown in a panel and replaced whole on every redraw.

    `widget` is an ipywidgets Output holding one output: the figure as plotly's mime bundle, which the
    notebook draws from scratch. Replacing it is one state update of the Output, so a redraw cannot
    arrive in pieces (a FigureWidget's relayout messages can be lost on a busy front-end: a redrawn plot
    then has no title). Attributes other than `widget` and `figure` (data, layout, select_xaxes...) read the
    figure shown. `responsive`: a figure without a layout width fills the output's width and follows it when
    the window is resized.
    """

    def __init__(self, responsive: bool = False) -> None:
        import ipywidgets as widgets
        import plotly.graph_objects as go

        self.widget = widgets.Output()
        self.figure = go.Figure()
        self.config = {"displaylogo": False} | ({"responsive": True} if responsive else {})

    def show(self, figure: Any) -> None:
        """Draw plain plotly `figure` in place of the one shown."""
        spec = json.loads(figure.to_json())
        bundle = {"application/vnd.plotly.v1+json": {**spec, "config": self.config},
                  "text/plain": f"<figure: {html.escape(str(figure.layout.title.text or ''))}>"}
        self.figure = figure
        self.widget.outputs = ({"output_type": "display_data", "data": bundle, "metadata": {}},)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name in ("figure", "widget", "config"):
            raise AttributeError(name)
        return getattr(self.figure, name)


def replace_figure(target: FigureView, source: Any) -> None:
    """Make `target` show plain figure `source` (traces and layout, nothing kept from before)."""
    target.show(source)


def guarded(refresh: Callable[[], None], message_widget: Any) -> Callable[..., None]:
    """Observer wrapper: any exception from `refresh` becomes a visible message instead of a traceback."""

    def observer(*_args: Any) -> None:
        try:
            refresh()
        except Exception as error:  # shown to the user; the panel stays usable
            show_message(message_widget, [f"{type(error).__name__}: {error}"], error=True)

    return observer
