"""benchmarks/bench_packed.py on the CPU: ours on a packed row equals the per-document loop, and the
interleaved pairs give the ratio of their own timings' medians."""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("bench_packed", ROOT / "benchmarks" / "bench_packed.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_run_matches_the_loop_and_pairs_report_their_own_ratio():
    script = _script()
    args = argparse.Namespace(device="cpu", tokens=384, documents=4, heads=4, head_dim=8,
                              segment_lengths="32,64,128", dilation_rates="1,2,4", not_causal=False, repeats=2,
                              backends="auto,sdpa")
    result = script.run(args)
    for direction in ("fwd", "fwd+bwd"):
        cell = result["cells"][direction]
        for name in ("ours[auto]", "ours[sdpa]"):  # float32 on the packed row against the loop over documents
            assert cell["errors"][name] < 1e-6 and cell["errors_after_timing"][name] < 1e-6
        assert "interleaved" not in cell  # no FlashAttention-4 floor off the GPU
    pair = result["gqa"]["interleaved"]
    assert pair["of"] == "gqa / mha" and pair["rounds"] == 6
    ratio = pair["gqa"]["median"] / pair["mha"]["median"]
    assert pair["ratio"] == pytest.approx(ratio)
    assert pair["interval"][0] <= pair["ratio"] <= pair["interval"][1]
    assert result["gqa"]["gqa"]["kv_bytes"] * 4 == result["gqa"]["mha"]["kv_bytes"]


def test_a_pair_that_could_not_be_timed_is_reported_with_why():
    script = _script()
    assert script.pair_text({"error": "RuntimeError: out of memory"}) == "not timed: RuntimeError: out of memory"
    pair = {"of": "gqa / mha", "ratio": 0.912, "interval": [0.9, 0.93], "rounds": 10}
    assert script.pair_text(pair) == "gqa / mha: 0.912 [0.900, 0.930] over 10 rounds"
    pair["graph_regions"] = {"eager": 0, "captured": 0, "replayed": 40, "refused": 0}
    assert script.pair_text(pair) == "gqa / mha: 0.912 [0.900, 0.930] over 10 rounds"
    pair["graph_regions"] = {"eager": 96, "captured": 0, "replayed": 0, "refused": 0}  # told: it times Python
    assert script.pair_text(pair) == "gqa / mha: 0.912 [0.900, 0.930] over 10 rounds (96 region calls eager)"
