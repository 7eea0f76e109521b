"""benchmarks/train_gpu.py: the length probe's pattern, the probe itself on a CPU, --init-from checks, and a mesh run."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "train_gpu.py"


def _script():
    spec = importlib.util.spec_from_file_location("train_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_spanning_pattern_extends_dil8_at_4096_keys_per_query():
    pattern = _script().spanning_pattern
    assert pattern(32768) == ([2048, 8192, 32768], [1, 4, 8])
    assert pattern(131072) == ([2048, 8192, 32768, 131072], [1, 4, 8, 32])
    segments, rates = pattern(3_000_000)
    assert segments[-1] >= 3_000_000 > segments[-2]
    assert all(w // r == 4096 for w, r in zip(segments[2:], rates[2:]))


@pytest.mark.slow  # a script in a fresh interpreter
def test_probe_records_every_length_and_stops_at_the_first_failure(tmp_path):
    out = tmp_path / "probe.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--small", "--skip-throughput", "--skip-train", "--quiet",
                           "--probe-lengths", "256", "512", "0", "1024", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["longest_trainable"]
    assert [r["seq_len"] for r in rows] == [256, 512, 0]  # 0 fails (a ValueError), 1024 is never tried
    assert all(r["tokens_per_s"] > 0 for r in rows[:2]) and rows[2]["error"].startswith("ValueError")


@pytest.mark.slow  # a script in a fresh interpreter
def test_init_from_must_name_a_file(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--small", "--skip-throughput", "--quiet",
                           "--init-from", str(tmp_path / "none.pt"), "--out", str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=600)  # wide: only a hang reaches it
    assert done.returncode == 2 and "--init-from must name an existing checkpoint file" in done.stderr


@pytest.mark.slow  # two gloo ranks under torchrun on a 2-core machine
def test_the_script_trains_on_a_mesh_under_torchrun(tmp_path):
    """--data-parallel 2 under torchrun: the run trains on the mesh and rank 0 writes the report, with tokens/s
    per GPU beside the global figure."""
    out = tmp_path / "mesh.json"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(SCRIPT), "--small", "--data-parallel", "2", "--steps", "2", "--throughput-steps", "2",
                           "--window", "1", "--quiet", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["world_size"] == 2 and report["config"]["data_parallel"] == 2
    for row in report["throughput"]:
        assert row["tokens_per_s_per_gpu"] == pytest.approx(row["tokens_per_s"] / 2)
    assert report["training"]["final_eval"]["count"] > 0
