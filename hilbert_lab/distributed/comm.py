"""Point-to-point ring communicator with message/byte counters (isend/irecv on gloo, batched on NCCL).

A ring is an ordered list of global ranks. `RingComm.exchange(sends, recvs)` posts every send and
receive of one pipeline step at once and returns a handle to wait on, so the caller computes on
the previous buffer while this step's buffers travel (double buffering). On NCCL the step's
operations go through one `batch_isend_irecv`; on gloo (where batched calls can hang) through
plain isend/irecv pairs. Every send is counted, globally and per label, in `STATS`.
"""
from __future__ import annotations

from collections import defaultdict
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


class _Handle:
    """Pending operations of one exchange; `wait()` blocks until all completed."""

    def __init__(self, works: list) -> None:
        self._works = works

    def wait(self) -> None:
        for work in self._works:
            if work is not None:
                work.wait()
        self._works = []


_WARMED_GROUPS: set[int] = set()


class RingComm:
    """Ring of global `ranks` (default: all ranks of `group`, in group order) with send counters.

    Messages go through `group` (default: the world) addressed by global rank. `index` is this
    process's position in the ring (None when it is not a member).
    """

    def __init__(self, ranks: Sequence[int] | None = None, group: dist.ProcessGroup | None = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError("RingComm needs torch.distributed to be initialised (dist.init_process_group)")
        self.group = group
        if ranks is None:
            ranks = [dist.get_global_rank(group, r) if group is not None else r
                     for r in range(dist.get_world_size(group))]
        self.ranks = [int(r) for r in ranks]
        if len(set(self.ranks)) != len(self.ranks) or not self.ranks:
            raise ValueError(f"ranks must be a non-empty list of distinct global ranks, got {list(ranks)}")
        self.stats = CommStats()  # this communicator's sends (STATS counts every communicator's)
        me = dist.get_rank()
        self.index = self.ranks.index(me) if me in self.ranks else None
        self.size = len(self.ranks)
        self.nccl = "nccl" in str(dist.get_backend(group))
        if self.nccl and id(group) not in _WARMED_GROUPS:
            # batch_isend_irecv on NCCL needs the communicator to exist on every rank first.
            dist.barrier(group=group)
            _WARMED_GROUPS.add(id(group))

    @property
    def next_rank(self) -> int:
        return self.ranks[(self.index + 1) % self.size]

    @property
    def prev_rank(self) -> int:
        return self.ranks[(self.index - 1) % self.size]

    def global_rank(self, member: int) -> int:
        """Global rank of ring member `member` (taken modulo the ring size)."""
        return self.ranks[member % self.size]

    def exchange(
        self,
        sends: Sequence[tuple[int, torch.Tensor]] = (),
        recvs: Sequence[tuple[int, torch.Tensor]] = (),
        label: str = "",
    ) -> _Handle:
        """Post sends [(global dst, tensor)] and receives [(global src, buffer)]; returns a handle.

        Tensors must be contiguous; receive buffers are filled in place once `wait()` returns.
        """
        for _, tensor in list(sends) + list(recvs):
            if not tensor.is_contiguous():
                raise ValueError("exchange needs contiguous tensors")
        if not sends and not recvs:
            return _Handle([])
        for _, tensor in sends:
            STATS.record(label, tensor_bytes(tensor))
            self.stats.record(label, tensor_bytes(tensor))
        if self.nccl and all(t.is_cuda for _, t in list(sends) + list(recvs)):
            ops = [dist.P2POp(dist.isend, t, peer, group=self.group) for peer, t in sends]
            ops += [dist.P2POp(dist.irecv, t, peer, group=self.group) for peer, t in recvs]
            return _Handle(dist.batch_isend_irecv(ops))
        works = [dist.irecv(t, src=peer, group=self.group) for peer, t in recvs]
        works += [dist.isend(t, dst=peer, group=self.group) for peer, t in sends]
        return _Handle(works)

    def send_recv(self, send: torch.Tensor | None, recv: torch.Tensor | None, label: str = "") -> _Handle:
        """One ring step: send `send` to the next member and receive `recv` from the previous one."""
        return self.exchange(
            [] if send is None else [(self.next_rank, send)],
            [] if recv is None else [(self.prev_rank, recv)],
            label,
        )


def pack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Concatenate tensors of any dtypes into one uint8 buffer (each part 8-byte aligned)."""
    parts = []
    for t in tensors:
        raw = t.contiguous().reshape(-1).view(torch.uint8)
        parts.append(raw)
        pad = (-raw.numel()) % 8
        if pad:
            parts.append(torch.zeros(pad, dtype=torch.uint8, device=raw.device))
    if not parts:
        return torch.empty(0, dtype=torch.uint8)
    return torch.cat(parts)


def packed_size(specs: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> int:
    """Bytes of `pack` for tensors of the given (shape, dtype) specs."""
    total = 0
    for shape, dtype in specs:
        n = int(torch.Size(shape).numel()) * torch.empty(0, dtype=dtype).element_size()
        total += n + (-n) % 8
    return total


def unpack(buffer: torch.Tensor, specs: Sequence[tuple[tuple[int, ...], torch.dtype]]) -> list[torch.Tensor]:
    """Views into a `pack`ed uint8 buffer for the given (shape, dtype) specs."""
    if packed_size(specs) != buffer.numel():
        raise ValueError(f"buffer has {buffer.numel()} bytes but the specs describe {packed_size(specs)}")
    out, start = [], 0
    for shape, dtype in specs:
        n = int(torch.Size(shape).numel()) * torch.empty(0, dtype=dtype).element_size()
        out.append(buffer[start : start + n].view(dtype).view(shape))
        start += n + (-n) % 8
    return out
