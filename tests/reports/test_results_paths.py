"""Committed result files hold no absolute path of the machine that made them (a venv's python, a temporary
folder, a home folder), and the writers of results record none."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from hilbert_lab.io import strip_paths

RESULTS = Path(__file__).resolve().parents[2] / "reports"  # results/ and the committed report runs
# a path from the file-system root with at least two parts (/tmp/x, /root/out/y.json, /work/main/.venv/...),
# not a part of a relative path, a URL or a ratio such as tokens/s
ABSOLUTE = re.compile(r"(?<![\w.:/~-])(?:~|/[\w.@+-]+)(?:/[\w.@+-]+)+")
MACHINE_ROOTS = ("/tmp/", "/root/", "/home/", "/work/", "/opt/", "/Users/", "/var/", "/mnt/", "/scratch/")


def _result_files() -> list[Path]:
    return sorted(path for path in RESULTS.rglob("*") if path.is_file() and path.suffix in (".json", ".jsonl"))


def test_results_folder_is_scanned():
    assert len(_result_files()) >= 20


@pytest.mark.parametrize("path", _result_files(), ids=lambda path: str(path.relative_to(RESULTS)))
def test_committed_results_hold_no_absolute_path(path):
    text = path.read_text(encoding="utf-8")
    found = sorted(set(ABSOLUTE.findall(text)))
    assert not found, f"{path.name} holds absolute paths: {found[:5]}"
    assert not any(root in text for root in MACHINE_ROOTS), path.name


def test_strip_paths_keeps_the_file_name_and_relative_paths():
    command = ("/work/main/.venv/bin/python benchmarks/train_gpu.py --run-dir /tmp/ft128k --out /root/out/r.json "
               "--init-from scratch/ckpt/a.pt --url https://example.org/a/b ~/runs/x.json 12 tokens/s")
    assert strip_paths(command) == ("python benchmarks/train_gpu.py --run-dir ft128k --out r.json "
                                    "--init-from scratch/ckpt/a.pt --url https://example.org/a/b x.json 12 tokens/s")


def test_the_environment_block_of_results_names_the_interpreter_without_its_folder():
    from hilbert_lab.bench.env import collect_environment

    env = collect_environment("cpu")
    assert env["executable"] == Path(sys.executable).name and "/" not in env["executable"]
    assert not ABSOLUTE.search(str(env))
