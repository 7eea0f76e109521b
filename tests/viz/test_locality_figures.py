"""Locality figures of the report: one bar per value (never two parameters stacked), readable axis titles."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("plotly", reason="plotly (notebooks extra) draws the figures")

from hilbert_lab.locality import COLUMNS, compare_orderings  # noqa: E402
from hilbert_lab.viz.locality import METRIC_LABELS, metric_bars, miss_curve_figure  # noqa: E402
from hilbert_lab.viz.style import ordering_name  # noqa: E402


@pytest.fixture(scope="module")
def table():
    return compare_orderings(((32, 32), (8, 8, 8)), box_sizes=(4, 8), segment_lengths=(16,), dilated_configs=(),
                             cache_lines=(64,), progress=False)


def _bars(figure) -> dict[tuple[str, str], float]:
    return {(trace.name, ordering): value for trace in figure.data for ordering, value in zip(trace.x, trace.y)}


def test_metric_bars_keep_each_box_size_apart(table):
    clustering = metric_bars(table, "clustering_mean")
    for trace in clustering.data:  # plotly stacks repeated x values of one trace into one bar
        assert len(set(trace.x)) == len(trace.x), trace.name
    bars = _bars(clustering)
    # row-major: a b x b box of a row-major grid is b runs (one per row), whatever b
    assert bars[("32x32, box 4", "row-major")] == 4.0 and bars[("32x32, box 8", "row-major")] == 8.0
    lines = _bars(metric_bars(table, "lines_per_box_mean"))
    # 128 B rows on 128 B lines: one line per cell of the box
    assert lines[("8x8x8, box 4", "row-major")] == 64.0 and lines[("8x8x8, box 8", "row-major")] == 512.0
    # every bar is one row of the table
    rows = table[table["metric"] == "lines_per_box_mean"]
    assert len(lines) == len(rows)
    for row in rows.itertuples():
        assert lines[(f"{row.configuration}, box {row.parameter}", ordering_name(row.ordering))] == row.value


def test_metric_bars_one_parameter_and_plain_metrics(table):
    only_box_8 = metric_bars(table, "clustering_mean", parameter=8)
    assert [trace.name for trace in only_box_8.data] == ["32x32, box 8", "8x8x8, box 8"]
    steps = metric_bars(table, "step_mean")  # no parameter: one series per configuration
    assert [trace.name for trace in steps.data] == ["32x32", "8x8x8"]
    assert _bars(steps)[("32x32", "Hilbert")] == 1.0


def test_axis_titles_have_units_and_direction_not_column_names(table):
    raw_names = set(COLUMNS) | set(table["metric"])
    figures = [metric_bars(table, metric) for metric in ("step_mean", "clustering_mean", "lines_per_box_mean")]
    figures.append(miss_curve_figure([4, 16], {"hilbert": [9, 3]}))
    for figure in figures:
        for axis in (figure.layout.xaxis, figure.layout.yaxis):
            assert axis.title.text and axis.title.text not in raw_names
        assert "better" in figure.layout.yaxis.title.text and "(" in figure.layout.yaxis.title.text
    assert all("better" in label or "rows" in label or "lines" in label for label, _ in METRIC_LABELS.values())
    assert np.array_equal(figures[-1].data[0].y, [9, 3])
