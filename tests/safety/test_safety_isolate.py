"""run_isolated: statuses for every way a case can end, and no orphaned case when the runner dies."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from hilbert_lab.bench import SafeBenchmarkRunner, read_results
from hilbert_lab.bench.cases import CASE_TARGET
from hilbert_lab.safety import run_isolated

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("behavior, status, text", [
    ("ok", "ok", ""), ("raise", "error", "RuntimeError"), ("oom", "oom", "MemoryError"),
    ("signal", "signal", "SIGKILL"), ("exit", "crash", "code 3"),
])
def test_each_ending_has_its_status(behavior, status, text):
    outcome = run_isolated(CASE_TARGET, {"kind": "selftest", "behavior": behavior, "value": 7}, timeout_s=120)
    assert outcome.status == status and text in outcome.error
    assert (outcome.result.get("value") == 7) == (status == "ok")


def test_timeout_kills_the_case_quickly():
    start = time.perf_counter()
    outcome = run_isolated(CASE_TARGET, {"kind": "selftest", "behavior": "sleep", "seconds": 60}, timeout_s=2)
    assert outcome.status == "timeout" and time.perf_counter() - start < 30


def test_bad_target_and_timeout_are_rejected():
    with pytest.raises(ValueError, match="target"):
        run_isolated("no_colon", {}, timeout_s=1)
    with pytest.raises(ValueError, match="timeout_s"):
        run_isolated(CASE_TARGET, {}, timeout_s=0)


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/status") as handle:
            return next(line.split()[1] for line in handle if line.startswith("State:"))
    except (FileNotFoundError, ProcessLookupError):
        return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_case_dies_with_a_killed_runner(tmp_path):
    (tmp_path / "pid_case.py").write_text(
        "import os, time\n"
        "def run(params):\n"
        "    open(params['path'], 'w').write(str(os.getpid()))\n"
        "    time.sleep(120)\n"
        "    return {}\n")
    pid_file = tmp_path / "pid"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]))
    parent = subprocess.Popen([sys.executable, "-c", "from hilbert_lab.safety import run_isolated; "
                               f"run_isolated('pid_case:run', {{'path': {str(pid_file)!r}}}, timeout_s=300)"], env=env)
    deadline = time.time() + 120
    while time.time() < deadline and not (pid_file.exists() and pid_file.read_text()):
        time.sleep(0.1)
    child = int(pid_file.read_text())
    assert _state(child) not in (None, "Z")
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    deadline = time.time() + 20
    while time.time() < deadline and _state(child) not in (None, "Z"):
        time.sleep(0.1)
    assert _state(child) in (None, "Z"), "the case outlived its runner"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the record of a CUDA case on a machine without CUDA")
def test_cuda_case_without_cuda_is_recorded_as_refused(tmp_path):
    path = tmp_path / "r.jsonl"
    case = {"kind": "attention", "seq_len": 256, "segment_lengths": [64], "dilation_rates": [1], "device": "cuda"}
    SafeBenchmarkRunner(str(path), progress=False).run([case])
    (record,) = read_results(str(path))[0]
    assert record["status"] == "refused" and "not available" in record["error"]
