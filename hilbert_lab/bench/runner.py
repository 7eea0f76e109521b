"""SafeBenchmarkRunner: isolated cases, append-only JSON-lines results, resume, clean Ctrl-C."""
from __future__ import annotations

import datetime as _dt
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from hilbert_lab.bench.cases import CASE_PRELOAD, CASE_TARGET, case_id, estimate_case_bytes, normalize_case, worker_env
from hilbert_lab.bench.env import collect_environment
from hilbert_lab.bench.checker import MemorySafetyChecker
from hilbert_lab.bench.config import SafetyConfig
from hilbert_lab.bench.isolate import clean_stale_case_dirs, run_isolated
from hilbert_lab.io import append_line, exclusive_lock, path_problem

SCHEMA_VERSION = 1
FAILED_STATUSES = ("error", "oom", "timeout", "signal", "crash", "refused")


@dataclass
class RunSummary:
    """Counts of one run: cases done now, skipped as already finished, failed, and whether Ctrl-C stopped it."""

    results_path: str
    total: int = 0
    completed: int = 0
    failed: int = 0
    skipped: int = 0
    interrupted: bool = False
    torn: int = 0  # torn lines found in the file (writes cut short by a killed run), kept apart and skipped
    records: list[dict[str, Any]] = field(default_factory=list)

    def line(self) -> str:
        state = "interrupted" if self.interrupted else "done"
        torn = (f"; {self.torn} torn line(s) from an interrupted run skipped (their cases run again)"
                if self.torn else "")
        return (f"{state}: {self.completed} ran ({self.failed} failed), {self.skipped} already finished, "
                f"{self.total - self.completed - self.skipped} left; results in {self.results_path}{torn}")


def _case_label(params: dict[str, Any], varying: list[str]) -> str:
    shown = [f"{key}={'identity' if key == 'ordering' and params.get(key) is None else params.get(key)}"
             for key in varying]
    return " ".join(shown)


def results_table(records: list[dict[str, Any]]) -> list[str]:
    """Lines of a table of benchmark records: the case (the parameters that differ between the records, but
    the backend), the backend (-> the one `auto` used), the median time in ms and its 95% bootstrap interval;
    a failed case shows its status. No records: no lines."""
    from hilbert_lab.bench.stats import bootstrap_median_ci

    if not records:
        return []
    keys = sorted({key for record in records for key in record["params"]} - {"backend"})
    varying = [key for key in keys if len({json.dumps(r["params"].get(key), default=str) for r in records}) > 1]
    rows = []
    for record in records:
        params, result = record["params"], record.get("result") or {}
        case = _case_label(params, varying) if varying else record["case_id"]
        backend = str(params.get("backend", "-"))
        if result.get("backend_used") and result["backend_used"] != backend:
            backend += f" -> {result['backend_used']}"
        times = result.get("times_ms") or []
        if record["status"] == "ok" and times:
            median, low, high = bootstrap_median_ci(times)
            rows.append((case, backend, f"{median:.3f}", f"[{low:.3f}, {high:.3f}]"))
        else:
            rows.append((case, backend, "-", record["status"]))
    header = ("case", "backend", "median ms", "95% interval")
    widths = [max(len(row[i]) for row in rows + [header]) for i in range(4)]
    return [f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]}".rstrip()
            for row in [header] + rows]


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


_RECORD_START = '{"case_id": '  # every record line starts so (json.dumps with sort_keys)


def _is_torn_record(line: str) -> bool:
    """A line that does not parse but is the start of a record line: a write cut short by a killed run."""
    text = line.strip()
    return bool(text) and (text.startswith(_RECORD_START) or _RECORD_START.startswith(text))


def _scan_results(path: str) -> tuple[list[dict[str, Any]], int, int]:
    """(records, foreign lines, torn record lines) of a results file; ValueError naming the file and the line
    for a record (an object with case_id and status) whose case_id or status is not a string."""
    records: list[dict[str, Any]] = []
    foreign = torn = 0
    if not os.path.exists(path):
        return records, 0, 0
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                if _is_torn_record(line):
                    torn += 1
                else:
                    foreign += 1
                continue
            if isinstance(record, dict) and "case_id" in record and "status" in record:
                for key in ("case_id", "status"):
                    if not isinstance(record[key], str):
                        raise ValueError(f"results file {path!r} line {number}: {key} must be a string, got "
                                         f"{json.dumps(record[key])[:80]}; the line was "
                                         "not written by the benchmark runner: fix or remove it, or choose another "
                                         "results file")
                records.append(record)
            else:
                foreign += 1
    return records, foreign, torn


def read_results(path: str) -> tuple[list[dict[str, Any]], int]:
    """(records, number of malformed lines) of a results file; a torn line counts as malformed."""
    records, foreign, torn = _scan_results(path)
    return records, foreign + torn


class SafeBenchmarkRunner:
    """Runs benchmark cases one by one, each in its own subprocess, and never loses a finished result.

    - Each case runs via hilbert_lab.bench.isolate.run_isolated with config.case_timeout_s; an
      exception, out-of-memory error, timeout, signal or crash becomes a failed record and the run goes on.
    - Before a case runs, its estimated peak is checked against free memory (status "refused" if it
      does not fit; check_memory=False turns this off).
    - One JSON line per case is appended to results_path in one write and fsynced as soon as the case
      ends, with the exact parameters and an environment block; a write that fails (a full disk, a
      file-size limit) is cut back, so no torn line is left, and raises OSError saying so. The file is only
      ever appended to; a line torn by a killed run is ended and skipped (even when it is the only line),
      and the summary says so; a file that is not a results file, or not a regular file (a FIFO, a
      device), is refused; an exclusive lock (hilbert_lab.io.exclusive_lock) stops two runs writing at once.
    - Case folders left in the temp directory by a killed run (SIGKILL) are removed at the next run.
    - Re-running skips cases whose id already has a record (failed ones too, unless retry_failed).
    - Ctrl-C kills the running case (not recorded, so a resume runs it) and returns with interrupted=True.
    """

    def __init__(self, results_path: str, *, config: SafetyConfig | None = None, target: str = CASE_TARGET,
                 progress: bool = True, retry_failed: bool = False, check_memory: bool = True,
                 estimate: Callable[[dict[str, Any]], int | None] | None = None) -> None:
        self.results_path = os.path.abspath(results_path)
        self.config = config if config is not None else SafetyConfig()
        self.target = target
        self.progress = progress
        self.retry_failed = retry_failed
        self.check_memory = check_memory
        self.estimate = estimate if estimate is not None else estimate_case_bytes
        self._check_path()

    def _check_path(self) -> None:
        directory = os.path.dirname(self.results_path) or "."
        problem = path_problem(self.results_path, must_exist=False)
        if problem is not None:
            raise ValueError(f"results_path {self.results_path!r} {problem}")
        if not os.path.isdir(directory):
            raise ValueError(f"results_path {self.results_path!r}: directory {directory!r} does not exist")
        if os.path.exists(self.results_path):
            if not os.access(self.results_path, os.W_OK):
                raise ValueError(f"results_path {self.results_path!r} is not writable")
            records, foreign, _torn = _scan_results(self.results_path)  # torn lines are skipped on resume
            if foreign and not records:
                raise ValueError(f"results_path {self.results_path!r} exists and is not a hilbert_lab results "
                                 f"file; refusing to append to it (choose another path)")
        elif not os.access(directory, os.W_OK):
            raise ValueError(f"results_path {self.results_path!r}: directory {directory!r} is not writable")

    def finished(self) -> dict[str, str]:
        """case_id -> status of the records already in the results file (the last record of an id wins)."""
        records, _ = read_results(self.results_path)
        return {record["case_id"]: record["status"] for record in records}

    def pending(self, cases: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
        """(validated cases still to run, number skipped as finished)."""
        finished = self.finished()
        pending, skipped, seen = [], 0, set()
        for case in (normalize_case(c) for c in cases):
            identifier = case_id(case)
            if identifier in seen:
                continue
            seen.add(identifier)
            status = finished.get(identifier)
            if status == "ok" or (status is not None and not self.retry_failed):
                skipped += 1
            else:
                pending.append(case)
        return pending, skipped

    def _refusal(self, case: dict[str, Any]) -> tuple[str | None, str | None]:
        """(why the case must not run or None, why it has no estimate or None)."""
        if not self.check_memory:
            return None, None
        if case["kind"] != "selftest" and case["seq_len"] > self.config.max_seq_len:
            return f"seq_len {case['seq_len']} > max_seq_len {self.config.max_seq_len}", None
        try:
            required = self.estimate(case)
        except Exception as exc:  # no estimate for this case: run it, and say so in the record
            return None, f"{type(exc).__name__}: {exc}"
        if required is None:
            return None, None
        device = str(case.get("device", "cpu"))
        try:
            ok, reason = MemorySafetyChecker(self.config, device).check_memory_available(required)
        except ValueError as exc:  # e.g. a CUDA case on a machine without CUDA
            return str(exc), None
        return (None if ok else reason), None

    def run_one(self, case: dict[str, Any], run_id: str) -> dict[str, Any]:
        """Run one validated case in isolation and return its record (not yet written)."""
        started = _now()
        refusal, estimate_error = self._refusal(case)
        if refusal is not None:
            status, result, error, duration, stderr_tail = "refused", {}, refusal, 0.0, ""
        else:
            outcome = run_isolated(self.target, case, timeout_s=self.config.case_timeout_s, env=worker_env(case),
                                   preload=CASE_PRELOAD)
            status, result, error = outcome.status, outcome.result, outcome.error
            duration, stderr_tail = outcome.duration_s, ("" if outcome.ok else outcome.stderr_tail)
        record = {"schema": SCHEMA_VERSION, "case_id": case_id(case), "run_id": run_id, "status": status,
                  "params": case, "result": result, "error": error, "duration_s": round(duration, 4),
                  "started_at": started, "finished_at": _now(),
                  "env": collect_environment(str(case.get("device", "cpu")))}
        if stderr_tail:
            record["stderr_tail"] = stderr_tail
        if estimate_error:
            record["estimate_error"] = estimate_error
        return record

    def _append(self, handle, record: dict[str, Any]) -> None:
        try:
            append_line(handle, json.dumps(record, sort_keys=True, default=str))
        except OSError as error:
            raise OSError(error.errno, f"{error.strerror or error}; the record of case {record['case_id']} was not "
                          "written and the file is as before it (no torn line): make room and run again to resume",
                          self.results_path) from None

    def run(self, cases: Iterable[dict[str, Any]]) -> RunSummary:
        """Run every case not yet finished; returns a RunSummary (interrupted=True after Ctrl-C)."""
        cases = list(cases)
        pending, skipped = self.pending(cases)
        summary = RunSummary(self.results_path, total=len(pending) + skipped, skipped=skipped)
        run_id = uuid.uuid4().hex[:12]
        clean_stale_case_dirs(before=time.time())
        with exclusive_lock(self.results_path, f"results_path {self.results_path!r}") as handle:
            summary.torn = _scan_results(self.results_path)[2]
            handle.seek(0, os.SEEK_END)
            if handle.tell() > 0:  # a torn line from a killed run must not swallow the next record
                handle.seek(handle.tell() - 1)
                last = handle.read(1)
                if last != "\n":
                    append_line(handle, "")
            bar = None
            if self.progress:
                from tqdm.auto import tqdm

                bar = tqdm(total=len(pending), desc="bench", unit="case", dynamic_ncols=True)
            try:
                for case in pending:
                    if bar is not None:
                        bar.set_postfix_str(_short(case))
                    record = self.run_one(case, run_id)
                    self._append(handle, record)
                    summary.completed += 1
                    summary.failed += record["status"] != "ok"
                    summary.records.append(record)
                    if bar is not None:
                        bar.update(1)
            except KeyboardInterrupt:
                summary.interrupted = True
            finally:
                if bar is not None:
                    bar.close()
        return summary


def _short(case: dict[str, Any]) -> str:
    if case["kind"] == "selftest":
        return f"selftest {case['behavior']}"
    return f"{case['kind']} {case['backend']} N={case['seq_len']} {case['mode']} {case['dtype']}"
