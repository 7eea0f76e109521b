"""benchmarks/bench_gpu_attention.py runs each ragged pair in a fresh process: its entry (with that process's graph
region counts) comes back, and a process that dies gives an entry naming the signal or exit status."""
from __future__ import annotations

import json
import signal
import types
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gpu_attention.py"


def test_a_finished_pair_returns_its_entry_and_the_region_counts(bench, monkeypatch):
    commands = []

    def finished(command):
        commands.append(command)
        out = Path(command[command.index("--out") + 1])
        out.write_text(json.dumps({"ragged": [{"mode": "longnet", "m": 32768, "ratios": {"auto": 1.02}}],
                                   "graph_regions": {"enabled": True, "counts": {"eager": 4, "replayed": 60}}}))
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(bench.subprocess, "run", finished)
    entry = bench.ragged_in_process("32768,longnet,fwd", 5, True, backward_thread="caller")
    assert entry == {"mode": "longnet", "m": 32768, "ratios": {"auto": 1.02},
                     "graph_regions": {"enabled": True, "counts": {"eager": 4, "replayed": 60}}}
    (command,) = commands
    assert command[command.index("--ragged-pair") + 1] == "32768,longnet,fwd"
    assert command[command.index("--repeats") + 1] == "5" and command[-1] == "--no-graphs"
    assert command[command.index("--backward-thread") + 1] == "caller"  # the child times backwards as its parent


@pytest.mark.parametrize("code, how", [(-int(signal.SIGSEGV), "signal SIGSEGV"), (3, "exit status 3")])
def test_a_pair_whose_process_dies_is_recorded_with_how(bench, monkeypatch, code, how):
    monkeypatch.setattr(bench.subprocess, "run", lambda command: types.SimpleNamespace(returncode=code))
    entry = bench.ragged_in_process("131072,head_groups,fwd+bwd", 5, False)
    assert entry == {"mode": "head_groups", "m": 131072, "direction": "fwd+bwd",
                     "error": f"the process running the pair died: {how}"}


@pytest.mark.parametrize("variants, timed", [
    (("auto", "hilbert", "floors"), {"auto", "auto[hilbert]", "floor[fa4]", "floor[cudnn]", "floor[flash]"}),
    (("executors", "compositions"), {"sdpa", "fa4", "torchscale[cudnn]", "torchscale[flash]", "strided[cudnn]",
                                     "strided[flash]"}),
    (("auto",), {"auto"}),
])
def test_variants_name_what_a_cell_times(bench, monkeypatch, variants, timed):
    """--variants: a cell times ours and the anchors of the named groups alone (the targets need auto, its ordering and
    the floors), each output still checked against the torchscale-style composition; auto, its hilbert ordering
    and the FlashAttention-4 floor are timed interleaved."""
    import torch

    from hilbert_lab.attention import DilatedPattern

    monkeypatch.setattr(bench, "executors", lambda: ["sdpa", "fa4"])
    monkeypatch.setattr(bench, "dilated_attention", lambda q, k, v, **kw: q)
    for name in ("torchscale_composition", "strided_composition"):
        monkeypatch.setattr(bench.anchors, name, lambda q, k, v, pattern, scale, kernel: q)
    monkeypatch.setattr(bench.anchors, "gather_blocks", lambda *args: [])
    monkeypatch.setattr(bench.anchors, "fa4_floor", lambda *args, **kw: None)
    monkeypatch.setattr(bench, "graphed", lambda step, device: step)
    monkeypatch.setattr(bench, "time_function", lambda step, **kw: types.SimpleNamespace(as_dict=dict))
    interleaved = []

    def pair(steps, **kw):
        interleaved.append((sorted(steps), kw["burst_ms"]))
        return {name: types.SimpleNamespace(as_dict=lambda: {"median": 1.0}) for name in steps}

    monkeypatch.setattr(bench, "time_interleaved", pair)
    pattern = DilatedPattern.create([4, 8], [1, 2], mode="head_groups")
    q = torch.ones(1, 8, 2, 4)
    results, errors = bench.run_variants(pattern, q, q, q, "fwd", 0.5, 3, variants)
    assert set(results) == timed and set(errors) == timed - {name for name in timed if name.startswith("floor")}
    assert all(error == 0 for error in errors.values())
    if "floor[fa4]" in timed:  # auto, its hilbert ordering and the FlashAttention-4 floor, round by round together
        assert interleaved == [(["auto", "auto[hilbert]", "floor[fa4]"], bench.PAIR_BURST_MS)]
        assert results["auto"] == {"median": 1.0, "interleaved_with": ["auto[hilbert]", "floor[fa4]"]}
        assert results["floor[fa4]"] == {"median": 1.0, "interleaved_with": ["auto", "auto[hilbert]"]}
    else:
        assert interleaved == []


@pytest.mark.parametrize("direction", ["fwd", "fwd+bwd"])
def test_auto_at_both_ragged_lengths_is_timed_round_by_round(bench, monkeypatch, direction):
    """The ragged target's ratio from auto at N = m and m + 5 timed together (bursts, paired rounds): each length's
    timing, the ratio of medians and its interval; the calls see inputs of their own length, with a backward in
    fwd+bwd."""
    import torch

    seen = []

    def attention(q, k, v, **kw):
        seen.append((q.shape[1], torch.is_grad_enabled() and q.requires_grad, kw["backend"], kw["mode"]))
        return q * 2

    monkeypatch.setattr(bench, "DEV", torch.device("cpu"))
    monkeypatch.setattr(bench, "dilated_attention", attention)
    found = bench.auto_at_both_lengths(64, 2, 8, "head_groups", direction, rounds=4)
    assert set(found) == {"m", "m_plus_5", "ratio", "interval", "rounds"} and found["rounds"] == 4
    assert len(found["m"]["samples"]) == len(found["m_plus_5"]["samples"]) == 4
    assert found["interval"][0] <= found["ratio"] <= found["interval"][1]
    assert found["ratio"] == pytest.approx(found["m_plus_5"]["median"] / found["m"]["median"])
    assert {(n, grad, backend, mode) for n, grad, backend, mode in seen} == \
        {(64, direction == "fwd+bwd", "auto", "head_groups"), (69, direction == "fwd+bwd", "auto", "head_groups")}
