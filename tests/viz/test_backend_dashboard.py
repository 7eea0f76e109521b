"""Backend dashboard: availability, the auto choice and the live timing, driven headlessly."""
from __future__ import annotations

import math

import pytest

pytest.importorskip("plotly", reason="plotly (notebooks extra) draws the figures")
pytest.importorskip("ipywidgets", reason="ipywidgets (notebooks extra) builds the panels")
pytest.importorskip("hilbert_lab.attention.engine", reason="the engine has not landed")

from hilbert_lab.viz.backends import backend_availability, backend_dashboard, explain_auto_choice, time_backends  # noqa: E402


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


def test_timing_table_backends_agree():
    table = time_backends(seq_len=64, num_heads=2, head_dim=8, segment_lengths=[16, 32], dilation_rates=[1, 2],
                          backends=["reference", "manual", "sdpa"], repeats=2, dtype="float64")
    assert list(table["backend"]) == ["reference", "manual", "sdpa"]
    assert (table["error"] == "").all()
    assert (table["max_abs_diff_vs_first"] < 1e-10).all()  # float64: all backends compute the same attention
    assert (table["min_ms"] <= table["median_ms"]).all() and (table["median_ms"] <= table["max_ms"]).all()
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
    assert list(panel.figures["timing"].data[0].x) == list(timings[timings["error"] == ""]["backend"])
    panel.controls["seq_len"].value = 10**9
    panel.controls["segment_lengths"].value = "16,abc"
    panel.refresh()  # refused with a visible message
    assert "segment_lengths" in panel.message.value
