"""Hybrid context parallelism: head-parallel groups (all-to-all) around rings, on a 2-D DeviceMesh.

The mesh has a "ring" dimension of R ranks and a "ulysses" dimension of U ranks (P = R U). The sequence is cut
as the ring cuts it over R ranks (layout "contiguous" or "zigzag"), and each ring shard of N/R tokens into U
equal pieces in storage order: rank (ring r, ulysses u) holds piece u of ring shard r (`hybrid_positions`).
An all-to-all over the ulysses group gives each rank the heads [u H/U, (u + 1) H/U) of its whole ring shard
(exchange.py); the ring runs those heads, keeping the global heads' offsets, around the ring group
(ring.ring_dilated_attention(global_heads=...)); an all-to-all returns the output (and LSE). Gradients are
exact (the transposed all-to-alls around the ring's exact backward).

Safety: the configuration agreement runs over the ulysses group, then over the ring group carrying any error
of the first, so every rank of the mesh raises together before any data moves.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from hilbert_lab.attention.executors import Executor
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.validation import validate_attention_inputs, validate_cu_seqlens
from hilbert_lab.distributed.agreement import agree_on_configuration, configuration_fields
from hilbert_lab.distributed.comm import DEFAULT_TIMEOUT_S, resolve_timeout
from hilbert_lab.distributed.ring import ring_dilated_attention
from hilbert_lab.distributed.sharding import LAYOUTS, check_divisible, shard_positions
from hilbert_lab.distributed.ulysses import back_to_sequence, check_head_degree, heads_of_sequence

MESH_DIMS = ("ring", "ulysses")  # the names of the mesh's two dimensions


def hybrid_positions(ring_index: int, ulysses_index: int, ring_degree: int, ulysses_degree: int, seq_len: int,
                     layout: str = "contiguous") -> torch.Tensor:
    """int64 (N/P,): the global positions rank (ring_index, ulysses_index) holds, in storage order: piece
    ulysses_index of U of the ring shard `shard_positions(ring_index, R, N, layout)`."""
    ring_shard = shard_positions(ring_index, ring_degree, seq_len, layout)
    if isinstance(ulysses_degree, bool) or not isinstance(ulysses_degree, int) or ulysses_degree < 1 \
            or ring_shard.numel() % ulysses_degree:
        raise ValueError(f"ulysses_degree must be a positive integer dividing the ring shard length "
                         f"{ring_shard.numel()}, got {ulysses_degree!r}")
    if isinstance(ulysses_index, bool) or not isinstance(ulysses_index, int) or not 0 <= ulysses_index < ulysses_degree:
        raise ValueError(f"ulysses_index must be an integer in [0, {ulysses_degree}), got {ulysses_index!r}")
    return ring_shard.chunk(ulysses_degree)[ulysses_index]


def check_mesh(mesh) -> tuple[str, ...]:
    """The dimension names of `mesh`, a 2-D DeviceMesh with dimensions MESH_DIMS (in either order); else a
    ValueError naming mesh."""
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if getattr(mesh, "ndim", None) != 2 or sorted(names) != sorted(MESH_DIMS):
        raise ValueError(f"mesh must be a 2-D DeviceMesh with dimensions named {MESH_DIMS}, got "
                         f"{type(mesh).__name__} with dimensions {names or None}")
    return names


def _mesh_groups(mesh) -> tuple[dist.ProcessGroup, dist.ProcessGroup, int, int, int]:
    """(ring group, ulysses group, R, U, this rank's ulysses index) of a 2-D mesh."""
    names = check_mesh(mesh)
    return (mesh.get_group("ring"), mesh.get_group("ulysses"), mesh.size(names.index("ring")),
            mesh.size(names.index("ulysses")), mesh.get_local_rank("ulysses"))


def hybrid_dilated_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    segment_lengths: Sequence[int],
    dilation_rates: Sequence[int],
    mesh,
    causal: bool = False,
    mode: str = "longnet",
    layout: str = "contiguous",
    backend: str | Executor = "auto",
    scale: float | None = None,
    return_lse: bool = False,
    timeout_s: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
):
    """This rank's shard of the single-process engine's dilated attention, head-parallel x ring on `mesh`.

    q: (B, N/P, H, D), k, v: (B, N/P, H_kv, D): the positions `hybrid_positions(r, u, R, U, N, layout)` of rank
    (r, u) of the 2-D DeviceMesh `mesh` (dimensions "ring" of R ranks and "ulysses" of U; H divisible by U).
    Returns out (B, N/P, H, D) (and lse (B, H, N/P) if return_lse), differentiable with exact gradients.
    Key/value heads, cu_seqlens (the whole row's, the same on every rank) and timeout_s as in
    ulysses_dilated_attention and ring_dilated_attention.
    """
    if not dist.is_initialized():
        raise RuntimeError("hybrid_dilated_attention needs torch.distributed to be initialised")
    ring_group, ulysses_group, ring_degree, degree, index = _mesh_groups(mesh)
    error: Exception | None = None
    pattern = documents = None
    resolved_scale, timeout = scale, DEFAULT_TIMEOUT_S
    try:
        timeout = resolve_timeout(timeout_s)
        if not isinstance(return_lse, bool):
            raise ValueError(f"return_lse must be True or False, got {return_lse!r}")
        pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        resolved_scale = validate_attention_inputs(q, k, v, scale=scale, shape="(B, N/P, H, D)", grouped_heads=True)
        check_head_degree(q.shape[2], degree)
        seq_len = q.shape[1] * degree * ring_degree
        check_divisible(seq_len, ring_degree, layout)
        documents = validate_cu_seqlens(cu_seqlens, q, seq_len=seq_len)
    except (ValueError, TypeError) as exc:
        error = exc
    fields = configuration_fields(
        q, k, pattern, segment_lengths=segment_lengths, dilation_rates=dilation_rates, mode=mode, causal=causal,
        scale=resolved_scale, layout=layout, backend=backend, cu_seqlens=cu_seqlens, documents=documents, error=error,
        placement={"mesh": f"ring {ring_degree} x ulysses {degree}"}, return_lse=return_lse)
    for group in (ulysses_group, ring_group):  # the second carries the first's error to the whole mesh
        try:
            agree_on_configuration(fields, error, group, timeout, caller="hybrid_dilated_attention", members="mesh")
        except ValueError as exc:
            error = exc
    if error is not None:
        raise error
    heads = q.shape[2]
    *local, exchange = heads_of_sequence(q, k, v, ulysses_group, degree, index, "contiguous", timeout, "hybrid")
    local = ring_dilated_attention(
        *local, segment_lengths=pattern.segment_lengths, dilation_rates=pattern.dilation_rates, causal=pattern.causal,
        mode=pattern.mode, group=ring_group, layout=layout, backend=backend, scale=resolved_scale,
        return_lse=return_lse, check_config=False, timeout_s=timeout, cu_seqlens=cu_seqlens,
        global_heads=(index * heads // degree, heads))
    return back_to_sequence(local, exchange, return_lse)
