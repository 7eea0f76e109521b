"""Multiprocess harness for the ring tests: gloo ranks with a file rendezvous and a deadline.

Gloo ranks are forked from the fork server (tests/conftest.py preloads torch and the library in it, so a
rank starts in a fraction of a second instead of importing torch anew); its environment is the one it
started with. NCCL ranks (one GPU each) are spawned fresh.

Checks run inside every rank (`CHECKS[name](rank, world_size)`); a failed assertion in any rank
fails the test with its traceback, and a rank that hangs (deadlock) fails it at the deadline.
"""
from __future__ import annotations

import datetime
import os
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CHECKS: dict[str, Callable[[int, int], None]] = {}
# Only a hang should reach these limits: a 4-rank world on a busy 2-core machine runs many times slower than on an
# idle one, so they are minutes, not a multiple of an idle run (the deadlock test passes its own short limit).
GROUP_TIMEOUT_S = 300
WORLD_TIMEOUT_S = 600.0


def check(fn: Callable[[int, int], None]) -> Callable[[int, int], None]:
    """Register a per-rank check under its function name."""
    CHECKS[fn.__name__] = fn
    return fn


def _entry(rank: int, world_size: int, init_file: str, names: list[str], backend: str = "gloo") -> None:
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if Path("/sys/class/net/lo").exists():  # loopback: no dependence on the host name resolving
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import ring_checks  # noqa: F401  registers the checks in this (spawned) process
    import ulysses_checks  # noqa: F401
    import zigzag_checks  # noqa: F401

    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    try:
        for name in names:
            start = time.perf_counter()
            CHECKS[name](rank, world_size)
            dist.barrier()
            if rank == 0 and os.environ.get("RING_TEST_TIMES"):
                print(f"{name} on {world_size} ranks: {time.perf_counter() - start:.2f} s", flush=True)
    finally:
        dist.destroy_process_group()


def run_world(world_size: int, tmp_path: Path, names: list[str], timeout_s: float = WORLD_TIMEOUT_S,
              backend: str = "gloo") -> None:
    """Run the named checks in `world_size` ranks (gloo, or nccl: one GPU each); raise on failure or timeout."""
    init_file = str(tmp_path / f"rendezvous_{world_size}_{time.monotonic_ns()}")
    context = mp.start_processes(_entry, args=(world_size, init_file, names, backend), nprocs=world_size,
                                 join=False, start_method="spawn" if backend == "nccl" else "forkserver")
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
            raise TimeoutError(f"ranks of a {world_size}-rank world did not finish {names} in {timeout_s} s (deadlock?)")
