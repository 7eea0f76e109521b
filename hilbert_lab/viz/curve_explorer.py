"""Curve explorer panel: family, 2D/3D, order or width/height/depth, colouring, animation, live metrics."""
from __future__ import annotations

import html

from hilbert_lab.viz.curves import (
    CURVE_FAMILIES,
    CURVE_LABELS,
    ORDER_FAMILIES,
    TRAVERSAL_METRIC_LABELS,
    curve_coordinates,
    curve_figure,
    format_metric,
    traversal_metrics,
)
from hilbert_lab.viz.panels import FigureView, Panel, clamp, guarded, replace_figure, show_message, wrapping_row

MAX_ORDER = {2: 7, 3: 4}  # 16384 cells in 2D, 4096 in 3D: what a browser redraws smoothly
MAX_SIDE = {2: 128, 3: 16}


def metrics_table_html(metrics: dict[str, float]) -> str:
    """The locality metrics as a titled two-column HTML table, each label on one line."""
    rows = "".join(f"<tr><td style='white-space:nowrap;padding-right:12px'>"
                   f"{html.escape(TRAVERSAL_METRIC_LABELS.get(name, name))}</td><td>{format_metric(value)}</td></tr>"
                   for name, value in metrics.items())
    return f"<b>locality</b><table>{rows}</table>"


def curve_explorer(family: str = "hilbert", ndim: int = 2, order: int = 3, width: int = 12, height: int = 8,
                   depth: int = 4) -> Panel:
    """Build the curve explorer; `panel.figures['curve']` is the FigureView it redraws."""
    import ipywidgets as widgets

    if family not in CURVE_FAMILIES:
        raise ValueError(f"family must be one of {CURVE_FAMILIES}, got {family!r}")
    labelled = {"style": {"description_width": "initial"}}  # descriptions shown in full, never cut off
    controls = {
        "family": widgets.Dropdown(options=[(CURVE_LABELS[name], name) for name in CURVE_FAMILIES],
                                   value=family, description="curve", layout={"width": "max-content"}, **labelled),
        "ndim": widgets.ToggleButtons(options=[("2D", 2), ("3D", 3)], value=ndim, description="dims",
                                      style={"description_width": "initial", "button_width": "60px"}),
        "order": widgets.IntSlider(value=order, min=1, max=MAX_ORDER[2], description="order",
                                   continuous_update=False, **labelled),
        "width": widgets.IntText(value=width, description="width", **labelled),
        "height": widgets.IntText(value=height, description="height", **labelled),
        "depth": widgets.IntText(value=depth, description="depth", **labelled),
        "color_by_index": widgets.Checkbox(value=True, description="colour by index", **labelled),
        "drawn_percent": widgets.IntSlider(value=100, min=1, max=100, description="drawn %",
                                           continuous_update=True, **labelled),
    }
    play = widgets.Play(value=100, min=1, max=100, step=5, interval=150, description="animate")
    widgets.jslink((play, "value"), (controls["drawn_percent"], "value"))
    controls["play"] = play
    message = widgets.HTML()
    metrics_html = widgets.HTML()
    figure = FigureView()
    state: dict = {}

    def refresh() -> None:
        notes: list[str] = []
        dims = controls["ndim"].value
        chosen = controls["family"].value
        # only the size controls that shape this curve are active
        sized_by_order = chosen in ORDER_FAMILIES
        controls["order"].disabled = not sized_by_order
        controls["width"].disabled = controls["height"].disabled = sized_by_order
        controls["depth"].disabled = sized_by_order or dims == 2
        kwargs: dict = {"ndim": dims}
        if sized_by_order:
            kwargs["order"] = clamp(controls["order"].value, 1, MAX_ORDER[dims], "order", notes)
            size_text = f"side {2 ** kwargs['order']}"
        else:
            for name in ("width", "height") + (("depth",) if dims == 3 else ()):
                kwargs[name] = clamp(controls[name].value, 1, MAX_SIDE[dims], name, notes)
            if kwargs["width"] * kwargs["height"] * kwargs.get("depth", 1) < 2:
                notes.append("a traversal needs at least 2 cells; width raised to 2")
                kwargs["width"] = 2
            size_text = " x ".join(str(kwargs[name]) for name in ("width", "height", "depth") if name in kwargs)
        coords = curve_coordinates(chosen, **kwargs)
        visible = max(1, round(coords.shape[0] * controls["drawn_percent"].value / 100))
        plain = curve_figure(coords, title=f"{CURVE_LABELS[chosen]}, {dims}D, {size_text}, {coords.shape[0]} cells",
                             color_by_index=controls["color_by_index"].value, visible_cells=visible)
        replace_figure(figure, plain)
        metrics = traversal_metrics(coords)
        state.update(coords=coords, metrics=metrics, parameters=kwargs | {"family": chosen})
        metrics_html.value = metrics_table_html(metrics)
        show_message(message, notes)

    observer = guarded(refresh, message)
    for name, control in controls.items():
        if name != "play":
            control.observe(observer, names="value")
    size_box = widgets.HBox([controls["width"], controls["height"], controls["depth"]])
    layout = widgets.VBox([
        widgets.HBox([controls["family"], controls["ndim"]]),
        widgets.HBox([controls["order"], controls["color_by_index"]]),
        size_box,
        widgets.HBox([play, controls["drawn_percent"]]),
        message,
        # the table beside the curve where the notebook is wide enough for both, under it where not
        widgets.HBox([figure.widget, metrics_html], layout=wrapping_row()),
    ])
    observer()
    return Panel(widget=layout, figures={"curve": figure}, controls=controls, message=message, refresh=refresh,
                 state=state)
