"""The context-parallel modes of hilbert_lab.distributed side by side, for benchmarks (benchmarks/bench_ring.py).

On a world of P ranks, each mode runs one attention call on this rank's shard of a length-N sequence:
- "ring": ring_dilated_attention over the world;
- "ulysses": ulysses_dilated_attention over the world (head-parallel: H divisible by P);
- "hybrid": hybrid_dilated_attention on a DeviceMesh of ring 2 x ulysses P/2 (`hybrid_mesh_shape`: an even
  P >= 4, H divisible by P/2). On 2 ranks a 2 x 1 or 1 x 2 mesh is the ring or head-parallel itself: skipped.
`skip_reason` says why a mode does not run on a world (None: it runs); `placement` gives what one rank holds
(its global positions, in storage order) and the call; `sent_bytes` counts what one call sends per rank.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as dist

from hilbert_lab.distributed import comm
from hilbert_lab.distributed.modules import PARALLEL_MODES
from hilbert_lab.distributed.hybrid import MESH_DIMS, hybrid_dilated_attention, hybrid_positions
from hilbert_lab.distributed.ring import ring_dilated_attention
from hilbert_lab.distributed.sharding import shard_positions
from hilbert_lab.distributed.ulysses import ulysses_dilated_attention

_MESHES: dict[tuple[str, int, int], object] = {}  # (device type, R, U) -> the DeviceMesh, made once per world


def ring_layout(causal: bool) -> str:
    """The shard layout the modes are compared on: zigzag (causal load balance) for causal, else contiguous."""
    return "zigzag" if causal else "contiguous"


def hybrid_mesh_shape(world: int) -> Optional[tuple[int, int]]:
    """(R, U) of the hybrid mesh on `world` ranks: (2, P/2) for an even P >= 4, else None."""
    return (2, world // 2) if world >= 4 and world % 2 == 0 else None


def skip_reason(mode: str, world: int, heads: int) -> Optional[str]:
    """Why `mode` does not run on `world` ranks with `heads` query heads, or None where it runs."""
    if mode not in PARALLEL_MODES:
        raise ValueError(f"mode must be one of {PARALLEL_MODES}, got {mode!r}")
    if mode == "ring":
        return None
    if world == 1:
        return "one rank: every mode is the single-GPU engine"
    if mode == "ulysses":
        return None if heads % world == 0 else f"heads {heads} not divisible by the head-parallel degree {world}"
    shape = hybrid_mesh_shape(world)
    if shape is None:
        return (f"{world} ranks: hybrid runs on an even number of ranks >= 4 (mesh ring 2 x ulysses P/2); on 2 "
                f"ranks a 2 x 1 or 1 x 2 mesh is the ring or ulysses itself")
    if heads % shape[1]:
        return f"heads {heads} not divisible by the hybrid mesh's ulysses degree {shape[1]}"
    return None


def default_seq_len(seq_lens: Sequence[int], world: int) -> Optional[int]:
    """The largest of `seq_lens` divisible by 2P (the granularity every mode's shards need on either layout),
    or None."""
    fitting = [n for n in seq_lens if n % (2 * world) == 0]
    return max(fitting) if fitting else None


@dataclass(frozen=True)
class Placement:
    """What this rank holds in one mode (its global positions, in storage order) and the call: `call(q, k, v,
    **pattern)` with the shards of those positions; mesh: (R, U) for hybrid, else None."""

    mode: str
    layout: str
    positions: torch.Tensor
    call: Callable
    mesh: Optional[tuple[int, int]] = None


def _mesh(device_type: str, shape: tuple[int, int]):
    """The ("ring", "ulysses") DeviceMesh of the world, made once (every rank must call it the first time)."""
    key = (device_type, *shape)
    if key not in _MESHES:
        from torch.distributed.device_mesh import init_device_mesh

        _MESHES[key] = init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)
    return _MESHES[key]


def placement(mode: str, seq_len: int, layout: str, device: torch.device) -> Placement:
    """This rank's Placement in `mode` (see skip_reason first) for a length-`seq_len` sequence over the world;
    the first hybrid placement makes the mesh (collective: every rank calls it)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if mode == "ring":
        return Placement(mode, layout, shard_positions(rank, world, seq_len, layout),
                         functools.partial(ring_dilated_attention, layout=layout))
    if mode == "ulysses":
        return Placement(mode, layout, shard_positions(rank, world, seq_len, layout),
                         functools.partial(ulysses_dilated_attention, layout=layout))
    shape = hybrid_mesh_shape(world)
    if mode != "hybrid" or shape is None:
        raise ValueError(f"no placement for mode {mode!r} on {world} ranks: {skip_reason(mode, world, 0)}")
    mesh = _mesh(device.type, shape)
    r, u = mesh.get_local_rank("ring"), mesh.get_local_rank("ulysses")
    return Placement(mode, layout, hybrid_positions(r, u, *shape, seq_len, layout),
                     functools.partial(hybrid_dilated_attention, mesh=mesh, layout=layout), shape)


def sent_bytes(step: Callable[[], object]) -> int:
    """Bytes this rank sends in one `step()`: ring steps and all-to-alls as comm.STATS counts them (an all-to-all
    counts the (P - 1) / P of its buffer that leaves the rank; the configuration check is not counted)."""
    comm.reset_stats()
    step()
    return int(comm.STATS.bytes)
