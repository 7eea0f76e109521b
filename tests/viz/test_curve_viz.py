"""Curve figures, traversal metrics and the curve explorer panel driven headlessly."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("plotly", reason="plotly (notebooks extra) draws the figures")
pytest.importorskip("ipywidgets", reason="ipywidgets (notebooks extra) builds the panels")

from hilbert_lab.viz.curve_explorer import MAX_SIDE, curve_explorer  # noqa: E402
from hilbert_lab.viz.curves import (  # noqa: E402
    CURVE_FAMILIES,
    curve_animation_figure,
    curve_coordinates,
    curve_figure,
    metrics_figure,
    traversal_metrics,
)


def _is_grid_traversal(coords: np.ndarray, sides: tuple[int, ...]) -> bool:
    """Every cell of the grid exactly once."""
    flat = np.ravel_multi_index(tuple(coords.T), sides)
    return coords.shape == (int(np.prod(sides)), len(sides)) and np.array_equal(np.sort(flat), np.arange(np.prod(sides)))


@pytest.mark.parametrize("family", CURVE_FAMILIES)
@pytest.mark.parametrize("ndim", [2, 3])
def test_curve_coordinates_visit_every_cell_once(family, ndim):
    if family in ("hilbert", "morton"):
        coords = curve_coordinates(family, order=2, ndim=ndim)
        sides = (4,) * ndim
    else:
        sizes = dict(width=5, height=3, depth=2)
        coords = curve_coordinates(family, ndim=ndim, **sizes)
        sides = (5, 3, 2)[:ndim]
    assert _is_grid_traversal(coords, sides)


def test_continuous_curves_have_unit_steps_and_morton_jumps():
    hilbert = traversal_metrics(curve_coordinates("hilbert", order=4))
    gilbert = traversal_metrics(curve_coordinates("gilbert", width=12, height=7))
    morton = traversal_metrics(curve_coordinates("morton", order=4))
    rowmajor = traversal_metrics(curve_coordinates("rowmajor", width=16, height=16))
    assert hilbert["max_step"] == 1.0 and hilbert["unit_step_fraction"] == 1.0
    assert gilbert["unit_step_fraction"] >= 0.95  # odd x odd-ish grids may need a few diagonal steps
    assert morton["max_step"] > 1.0 and morton["unit_step_fraction"] < 1.0
    # 16 consecutive Hilbert cells form a 4x4 block (spread 1); row-major runs are 16x1 lines (spread 4)
    assert hilbert["window_spread"] == pytest.approx(1.0)
    assert rowmajor["window_spread"] == pytest.approx(4.0)


def test_counts_are_integers_in_the_panel_and_the_table():
    from hilbert_lab.viz.curves import format_metric, traversal_metrics_table

    metrics = traversal_metrics(curve_coordinates("hilbert", order=3))
    assert metrics["cells"] == 64 and isinstance(metrics["cells"], int)
    assert format_metric(metrics["cells"]) == "64" and format_metric(metrics["mean_step"]) == "1.000"
    panel = curve_explorer(order=3)
    assert ">cells</td><td>64</td>" in panel.widget.children[-1].children[1].value
    table = traversal_metrics_table({"hilbert": metrics, "snake": traversal_metrics(curve_coordinates(
        "snake", width=8, height=8))})
    assert table["cells"].tolist() == [64, 64] and str(table["cells"].dtype).startswith("int")
    assert "mean step (cells, lower is better)" in table.columns and "mean_step" not in table.columns


def test_traversal_metrics_hand_computed():
    coords = np.array([[0, 0], [1, 0], [1, 1], [3, 1]])
    metrics = traversal_metrics(coords, window=2)
    assert metrics["mean_step"] == pytest.approx(4 / 3)
    assert metrics["max_step"] == 2.0
    assert metrics["unit_step_fraction"] == pytest.approx(2 / 3)
    # windows [(0,0),(1,0)] extent 2 and [(1,1),(3,1)] extent 3, divided by sqrt(2)
    assert metrics["window_spread"] == pytest.approx(2.5 / np.sqrt(2))


@pytest.mark.parametrize("bad", [dict(family="peano", order=2), dict(family="hilbert", order=0),
                                 dict(family="gilbert", width=0, height=3), dict(family="snake", width=3, height=3, ndim=4)])
def test_curve_coordinates_refuses_bad_input(bad):
    with pytest.raises(ValueError, match="family|order|width|ndim"):
        curve_coordinates(**bad)


def test_curve_figure_draws_the_traversal_in_order():
    coords = curve_coordinates("hilbert", order=2)
    fig = curve_figure(coords, visible_cells=5)
    assert list(fig.data[0].x) == coords[:5, 0].tolist() and list(fig.data[0].y) == coords[:5, 1].tolist()
    assert list(fig.data[0].marker.color) == [0, 1, 2, 3, 4]
    fig3 = curve_figure(curve_coordinates("gilbert", width=3, height=2, depth=2, ndim=3))
    assert fig3.data[0].type == "scatter3d" and len(fig3.data[0].z) == 12


def test_animation_frames_grow_to_the_full_traversal():
    coords = curve_coordinates("gilbert", width=6, height=4)
    fig = curve_animation_figure(coords, frames=6)
    lengths = [len(frame.data[0].x) for frame in fig.frames]
    assert lengths == sorted(lengths) and lengths[-1] == 24 and len(set(lengths)) == len(lengths)
    assert [step.args[0][0] for step in fig.layout.sliders[0].steps] == [frame.name for frame in fig.frames]


def test_explorer_slider_changes_the_figure():
    panel = curve_explorer(family="hilbert", order=2)
    figure = panel.figures["curve"]
    before = (list(figure.data[0].x), list(figure.data[0].y))
    assert len(before[0]) == 16
    panel.controls["order"].value = 3
    assert len(figure.data[0].x) == 64
    assert list(figure.data[0].x) != before[0]
    assert panel.state["metrics"]["cells"] == 64.0
    panel.controls["family"].value = "morton"
    assert panel.state["metrics"]["max_step"] > 1.0  # the metrics follow the curve live
    assert panel.message.value == ""


def test_explorer_animation_slider_draws_a_prefix():
    panel = curve_explorer(family="gilbert", width=10, height=10)
    full = list(panel.figures["curve"].data[0].x)
    panel.controls["drawn_percent"].value = 30
    assert list(panel.figures["curve"].data[0].x) == full[:30]


def test_explorer_3d_and_clamping_message():
    panel = curve_explorer(family="gilbert", width=4, height=3)
    panel.controls["ndim"].value = 3
    assert panel.figures["curve"].data[0].type == "scatter3d"
    panel.controls["width"].value = 10_000
    assert f"clamped to {MAX_SIDE[3]}" in panel.message.value and "width" in panel.message.value
    assert len(panel.figures["curve"].data[0].x) == MAX_SIDE[3] * 3 * 4
    panel.controls["width"].value = -3
    assert "clamped to 1" in panel.message.value
    panel.controls["ndim"].value = 2
    panel.controls["family"].value = "hilbert"
    panel.controls["order"].value = 7
    assert len(panel.figures["curve"].data[0].x) == 4 ** 7


def test_explorer_shows_errors_instead_of_raising(monkeypatch):
    panel = curve_explorer(family="hilbert", order=2)
    monkeypatch.setattr("hilbert_lab.viz.curve_explorer.curve_coordinates",
                        lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("boom 77")))
    panel.controls["order"].value = 3  # must not raise
    assert "boom 77" in panel.message.value


def test_2d_figure_shows_every_column_and_row_whole():
    coords = curve_coordinates("gilbert", width=12, height=8)
    for figure in (curve_figure(coords), curve_figure(coords, visible_cells=3), curve_animation_figure(coords)):
        # fixed ranges half a cell beyond the outer cells, kept by shrinking the plot area (not the range)
        assert list(figure.layout.xaxis.range) == [-0.5, 11.5] and list(figure.layout.yaxis.range) == [7.5, -0.5]
        assert figure.layout.xaxis.constrain == figure.layout.yaxis.constrain == "domain"
        assert figure.layout.yaxis.scaleanchor == "x"
        assert figure.layout.xaxis.title.text and figure.layout.yaxis.title.text


def test_animation_starts_in_full_with_the_colour_scale_of_the_whole_traversal():
    coords = curve_coordinates("gilbert", width=12, height=8)
    fig = curve_animation_figure(coords, frames=6)
    assert len(fig.data[0].x) == 96  # drawn in full until played
    assert fig.layout.sliders[0].active == len(fig.frames) - 1
    for trace in [fig.data[0]] + [frame.data[0] for frame in fig.frames]:
        assert (trace.marker.cmin, trace.marker.cmax) == (0, 95)  # never a -0.4..0.4 bar for one cell
    play = fig.layout.updatemenus[0].buttons[0]
    assert play.args[0] is None and play.args[1]["fromcurrent"] is False  # play draws from the first cell


def test_explorer_disables_size_controls_without_effect():
    panel = curve_explorer(family="hilbert", order=2)
    disabled = {name: control.disabled for name, control in panel.controls.items() if name != "play"}
    assert disabled == {"family": False, "ndim": False, "order": False, "width": True, "height": True, "depth": True,
                        "color_by_index": False, "drawn_percent": False}
    panel.controls["family"].value = "gilbert"
    assert panel.controls["order"].disabled and not panel.controls["width"].disabled
    assert panel.controls["depth"].disabled  # 2D
    panel.controls["ndim"].value = 3
    assert not panel.controls["depth"].disabled
    panel.controls["family"].value = "morton"
    assert [panel.controls[name].disabled for name in ("order", "width", "height", "depth")] == [False, True, True,
                                                                                                True]


def test_explorer_labels_are_not_cut_off():
    panel = curve_explorer()
    for name, control in panel.controls.items():
        if name != "play":
            assert control.style.description_width == "initial", name


def test_metrics_figure_one_panel_per_metric_with_unit_and_direction():
    metrics = {family: traversal_metrics(curve_coordinates(family, order=3) if family in ("hilbert", "morton")
                                         else curve_coordinates(family, width=8, height=8))
               for family in CURVE_FAMILIES}
    fig = metrics_figure(metrics)
    names = ["mean_step", "max_step", "unit_step_fraction", "window_spread"]
    assert [trace.name for trace in fig.data] == names
    for trace, axis in zip(fig.data, ("yaxis", "yaxis2", "yaxis3", "yaxis4")):
        assert list(trace.x) == list(CURVE_FAMILIES)
        assert list(trace.y) == [metrics[family][trace.name] for family in CURVE_FAMILIES]
        title = fig.layout[axis].title.text
        assert "better" in title and "(" in title and trace.name not in title
