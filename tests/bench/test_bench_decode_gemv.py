"""benchmarks/bench_decode_gemv.py on the CPU under Triton's interpreter: every variant of the quick sweep runs at
every weight of a layer and the head and matches the float64 product, and where a decoding step fuses more into
the weight's GEMV (the folded norm, rotary pairs, GELU, residual) the fused variants match float64 with that work;
the summary reads the rows; bad arguments exit 2."""
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
@pytest.mark.parametrize("quick_interpreted", [[], ["--rows", "3"]], indirect=True, ids=["one row", "3 rows"])
def test_the_quick_sweep_runs_every_variant_at_every_weight(bench, quick_interpreted):
    """One row, and 3 rows at their own positions (each its own programs, or in one tensor-core tile)."""
    report = quick_interpreted
    rows = report["config"]["rows"]
    args = bench.parse_args(["--quick", "--out", "unused.json"])
    shapes = bench.weights_of(args)
    assert list(report["weights"]) == list(shapes) == ["qkv", "out", "fc1", "fc2", "head"]
    for name, entry in report["weights"].items():
        assert (entry["n"], entry["k"], entry["bias"]) == shapes[name]
        plain = ["cublas", *bench.tunings(True, rows)]
        fused = [] if not bench.STEP_PARTS[name] else ["fused"] + [
            f"fused_{tuning}" for tuning, options in bench.tunings(True, rows).items() if tuning != "default"
            and ("rotation" not in bench.STEP_PARTS[name] or options["block_n"] == 2 or options["block_n"] >= 16)]
        assert [row["variant"] for row in entry["variants"]] == plain + fused
        assert [row["fused"] for row in entry["variants"]] == [False] * len(plain) + [True] * len(fused)
        for row in entry["variants"]:  # float16 outputs: one rounding (fused: x, the folded weight, the output)
            assert row["max_error"] < (4e-3 if row["fused"] else 2e-3) and row["us"] > 0, (name, row)
        times = {row["variant"]: row["us"] for row in entry["variants"]}
        assert entry["summary"]["fastest_us"] == min(times[variant] for variant in plain)
        assert entry["summary"]["cublas_over_default"] == pytest.approx(times["cublas"] / times["default"])
        if fused:
            assert entry["summary"]["fused_fastest_us"] == min(times[variant] for variant in fused)
            assert entry["summary"]["fused_over_default"] == pytest.approx(times["fused"] / times["default"])
    assert [name for name, parts in bench.STEP_PARTS.items() if parts] == ["qkv", "out", "fc1", "fc2"]


def test_the_sweep_keeps_each_program_within_8192_values(bench):
    for rows, count in ((1, 52), (8, 39)):
        grid = bench.tunings(False, rows)
        assert grid["default"] == {} and len(grid) == count
        assert all(t["block_n"] * t["block_k"] <= 8192 for name, t in grid.items() if name != "default")


@pytest.mark.slow  # the interpreter in a fresh process
@pytest.mark.parametrize("quick_interpreted", [["--weights", "out,head", "--fused-only"]], indirect=True,
                         ids=["two weights, fused only"])
def test_a_run_of_some_weights_with_the_fused_grid_only(bench, quick_interpreted):
    """--weights keeps the named weights in the sweep's order; --fused-only cuts a fused weight's plain variants to
    cuBLAS and the default, and leaves a weight the step does not fuse its plain grid."""
    weights = quick_interpreted["weights"]
    assert list(weights) == ["out", "head"]
    grid = [name for name in bench.tunings(True, 1) if name != "default"]
    assert [row["variant"] for row in weights["out"]["variants"]] == \
        ["cublas", "default", "fused"] + [f"fused_{name}" for name in grid]
    assert [row["variant"] for row in weights["head"]["variants"]] == ["cublas", "default"] + grid
    for entry in weights.values():
        assert all(row["max_error"] < 4e-3 for row in entry["variants"])


@pytest.mark.parametrize("extra", [["--weights", "qkv,nope"], ["--weights", ","],
                                   ["--layers", "0"], ["--dim", "-1"], ["--dtype", "fp8"], ["--heads", "3"],
                                   ["--heads", "32"], ["--rows", "0"], ["--rows", "9"]])
def test_bad_arguments_exit_2(bench, extra):
    with pytest.raises(SystemExit) as done:
        bench.parse_args(["--quick", "--out", "x.json", *extra])
    assert done.value.code == 2
