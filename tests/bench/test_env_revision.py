"""The revision a result records: git where the checkout has it, else the one named in HILBERT_LAB_REVISION."""
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


def test_a_git_checkout_records_its_own_head_whatever_the_variable_says(monkeypatch):
    if not (REPO / ".git").exists():
        import pytest

        pytest.skip("this checkout has no .git")
    monkeypatch.setenv(REVISION_VARIABLE, "0123abc")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert git_revision(str(REPO))["commit"] == head
