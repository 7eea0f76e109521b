"""run_isolated: statuses for every way a case can end, and no orphaned case when the runner dies."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from hilbert_lab.bench import SafeBenchmarkRunner, read_results
from hilbert_lab.bench.cases import CASE_TARGET
from hilbert_lab.bench.isolate import clean_stale_case_dirs, run_isolated

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("python", [None, sys.executable], ids=["forked", "spawned"])
@pytest.mark.parametrize("behavior, status, text", [
    ("ok", "ok", ""), ("raise", "error", "RuntimeError"), ("oom", "oom", "MemoryError"),
    ("signal", "signal", "SIGKILL"), ("exit", "crash", "result: selftest: leaving with code 3"),
])
def test_each_ending_has_its_status(behavior, status, text, python):
    outcome = run_isolated(CASE_TARGET, {"kind": "selftest", "behavior": behavior, "value": 7}, timeout_s=120,
                           python=python)
    assert outcome.status == status and text in outcome.error
    assert (outcome.result.get("value") == 7) == (status == "ok")


def _process_case_module(folder) -> None:
    (folder / "process_case.py").write_text(
        "import os, sys\n"
        "def run(params):\n"
        "    import torch\n"
        "    return {'pid': os.getpid(), 'parent': os.getppid(), 'session': os.getsid(0), 'cwd': os.getcwd(),\n"
        "            'threads': torch.get_num_threads(), 'env': {k: os.environ.get(k) for k in params['names']},\n"
        "            'preloaded': 'json.tool' in sys.modules}\n")


@pytest.mark.slow  # a fork server, a timed-out case and a spawned interpreter: 12 s here
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="cases are forked on Linux only")
def test_forked_cases_are_fresh_processes_with_their_environment(tmp_path, monkeypatch):
    _process_case_module(tmp_path)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), REPO]))
    monkeypatch.setenv("HILBERT_LAB_SEEN_BY_CASE", "yes")
    monkeypatch.chdir(tmp_path)
    names = ["OMP_NUM_THREADS", "MALLOC_MMAP_THRESHOLD_", "HILBERT_LAB_SEEN_BY_CASE"]
    env = {"OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    runs = [run_isolated("process_case:run", {"names": names}, timeout_s=120, env=env, preload=["json.tool"])
            for _ in range(2)]
    assert all(run.ok for run in runs), [run.error for run in runs]
    first, second = (run.result for run in runs)
    # two processes, both children of one server (not of this runner), each in a session of its own
    assert first["pid"] != second["pid"] and first["parent"] == second["parent"] != os.getpid()
    assert first["session"] == first["pid"] and second["session"] == second["pid"]
    for result in (first, second):
        assert result["env"] == {"OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536",
                                 "HILBERT_LAB_SEEN_BY_CASE": "yes"}
        assert result["threads"] == 1 and result["cwd"] == str(tmp_path) and result["preloaded"]
    # a timed-out case is killed and the server serves the next one
    slow = run_isolated(CASE_TARGET, {"kind": "selftest", "behavior": "sleep", "seconds": 60}, timeout_s=2)
    after = run_isolated("process_case:run", {"names": []}, timeout_s=120)
    assert slow.status == "timeout" and after.ok and after.result["parent"] == first["parent"]
    # a variable only a new interpreter reads: the case is spawned by this runner instead
    spawned = run_isolated("process_case:run", {"names": ["MALLOC_ARENA_MAX"]}, timeout_s=120,
                           env={"MALLOC_ARENA_MAX": "1"})
    assert spawned.ok and spawned.result["parent"] == os.getpid()
    assert spawned.result["env"] == {"MALLOC_ARENA_MAX": "1"}


def test_child_imports_the_package_the_parent_imported(tmp_path):
    # A script that puts a checkout on sys.path (as benchmarks/*.py do) and runs from another folder:
    # the child imports hilbert_lab from that checkout, not from an installed copy or not at all.
    checkout = tmp_path / "checkout"
    shutil.copytree(os.path.join(REPO, "hilbert_lab"), checkout / "hilbert_lab",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (checkout / "where_case.py").write_text(
        "import hilbert_lab\ndef run(params):\n    return {'file': hilbert_lab.__file__}\n")
    script = ("import sys, json; sys.path.insert(0, sys.argv[1])\n"
              "from hilbert_lab.bench.isolate import run_isolated\n"
              "o = run_isolated('where_case:run', {}, timeout_s=120)\n"
              "print(json.dumps([o.status, o.result.get('file'), o.error]))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", script, str(checkout)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    status, file, error = json.loads(done.stdout.strip().splitlines()[-1])
    assert (status, file) == ("ok", str(checkout / "hilbert_lab" / "__init__.py")), error


def test_timeout_kills_the_case_quickly():
    start = time.perf_counter()
    outcome = run_isolated(CASE_TARGET, {"kind": "selftest", "behavior": "sleep", "seconds": 60}, timeout_s=2)
    assert outcome.status == "timeout" and time.perf_counter() - start < 60  # killed, not waited for


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
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), REPO]), TMPDIR=str(temp))
    parent = subprocess.Popen([sys.executable, "-c", "from hilbert_lab.bench.isolate import run_isolated; "
                               f"run_isolated('pid_case:run', {{'path': {str(pid_file)!r}}}, timeout_s=300)"], env=env)
    while not (pid_file.exists() and pid_file.read_text()):  # progress, not a clock (pytest's timeout bounds it)
        assert parent.poll() is None, f"the runner exited ({parent.returncode}) before its case started"
        time.sleep(0.1)
    child = int(pid_file.read_text())
    assert _state(child) not in (None, "Z")
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=300)  # SIGKILL: at once; the limits here are wide, only a hang reaches them
    deadline = time.time() + 300
    while time.time() < deadline and _state(child) not in (None, "Z"):
        time.sleep(0.1)
    assert _state(child) in (None, "Z"), "the case outlived its runner"
    # its case folder is left behind, named by the runner's pid; the next run removes it
    (left,) = [p for p in temp.iterdir() if p.name.startswith(f"hilbert_lab_case_{parent.pid}_")]
    assert clean_stale_case_dirs(tmpdir=str(temp)) == [str(left)] and not left.exists()


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_only_stale_case_folders_are_cleaned(tmp_path):
    from hilbert_lab.bench.isolate import _host_tag

    tag, dead = _host_tag(), _dead_pid()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {
            "stale": f"hilbert_lab_case_{dead}_{tag}_abc",  # owner gone, older than the run: removed
            "mine": f"hilbert_lab_case_{os.getpid()}_{tag}_abc",  # this process: kept
            "alive": f"hilbert_lab_case_{sleeper.pid}_{tag}_abc",  # a running owner: kept
            "other_host": f"hilbert_lab_case_{dead}_00000000_abc" if tag != "00000000" else "x",
            "no_pid": "hilbert_lab_case_abc123",  # an old-style name: nothing says whose it is
            "unrelated": f"something_{dead}_{tag}_abc",
        }
        for name in names.values():
            (tmp_path / name).mkdir()
            (tmp_path / name / "in.json").write_text("{}")
            os.utime(tmp_path / name, (time.time() - 3600, time.time() - 3600))
        new = tmp_path / f"hilbert_lab_case_{dead}_{tag}_new"  # modified after the run started: kept
        new.mkdir()
        removed = clean_stale_case_dirs(before=time.time() - 60, tmpdir=str(tmp_path))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert removed == [str(tmp_path / names["stale"])]
    kept = [name for key, name in names.items() if key != "stale"] + [new.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


def test_the_runner_cleans_stale_case_folders(tmp_path, monkeypatch):
    import tempfile

    from hilbert_lab.bench.isolate import _host_tag

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    stale = temp / f"hilbert_lab_case_{_dead_pid()}_{_host_tag()}_x"
    stale.mkdir()
    os.utime(stale, (time.time() - 10, time.time() - 10))
    SafeBenchmarkRunner(str(tmp_path / "r.jsonl"), progress=False).run([{"kind": "selftest"}])
    assert not stale.exists() and list(temp.iterdir()) == []  # the case's own folder is gone too


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the record of a CUDA case on a machine without CUDA")
def test_cuda_case_without_cuda_is_recorded_as_refused(tmp_path):
    path = tmp_path / "r.jsonl"
    case = {"kind": "attention", "seq_len": 256, "segment_lengths": [64], "dilation_rates": [1], "device": "cuda"}
    SafeBenchmarkRunner(str(path), progress=False).run([case])
    (record,) = read_results(str(path))[0]
    assert record["status"] == "refused" and "not available" in record["error"]
