"""Run a per-rank function in a gloo world of spawned processes (CPU), with each failing rank's traceback in the
test's error and a deadline against hangs."""
from __future__ import annotations

import datetime
import os
import time
import traceback
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

NO_GLOO = not dist.is_available() or not dist.is_gloo_available()


def _entry(rank: int, world_size: int, checks: Callable[[int, int, str], None], folder: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=300))  # wide: only a hang should reach it
    try:
        checks(rank, world_size, folder)
    except BaseException:
        with open(os.path.join(folder, f"rank{rank}.txt"), "w") as handle:
            handle.write(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def run_world(checks: Callable[[int, int, str], None], world_size: int, folder: Path, timeout_s: float = 600) -> None:
    """checks(rank, world_size, folder) on every rank of a new gloo world; AssertionError with the failing ranks'
    tracebacks, TimeoutError after timeout_s (wide: a busy 2-core machine runs the ranks many times slower)."""
    context = mp.start_processes(_entry, args=(world_size, checks, str(folder)), nprocs=world_size, join=False,
                                 start_method="forkserver")
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {world_size} ranks did not finish within {timeout_s} s (deadlock?)")
    except mp.ProcessRaisedException as error:
        reports = "\n".join(p.read_text() for p in sorted(folder.glob("rank*.txt")))
        raise AssertionError(f"a rank failed:\n{reports or error}") from None
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
