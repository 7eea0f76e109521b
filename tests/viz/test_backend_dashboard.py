"""Backend dashboard: availability, the auto choice and the live timing, driven headlessly."""
from __future__ import annotations

import math

import pytest

pytest.importorskip("plotly", reason="plotly (notebooks extra) draws the figures")
pytest.importorskip("ipywidgets", reason="ipywidgets (notebooks extra) builds the panels")
pytest.importorskip("hilbert_lab.attention.engine", reason="the engine has not landed")

from hilbert_lab.viz.backends import (  # noqa: E402
    backend_availability, backend_dashboard, backend_label, explain_auto_choice, time_backends, timing_figure,
)


def test_auto_choice_matches_the_engine_rules():
    from hilbert_lab.attention.selection import rule_backend
    import torch

    choice = explain_auto_choice("cpu", "float32")
    assert choice["auto"] == rule_backend(torch.device("cpu"), torch.float32)
    assert choice["why"]
    with pytest.raises(ValueError, match="dtype"):
        explain_auto_choice("cpu", "int8")


def test_availability_lists_every_backend_with_a_reason_when_missing():
    table = backend_availability("cpu", "float32")
    assert {"reference", "manual", "sdpa"} <= set(table[table["available"]]["backend"])
    missing = table[~table["available"]]
    assert (missing["reason"].str.len() > 0).all()
    # a CPU user is never told to install a GPU extra (gpu, fa4) or a CUDA-only package
    assert not missing["reason"].str.contains("pip install|hilbert-lab\\[", regex=True).any(), missing
    by_name = missing.set_index("backend")["reason"]
    assert by_name["fa4"] == "it runs on cuda only, not on this CPU"


def test_a_gpu_package_missing_on_the_cpu_is_not_advised(monkeypatch):
    from hilbert_lab.attention.executors import base

    monkeypatch.setattr(base, "_importable", lambda package: False)  # as on a CPU machine without triton
    reason = backend_availability("cpu", "float32").set_index("backend")["reason"]
    assert "pip install" not in reason["triton"] and "GPU package" in reason["triton"]


def test_timing_table_backends_agree():
    table = time_backends(seq_len=64, num_heads=2, head_dim=8, segment_lengths=[16, 32], dilation_rates=[1, 2],
                          backends=["reference", "manual", "sdpa"], repeats=2, dtype="float64")
    assert list(table["backend"]) == ["reference", "manual", "sdpa"]
    assert (table["error"] == "").all()
    assert (table["max_abs_diff_vs_first"] < 1e-10).all()  # float64: all backends compute the same attention
    assert (table["min_ms"] <= table["median_ms"]).all() and (table["median_ms"] <= table["max_ms"]).all()
    assert (table["low_ms"] <= table["median_ms"]).all() and (table["median_ms"] <= table["high_ms"]).all()
    assert all(len(times) == 2 for times in table["times_ms"])
    assert all(math.isclose(row.median_ms, sorted(row.times_ms)[0] / 2 + sorted(row.times_ms)[1] / 2)
               for row in table.itertuples())
    assert all(math.isclose(row.tokens_per_s, 64 / (row.median_ms / 1e3)) for row in table.itertuples())


def test_timing_records_a_failing_backend_instead_of_raising():
    table = time_backends(seq_len=32, num_heads=1, head_dim=8, segment_lengths=[16], dilation_rates=[1],
                          backends=["no_such_backend", "manual"], repeats=1)
    assert table.iloc[0]["error"] and math.isnan(table.iloc[0]["median_ms"]) and table.iloc[1]["error"] == ""


def test_dashboard_button_times_and_draws():
    panel = backend_dashboard(seq_len=64, num_heads=2, head_dim=16, segment_lengths="16,32", dilation_rates="1,2",
                              repeats=1)
    assert panel.state["choice"]["auto"] in panel.state["availability"]["backend"].tolist()
    assert len(panel.figures["timing"].data) == 0
    panel.refresh()
    timings = panel.state["timings"]
    assert list(panel.figures["timing"].data[0].x) == [backend_label(row) for row in
                                                      timings[timings["error"] == ""].itertuples()]
    panel.controls["seq_len"].value = 10**9
    panel.controls["segment_lengths"].value = "16,abc"
    panel.refresh()  # refused with a visible message
    assert "segment_lengths" in panel.message.value


def test_timing_warnings_flag_wide_and_overlapping_intervals():
    pd = pytest.importorskip("pandas", reason="pandas (notebooks extra) holds the tables")

    from hilbert_lab.viz.backends import timing_display, timing_warnings

    table = pd.DataFrame([
        {"backend": "a", "median_ms": 2.0, "low_ms": 1.9, "high_ms": 26.0, "times_ms": [1.9, 2.0, 26.0],
         "spread": 26.0 / 1.9, "tokens_per_s": 1.0, "max_abs_diff_vs_first": 0.0, "error": ""},
        {"backend": "b", "median_ms": 3.0, "low_ms": 2.9, "high_ms": 3.1, "times_ms": [2.9, 3.0, 3.1],
         "spread": 3.1 / 2.9, "tokens_per_s": 1.0, "max_abs_diff_vs_first": 0.0, "error": ""},
        {"backend": "c", "median_ms": 9.0, "low_ms": 8.9, "high_ms": 9.1, "times_ms": [8.9, 9.0, 9.1],
         "spread": 9.1 / 8.9, "tokens_per_s": 1.0, "max_abs_diff_vs_first": 0.0, "error": ""},
    ])
    notes = timing_warnings(table)
    assert any(note.startswith("a:") and "noisy" in note for note in notes)
    assert any("a and b are within noise" in note for note in notes)
    assert not any("b and c" in note for note in notes)
    assert timing_display(table)["median ms [95%]"].tolist()[1] == "3 [2.9, 3.1]"


def test_hardware_table_is_html_not_a_dict():
    from hilbert_lab.viz.backends import hardware_html, hardware_summary

    text = hardware_html(hardware_summary("cpu"))
    assert text.startswith("<table>") and "torch CPU threads" in text and "{" not in text


def test_auto_is_timed_and_names_the_backend_it_ran():
    from hilbert_lab.attention.selection import resolve_executor
    from hilbert_lab.attention.pattern import DilatedPattern
    import torch

    table = time_backends(seq_len=64, num_heads=2, head_dim=16, segment_lengths=(16, 32), repeats=1)
    auto = table[table["backend"] == "auto"].iloc[0]
    expected = resolve_executor("auto", torch.empty(1, 64, 2, 16), DilatedPattern.create((16, 32), (1, 2))).name
    assert auto["runs"] == expected and auto["error"] == "" and auto["median_ms"] > 0
    assert backend_label(auto) == f"auto (runs {expected})"
    assert auto["max_abs_diff_vs_first"] < 1e-5  # the same attention as the other backends
    assert "auto" not in time_backends(seq_len=64, num_heads=2, head_dim=16, segment_lengths=(16, 32), repeats=1,
                                       backends=["manual"])["backend"].tolist()  # only when asked for every backend


def test_timing_axis_title_is_short_and_the_details_are_under_the_title():
    table = time_backends(seq_len=64, num_heads=2, head_dim=16, segment_lengths=(16, 32), repeats=2,
                          backends=["manual"])
    figure = timing_figure(table, "forward time, 64 tokens")
    assert figure.layout.yaxis.title.text == "forward time (ms)"  # a 380 px figure holds it
    assert "95% interval" in figure.layout.title.text and "2 repeats" in figure.layout.title.text


def test_a_control_change_marks_the_timing_out_of_date_until_the_next_press():
    panel = backend_dashboard(seq_len=64, num_heads=2, head_dim=16, segment_lengths="16,32", dilation_rates="1,2",
                              repeats=1)
    panel.controls["seq_len"].value = 32  # before any timing: nothing to mark
    assert "out of date" not in panel.widget.children[-1].value
    panel.refresh()
    figure, table = panel.figures["timing"], panel.widget.children[-1]
    assert "out of date" not in figure.layout.title.text and "out of date" not in table.value
    panel.controls["seq_len"].value = 48
    assert figure.layout.title.text.startswith("<b>out of date</b>") and "32 tokens" in figure.layout.title.text
    assert "out of date" in table.value and "tokens 32 -&gt; 48" in table.value
    assert all(trace.opacity == 0.35 for trace in figure.data)
    panel.controls["seq_len"].value = 32  # back to what was timed: current again
    assert "out of date" not in figure.layout.title.text and "out of date" not in table.value
    panel.controls["head_dim"].value = 32
    panel.refresh()
    assert "out of date" not in figure.layout.title.text and "out of date" not in table.value
