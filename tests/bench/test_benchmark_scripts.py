"""Every script in benchmarks/ answers --help with exit 0 on a CPU-only machine, run as documented
(`python benchmarks/NAME.py`, no PYTHONPATH), and puts its own checkout first on sys.path.

One subprocess runs every script (torch is imported once): each gets a fresh sys.path and argv, and
a script that cannot be imported without CUDA is reported as a skip with its reason.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(path.name for path in (ROOT / "benchmarks").glob("*.py"))

DRIVER = r'''
import contextlib, io, json, runpy, sys, traceback
root, scripts = sys.argv[1], sys.argv[2:]
original = list(sys.path)
gpu_only = ("triton", "flash_attn", "xformers", "pynvml", "Torch not compiled with CUDA", "no CUDA")
results = {}
for name in scripts:
    sys.path[:] = original
    sys.argv = [f"{root}/benchmarks/{name}", "--help"]
    out, err = io.StringIO(), io.StringIO()
    code, reason = 0, ""
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException as error:
        code, reason = 1, "".join(traceback.format_exception_only(type(error), error)).strip()
        if any(word in reason for word in gpu_only):
            code = "skip"
    results[name] = {"code": code, "reason": reason, "stdout": out.getvalue()[:2000],
                     "stderr": err.getvalue()[-2000:], "root_on_path": root in sys.path}
print(json.dumps(results))
'''


@pytest.fixture(scope="module")
def help_results(tmp_path_factory) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU even where a GPU exists
    done = subprocess.run([sys.executable, "-c", DRIVER, str(ROOT), *SCRIPTS], capture_output=True, text=True,
                          cwd=tmp_path_factory.mktemp("help"), env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_script_is_listed():
    assert "bench_engine.py" in SCRIPTS and len(SCRIPTS) >= 5


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_help_exits_zero(help_results, script):
    result = help_results[script]
    if result["code"] == "skip":
        pytest.skip(f"{script} needs CUDA to import: {result['reason']}")
    assert result["code"] == 0, f"{script} --help: {result['reason']}\n{result['stderr']}"
    assert "usage:" in result["stdout"], result["stdout"]
    assert result["root_on_path"], f"{script} does not put {ROOT} on sys.path (it must run without PYTHONPATH)"
