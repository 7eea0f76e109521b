"""Committed result files hold no absolute path of the machine that made them (a venv's python, a temporary
folder, a home folder), and the writers of results record none."""
from __future__ import annotations

import json
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


GPU_DEVICE = re.compile(r"cuda|H100|H200")
RESULTS_DIR = RESULTS / "results"


def _environment_names_a_gpu(document) -> bool:
    """A device name of cuda / H100 / H200 in the file's environment: its 'environment' / 'env' block, or a
    'device' field at the top or in its 'config'."""
    if not isinstance(document, dict):
        return False
    blocks = [document.get("environment"), document.get("env"), document.get("device"),
              (document.get("config") or {}).get("device") if isinstance(document.get("config"), dict) else None]
    return any(block is not None and GPU_DEVICE.search(json.dumps(block)) for block in blocks)


def _documents(path: Path) -> list:
    text = path.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" \
        else [json.loads(text)]


def test_every_gpu_result_records_its_revision_or_is_listed_as_older_code():
    """bench_engine_h100.json, gpu_curves.json and train_gpu_h100_run/summary.json carried no revision and no
    'older code' label: a GPU result records its git revision, or provenance.UNRECORDED_REVISION lists it with
    why, and then it reads as older code."""
    from hilbert_lab.reports.provenance import UNRECORDED_REVISION, older_code, result_git

    gpu, missing = [], []
    for path in sorted(RESULTS_DIR.rglob("*.json")):
        name = str(path.relative_to(RESULTS_DIR))
        (document,) = _documents(path)
        if not _environment_names_a_gpu(document):
            continue
        gpu.append(name)
        if result_git(document) is None and name not in UNRECORDED_REVISION:
            missing.append(name)
    assert len(gpu) >= 30 and "gpu_curves.json" in gpu and "bench_engine_h100.json" in gpu
    assert missing == [], f"GPU results without a revision, not in provenance.UNRECORDED_REVISION: {missing}"
    for name, reason in UNRECORDED_REVISION.items():
        path = RESULTS_DIR / name
        assert path.is_file(), name  # the list names files that exist ...
        assert all(result_git(document) is None for document in _documents(path)), name  # ... and lack a revision
        assert "first committed in" in reason and len(reason) > 40, name
    assert older_code(None) == "measured with older code (rev unrecorded)"


def test_code_quoting_an_older_gpu_result_says_it_was_measured_with_older_code():
    """Docstrings quoted gpu_curves.json (no revision) and gpu_attention.json (rev 0ceb35e) as current: a quote
    in the package of a GPU result (a GPU named in the file) that older code made carries 'measured with older
    code (rev ...' nearby."""
    from hilbert_lab.reports.provenance import older_code, result_git

    package = Path(__file__).resolve().parents[2] / "hilbert_lab"
    quoted, unlabelled = set(), []
    for source in sorted(package.rglob("*.py")):
        text = source.read_text(encoding="utf-8")
        for match in re.finditer(r"reports/results/([\w/]+\.jsonl?)", text):
            path = RESULTS_DIR / match.group(1)
            if not path.is_file():
                continue
            (document, *_) = _documents(path)
            if not GPU_DEVICE.search(path.read_text(encoding="utf-8")):  # a GPU named anywhere in the file
                continue
            label = older_code(result_git(document))
            if not label:
                continue
            quoted.add(match.group(1))
            near = " ".join(text[match.start():match.end() + 200].replace("#", " ").split())
            if label.split(" + ")[0].rstrip(")") not in near:
                unlabelled.append(f"{source.relative_to(package)}: {match.group(1)} ({label})")
    assert {"gpu_curves.json", "gpu_attention.json"} <= quoted
    assert unlabelled == [], unlabelled
