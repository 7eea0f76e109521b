"""Figure builders: the plotted data equal the table they are built from."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("plotly", reason="plotly is an optional (notebooks) dependency")

from hilbert_lab.curves import grid_permutation  # noqa: E402
from hilbert_lab.locality import compare_orderings, miss_curve, window_attention_trace  # noqa: E402
from hilbert_lab.viz.style import ORDERING_COLOURS, ordering_name  # noqa: E402
from hilbert_lab.viz.locality import (  # noqa: E402
    access_order_heatmap,
    claims_figure,
    metric_bars,
    miss_curve_figure,
    miss_curves_from_table,
)


@pytest.fixture(scope="module")
def table():
    return compare_orderings(((8, 8),), box_sizes=(4,), segment_lengths=(16,), dilated_configs=((512, 128, 2),),
                             cache_lines=(8, 32, 128), progress=False)


def test_access_order_heatmap_shows_the_inverse_permutation():
    _, inverse = grid_permutation((8, 8), "hilbert")
    index_grid = inverse.reshape(8, 8)
    figure = access_order_heatmap(index_grid)
    np.testing.assert_array_equal(np.asarray(figure.data[0].z), index_grid)
    path = figure.data[1]
    # consecutive path points are grid neighbours for Hilbert, and the path starts at slot 0
    steps = np.hypot(np.diff(np.asarray(path.x)), np.diff(np.asarray(path.y)))
    np.testing.assert_array_equal(steps, 1.0)
    assert index_grid[path.y[0], path.x[0]] == 0
    with pytest.raises(ValueError, match="index_grid"):
        access_order_heatmap(np.arange(4))


def test_miss_curve_figure_data_match_simulator():
    capacities = [4, 16, 64, 256]
    misses = {ordering: miss_curve(window_attention_trace((16, 16), 5, ordering).lines, capacities)
              for ordering in ("rowmajor", "hilbert")}
    figure = miss_curve_figure(capacities, misses)
    assert [trace.name for trace in figure.data] == ["row-major", "Hilbert"]  # display names (viz.style)
    assert [trace.line.color for trace in figure.data] == [ORDERING_COLOURS["rowmajor"], ORDERING_COLOURS["hilbert"]]
    for trace, ordering in zip(figure.data, misses):
        np.testing.assert_array_equal(trace.x, capacities)
        np.testing.assert_array_equal(trace.y, misses[ordering])
    with pytest.raises(ValueError, match="misses_by_ordering"):
        miss_curve_figure([1, 2], {"rowmajor": [1, 2, 3]})


def test_miss_curves_from_table_match_rows(table):
    configuration = "8x8, window 4, tile 64, gather, 128 B rows"
    figure = miss_curves_from_table(table, configuration)
    rows = table[(table["configuration"] == configuration) & (table["metric"] == "misses")]
    assert {trace.name for trace in figure.data} == set(rows["ordering"].map(ordering_name))
    for trace in figure.data:
        expected = rows[rows["ordering"].map(ordering_name) == trace.name].sort_values("parameter")
        np.testing.assert_array_equal(trace.x, expected["parameter"].astype(int))
        np.testing.assert_array_equal(trace.y, expected["value"])
    with pytest.raises(ValueError, match="configuration"):
        miss_curves_from_table(table, "nope")


def test_density_bars_match_rows(table):
    figure = metric_bars(table, "tile_mean_density", parameter=64)
    rows = table[(table["metric"] == "tile_mean_density") & (table["parameter"] == 64)]
    assert len(figure.data) == rows["configuration"].nunique() == 1
    np.testing.assert_array_equal(figure.data[0].x, rows["ordering"].map(ordering_name))
    np.testing.assert_array_equal(figure.data[0].y, rows["value"])
    assert dict(zip(figure.data[0].x, figure.data[0].y))["dilation-major"] == 1.0
    with pytest.raises(ValueError, match="metric"):
        metric_bars(table, "no_such_metric")


def test_claims_figure_plots_measured_rows():
    pd = pytest.importorskip("pandas", reason="pandas (notebooks extra) holds the tables")

    claims = pd.DataFrame({"claim": ["C4", "C5", "C5"], "metric": ["a", "b", "c"], "configuration": ["x", "y", "z"],
                           "claimed": ["25-40", "28", "20-35"], "measured": [0.0, 50.0, float("nan")],
                           "verdict": ["refuted", "confirmed", "not reproducible here"], "why": ["", "", ""]})
    figure = claims_figure(claims)
    np.testing.assert_array_equal(figure.data[0].y, [0.0, 50.0])
    np.testing.assert_array_equal(figure.data[1].y, [25.0, 28.0])
    np.testing.assert_array_equal(figure.data[2].y, [40.0, 28.0])
