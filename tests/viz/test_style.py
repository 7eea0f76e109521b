"""Shared figure helpers: readable log ticks, series on top of each other drawn apart, one colour per run."""
from __future__ import annotations

import pytest

go = pytest.importorskip("plotly.graph_objects", reason="plotly draws the figures")

from hilbert_lab.viz.style import compact_number, log_ticks, readable_log_axes, run_colours, separate_overlapping  # noqa: E402
from hilbert_lab.viz.training import training_curves  # noqa: E402


def test_log_ticks_are_one_two_five_steps_with_compact_labels():
    """plotly's own log ticks label the minor ticks with bare digits: '9 10 2 3 4 5 6'."""
    assert log_ticks([3.1, 17.9, 58.0]) == [5, 10, 20, 50]
    assert log_ticks([5.2e6, 7.2e7]) == [5e6, 1e7, 2e7, 5e7]
    assert log_ticks([1, 1e6]) == [1, 10, 100, 1000, 1e4, 1e5, 1e6]
    assert log_ticks([0, -1, float("nan")]) == [] and len(log_ticks([0.95, 1.05])) >= 2
    assert [compact_number(v) for v in (0.5, 20, 1500, 2e6, 7.2e7, 3e9)] == ["0.5", "20", "1.5K", "2M", "72M", "3G"]


def test_readable_log_axes_labels_only_log_axes_without_ticks():
    fig = go.Figure(go.Scatter(x=[512, 1024, 2048], y=[3.1, 7.0, 13.5],
                               error_y={"type": "data", "array": [0.5, 0.5, 40.0], "arrayminus": [0.1, 0.1, 0.1]}))
    fig.update_layout(xaxis_type="log", yaxis_type="log", xaxis={"tickvals": [512, 1024, 2048]})
    readable_log_axes(fig)
    assert list(fig.layout.xaxis.tickvals) == [512, 1024, 2048]  # explicit ticks are kept
    assert list(fig.layout.yaxis.ticktext) == ["5", "10", "20", "50"]  # error bars widen the range
    linear = readable_log_axes(go.Figure(go.Scatter(x=[1, 2], y=[1, 2])))
    assert linear.layout.yaxis.tickvals is None


def test_series_on_top_of_each_other_are_drawn_apart_once():
    fig = go.Figure([go.Scatter(x=[1, 2], y=[8.25, 33.0], name="triton / identity", mode="lines+markers"),
                     go.Scatter(x=[1, 2], y=[8.25, 33.0], name="triton / hilbert", mode="lines"),
                     go.Scatter(x=[1, 2], y=[84.0, 336.0], name="auto / identity")])
    separate_overlapping(separate_overlapping(fig))
    first, second, third = fig.data
    assert first.name == "triton / identity" and first.line.dash is None
    assert second.name == "triton / hilbert (on top of triton / identity)" and second.line.dash == "dash"
    assert "markers" in second.mode and second.marker.symbol == "circle-open"
    assert third.name == "auto / identity" and third.line.dash is None


def test_run_colours_are_stable_across_figures():
    colours = run_colours(["a", "b", "c"])
    assert run_colours(["c", "a"], colours) == colours and len(set(colours.values())) == 3


def test_runs_with_one_curriculum_share_one_set_of_phase_marks():
    """Two runs with the same phases drew every label twice, one on top of the other ('1K' '1K')."""
    history = [{"kind": "train", "step": step, "seq_len": 1024 if step <= 20 else 32768, "loss": 4.0}
               for step in range(10, 70, 10)]
    figure = training_curves({"1 GPU": history, "2 GPUs": history}, "loss", chance=4.16)
    labels = [a.text for a in figure.layout.annotations if a.name == "phase"]
    assert labels == ["1K", "32K"]
    assert any(a.text == "chance 4.16 nats" for a in figure.layout.annotations)


def test_one_display_name_and_one_colour_per_ordering():
    from hilbert_lab.curves import GRID_ORDERINGS, ORDERINGS, SERIALIZATIONS
    from hilbert_lab.curves.layouts import LAYOUTS
    from hilbert_lab.viz.style import ORDERING_COLOURS, ordering_colour, ordering_name

    every = list(dict.fromkeys([*GRID_ORDERINGS, *ORDERINGS, *SERIALIZATIONS, *LAYOUTS,
                                *(f"{name}/{name}-trans" for name in GRID_ORDERINGS)]))
    names = {ordering: ordering_name(ordering) for ordering in every}
    assert names["rowmajor"] == "row-major" and names["dilation_major"] == "dilation-major"
    assert names["hilbert/hilbert-trans"] == "Hilbert alternating with its transpose"
    assert names["hilbert-trans"] == "Hilbert (transposed)"
    assert not any("_" in name or "rowmajor" in name for name in names.values()), names
    assert len(set(names.values())) == len(names)  # one name per ordering, no two orderings share one
    colours = {ordering: ordering_colour(ordering) for ordering in every}
    assert all(colours.values()), colours
    # identity and row-major are the same token order (the baseline); every other ordering has its own colour
    assert colours["identity"] == colours["rowmajor"]
    others = [colour for ordering, colour in colours.items() if ordering != "identity"]
    assert len(set(others)) == len(others)
    assert set(ORDERING_COLOURS) <= set(every)


def test_an_ordering_keeps_its_colour_and_name_in_every_figure():
    from hilbert_lab.locality.serialization import serialization_table
    from hilbert_lab.viz.locality import miss_curve_figure
    from hilbert_lab.viz.serialization import accuracy_figure, locality_figure
    from hilbert_lab.viz.style import ORDERING_COLOURS

    def colours(figure):
        found = {}
        for trace in figure.data:
            colour = trace.marker.color if trace.type == "bar" or trace.mode == "markers" else trace.line.color
            found[trace.name] = colour
        return found

    table = serialization_table({"grid": (8, 8)}, ["snake", "hilbert", "rowmajor"], [([16], [1])], ks=(4,))
    tasks = [{"name": "t", "summary": [{"ordering": o, "mean": 0.8, "low": 0.7, "high": 0.9}
                                       for o in ("morton", "rowmajor", "hilbert")]}]
    figures = [locality_figure(table, "recall@4"), accuracy_figure(tasks),
               miss_curve_figure([4, 8], {"rowmajor": [3, 2], "morton": [3, 1], "hilbert": [2, 1]})]
    for figure in figures:
        found = colours(figure)
        assert found["Hilbert"] == ORDERING_COLOURS["hilbert"] and found["row-major"] == ORDERING_COLOURS["rowmajor"]
        assert "rowmajor" not in found and "hilbert" not in found


def test_a_raw_ordering_id_or_an_off_palette_colour_is_caught():
    from hilbert_lab.viz.style import ORDERING_COLOURS, ordering_figure_problems, ordering_table_problems, ordering_trace

    pd = pytest.importorskip("pandas")
    right = go.Figure([go.Scatter(x=[1], y=[1], name="auto / Hilbert", **ordering_trace("hilbert")),
                       go.Scatter(x=[1], y=[1], name="manual / row-major / fwd+bwd", **ordering_trace("rowmajor", 1))])
    assert ordering_figure_problems(right) == []
    assert right.data[0].line.color == ORDERING_COLOURS["hilbert"] == "#1f77b4"
    assert right.data[1].line.dash == "dash" and right.data[1].marker.color == ORDERING_COLOURS["rowmajor"]
    default = go.Figure(go.Scatter(x=[1], y=[1], name="auto / Hilbert"))  # plotly's cycle would pick its colour
    assert ordering_figure_problems(default) == ["'auto / Hilbert': drawn in the default colour, not Hilbert's #1f77b4"]
    red = go.Figure(go.Scatter(x=[1], y=[1], name="Morton", line={"color": "#EF553B"}))
    assert ordering_figure_problems(red) == ["'Morton': drawn in ['#EF553B'], not Morton's #ff7f0e"]
    raw = go.Figure(go.Scatter(x=[1], y=[1], name="auto / rowmajor", line={"color": "#7f7f7f"}))
    assert ordering_figure_problems(raw) == ["'auto / rowmajor': ordering id 'rowmajor', not its display name"]
    table = pd.DataFrame({"ordering": ["row-major", "hilbert/hilbert-trans", "snake", "Hilbert (transposed)"]})
    assert ordering_table_problems(table) == [
        "column 'ordering': 'hilbert/hilbert-trans' shows the id 'hilbert/hilbert-trans'"]


def test_benchmark_scaling_figure_uses_display_names_and_ordering_colours():
    pd = pytest.importorskip("pandas")
    from hilbert_lab.reports.benchmark import scaling_figure
    from hilbert_lab.viz.style import ORDERING_COLOURS, ordering_figure_problems

    table = pd.DataFrame([{"backend": backend, "mode": "longnet", "ordering": ordering, "pass": "forward",
                           "seq_len": n, "median_ms": n / 100 * (2 if backend == "manual" else 1) * (1.5 if ordering == "hilbert" else 1)}
                          for backend in ("auto", "manual") for ordering in ("identity", "hilbert") for n in (512, 1024)])
    figure = scaling_figure(table)
    assert [t.name for t in figure.data][:2] == ["auto / identity / longnet / forward", "auto / Hilbert / longnet / forward"]
    assert ordering_figure_problems(figure) == []
    hilbert = [t for t in figure.data if "Hilbert" in t.name]
    assert {t.line.color for t in hilbert} == {ORDERING_COLOURS["hilbert"]}
    assert len({t.line.dash for t in hilbert}) == 2  # the two backends told apart by dash
