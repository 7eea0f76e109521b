"""atomic_write: content, no temporary file left, replaces an existing file, a failure keeps the old file."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

import hilbert_lab.io as hio
from hilbert_lab.io import atomic_write

class _OsWith:
    """The os module with some functions replaced, for one module's view of it."""

    def __init__(self, **replaced):
        self.__dict__.update(replaced)

    def __getattr__(self, name):
        return getattr(os, name)



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


# ---------------------------------------------------------------- permissions, whole lines, the lock, paths

def test_new_files_get_the_umask_permissions_and_replaced_files_keep_theirs(tmp_path):
    previous = os.umask(0o022)
    try:
        atomic_write(tmp_path / "new", "x")
        assert os.stat(tmp_path / "new").st_mode & 0o777 == 0o644  # not mkstemp's 0600
        os.chmod(tmp_path / "new", 0o640)
        atomic_write(tmp_path / "new", "y")
        assert os.stat(tmp_path / "new").st_mode & 0o777 == 0o640
    finally:
        os.umask(previous)


def test_append_line_writes_whole_lines_and_cuts_back_a_failed_write(tmp_path, monkeypatch):
    path = tmp_path / "log.jsonl"
    with open(path, "a") as handle:
        hio.append_line(handle, '{"a": 1}')
    real_write = os.write

    def half_then_full(descriptor, data):  # a disk that fills half way through the line
        if len(data) > 4:
            real_write(descriptor, bytes(data[:4]))
            raise OSError(28, "No space left on device")
        return real_write(descriptor, data)

    monkeypatch.setattr(hio, "os", _OsWith(write=half_then_full))  # only hilbert_lab.io sees the failing write
    with open(path, "a") as handle, pytest.raises(OSError, match="No space"):
        hio.append_line(handle, '{"b": 2222222}')
    monkeypatch.undo()
    assert path.read_text() == '{"a": 1}\n'  # no torn line


def test_exclusive_lock_refuses_a_second_holder_at_once(tmp_path):
    path = tmp_path / "lock"
    with hio.exclusive_lock(path, "the run folder"):
        with pytest.raises(hio.LockedError, match="the run folder is being written by another run"):
            with hio.exclusive_lock(path, "the run folder"):
                pass
    with hio.exclusive_lock(path, "the run folder"):  # released with the block
        pass


def _fifo(tmp_path) -> Path:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return fifo


def test_path_problem_names_each_kind_of_unusable_path(tmp_path):
    (tmp_path / "file").write_text("x")
    os.symlink(tmp_path / "missing", tmp_path / "dangling")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    cases = {
        str(_fifo(tmp_path)): "FIFO", "/dev/zero": "character device", str(tmp_path): "directory",
        str(tmp_path / "dangling"): "dangling symbolic link", str(tmp_path / "loop"): "symbolic link loop",
        str(tmp_path / ("x" * 300)): "too long", str(tmp_path / "file" / "x"): "not a directory",
        "": "empty", str(tmp_path / "absent"): "does not exist",
    }
    for path, words in cases.items():
        assert words in (hio.path_problem(path) or ""), (path, hio.path_problem(path))
    assert hio.path_problem(tmp_path / "file") is None
    assert hio.path_problem(tmp_path / "absent", must_exist=False) is None
    assert hio.path_problem(tmp_path, folder=True) is None
    assert "is a file" in hio.path_problem(tmp_path / "file", folder=True)


def test_read_bounded_refuses_fifos_devices_and_large_files_at_once(tmp_path):
    (tmp_path / "small").write_bytes(b"{}")
    assert hio.read_bounded(tmp_path / "small", "--config", 10) == b"{}"
    (tmp_path / "large").write_bytes(b" " * 11)
    for path, words in ((tmp_path / "large", "more than the 10"), (_fifo(tmp_path), "FIFO"),
                        ("/dev/zero", "character device"), (tmp_path, "directory")):
        with pytest.raises(ValueError, match=f"--config .*{words}"):
            hio.read_bounded(path, "--config", 10)
