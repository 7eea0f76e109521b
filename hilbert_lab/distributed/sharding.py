"""Sequence layouts over ranks: contiguous and zigzag shard/unshard, positions and all-gather.

contiguous: rank i holds tokens [i*N/P, (i+1)*N/P).
zigzag (load balance for causal attention): the sequence is cut into 2P equal chunks and rank i
holds chunks i and 2P-1-i, in that order (early + late tokens, so causal work is even).
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

LAYOUTS = ("contiguous", "zigzag")


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _check_rank(rank: int, world_size: int) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an integer in [0, {world_size}), got {rank!r}")


def _check_dim(x: torch.Tensor, dim: int) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be an integer in [{-x.dim()}, {x.dim()}) for a {x.dim()}D tensor, got {dim!r}")


def check_divisible(seq_len: int, world_size: int, layout: str = "contiguous") -> int:
    """Shard length N/P; ValueError naming the constraint when N is not divisible (2P for zigzag)."""
    _check_layout(layout)
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
    parts = world_size if layout == "contiguous" else 2 * world_size
    if seq_len % parts != 0:
        what = "the number of ranks" if layout == "contiguous" else "2 x the number of ranks (zigzag chunks)"
        raise ValueError(
            f"sequence length {seq_len} must be divisible by {what} = {parts} "
            f"(equal shards: N % {parts} == 0), got remainder {seq_len % parts}"
        )
    return seq_len // world_size


def shard_positions(rank: int, world_size: int, seq_len: int, layout: str = "contiguous") -> torch.Tensor:
    """int64 (N/P,) global positions held by `rank`, in storage order."""
    _check_rank(rank, world_size)
    n = check_divisible(seq_len, world_size, layout)
    if layout == "contiguous":
        return torch.arange(rank * n, (rank + 1) * n, dtype=torch.int64)
    c = n // 2
    late = 2 * world_size - 1 - rank
    return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange(late * c, (late + 1) * c)])


def shard(x: torch.Tensor, rank: int, world_size: int, *, dim: int = 1) -> torch.Tensor:
    """The contiguous shard of the full sequence `x` (sequence along `dim`) held by `rank`."""
    _check_rank(rank, world_size)
    _check_dim(x, dim)
    n = check_divisible(x.shape[dim], world_size, "contiguous")
    return x.narrow(dim, rank * n, n)


def unshard(parts: Sequence[torch.Tensor], *, dim: int = 1) -> torch.Tensor:
    """Inverse of `shard`: the full sequence from the P contiguous shards in rank order."""
    if not parts:
        raise ValueError("parts must be a non-empty list of shards in rank order")
    return torch.cat(list(parts), dim=dim)


def zigzag_shard(x: torch.Tensor, rank: int, world_size: int, *, dim: int = 1) -> torch.Tensor:
    """Rank's zigzag shard: chunks rank and 2P-1-rank of 2P equal chunks of `x` along `dim`."""
    _check_rank(rank, world_size)
    _check_dim(x, dim)
    check_divisible(x.shape[dim], world_size, "zigzag")
    chunks = x.chunk(2 * world_size, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * world_size - 1 - rank]], dim=dim)


def zigzag_unshard(parts: Sequence[torch.Tensor], *, dim: int = 1) -> torch.Tensor:
    """Inverse of `zigzag_shard`: the full sequence from the P zigzag shards in rank order."""
    if not parts:
        raise ValueError("parts must be a non-empty list of shards in rank order")
    world_size = len(parts)
    chunks: list[torch.Tensor | None] = [None] * (2 * world_size)
    for rank, part in enumerate(parts):
        if part.shape[dim] % 2:
            raise ValueError(f"zigzag shards must have an even length along dim {dim}, got {part.shape[dim]}")
        early, late = part.chunk(2, dim=dim)
        chunks[rank], chunks[2 * world_size - 1 - rank] = early, late
    return torch.cat(chunks, dim=dim)


def all_gather_sequence(
    x: torch.Tensor, *, group: dist.ProcessGroup | None = None, layout: str = "contiguous", dim: int = 1
) -> torch.Tensor:
    """Every rank's shard gathered into the full sequence (O(N) memory: for checks and examples)."""
    _check_layout(layout)
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return unshard(parts, dim=dim) if layout == "contiguous" else zigzag_unshard(parts, dim=dim)
