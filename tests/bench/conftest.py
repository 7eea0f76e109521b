"""The benchmark script a test module names in its SCRIPT (a path under benchmarks/), loaded as a module; and its
quick run under Triton's interpreter in a fresh process."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

HAVE_TRITON = importlib.util.find_spec("triton") is not None


@pytest.fixture(scope="module")
def bench(request):
    path = request.module.SCRIPT
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def quick_interpreted(request, tmp_path):
    """The report (JSON) of the module's SCRIPT run with --quick --device cpu (and the arguments an indirect
    parametrization gives) under Triton's interpreter; skips
    where triton is not installed, shows the end of stderr where the run fails."""
    if not HAVE_TRITON:
        pytest.skip("triton not installed: its interpreter runs the kernels")
    out = tmp_path / "report.json"
    extra = list(getattr(request, "param", []))  # indirect parametrization: more arguments
    proc = subprocess.run([sys.executable, str(request.module.SCRIPT), "--quick", "--device", "cpu", "--out", str(out),
                           *extra],
                          capture_output=True, text=True, env=dict(os.environ, TRITON_INTERPRET="1"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())
