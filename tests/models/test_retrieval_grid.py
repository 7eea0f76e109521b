"""benchmarks/train_retrieval_grid.py: chunked runs resume exactly, a time limit keeps finished runs, the
JSON pools the seeds; the attention cost counted from the plan."""
from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from hilbert_lab.models.cost import attention_cost, config_attention_cost
from hilbert_lab.models.evaluate import wilson_interval
from hilbert_lab.models.train import PRESETS, TrainConfig, read_log, train

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "train_retrieval_grid.py"


def _grid_module():
    spec = importlib.util.spec_from_file_location("train_retrieval_grid", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_attention_cost_against_a_brute_force_count():
    """pairs = what the dense mask of the pattern allows, summed over heads (longnet mode: a query is in a
    branch only through the heads of its offset)."""
    from hilbert_lab.attention.pattern import DilatedPattern

    segments, rates, n, heads, head_dim = [4, 16, 32], [1, 2, 4], 32, 4, 8
    cost = attention_cost(segments, rates, seq_len=n, num_heads=heads, head_dim=head_dim, depth=3)
    multiplicity = DilatedPattern.create(segments, rates, causal=True).multiplicity(n, heads)
    assert cost["pairs_per_layer"] == int(multiplicity.sum())
    assert cost["flops_per_token"] == pytest.approx(3 * 4 * head_dim * int(multiplicity.sum()) / n)
    dense = attention_cost([n], [1], seq_len=n, num_heads=heads, head_dim=head_dim, depth=3)
    assert dense["flops_per_token"] == pytest.approx(dense["dense_flops_per_token"])
    assert [b["keys_per_query"] for b in cost["branches"]] == [4, 8, 8]
    assert [b["offsets_covered"] for b in cost["branches"]] == [1, 2, 4]
    short = attention_cost([32], [8], seq_len=32, num_heads=4, head_dim=8)  # 4 heads cannot cover 8 offsets
    assert short["branches"][0]["offsets_covered"] == 4
    with pytest.raises(ValueError, match="seq_len"):
        attention_cost([4], [1], seq_len=0, num_heads=1, head_dim=8)


def test_grid_presets_share_the_model_and_meet_the_cost_claims():
    rows = ("gpu-32k", "gpu-32k-dil8", "gpu-32k-dil16", "gpu-32k-dil16-w1024", "gpu-32k-local")
    configs = {row: TrainConfig(**PRESETS[row]) for row in rows}
    shared = ("dim", "depth", "steps", "curriculum", "seq_len", "batch_size", "lr", "rotary_base")
    for name in shared:
        assert len({json.dumps(getattr(c, name)) for c in configs.values()}) == 1, name
    costs = {row: config_attention_cost(c) for row, c in configs.items()}
    dense = costs["gpu-32k"]["flops_per_token"]
    for row in ("gpu-32k-dil8", "gpu-32k-dil16", "gpu-32k-dil16-w1024"):
        assert costs[row]["flops_per_token"] <= dense / 8 and costs[row]["max_keys_per_query"] <= 4096
        assert all(b["offsets_covered"] == b["dilation_rate"] for b in costs[row]["branches"])
        assert costs[row]["branches"][-1]["spans_sequence"]
    assert not any(b["spans_sequence"] for b in costs["gpu-32k-local"]["branches"])
    for config in configs.values():
        assert config.final_eval_batches * config.batch_size >= 512


def test_chunked_grid_run_resumes_exactly(tmp_path):
    grid = _grid_module()
    config = grid.row_config("cpu-512-dil8", 3, small=True)
    uninterrupted = train(config, tmp_path / "straight")
    assert grid.run_one(config, tmp_path / "chunked", math.inf, {})  # checkpoint_every=2: two chunks
    chunked = read_log(tmp_path / "chunked")
    assert [(r["kind"], r["step"], r["loss"]) for r in chunked] == [
        (r["kind"], r["step"], r["loss"]) for r in uninterrupted.history]
    # a spent time limit starts nothing and reports the run as unfinished
    fresh = tmp_path / "late"
    assert not grid.run_one(config, fresh, 0.0, {})
    assert not (fresh / "checkpoint.pt").exists()


@pytest.mark.slow
def test_small_grid_cli_writes_pooled_rows_and_resumes(tmp_path):
    out = tmp_path / "grid.json"
    command = [sys.executable, str(SCRIPT), "--small", "--rows", "cpu-512-local", "--seeds", "0,1",
               "--out", str(out), "--runs-dir", str(tmp_path / "runs")]
    stopped = subprocess.run(command + ["--time-limit-s", "0"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert stopped.returncode == 0 and "run the same command to continue" in stopped.stdout
    assert json.loads(out.read_text())["runs"] == []
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["kind"] == "retrieval_grid" and len(report["runs"]) == 2
    for name, row in report["rows"].items():
        members = [r["final_eval"] for r in report["runs"] if r["row"] == name]
        correct, count = sum(e["correct"] for e in members), sum(e["count"] for e in members)
        assert row["pooled"]["count"] == count == 2 * 2 * 4  # seeds x final_eval_batches x batch
        assert (row["pooled"]["accuracy_low"], row["pooled"]["accuracy_high"]) == pytest.approx(wilson_interval(correct, count))
        assert sum(b["count"] for b in row["pooled_by_distance"]) == count
        assert row["attention"]["flops_per_token"] > 0
    bad = subprocess.run([sys.executable, str(SCRIPT), "--small", "--rows", "nope", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert bad.returncode == 2 and "--rows" in bad.stderr


@pytest.mark.slow
def test_concurrent_runs_match_the_sequential_ones(tmp_path):
    """--jobs 2 runs the seeds in child processes: the same loss curves as one after the other; the row's
    tokens/s is the probe timed alone."""
    base = [sys.executable, str(SCRIPT), "--small", "--rows", "cpu-512-local", "--seeds", "0,1"]
    runs = {}
    for jobs in (1, 2):
        out = tmp_path / f"grid{jobs}.json"
        extra = ["--jobs", "2", "--throughput-steps", "4"] if jobs == 2 else []
        done = subprocess.run(base + extra + ["--out", str(out), "--runs-dir", str(tmp_path / f"runs{jobs}")],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        report = json.loads(out.read_text())
        runs[jobs] = {r["seed"]: [(h["kind"], h["step"], h["loss"]) for h in r["history"]] for r in report["runs"]}
        assert report["reference"]["row"] == "cpu-512-dense"
    assert runs[1] == runs[2] and sorted(runs[2]) == [0, 1]
    row = report["rows"]["cpu-512-local"]
    assert row["tokens_per_s_source"] == "alone" and row["tokens_per_s"] == report["throughput"]["cpu-512-local"]["tokens_per_s"]
