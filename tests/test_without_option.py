"""`pytest --without=PACKAGES` (tests/conftest.py; `make test-gpu WITHOUT=flash_attn`): the run treats the named
packages as not installed, so the executors that need them report themselves unavailable and `auto` picks among the
others, as on a machine without them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
PROBE = '''
import importlib.util

import pytest


def test_probe():
    with pytest.raises(ImportError):
        import fakepkg  # noqa: F401
    with pytest.raises(ImportError):  # what the executors' availability check asks
        importlib.util.find_spec("fakepkg.sub")
'''


def _run(tmp_path: Path, *options: str) -> subprocess.CompletedProcess:
    (tmp_path / "fakepkg").mkdir(exist_ok=True)
    (tmp_path / "fakepkg" / "__init__.py").write_text("")
    (tmp_path / "fakepkg" / "sub.py").write_text("")
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(TESTS), str(TESTS.parent)]))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-p", "conftest", "--rootdir", str(tmp_path), *options, str(tmp_path / "test_probe.py")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


@pytest.mark.slow  # three pytest processes, each importing torch
def test_a_package_named_by_without_cannot_be_imported_or_found(tmp_path):
    hidden, shown = _run(tmp_path, "--without=fakepkg"), _run(tmp_path)
    assert hidden.returncode == 0, hidden.stdout[-2000:] + hidden.stderr[-2000:]
    assert shown.returncode == 1 and "DID NOT RAISE" in shown.stdout, shown.stdout[-2000:]  # found when not hidden


@pytest.mark.slow
def test_without_refuses_a_dotted_name(tmp_path):
    result = _run(tmp_path, "--without=fakepkg.sub")
    assert result.returncode == 4 and "--without takes top-level package names" in result.stderr, result.stderr
