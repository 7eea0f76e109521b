"""Serialization figures and the windows panel, driven headlessly."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("plotly", reason="plotly (notebooks extra) draws the figures")
pytest.importorskip("ipywidgets", reason="ipywidgets (notebooks extra) builds the panels")

from hilbert_lab.locality.serialization import serialization_table  # noqa: E402
from hilbert_lab.viz.serialization import (  # noqa: E402
    accuracy_figure,
    locality_figure,
    serialization_panel,
    window_groups,
    windows_figure,
)


def test_window_groups_are_row_blocks_for_rowmajor_and_squares_for_hilbert():
    rows = window_groups((8, 8), "rowmajor", 16)
    assert np.array_equal(rows, np.repeat(np.arange(4), 16).reshape(8, 8))
    squares = window_groups((8, 8), "hilbert", 16)
    for group in range(4):
        ys, xs = np.nonzero(squares == group)
        assert ys.max() - ys.min() == 3 and xs.max() - xs.min() == 3
    dilated = window_groups((4, 4), "rowmajor", 8, 2)
    assert dilated[0].tolist() == [0, 1, 0, 1] and dilated[2].tolist() == [2, 3, 2, 3]


def test_windows_figure_draws_groups_and_path():
    figure = windows_figure((6, 10), "snake", 12)
    assert len(figure.data) == 2
    assert np.asarray(figure.data[0].customdata).max() == 4  # 60 cells / 12 = 5 groups
    assert list(figure.data[1].x[:11]) == list(range(10)) + [9]  # the snake turns at the row end


def test_locality_and_accuracy_figures():
    table = serialization_table({"grid": (8, 8)}, ["rowmajor", "hilbert"], [([16], [1])], ks=(4,))
    figure = locality_figure(table, "recall@4")
    assert [trace.name for trace in figure.data] == ["row-major", "Hilbert"]
    assert figure.data[1].y[0] > figure.data[0].y[0]
    with pytest.raises(ValueError, match="metric must be one of"):
        locality_figure(table, "speed")
    tasks = [{"name": "t", "summary": [{"ordering": "hilbert", "mean": 0.9, "low": 0.85, "high": 0.95}]}]
    acc = accuracy_figure(tasks, chance=0.5)
    assert acc.data[0].y[0] == 0.9 and acc.data[0].error_y.array[0] == pytest.approx(0.05)


def test_panel_redraws_and_clamps():
    panel = serialization_panel(size=16, ordering="hilbert", segment_length=16)
    assert panel.state["metrics"]["recall@4"] > panel.state["baseline"]["recall@4"]
    assert panel.widget.children[-1].children[1].value.count("<th>") == 3  # blank, hilbert, rowmajor
    panel.controls["ordering"].value = "rowmajor"
    assert panel.state["metrics"] == panel.state["baseline"]
    table = panel.widget.children[-1].children[1].value
    assert table.count("<th>rowmajor</th>") == 1 and table.count("<th>") == 2  # the baseline itself: one column
    panel.controls["dilation_rate"].value = 99
    assert panel.state["parameters"]["dilation_rate"] == 16
    assert "clamped" in panel.message.value
