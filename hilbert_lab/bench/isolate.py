"""Run one case function in a fresh subprocess with a timeout; every way it can die becomes a record."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from hilbert_lab.bench.forkserver import can_fork, run_forked

# Statuses of an isolated run. "ok" is the only success.
STATUSES = ("ok", "error", "oom", "timeout", "signal", "crash")
_STDERR_TAIL_CHARS = 2000
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class IsolatedOutcome:
    """What happened to one isolated case: status (one of STATUSES), its result dict when ok, or why not."""

    status: str
    result: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    returncode: int | None = None
    duration_s: float = 0.0
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's own process group (it was started in a new session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover - a zombie that ignores SIGKILL
        pass


_CASE_DIR_PREFIX = "hilbert_lab_case_"


def _host_tag() -> str:
    """8 hex digits of the host name: case folders of other hosts (a shared /tmp) are never judged here."""
    return hashlib.blake2b(socket.gethostname().encode(), digest_size=4).hexdigest()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def clean_stale_case_dirs(*, before: float | None = None, tmpdir: str | None = None) -> list[str]:
    """Remove case folders left by runners that were killed (SIGKILL): returns the paths removed.

    A folder hilbert_lab_case_<pid>_<host tag>_* in `tmpdir` (default: tempfile.gettempdir()) is
    stale when it belongs to this host and this user, its pid is no longer running, and it was
    last modified before `before` (a time.time() value, default now: the start of this run).
    """
    directory = tmpdir or tempfile.gettempdir()
    cutoff = time.time() if before is None else before
    pattern = re.compile(rf"{_CASE_DIR_PREFIX}(\d+)_{_host_tag()}_")
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        pid = int(match.group(1))
        if info.st_uid != os.getuid() or info.st_mtime >= cutoff or pid == os.getpid() or _pid_alive(pid):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        if not os.path.exists(entry.path):
            removed.append(entry.path)
    return removed


def _spawn(python: str, in_path: str, out_path: str, err_path: str, env: dict[str, str],
           timeout_s: float) -> tuple[int | None, bool]:
    """Run the worker as a new interpreter in its own session; (return code, timed out)."""
    with open(err_path, "wb") as err_handle:
        proc = subprocess.Popen([python, "-m", "hilbert_lab.bench.worker", in_path, out_path],
                                stdin=subprocess.DEVNULL, stdout=err_handle, stderr=subprocess.STDOUT,
                                env=env, start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return proc.returncode, True
        except BaseException:
            _kill_group(proc)
            raise


def run_isolated(target: str, params: dict[str, Any], *, timeout_s: float,
                 env: dict[str, str] | None = None, python: str | None = None,
                 preload: Sequence[str] = ()) -> IsolatedOutcome:
    """Call `target` ('package.module:function') with `params` in a new Python process.

    On Linux the process is forked from a server that has imported `preload` (bench.forkserver), unless
    `python` names an interpreter or `env` sets a variable only a new interpreter reads; else it is a new
    interpreter. The function must return a JSON-serialisable dict. The child runs in its own session so that
    Ctrl-C in the terminal does not reach it; on timeout or KeyboardInterrupt its process group is
    killed (KeyboardInterrupt is then re-raised). An out-of-memory error (torch.OutOfMemoryError,
    MemoryError) gives status "oom", any other exception "error", death by a signal "signal"
    (SIGKILL is often the kernel's OOM killer), another non-zero exit without a result "crash".
    """
    if ":" not in target:
        raise ValueError(f"target must be 'module:function', got {target!r}")
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
    base_env = dict(os.environ)
    # The child imports the same hilbert_lab as this process, also when it was found through sys.path only
    # (an installed one is found the same way by the child; its site folder must not precede the stdlib).
    if os.path.basename(_PACKAGE_ROOT) not in ("site-packages", "dist-packages"):
        base_env["PYTHONPATH"] = os.pathsep.join(
            [_PACKAGE_ROOT] + [p for p in base_env.get("PYTHONPATH", "").split(os.pathsep) if p])
    base_env["HILBERT_LAB_PARENT_PID"] = str(os.getpid())
    extra_env = dict(env or {})
    # The folder name carries this process's pid: if it is SIGKILLed, clean_stale_case_dirs removes it later.
    with tempfile.TemporaryDirectory(prefix=f"{_CASE_DIR_PREFIX}{os.getpid()}_{_host_tag()}_") as workdir:
        in_path = os.path.join(workdir, "in.json")
        out_path = os.path.join(workdir, "out.json")
        err_path = os.path.join(workdir, "stderr.txt")
        with open(in_path, "w") as handle:
            json.dump({"target": target, "params": params}, handle)
        start = time.perf_counter()
        forked = python is None and can_fork(extra_env)
        if forked:
            try:
                returncode, timed_out = run_forked(in_path, out_path, err_path, base_env=base_env, env=extra_env,
                                                   timeout_s=timeout_s, preload=preload)
            except OSError:  # no fork server here: spawn the case instead
                forked = False
        if not forked:
            returncode, timed_out = _spawn(python or sys.executable, in_path, out_path, err_path,
                                           {**base_env, **extra_env}, timeout_s)
        duration = time.perf_counter() - start
        with open(err_path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - _STDERR_TAIL_CHARS))
            stderr_tail = handle.read().decode("utf-8", errors="replace")
        payload: dict[str, Any] | None = None
        if os.path.exists(out_path):
            try:
                with open(out_path) as handle:
                    payload = json.load(handle)
            except (OSError, ValueError):
                payload = None
    if timed_out:
        return IsolatedOutcome("timeout", error=f"timed out after {timeout_s:g} s (process group killed)",
                               returncode=returncode, duration_s=duration, stderr_tail=stderr_tail)
    if payload is not None and payload.get("status") in ("ok", "error", "oom"):
        return IsolatedOutcome(payload["status"], result=payload.get("result") or {},
                               error=payload.get("error", ""), returncode=returncode,
                               duration_s=duration, stderr_tail=stderr_tail)
    if returncode is not None and returncode < 0:
        name = _signal_name(-returncode)
        hint = " (often the kernel's out-of-memory killer)" if -returncode == signal.SIGKILL else ""
        return IsolatedOutcome("signal", error=f"killed by {name}{hint}", returncode=returncode,
                               duration_s=duration, stderr_tail=stderr_tail)
    last_line = next((line.strip() for line in reversed(stderr_tail.splitlines()) if line.strip()), "")
    ending = "ended with its fork server" if returncode is None else f"exited with code {returncode}"
    return IsolatedOutcome("crash", error=f"{ending} without a result"
                                          + (f": {last_line[:300]}" if last_line else ""),
                           returncode=returncode, duration_s=duration, stderr_tail=stderr_tail)
