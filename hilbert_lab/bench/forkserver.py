"""A preloaded Python process that forks one fresh process per isolated case.

Starting Python and importing torch, the engine and torch._dynamo costs about 5 s of CPU per case on a small
machine, while a CPU case's timed work is often 50 ms. The server imports what cases need once; each case is a
child forked from it, so it still runs in a process of its own (own memory, own session, killed as a group on
a timeout, dead with its server, and the server dead with its runner), only without the start-up.

Protocol (one line each, on the server's stdin and stdout): the server says `ready`; a request is a JSON
object {in, out, err, env, cwd, preload}; the server imports `preload`, forks, says `pid N`, and once the
child ends `exit CODE` (negative: killed by that signal, as subprocess reports it).
"""
from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Sequence

# Variables a forked child can still apply (the rest are read when a process starts: those cases spawn).
APPLICABLE = ("OMP_NUM_THREADS", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "CUDA_VISIBLE_DEVICES")
_MALLOPT = {"MALLOC_TRIM_THRESHOLD_": -1, "MALLOC_MMAP_THRESHOLD_": -3}  # glibc's M_TRIM_THRESHOLD, M_MMAP_THRESHOLD
_START_TIMEOUT_S = 300.0
_REAP_TIMEOUT_S = 30.0


@dataclass
class _Server:
    proc: subprocess.Popen
    pending: bytes = field(default=b"")


_SERVERS: dict[tuple[str, str], _Server] = {}
_LOCK = threading.Lock()  # one case at a time per runner process: a server answers one request at a time


def can_fork(env: dict[str, str]) -> bool:
    """True where a case with extra environment `env` can be forked (Linux; every variable in APPLICABLE)."""
    return sys.platform.startswith("linux") and hasattr(os, "fork") and all(key in APPLICABLE for key in env)


def _read_line(server: _Server, deadline: float | None) -> str | None:
    """The server's next line; None once `deadline` (time.monotonic) passes; EOFError when the server is gone."""
    stream = server.proc.stdout
    assert stream is not None
    while b"\n" not in server.pending:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return None
        ready, _, _ = select.select([stream], [], [], remaining)
        if not ready:
            return None
        chunk = os.read(stream.fileno(), 4096)
        if not chunk:
            raise EOFError("the fork server exited")
        server.pending += chunk
    line, _, server.pending = server.pending.partition(b"\n")
    return line.decode()


def _stop(server: _Server) -> None:
    try:
        server.proc.kill()
        server.proc.wait(timeout=_REAP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):  # pragma: no cover - already gone, or a zombie
        pass


def _server(base_env: dict[str, str]) -> _Server:
    """The running server of this interpreter and `base_env`'s import path; started (and waited for) if none,
    stopping one of another import path."""
    key = (sys.executable, base_env.get("PYTHONPATH", ""))
    server = _SERVERS.get(key)
    if server is not None and server.proc.poll() is None:
        return server
    for other in _SERVERS.values():  # one server at a time (each holds torch in memory)
        _stop(other)
    _SERVERS.clear()
    proc = subprocess.Popen([sys.executable, "-m", "hilbert_lab.bench.forkserver"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=base_env, start_new_session=True)
    server = _Server(proc)
    try:
        line = _read_line(server, time.monotonic() + _START_TIMEOUT_S)
    except EOFError:
        line = None
    if line != "ready":
        _stop(server)
        raise OSError("the fork server did not start")
    _SERVERS[key] = server
    return server


def _kill_case(pid: int) -> None:
    for kill in (os.killpg, os.kill):  # its own group; the pid alone if it died before setsid
        try:
            kill(pid, signal.SIGKILL)
            return
        except (ProcessLookupError, PermissionError):
            continue


def run_forked(in_path: str, out_path: str, err_path: str, *, base_env: dict[str, str], env: dict[str, str],
               timeout_s: float, preload: Sequence[str] = ()) -> tuple[int | None, bool]:
    """Run `python -m hilbert_lab.bench.worker in_path out_path` as a child of the server, output to `err_path`;
    (return code, timed out). OSError when no server can be had (the caller then spawns the case itself)."""
    with _LOCK:
        return _run_forked(in_path, out_path, err_path, base_env=base_env, env=env, timeout_s=timeout_s,
                           preload=preload)


def _run_forked(in_path: str, out_path: str, err_path: str, *, base_env: dict[str, str], env: dict[str, str],
                timeout_s: float, preload: Sequence[str]) -> tuple[int | None, bool]:
    server = _server(base_env)
    request = {"in": in_path, "out": out_path, "err": err_path, "env": {**base_env, **env}, "cwd": os.getcwd(),
               "preload": list(preload)}
    assert server.proc.stdin is not None
    try:
        server.proc.stdin.write((json.dumps(request) + "\n").encode())
        server.proc.stdin.flush()
        started = _read_line(server, time.monotonic() + _START_TIMEOUT_S)
    except (OSError, EOFError) as error:
        _stop(server)
        raise OSError(f"the fork server failed: {error}") from None
    if started is None or not started.startswith("pid "):
        _stop(server)
        raise OSError(f"the fork server answered {started!r}")
    pid = int(started.split()[1])
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        ended = _read_line(server, deadline)
        if ended is None:
            timed_out = True
            _kill_case(pid)
            ended = _read_line(server, time.monotonic() + _REAP_TIMEOUT_S)
    except EOFError:
        return None, timed_out
    except BaseException:  # Ctrl-C: the case goes with it; the server stays for the next run once it has reaped it
        _kill_case(pid)
        try:
            reaped = _read_line(server, time.monotonic() + _REAP_TIMEOUT_S)
        except EOFError:
            reaped = None
        if reaped is None or not reaped.startswith("exit "):
            _stop(server)
        raise
    if ended is None or not ended.startswith("exit "):
        _stop(server)
        return None, timed_out
    return int(ended.split()[1]), timed_out


def _apply_environment(env: dict[str, str]) -> None:
    """The request's environment in this forked child: variables, import path, glibc's malloc thresholds."""
    os.environ.clear()
    os.environ.update(env)
    for entry in reversed([part for part in env.get("PYTHONPATH", "").split(os.pathsep) if part]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    if any(name in env for name in _MALLOPT):
        import ctypes

        libc = ctypes.CDLL(None)
        for name, parameter in _MALLOPT.items():
            if name in env:
                libc.mallopt(parameter, int(env[name]))
    torch = sys.modules.get("torch")
    if torch is not None and env.get("OMP_NUM_THREADS", "").isdigit():
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))


def _child(request: dict, server_pid: int) -> None:
    """In the forked child: become a case process like a spawned one, run the worker, exit. Never returns."""
    code = 1
    try:
        os.setsid()
        from hilbert_lab.bench.worker import die_with, run_request

        die_with(server_pid)
        output = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.chdir(request["cwd"])
        _apply_environment(request["env"])
        code = run_request(request["in"], request["out"])
    except BaseException:  # noqa: BLE001 - the traceback goes to the case's output; the code says it failed
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve() -> None:
    """The server: die with the runner, then fork one child per request line until stdin closes."""
    from hilbert_lab.bench.worker import die_with_parent

    die_with_parent()
    reply = sys.stdout.buffer
    reply.write(b"ready\n")
    reply.flush()
    for line in sys.stdin.buffer:
        request = json.loads(line)
        for name in request.get("preload", ()):
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the child imports it again and records the error
                pass
        pid = os.fork()
        if pid == 0:
            _child(request, os.getppid())
        reply.write(f"pid {pid}\n".encode())
        reply.flush()
        _, status = os.waitpid(pid, 0)
        reply.write(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
        reply.flush()


if __name__ == "__main__":
    serve()
