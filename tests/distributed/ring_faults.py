"""Gloo worlds where one rank stalls, raises or exits inside ring attention; every rank reports how it ended.

Unlike ring_worlds (which fails a test as soon as a rank fails), each rank here writes a JSON
outcome (error type, message, seconds) to a folder, so that the test can check that the healthy
ranks failed in bounded time with an error naming rank, branch and step. Ranks are forked from the fork
server (see ring_worlds).
"""
from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

RING_TIMEOUT_S = 3.0
GROUP_TIMEOUT_S = 60  # the process group's own timeout: the ring must fail long before it
FAULTY = 1  # the rank that misbehaves
# How long the harness waits for the healthy ranks' reports (seconds after RING_TIMEOUT_S on an idle machine): wide,
# because a busy 2-core machine starts and runs the ranks many times slower; only a hang reaches it.
REPORT_LIMIT_S = 300.0


def _wait_for_reports(folder: Path, ranks: list[int], limit_s: float = REPORT_LIMIT_S) -> None:
    """Block until the given ranks have written their outcome (the stalled rank resumes after them)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and not all((folder / f"rank{r}.json").exists() for r in ranks):
        time.sleep(0.05)


def _inject(fault: str, rank: int, world: int, folder: Path) -> None:
    """Make RingComm.exchange misbehave on the faulty rank (stall, raise or exit) at its first use in `phase`."""
    from hilbert_lab.distributed import comm

    kind, phase = fault.split("_")
    original = comm.RingComm.exchange
    healthy = [r for r in range(world) if r != rank]

    def exchange(self, sends=(), recvs=(), label="", step=None):
        if label.startswith(phase):
            if kind == "stall":
                _wait_for_reports(folder, healthy)
            elif kind == "raise":
                raise RuntimeError("injected failure in the faulty rank")
            elif kind == "exit":
                os._exit(17)
        return original(self, sends, recvs, label, step)

    comm.RingComm.exchange = exchange


def _attention(rank: int, world: int) -> None:
    """Forward and backward of a pattern with one shard-local branch and one branch over the whole ring."""
    from hilbert_lab.distributed.ring import ring_dilated_attention

    n = 4
    gen = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, n, 2, 2, dtype=torch.float64, generator=gen).requires_grad_(True) for _ in range(3))
    out = ring_dilated_attention(q, k, v, segment_lengths=[2, n * world], dilation_rates=[1, 2],
                                 timeout_s=RING_TIMEOUT_S)
    out.sum().backward()


def _entry(rank: int, world: int, init_file: str, fault: str, folder: str) -> None:
    torch.set_num_threads(1)
    if Path("/sys/class/net/lo").exists():
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    folder_path = Path(folder)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    import hilbert_lab.distributed.ring  # noqa: F401  imported before the clock starts

    dist.barrier()
    healthy = [r for r in range(world) if r != FAULTY]
    if rank == FAULTY:
        if fault == "stall_before":  # never arrives until the others gave up, then calls like them
            _wait_for_reports(folder_path, healthy)
        else:
            _inject(fault, rank, world, folder_path)
    start = time.monotonic()
    outcome: dict = {"rank": rank, "status": "ok"}
    try:
        _attention(rank, world)
    except Exception as exc:  # noqa: BLE001 - the outcome is the point
        outcome.update(status="raised", type=type(exc).__name__, kinds=[c.__name__ for c in type(exc).__mro__],
                       message=str(exc))
    outcome["seconds"] = time.monotonic() - start
    (folder_path / f"rank{rank}.tmp").write_text(json.dumps(outcome))
    os.replace(folder_path / f"rank{rank}.tmp", folder_path / f"rank{rank}.json")
    if rank == FAULTY and fault.startswith("raise"):
        _wait_for_reports(folder_path, healthy)  # alive, but no longer in the ring
    os._exit(0)  # no barrier or group teardown: the group is broken on purpose


def run_faulty_world(world: int, tmp_path: Path, fault: str, limit_s: float = REPORT_LIMIT_S) -> dict[int, dict]:
    """Spawn `world` gloo ranks where rank FAULTY does `fault`; {rank: outcome} of those that reported."""
    folder = tmp_path / f"outcomes_{fault}_{world}"
    folder.mkdir()
    init_file = str(tmp_path / f"rendezvous_{fault}_{world}_{time.monotonic_ns()}")
    context = mp.start_processes(_entry, args=(world, init_file, fault, str(folder)), nprocs=world, join=False,
                                 start_method="forkserver")
    deadline = time.monotonic() + limit_s
    try:
        while time.monotonic() < deadline and any(p.is_alive() for p in context.processes):
            time.sleep(0.1)
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join(5)
    return {int(path.stem[4:]): json.loads(path.read_text()) for path in folder.glob("rank*.json")}
