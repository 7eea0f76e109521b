"""The all-to-all between sequence shards and head shards (head-parallel attention), with its exact adjoint.

P ranks each hold a shard (B, N/P, H_x, D) of the sequence in a layout of sharding.py (contiguous or
zigzag). `sequence_to_heads` gives rank r the heads `heads[r]` of the whole sequence in token order
(B, N, h, D); `heads_to_sequence` is its transpose: from every rank's (B, N, h, D) it gives each rank its
shard (B, N/P, H_x, D), adding up where several ranks hold copies of one head (key/value heads replicated
for grouped-query attention). Each is the other's backward, so gradients are exact. One all_to_all_single
per call over a contiguous (P, B, N/P, h, D) buffer; every wait is bounded (comm.wait_bounded; on NCCL the
stream waits and the host checks later).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from hilbert_lab.distributed.comm import STATS, tensor_bytes, wait_bounded
from hilbert_lab.distributed.sharding import shard, unshard, zigzag_shard, zigzag_unshard


@dataclass(frozen=True, eq=False)
class HeadExchange:
    """Who exchanges what: the ranks of `group` (P = world_size, this process `rank`), the sequence layout
    of their shards, the heads each rank gets (`heads[r]`: global head indices, one count for every rank;
    None: rank r gets the r-th block of H_x / P heads), H_x, and the bound of every wait."""

    group: Optional[dist.ProcessGroup]
    world_size: int
    rank: int
    layout: str
    num_heads: int
    heads: Optional[tuple[tuple[int, ...], ...]] = None
    timeout_s: float = math.inf
    label: str = "heads"

    @property
    def local_heads(self) -> int:
        """h: the heads a rank holds after sequence_to_heads."""
        return self.num_heads // self.world_size if self.heads is None else len(self.heads[0])

    def index(self, device: torch.device) -> Optional[torch.Tensor]:
        """int64 (P * h,): the global heads of rank 0, then rank 1, ... (None for the plain blocks)."""
        if self.heads is None:
            return None
        return torch.tensor([h for heads in self.heads for h in heads], dtype=torch.int64, device=device)


def kv_heads_per_rank(num_heads: int, num_kv_heads: int, world_size: int) -> Optional[tuple[tuple[int, ...], ...]]:
    """The key/value heads each rank needs for its query heads [r H/P, (r + 1) H/P) (query head h reads key/value
    head h // (H / H_kv)), in the order the engine pairs them locally (local query head j reads local key/value
    head j // (H/P / h_kv)): None where H_kv / P consecutive heads per rank do it (P divides H_kv), else
    groups of g = gcd(H / H_kv, H / P) query heads, each with one (replicated) key/value head."""
    per_rank, per_kv = num_heads // world_size, num_heads // num_kv_heads
    if num_kv_heads % world_size == 0:
        return None
    run = math.gcd(per_kv, per_rank)  # query heads of a rank that read one key/value head, in aligned runs
    return tuple(tuple((r * per_rank + i * run) // per_kv for i in range(per_rank // run)) for r in range(world_size))


def _all_to_all(buffer: torch.Tensor, exchange: HeadExchange, what: str) -> torch.Tensor:
    """buffer (P, ...) contiguous, chunk r for rank r -> (P, ...), chunk s from rank s."""
    received = torch.empty_like(buffer)
    work = dist.all_to_all_single(received, buffer, group=exchange.group, async_op=True)
    STATS.record(f"{exchange.label}/{what}", tensor_bytes(buffer) * (exchange.world_size - 1) // exchange.world_size)
    on_device = buffer.is_cuda and "nccl" in str(dist.get_backend(exchange.group))
    wait_bounded([(work, f"exchange {what} with the {exchange.world_size} ranks")], exchange.timeout_s,
                 f"rank {dist.get_rank()}: {exchange.label} all-to-all ({what})", on_device=on_device)
    return received


def _to_heads(x: torch.Tensor, exchange: HeadExchange) -> torch.Tensor:
    """(B, N/P, H_x, D) shard -> (B, N, h, D) of this rank's heads, in token order."""
    batch, rows, _, dim = x.shape
    index = exchange.index(x.device)
    picked = x if index is None else x.index_select(2, index)  # (B, N/P, P * h, D): rank 0's heads first
    buffer = picked.reshape(batch, rows, exchange.world_size, -1, dim).permute(2, 0, 1, 3, 4).contiguous()
    parts = list(_all_to_all(buffer, exchange, "sequence to heads").unbind(0))  # rank s's shard of my heads
    return unshard(parts) if exchange.layout == "contiguous" else zigzag_unshard(parts)


def _to_sequence(y: torch.Tensor, exchange: HeadExchange) -> torch.Tensor:
    """(B, N, h, D) of this rank's heads -> (B, N/P, H_x, D) shard (copies of one head added up)."""
    cut = shard if exchange.layout == "contiguous" else zigzag_shard
    buffer = torch.stack([cut(y, r, exchange.world_size) for r in range(exchange.world_size)])
    received = _all_to_all(buffer, exchange, "heads to sequence")  # (P, B, N/P, h, D): rank s's heads
    batch, rows, dim = received.shape[1], received.shape[2], received.shape[4]
    gathered = received.permute(1, 2, 0, 3, 4).reshape(batch, rows, -1, dim)
    index = exchange.index(y.device)
    if index is None:
        return gathered
    out = gathered.new_zeros((batch, rows, exchange.num_heads, dim))
    return out.index_add_(2, index, gathered)


class _SequenceToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, exchange: HeadExchange) -> torch.Tensor:
        ctx.exchange = exchange
        return _to_heads(x, exchange)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _to_sequence(grad.contiguous(), ctx.exchange), None


class _HeadsToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y: torch.Tensor, exchange: HeadExchange) -> torch.Tensor:
        ctx.exchange = exchange
        return _to_sequence(y, exchange)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _to_heads(grad.contiguous(), ctx.exchange), None


def sequence_to_heads(x: torch.Tensor, exchange: HeadExchange) -> torch.Tensor:
    """(B, N/P, H_x, D) sequence shard -> (B, N, h, D): this rank's heads of the whole sequence in token order;
    differentiable (its backward is heads_to_sequence)."""
    return _SequenceToHeads.apply(x, exchange)


def heads_to_sequence(y: torch.Tensor, exchange: HeadExchange) -> torch.Tensor:
    """(B, N, h, D) of this rank's heads -> (B, N/P, H_x, D) sequence shard, copies of a head added up;
    differentiable (its backward is sequence_to_heads)."""
    return _HeadsToSequence.apply(y, exchange)
