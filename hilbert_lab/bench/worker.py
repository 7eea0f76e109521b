"""Subprocess entry point: `python -m hilbert_lab.bench.worker IN.json OUT.json` runs one case."""
from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

from hilbert_lab.io import atomic_write


def _is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return "out of memory" in str(exc).lower() and type(exc).__name__ in ("RuntimeError", "OutOfMemoryError")


def _write_atomic(path: str, payload: dict) -> None:
    atomic_write(path, json.dumps(payload))


def die_with(parent: int) -> None:
    """Linux: get SIGKILL when process `parent` (this one's parent) dies, so no orphaned case keeps running."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def die_with_parent() -> None:
    """die_with the runner named by HILBERT_LAB_PARENT_PID (nothing when it is not set)."""
    parent = os.environ.get("HILBERT_LAB_PARENT_PID")
    if parent:
        die_with(int(parent))


def run_request(in_path: str, out_path: str) -> int:
    """Run the case that `in_path` names; its record goes to `out_path`. The process's exit code: 0 when ok."""
    with open(in_path) as handle:
        request = json.load(handle)
    module_name, function_name = request["target"].split(":", 1)
    try:
        function = getattr(importlib.import_module(module_name), function_name)
        result = function(request["params"])
        payload = {"status": "ok", "result": result}
        json.dumps(payload)  # fail here (as an error record) if the result is not JSON-serialisable
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a record
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            exc = RuntimeError("case function called sys.exit(0) without returning a result")
        status = "oom" if _is_out_of_memory(exc) else "error"
        message = f"{type(exc).__name__}: {exc}".strip()
        payload = {"status": status, "error": message[:2000],
                   "result": {"traceback": traceback.format_exc()[-4000:]}}
        _write_atomic(out_path, payload)
        return 1
    _write_atomic(out_path, payload)
    return 0


def main(argv: list[str]) -> int:
    in_path, out_path = argv
    die_with_parent()
    return run_request(in_path, out_path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
