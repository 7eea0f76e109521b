"""Timed backend selection (bench.selection, `hilbert-lab select`): timing with the kit, the JSON file
that select_backend(timed=True) reads."""
from __future__ import annotations

import json
import statistics

import pytest
import torch

from hilbert_lab.attention import select_backend
from hilbert_lab.attention.selection import candidate_backends, selection_key
from hilbert_lab.bench import selection

SHAPE, LENGTHS, RATES = (1, 32, 2, 8), [8, 16], [1, 2]


def test_time_candidates_times_every_runnable_candidate_and_leaves_out_failures():
    timings = selection.time_candidates("cpu", torch.float32, SHAPE, LENGTHS, RATES, repeats=2,
                                        backends=["manual", "sdpa", "flash"])  # flash cannot run on the CPU
    assert set(timings) == {"manual", "sdpa"}
    for timing in timings.values():
        assert len(timing.samples) == 2 and min(timing.samples) > 0
        assert timing.median == statistics.median(timing.samples)
        assert (timing.low, timing.high) == (min(timing.samples), max(timing.samples))  # 10th / 90th of two samples
    with pytest.raises(ValueError, match="shape"):
        selection.time_candidates("cpu", torch.float32, (32, 2, 8), LENGTHS, RATES)


def test_measure_selection_stores_the_fastest_once_per_key(tmp_path, monkeypatch):
    monkeypatch.setenv("HILBERT_LAB_CACHE_DIR", str(tmp_path / "cache"))  # created on the first write
    calls = []
    real = selection.time_candidates

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(selection, "time_candidates", counting)
    writes = []
    real_write = selection.atomic_write
    monkeypatch.setattr(selection, "atomic_write", lambda path, data: (writes.append(path), real_write(path, data)))
    first = selection.measure_selection("cpu", torch.float32, SHAPE, LENGTHS, RATES, repeats=2)
    assert first["source"] == "timed" and len(calls) == 1
    assert writes == [tmp_path / "cache" / "backend_selection.json"]  # one whole-file replace
    assert first["backend"] == min(first["timings_ms"], key=first["timings_ms"].get)
    key = selection_key("cpu", torch.float32, SHAPE, LENGTHS, RATES)
    path = tmp_path / "cache" / "backend_selection.json"
    assert json.loads(path.read_text()) == {key: first["backend"]}
    again = selection.measure_selection("cpu", torch.float32, SHAPE, LENGTHS, RATES, repeats=2)
    assert again["source"] == "stored before" and again["backend"] == first["backend"] and len(calls) == 1
    assert select_backend("cpu", torch.float32, SHAPE, LENGTHS, dilation_rates=RATES, timed=True) == first["backend"]
    other = selection.measure_selection("cpu", torch.float32, SHAPE, LENGTHS, RATES, causal=True, repeats=2)
    stored = json.loads(path.read_text())
    assert len(calls) == 2 and len(stored) == 2 and stored[key] == first["backend"]  # other keys kept
    assert stored[selection_key("cpu", torch.float32, SHAPE, LENGTHS, RATES, causal=True)] == other["backend"]
    path.write_text(json.dumps({key: "sdpa" if first["backend"] == "manual" else "manual"}))
    refreshed = selection.measure_selection("cpu", torch.float32, SHAPE, LENGTHS, RATES, repeats=2, refresh=True)
    assert refreshed["source"] == "timed" and len(calls) == 3
    assert json.loads(path.read_text()) == {key: refreshed["backend"]}


def test_select_command_fills_the_cache_and_refuses_bad_input(tmp_path, monkeypatch, capsys):
    from hilbert_lab.cli import main

    monkeypatch.setenv("HILBERT_LAB_CACHE_DIR", str(tmp_path))
    argv = ["select", "--seq-len", "32", "--num-heads", "2", "--head-dim", "8", "--segment-lengths", "8,16",
            "--dilation-rates", "1,2", "--repeats", "2"]
    assert main(argv + ["--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["source"] == "timed" and row["backend"] in candidate_backends(torch.device("cpu"), torch.float32)
    key = selection_key("cpu", torch.float32, SHAPE, LENGTHS, RATES)
    assert json.loads((tmp_path / "backend_selection.json").read_text()) == {key: row["backend"]}
    assert main(argv) == 0
    assert "stored before" in capsys.readouterr().out
    assert main(argv + ["--dilation-rates", "1"]) == 2
    assert "dilation" in capsys.readouterr().err
    assert main(argv + ["--mode", "sparse"]) == 2
    assert "--mode" in capsys.readouterr().err


@pytest.mark.timeout(120)  # wide: only a hang reaches it on a busy machine
def test_a_shape_beyond_memory_is_refused_before_anything_is_allocated(monkeypatch):
    def no_allocation(*args, **kwargs):
        raise AssertionError("allocated")

    monkeypatch.setattr(torch, "randn", no_allocation)
    with pytest.raises(ValueError, match=r"shape \(B, N, H, D\) = \(1, 1000000000, 4, 32\) does not fit: needs"):
        selection.time_candidates("cpu", torch.float32, (1, 10 ** 9, 4, 32), [256, 512], [1, 2])
