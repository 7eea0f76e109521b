"""benchmarks/bench_decode_kernel.py on the CPU under Triton's interpreter: every tuning of the quick sweep runs
both paths of the decoding step and matches the float64 step; the key and value bytes are those of a brute-force
count of the rows each head sees; bad arguments exit 2."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_decode_kernel.py"


def _rows_seen(segment_lengths, dilation_rates, heads, position):
    """Key rows x heads one query at `position` reads, counted row by row."""
    from hilbert_lab.attention.pattern import DilatedPattern

    pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode="longnet", causal=True)
    total = 0
    for w, r, offsets in zip(segment_lengths, dilation_rates, pattern.head_offsets(heads)):
        start = position - position % w
        for offset in offsets:
            if offset >= 0 and (position - start) % r == offset:
                total += sum(1 for m in range(start, position + 1) if (m - start) % r == offset)
    return total


@pytest.mark.slow  # the interpreter in a fresh process (about 10 s)
def test_the_quick_sweep_runs_both_paths_equal_to_the_float64_step(bench, quick_interpreted):
    report = quick_interpreted
    config = report["config"]
    assert [t["tuning"] for t in report["tunings"]] == bench.tunings(quick=True)
    for entry in report["tunings"]:
        assert "error" not in entry, entry
        assert entry["out_error"] < 3e-3 and entry["lse_error"] < 1e-4, entry
        assert entry["us_per_layer"] > 0 and "x_limit" not in entry
    positions = [config["context"] - 1 - 3 * layer for layer in range(config["layers"])]
    rows = sum(_rows_seen(config["segment_lengths"], config["dilation_rates"], config["heads"], p) for p in positions)
    assert report["kv_bytes_per_layer"] == rows * config["head_dim"] * 2 * 2 / config["layers"]  # k and v, float16


@pytest.mark.parametrize("extra", [["--layers", "0"], ["--context", "8"], ["--dilation-rates", "1,2"],
                                   ["--dtype", "fp8"]])
def test_bad_arguments_exit_2(bench, extra):
    with pytest.raises(SystemExit) as done:
        bench.parse_args(["--quick", "--out", "x.json", *extra])
    assert done.value.code == 2
