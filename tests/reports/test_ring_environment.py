"""The ring report reads the environment of bench_ring.py files: the kit's block (bench.env) as written
now, and the older layout (block nested under "collected") of the committed H200 runs."""
from __future__ import annotations

import json
from pathlib import Path

from hilbert_lab.bench.env import collect_environment
from hilbert_lab.reports.ring import ring_run

REPO = Path(__file__).resolve().parents[2]


def test_ring_report_reads_the_kit_environment_block(tmp_path):
    block = collect_environment("cpu")
    block = {**block, "device": {**block["device"], "name": "Test GPU", "driver": "1.2", "cuda": "12.9",
                                 "cudnn": "91000", "nccl": "2.27.3"}}
    data = {"command": "bench_ring.py --smoke", "environment": {**block, "world_size": 2, "backend": "gloo"},
            "config": {"heads": 2}, "throughput": {"longnet": [{"seq_len": 1024, "seconds": 0.5,
                                                                  "tokens_per_s_per_gpu": 1024.0}]}}
    path = tmp_path / "ring_2.json"
    path.write_text(json.dumps(data))
    metrics, env = ring_run([path])
    assert env["device"]["device"] == "Test GPU" and env["device"]["driver"] == "1.2"
    assert env["device"]["device_count"] == 2 and env["device"]["cudnn"] == "91000"
    assert env["packages"]["torch"] == block["packages"]["torch"] and env["packages"]["nccl"] == "2.27.3"
    assert env["git"] == block["git"]
    assert metrics["tables"]["throughput"]["rows"][0]["tokens_per_s_total"] == 2048.0
