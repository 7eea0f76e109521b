"""benchmarks/bench_decode_projection.py on the CPU: the prepared projections and the modules decode the same
tokens (float32), the variants alternate round by round, and the modules' runs really run without the prepared
layers."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_decode_projection.py"


def test_both_projections_give_the_same_tokens_in_alternating_rounds(bench, tmp_path, monkeypatch):
    seen = []
    original = bench.decode_static

    def watching(model, prompt, caches, *args, **kwargs):
        seen.append(caches[0].projections is not None)
        return original(model, prompt, caches, *args, **kwargs)

    monkeypatch.setattr(bench, "decode_static", watching)
    out = tmp_path / "projection.json"
    args = bench.parse_args(["--quick", "--device", "cpu", "--rounds", "2", "--out", str(out)])
    report = bench.run(args, lambda data: out.write_text(json.dumps(data)))
    assert seen == [True, False, False, True]
    assert [run["prepared"] for run in report["runs"]] == seen
    tokens = {tuple(run["tokens"]) for run in report["runs"]}
    assert len(tokens) == 1 and len(next(iter(tokens))) == args.steps + 5
    summary = report["eager"]
    prepared = [run["ms_per_token"] for run in report["runs"] if run["prepared"]]
    modules = [run["ms_per_token"] for run in report["runs"] if not run["prepared"]]
    assert summary["repeatable"] is True and summary["agreement"] == 1.0
    assert summary["ratio"] == pytest.approx(statistics.median(prepared) / statistics.median(modules))
    assert json.loads(out.read_text())["eager"] == summary


def test_bad_arguments_exit_2(bench):
    with pytest.raises(SystemExit) as done:
        bench.parse_args(["--quick", "--rounds", "0", "--out", "x.json"])
    assert done.value.code == 2
