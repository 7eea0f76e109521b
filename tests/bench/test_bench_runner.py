"""SafeBenchmarkRunner: failures are records, results are append-only, resume and Ctrl-C keep results."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hilbert_lab.bench import SafeBenchmarkRunner, case_id, expand_matrix, normalize_case, read_results
from hilbert_lab.bench.config import SafetyConfig

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Each case is a new Python process (under a second to start here when the machine is idle): the limit leaves a
# busy machine room to start one, and the sleeping case sleeps far beyond it.
CASE_TIMEOUT_S = 10
SLEEP_S = 300


def _cases():
    return expand_matrix({"kind": "selftest"}, cases=[
        {"behavior": "ok", "value": 1},
        {"behavior": "raise"},
        {"behavior": "sleep", "seconds": SLEEP_S},   # exceeds the case timeout
        {"behavior": "signal"},                  # SIGKILLs itself
        {"behavior": "oom"},
        {"behavior": "ok", "value": 2},
    ])


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("runner") / "results.jsonl"
    runner = SafeBenchmarkRunner(str(path), config=SafetyConfig(case_timeout_s=CASE_TIMEOUT_S), progress=False)
    start = time.perf_counter()
    summary = runner.run(_cases())
    return path, summary, time.perf_counter() - start


def test_failures_are_recorded_and_the_run_goes_on(first_run):
    path, summary, elapsed = first_run
    records, malformed = read_results(str(path))
    assert malformed == 0
    assert [r["status"] for r in records] == ["ok", "error", "timeout", "signal", "oom", "ok"]
    assert [r["result"].get("value") for r in records if r["status"] == "ok"] == [1, 2]
    by_status = {r["status"]: r for r in records}
    assert "raised on purpose" in by_status["error"]["error"]
    assert "SIGKILL" in by_status["signal"]["error"]
    assert f"timed out after {CASE_TIMEOUT_S}" in by_status["timeout"]["error"]
    assert CASE_TIMEOUT_S <= by_status["timeout"]["duration_s"] < SLEEP_S  # killed, not waited for
    assert elapsed < SLEEP_S
    assert (summary.completed, summary.failed, summary.skipped, summary.interrupted) == (6, 4, 0, False)


def test_records_carry_exact_parameters_and_environment(first_run):
    path, _, _ = first_run
    records, _ = read_results(str(path))
    cases = _cases()
    for record, case in zip(records, cases):
        assert record["params"] == case
        assert record["case_id"] == case_id(case)
        env = record["env"]
        assert env["packages"]["python"] and env["packages"]["hilbert-lab"] == "0.1.0"
        assert set(env["git"]) == {"commit", "dirty"}
        assert env["device"]["device"] == "cpu" and env["cpu"]["logical_cores"] >= 1
    assert len({r["run_id"] for r in records}) == 1


def test_resume_skips_finished_cases_and_never_rewrites(first_run, tmp_path):
    path, _, _ = first_run
    copy = tmp_path / "results.jsonl"
    copy.write_bytes(path.read_bytes())
    before = copy.read_bytes()
    summary = SafeBenchmarkRunner(str(copy), config=SafetyConfig(case_timeout_s=CASE_TIMEOUT_S), progress=False).run(_cases())
    assert (summary.completed, summary.skipped) == (0, 6)
    assert copy.read_bytes() == before
    # one new case: only it runs, and the old bytes stay a prefix of the file
    summary = SafeBenchmarkRunner(str(copy), progress=False).run(
        _cases() + [normalize_case({"kind": "selftest", "value": 3})])
    assert (summary.completed, summary.skipped) == (1, 6)
    after = copy.read_bytes()
    assert after.startswith(before) and after.count(b"\n") == before.count(b"\n") + 1


def test_retry_failed_reruns_only_failed_cases(tmp_path):
    path = tmp_path / "r.jsonl"
    cases = expand_matrix({"kind": "selftest"}, {"behavior": ["ok", "raise"]})
    SafeBenchmarkRunner(str(path), progress=False).run(cases)
    summary = SafeBenchmarkRunner(str(path), progress=False, retry_failed=True).run(cases)
    assert (summary.completed, summary.skipped) == (1, 1)
    assert [r["params"]["behavior"] for r in read_results(str(path))[0]] == ["ok", "raise", "raise"]


def test_torn_last_line_is_kept_apart_from_new_records(tmp_path):
    path = tmp_path / "r.jsonl"
    cases = expand_matrix({"kind": "selftest"}, {"value": [1, 2]})
    SafeBenchmarkRunner(str(path), progress=False).run(cases[:1])
    with open(path, "a") as handle:
        handle.write('{"case_id": "torn", "sta')  # a run killed mid-write
    summary = SafeBenchmarkRunner(str(path), progress=False).run(cases)
    records, malformed = read_results(str(path))
    assert malformed == 1 and summary.completed == 1
    assert [r["params"]["value"] for r in records] == [1, 2]


@pytest.mark.parametrize("torn", ['{"case_id": "0123abcd", "sta', '{"case_id": "0123abcd", "sta\n', '{"ca'],
                         ids=["torn", "torn-then-ended", "few-bytes"])
def test_a_file_whose_only_line_is_torn_is_resumed(tmp_path, torn):
    path = tmp_path / "r.jsonl"
    path.write_text(torn)  # the first record of a run killed mid-write (and maybe of the next, killed at once)
    summary = SafeBenchmarkRunner(str(path), progress=False).run(expand_matrix({"kind": "selftest"}, {"value": [1]}))
    records, malformed = read_results(str(path))
    assert summary.completed == 1 and malformed == 1 and [r["params"]["value"] for r in records] == [1]
    assert path.read_text().startswith(torn)  # appended to, never rewritten


def test_a_file_that_is_not_a_results_file_is_refused(tmp_path):
    for text in ("notes without a newline", '{"title": "my data"}\n', "{not json"):
        other = tmp_path / "other.txt"
        other.write_text(text)
        with pytest.raises(ValueError, match="not a hilbert_lab results file"):
            SafeBenchmarkRunner(str(other), progress=False)
        assert other.read_text() == text

    path = tmp_path / "notes.txt"
    path.write_text("important notes\n")
    with pytest.raises(ValueError, match="not a hilbert_lab results file"):
        SafeBenchmarkRunner(str(path), progress=False)
    assert path.read_text() == "important notes\n"
    with pytest.raises(ValueError, match="does not exist"):
        SafeBenchmarkRunner(str(tmp_path / "missing" / "r.jsonl"), progress=False)


def test_case_whose_estimate_does_not_fit_is_refused_without_running(tmp_path):
    path = tmp_path / "r.jsonl"
    huge = {"kind": "selftest", "seq_len": 1 << 20, "bytes_per_token": 1 << 40}  # 1 EiB
    summary = SafeBenchmarkRunner(str(path), progress=False).run([huge])
    (record,) = read_results(str(path))[0]
    assert record["status"] == "refused" and record["result"] == {} and "needs" in record["error"]
    assert summary.failed == 1


def _wait_for(proc: subprocess.Popen, what: str, condition) -> None:
    """Wait until condition() holds, however long the machine takes (pytest's timeout bounds a hung test); fail
    at once with the run's stderr if it exits first."""
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the run exited ({proc.returncode}) before {what}: {proc.stderr.read()[-2000:]}")
        time.sleep(0.1)


def _case_workers(pid: int) -> list:
    """The case processes that the run with this pid has started and not yet reaped: interpreters running
    hilbert_lab.bench.worker, and children forked by its fork server (hilbert_lab.bench.forkserver)."""
    import psutil

    workers = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            parent = child.parent()
            forked = parent is not None and "hilbert_lab.bench.forkserver" in parent.cmdline()
            if forked or "hilbert_lab.bench.worker" in child.cmdline():
                workers.append(child)
        except psutil.Error:  # exited meanwhile
            pass
    return workers


@pytest.mark.slow  # a CLI run each (a minute on a busy machine)
@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM],
                         ids=["ctrl-c", "sigterm"])
def test_ctrl_c_keeps_finished_results_and_resume_knows_what_is_left(tmp_path, stop_signal):
    matrix = tmp_path / "m.yaml"
    matrix.write_text("base: {kind: selftest}\ncases:\n  - {value: 1}\n  - {behavior: sleep, seconds: 120, value: 2}\n"
                      "  - {value: 3}\n")
    out = tmp_path / "r.jsonl"
    # SIGINT at its default disposition in the run, as in a terminal: a shell that starts the tests in the background
    # without job control hands them SIGINT ignored, and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen([sys.executable, "-m", "hilbert_lab.cli", "bench", "--matrix", str(matrix), "--out",
                             str(out), "--quiet"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _wait_for(proc, "the first case's record", lambda: out.exists() and out.read_text().count("\n") >= 1)
    _wait_for(proc, "the sleeping case's worker", lambda: _case_workers(proc.pid))
    proc.send_signal(stop_signal)
    try:
        # The run only has to kill its case and exit: seconds. The limit is wide (a busy 2-core machine has taken
        # over a minute) and only keeps a run that ignores the signal from holding the suite.
        stdout, stderr = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the run did not stop within 600 s of {stop_signal.name}")
    assert proc.returncode == 130, stderr
    assert "interrupted" in stdout
    records, malformed = read_results(str(out))
    assert malformed == 0 and [r["params"]["value"] for r in records] == [1]
    from hilbert_lab.bench import load_matrix_file

    pending, skipped = SafeBenchmarkRunner(str(out), progress=False).pending(load_matrix_file(str(matrix)))
    assert skipped == 1 and [c["value"] for c in pending] == [2, 3]


def test_two_runs_cannot_write_one_file_at_once(tmp_path):
    import fcntl

    path = tmp_path / "r.jsonl"
    with open(path, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        with pytest.raises(ValueError, match="another run"):
            SafeBenchmarkRunner(str(path), progress=False).run([{"kind": "selftest"}])
