"""benchmarks/bench_decode_gemv.py on the CPU under Triton's interpreter: every variant of the quick sweep runs at
every weight of a layer and the head and matches the float64 product; the summary reads the rows; bad arguments
exit 2."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_decode_gemv.py"


@pytest.mark.slow  # the interpreter in a fresh process (about 12 s)
def test_the_quick_sweep_runs_every_variant_at_every_weight(bench, quick_interpreted):
    report = quick_interpreted
    args = bench.parse_args(["--quick", "--out", "unused.json"])
    shapes = bench.weights_of(args)
    assert list(report["weights"]) == list(shapes) == ["qkv", "out", "fc1", "fc2", "head"]
    for name, entry in report["weights"].items():
        assert (entry["n"], entry["k"], entry["bias"]) == shapes[name]
        assert [row["variant"] for row in entry["variants"]] == ["cublas", *bench.tunings(quick=True)]
        for row in entry["variants"]:
            assert row["max_error"] < 2e-3 and row["us"] > 0, (name, row)  # float16 outputs: one rounding
        times = {row["variant"]: row["us"] for row in entry["variants"]}
        assert entry["summary"]["fastest_us"] == min(times.values())
        assert entry["summary"]["cublas_over_default"] == pytest.approx(times["cublas"] / times["default"])


def test_the_sweep_keeps_each_program_within_8192_values(bench):
    grid = bench.tunings(quick=False)
    assert grid["default"] == {} and len(grid) == 52
    assert all(t["block_n"] * t["block_k"] <= 8192 for name, t in grid.items() if name != "default")


@pytest.mark.parametrize("extra", [["--layers", "0"], ["--dim", "-1"], ["--dtype", "fp8"]])
def test_bad_arguments_exit_2(bench, extra):
    with pytest.raises(SystemExit) as done:
        bench.parse_args(["--quick", "--out", "x.json", *extra])
    assert done.value.code == 2
