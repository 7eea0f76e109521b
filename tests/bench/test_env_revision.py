"""The revision a result records: the one HILBERT_LAB_REVISION names (a copy on another machine), else git's."""
from __future__ import annotations

import subprocess
from pathlib import Path

from hilbert_lab.bench.env import REVISION_VARIABLE, git_revision

REPO = Path(__file__).resolve().parents[2]


def test_a_copy_without_git_records_the_revision_it_names(tmp_path, monkeypatch):
    monkeypatch.setenv(REVISION_VARIABLE, "0123abc+dirty")
    assert git_revision(str(tmp_path)) == {"commit": "0123abc", "dirty": True}
    monkeypatch.setenv(REVISION_VARIABLE, "0123abc")
    assert git_revision(str(tmp_path)) == {"commit": "0123abc", "dirty": False}
    monkeypatch.delenv(REVISION_VARIABLE)
    assert git_revision(str(tmp_path)) == {"commit": None, "dirty": None}


def test_a_git_checkout_records_its_head_unless_the_variable_names_another(monkeypatch):
    if not (REPO / ".git").exists():
        import pytest

        pytest.skip("this checkout has no .git")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    monkeypatch.delenv(REVISION_VARIABLE, raising=False)
    assert git_revision(str(REPO))["commit"] == head
    monkeypatch.setenv(REVISION_VARIABLE, "0123abc")
    assert git_revision(str(REPO)) == {"commit": "0123abc", "dirty": False}


def test_a_saved_run_holds_the_environment_the_command_and_the_fields(tmp_path, monkeypatch):
    import json
    import sys

    from hilbert_lab.bench.env import collect_environment, save_run

    monkeypatch.setenv(REVISION_VARIABLE, "0123abc")
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "bench_x.py"), "--out", str(tmp_path / "r.json")])
    path = save_run(tmp_path / "new" / "r.json", "cpu", rows=[{"ms": 1.5}])
    record = json.loads(path.read_text())
    assert path == tmp_path / "new" / "r.json"
    assert record["rows"] == [{"ms": 1.5}]
    assert record["command"] == "bench_x.py --out r.json"  # no machine folders
    assert record["environment"] == json.loads(json.dumps(collect_environment("cpu")))
