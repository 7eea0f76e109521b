"""Shared pytest fixtures: seeded RNG and torch defaults, the headless browser; how the suite runs in parallel.

`make test` and `make test-all` run the suite on two pytest-xdist workers (`-n 2 --dist loadgroup
--no-loadscope-reorder`):
- each worker runs torch on one thread (two workers already fill two cores; more threads only contend),
  and its subprocesses inherit OMP_NUM_THREADS=1;
- tests marked slow or browser are collected first, so that the run ends on short tests, not on one
  long test that started last;
- the tests of a module that share a module-scoped fixture of that module run on one worker (an
  xdist_group per module), so the fixture is built once, and so do the modules that compile the numba kernels;
- multi-process tests (gloo rings) fork their ranks from a fork server that has imported torch and the
  library once per worker, instead of spawning interpreters that import torch anew (seconds of CPU each).
Tests that run in parallel keep their files under pytest's tmp_path (screenshots: one file per test in
test-artifacts/); servers take free ports; gloo worlds meet through a file in tmp_path.
"""
from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import torch


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _seed_torch():
    torch.manual_seed(0)
    yield


@pytest.fixture
def single_thread():
    """torch on one thread for the test (tiny ops: a shared 2-core machine wakes idle OpenMP workers slowly)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _node_ids_take_groups() -> bool:
    """Whether pytest-xdist can add a test's xdist_group to its node id (it writes `item._nodeid`, which the
    node id is read from up to pytest 9.1; pytest 9.2 reads it from elsewhere and the groups are lost)."""
    from _pytest.nodes import Node

    return "_nodeid" in Node.nodeid.fget.__code__.co_names


def pytest_report_header(config):
    lines = [f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}"]
    if config.getoption("dist", "no") == "loadgroup" and not _node_ids_take_groups():
        lines.append(f"NOTE: under pytest {pytest.__version__} pytest-xdist cannot keep a group of tests on one worker: "
                     f"modules that share a fixture build it on every worker (same results, slower; the dev extra "
                     f"pins a pytest that keeps them)")
    return lines


# What every forked rank needs; imported once in the fork server.
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "hilbert_lab.attention.engine", "hilbert_lab.distributed.ring",
                      "hilbert_lab.models"]


def pytest_addoption(parser):
    parser.addoption("--without", default="", metavar="PACKAGES",
                     help="comma-separated top-level packages this run treats as not installed (flash_attn: the GPU "
                          "suite as a machine without FlashAttention-4 runs it; subprocesses still see them)")


def pytest_configure(config):
    for name in filter(None, (part.strip() for part in config.getoption("--without").split(","))):
        if "." in name or not name.isidentifier():
            raise pytest.UsageError(f"--without takes top-level package names separated by commas, got {name!r}")
        sys.modules[name] = None  # importing it, or finding a module in it, now fails as for a missing package
    if not config.pluginmanager.hasplugin("timeout"):  # a GPU machine's python may lack pytest-timeout
        config.addinivalue_line("markers", "timeout(seconds): a time limit (pytest-timeout; not installed here)")
    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
        os.environ.setdefault("OMP_NUM_THREADS", "1")


# Modules that compile many specialisations of the numba kernels (a dtype, a layout, the parallel path: seconds
# each in a fresh checkout): one worker compiles them and caches them on disk, instead of two compiling the same.
JIT_MODULES = ("tests/curves/test_codec.py", "tests/curves/test_gilbert.py", "tests/kernels/test_numba_curves.py")


def _module_fixture_group(item) -> Optional[str]:
    """The group of tests that should share one worker: the numba-compiling modules, or the module's name when
    the test uses a module- (or wider-) scoped fixture defined in its own module."""
    if item.nodeid.split("::")[0] in JIT_MODULES:
        return "numba-kernels"
    info = getattr(item, "_fixtureinfo", None)
    module = getattr(item, "module", None)
    if info is None or module is None:
        return None
    for definitions in info.name2fixturedefs.values():
        definition = definitions[-1]
        if definition.scope != "function" and getattr(definition.func, "__module__", None) == module.__name__:
            return module.__name__
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    grouped = config.pluginmanager.hasplugin("xdist")
    groups = {item.nodeid: _module_fixture_group(item) for item in items}
    for item in items:  # hypothesis draws its examples (make fuzz: many, new each run)
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.property)
    if grouped:
        for item in items:
            if groups[item.nodeid]:
                item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))

    def long_first(item) -> int:
        """Long work first: slow and browser tests outside groups, and the numba group (the longest stretch one
        worker must run alone: started first, the other worker takes everything else beside it)."""
        long = item.get_closest_marker("slow") or item.get_closest_marker("browser")
        return 0 if (long and not groups[item.nodeid]) or groups[item.nodeid] == "numba-kernels" else 1

    items.sort(key=long_first)  # stable: the collection order otherwise


@pytest.fixture(scope="session")
def run_interpreted():
    """run(script, *args, timeout=600) -> the JSON objects (lines starting with "{") that `script` prints when run
    with `args` in a fresh process under Triton's interpreter (TRITON_INTERPRET=1, CPU), the checkout on its path;
    a failure shows the end of its stderr."""

    def run(script: Path, *args: str, timeout: float = 600) -> list[dict]:
        env = dict(os.environ, TRITON_INTERPRET="1",
                   PYTHONPATH=str(Path(__file__).resolve().parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, env=env,
                              timeout=timeout)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]

    return run


CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def chromium_path() -> Optional[str]:
    """Debian's chromium on PATH or in /usr/bin, or None."""
    return shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


def browser_unavailable_reason() -> Optional[str]:
    """Why the headless browser cannot run here (no chromium, no playwright), or None when it can."""
    if chromium_path() is None:
        return "Debian's chromium is not installed (make browser installs it)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package drives chromium and is not installed"
    return None


@pytest.fixture
def browser():
    """Headless Debian chromium driven by playwright; skips with the reason when the host has no chromium
    or no playwright."""
    reason = browser_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        try:
            yield instance
        finally:
            instance.close()
