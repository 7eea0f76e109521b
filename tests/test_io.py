"""atomic_write: content, no temporary file left, replaces an existing file, a failure keeps the old file."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

import hilbert_lab.io as hio
from hilbert_lab.io import atomic_write


def test_writes_text_and_bytes_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "out.json"
    atomic_write(path, "héllo\n")
    assert path.read_bytes() == "héllo\n".encode("utf-8")
    atomic_write(str(path), b"\x00\xffbytes")
    assert path.read_bytes() == b"\x00\xffbytes"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_replaces_by_rename_not_in_place(tmp_path):
    path = tmp_path / "state"
    atomic_write(path, "old")
    before = os.stat(path).st_ino
    atomic_write(path, "new")
    assert path.read_text() == "new"
    assert os.stat(path).st_ino != before  # a new file renamed over the old one, not rewritten in place


def test_failure_leaves_the_old_file_intact(tmp_path, monkeypatch):
    path = tmp_path / "state"
    atomic_write(path, "complete old content")

    def refuse(source, destination):
        raise OSError("rename refused")

    monkeypatch.setattr(hio.os, "replace", refuse)
    with pytest.raises(OSError, match="rename refused"):
        atomic_write(path, "new content that never lands")
    assert path.read_text() == "complete old content"
    assert [p.name for p in tmp_path.iterdir()] == ["state"]


def test_failure_while_writing_leaves_no_file(tmp_path, monkeypatch):
    path = tmp_path / "fresh"
    real_fsync = os.fsync

    def crash(descriptor):
        raise OSError("disk full")

    monkeypatch.setattr(hio.os, "fsync", crash)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, "x" * 1000)
    monkeypatch.setattr(hio.os, "fsync", real_fsync)
    assert list(tmp_path.iterdir()) == []


def test_bad_data_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="data must be str or bytes"):
        atomic_write(tmp_path / "x", {"not": "text"})
    assert list(tmp_path.iterdir()) == []


def test_io_imports_nothing_from_hilbert_lab():
    tree = ast.parse(Path(hio.__file__).read_text())
    modules = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    modules += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert not [m for m in modules if m.startswith("hilbert_lab")]
