"""Point-to-point ring communicator with message/byte counters (isend/irecv on gloo, batched on NCCL).

A ring is an ordered list of global ranks. `RingComm.exchange(sends, recvs)` posts every send and
receive of one pipeline step at once and returns a handle to wait on, so the caller computes on
the previous buffer while this step's buffers travel (double buffering). On NCCL the step's
operations go through one `batch_isend_irecv`; on gloo (where batched calls can hang) through
plain isend/irecv pairs. Every send is counted, globally and per label, in `STATS`.

Every wait is bounded: a step whose operations do not complete within the ring's `timeout_s`
(default `HILBERT_LAB_RING_TIMEOUT_S` or 120 s) raises `RingTimeoutError`, and one that fails (a
peer closed its connection) `RingCommError`, both naming this rank, the label (e.g.
"forward/branch1"), the step and the peers waited for. On gloo the host waits for each step. On NCCL
the stream waits (the host goes on queueing kernels) and the host checks each step, bounded, once
DEFERRED_STEPS later steps have been posted (or at `settle_transfers()`): a host that waited for every
transfer would leave the GPU idle while it queues the next step's kernels. timeout_s=inf: plain
`work.wait()`, with only the process group's own timeout.
"""
from __future__ import annotations

import datetime
import math
import numbers
import os
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Sequence

import torch
import torch.distributed as dist


@dataclass
class CommStats:
    """Counters of sent messages and bytes, in total and per label (e.g. "forward/branch2")."""

    messages: int = 0
    bytes: int = 0
    by_label: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))

    def record(self, label: str, num_bytes: int) -> None:
        self.messages += 1
        self.bytes += num_bytes
        entry = self.by_label[label]
        entry[0] += 1
        entry[1] += num_bytes

    def messages_for(self, prefix: str) -> int:
        """Messages sent under labels starting with `prefix`."""
        return sum(m for label, (m, _) in self.by_label.items() if label.startswith(prefix))

    def bytes_for(self, prefix: str) -> int:
        """Bytes sent under labels starting with `prefix`."""
        return sum(b for label, (_, b) in self.by_label.items() if label.startswith(prefix))

    def reset(self) -> None:
        self.messages = 0
        self.bytes = 0
        self.by_label.clear()


STATS = CommStats()


def reset_stats() -> None:
    """Zero this process's global communication counters."""
    STATS.reset()


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


TIMEOUT_ENV = "HILBERT_LAB_RING_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 120.0


class RingCommError(RuntimeError):
    """A ring operation failed (a peer crashed or closed its connection); names the rank, label and step.

    The process group is not usable afterwards: destroy it and start again.
    """


class RingTimeoutError(RingCommError, TimeoutError):
    """A ring operation did not complete within the ring's timeout (a peer stalled or stopped)."""


def resolve_timeout(timeout_s: float | None = None) -> float:
    """Seconds a ring operation may wait: timeout_s, else $HILBERT_LAB_RING_TIMEOUT_S, else 120 (inf: no bound)."""
    source = "timeout_s"
    if timeout_s is None:
        text = os.environ.get(TIMEOUT_ENV, "").strip()
        if not text:
            return DEFAULT_TIMEOUT_S
        source = f"${TIMEOUT_ENV}"
        try:
            timeout_s = float(text)
        except ValueError:
            raise ValueError(f"{source} must be a number of seconds > 0 (or inf), got {text!r}") from None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not timeout_s > 0:
        raise ValueError(f"{source} must be a number of seconds > 0 (or inf for no ring timeout), got {timeout_s!r}")
    return float(timeout_s)


DEFERRED_STEPS = 2  # device-side steps (NCCL) the host may run ahead of before it checks the oldest
_DEFERRED: deque = deque()  # (works, timeout_s, context) of device-side steps the host has not checked yet


def wait_bounded(works: Sequence[tuple[object, str]], timeout_s: float, context: str, *,
                 on_device: bool = False) -> None:
    """Wait for every (work, what it does) within timeout_s seconds in all, or raise naming what is missing.

    context: who waits and where (e.g. "rank 1: forward/branch0 step 2"); what: e.g. "receive from rank 0".
    on_device (NCCL works on CUDA tensors, finite timeout_s): the current stream waits for the works and the
    host returns at once; the host then checks, bounded, every earlier device-side step that has completed
    and the oldest ones beyond DEFERRED_STEPS (settle_transfers checks them all).
    """
    if on_device and not math.isinf(timeout_s):
        for work, _ in works:
            if work is not None:
                work.wait()  # no timeout: the stream waits, not the host
        _DEFERRED.append((works, timeout_s, context))
        while _DEFERRED and (len(_DEFERRED) > DEFERRED_STEPS or _completed(_DEFERRED[0][0])):
            wait_bounded(*_DEFERRED.popleft())
        return
    deadline = time.monotonic() + timeout_s
    for index, (work, what) in enumerate(works):
        if work is None:
            continue
        try:
            if math.isinf(timeout_s):
                work.wait()
            else:
                remaining = max(deadline - time.monotonic(), 1e-3)
                work.wait(timeout=datetime.timedelta(seconds=remaining))
        except Exception as exc:  # torch raises RuntimeError for both timeouts and closed connections
            later = [w for _, w in works[index + 1 :]]
            pending = works[index][1] + (f" (then: {', '.join(later)})" if later else "")
            message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if time.monotonic() >= deadline or "timed out" in message.lower():
                raise RingTimeoutError(
                    f"{context}: no progress within {timeout_s:g} s waiting to {pending}; a rank of the ring has "
                    f"stalled, stopped or is not running the same call (raise the bound with timeout_s= or "
                    f"${TIMEOUT_ENV}); the process group is not usable after this error"
                ) from exc
            raise RingCommError(
                f"{context}: failed waiting to {pending} ({message}); a rank of the ring has probably crashed "
                f"or raised; the process group is not usable after this error"
            ) from exc


def _completed(works: Sequence[tuple[object, str]]) -> bool:
    return all(work is None or work.is_completed() for work, _ in works)


def settle_transfers() -> None:
    """Check, on the host and bounded, every device-side step not checked yet (RingTimeoutError /
    RingCommError as a step's own wait): call it where the host waits for the device anyway (e.g. before
    reading a loss), so that a peer lost in the last steps of a call is reported within the ring's bound."""
    while _DEFERRED:
        wait_bounded(*_DEFERRED.popleft())


class _Handle:
    """Pending operations of one exchange; `wait()` blocks until all completed, at most timeout_s seconds."""

    def __init__(self, works: list[tuple[object, str]], timeout_s: float = math.inf, context: str = "",
                 on_device: bool = False) -> None:
        self._works = works
        self._timeout_s = timeout_s
        self._context = context
        self._on_device = on_device

    def wait(self) -> None:
        works, self._works = self._works, []
        wait_bounded(works, self._timeout_s, self._context, on_device=self._on_device)


_WARMED_GROUPS: set[int] = set()


class RingComm:
    """Ring of global `ranks` (default: all ranks of `group`, in group order) with send counters.

    Messages go through `group` (default: the world) addressed by global rank. `index` is this
    process's position in the ring (None when it is not a member). Every wait is bounded by
    `timeout_s` (see `resolve_timeout`): RingTimeoutError / RingCommError name rank, label and step.
    """

    def __init__(self, ranks: Sequence[int] | None = None, group: dist.ProcessGroup | None = None, *,
                 timeout_s: float | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("RingComm needs torch.distributed to be initialised (dist.init_process_group)")
        self.group = group
        self.timeout_s = resolve_timeout(timeout_s)
        if ranks is None:
            ranks = [dist.get_global_rank(group, r) if group is not None else r
                     for r in range(dist.get_world_size(group))]
        self.ranks = [int(r) for r in ranks]
        if len(set(self.ranks)) != len(self.ranks) or not self.ranks:
            raise ValueError(f"ranks must be a non-empty list of distinct global ranks, got {list(ranks)}")
        self.stats = CommStats()  # this communicator's sends (STATS counts every communicator's)
        self.rank = dist.get_rank()
        self.index = self.ranks.index(self.rank) if self.rank in self.ranks else None
        self.size = len(self.ranks)
        self.nccl = "nccl" in str(dist.get_backend(group))

    def _warm(self) -> None:
        """batch_isend_irecv on NCCL needs the group's communicator to exist on every rank first: one barrier at
        the group's first exchange (not at construction: a caller may build the ring before its ranks agree)."""
        if self.nccl and id(self.group) not in _WARMED_GROUPS:
            work = dist.barrier(group=self.group, async_op=True)
            wait_bounded([(work, "pass the barrier that sets up the group's communicator")], self.timeout_s,
                         self.context("set-up", None))
            _WARMED_GROUPS.add(id(self.group))

    @property
    def next_rank(self) -> int:
        return self.ranks[(self.index + 1) % self.size]

    @property
    def prev_rank(self) -> int:
        return self.ranks[(self.index - 1) % self.size]

    def global_rank(self, member: int) -> int:
        """Global rank of ring member `member` (taken modulo the ring size)."""
        return self.ranks[member % self.size]

    def context(self, label: str, step: int | None) -> str:
        """"rank R (member i of ring [...]): label step t", the prefix of this ring's errors."""
        where = f"{label or 'exchange'}" + ("" if step is None else f" step {step}")
        return f"rank {self.rank} (member {self.index} of the ring of ranks {self.ranks}): {where}"

    def exchange(
        self,
        sends: Sequence[tuple[int, torch.Tensor]] = (),
        recvs: Sequence[tuple[int, torch.Tensor]] = (),
        label: str = "",
        step: int | None = None,
    ) -> _Handle:
        """Post sends [(global dst, tensor)] and receives [(global src, buffer)]; returns a handle.

        Tensors must be contiguous; receive buffers are filled in place once `wait()` returns. The
        handle's wait raises RingTimeoutError after timeout_s seconds without completion.
        """
        for _, tensor in list(sends) + list(recvs):
            if not tensor.is_contiguous():
                raise ValueError("exchange needs contiguous tensors")
        if not sends and not recvs:
            return _Handle([])
        self._warm()
        for _, tensor in sends:
            STATS.record(label, tensor_bytes(tensor))
            self.stats.record(label, tensor_bytes(tensor))
        context = self.context(label, step)
        described = [f"send to rank {peer}" for peer, _ in sends] + [f"receive from rank {peer}" for peer, _ in recvs]
        on_device = self.nccl and all(t.is_cuda for _, t in list(sends) + list(recvs))
        try:
            if on_device:
                ops = [dist.P2POp(dist.isend, t, peer, group=self.group) for peer, t in sends]
                ops += [dist.P2POp(dist.irecv, t, peer, group=self.group) for peer, t in recvs]
                works = dist.batch_isend_irecv(ops)
                if len(works) != len(ops):  # coalesced: one work for the whole step
                    described = [" and ".join(described)] * len(works)
            else:
                described = described[len(sends):] + described[:len(sends)]
                works = [dist.irecv(t, src=peer, group=self.group) for peer, t in recvs]
                works += [dist.isend(t, dst=peer, group=self.group) for peer, t in sends]
        except RuntimeError as exc:  # a connection already closed by an earlier failure
            raise RingCommError(f"{context}: could not post the step's operations ({str(exc).splitlines()[0]}); "
                                f"a rank of the ring has failed before; the process group is not usable") from exc
        return _Handle(list(zip(works, described)), self.timeout_s, context, on_device)

    def send_recv(self, send: torch.Tensor | None, recv: torch.Tensor | None, label: str = "",
                  step: int | None = None) -> _Handle:
        """One ring step: send `send` to the next member and receive `recv` from the previous one."""
        return self.exchange(
            [] if send is None else [(self.next_rank, send)],
            [] if recv is None else [(self.prev_rank, recv)],
            label, step,
        )


def packed_size(specs: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> int:
    """Bytes of one uint8 buffer holding tensors of the given (shape, dtype) specs, each 8-byte aligned."""
    total = 0
    for shape, dtype in specs:
        n = int(torch.Size(shape).numel()) * torch.empty(0, dtype=dtype).element_size()
        total += n + (-n) % 8
    return total


def unpack(buffer: torch.Tensor, specs: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> list[torch.Tensor]:
    """Views (shape, dtype) into a uint8 buffer of `packed_size(specs)` bytes, in order, each 8-byte aligned."""
    if packed_size(specs) != buffer.numel():
        raise ValueError(f"buffer has {buffer.numel()} bytes but the specs describe {packed_size(specs)}")
    out, start = [], 0
    for shape, dtype in specs:
        n = int(torch.Size(shape).numel()) * torch.empty(0, dtype=dtype).element_size()
        out.append(buffer[start : start + n].view(dtype).view(shape))
        start += n + (-n) % 8
    return out
