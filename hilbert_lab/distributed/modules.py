"""torch.nn modules over context parallelism: RingDilatedAttention and RingMultiheadDilatedAttention.

Both take this rank's shard of the sequence and run it around the ring (parallel="ring"), head-parallel
(parallel="ulysses": all-to-all over heads) or head-parallel groups around rings on a 2-D DeviceMesh
(parallel="hybrid", mesh=...); parameter names match hilbert_lab.attention.modules so a single-process
MultiheadDilatedAttention state_dict loads into RingMultiheadDilatedAttention.
Dropout is not supported in the ring (it would need a shared RNG stream per block).
"""
from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from hilbert_lab.attention.modules import MultiheadDilatedAttention
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.distributed.comm import resolve_timeout
from hilbert_lab.distributed.hybrid import MESH_DIMS, check_mesh, hybrid_dilated_attention
from hilbert_lab.distributed.ring import ring_dilated_attention
from hilbert_lab.distributed.sharding import LAYOUTS
from hilbert_lab.distributed.ulysses import ulysses_dilated_attention

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

# how the shards' attention is computed: around the ring, head-parallel, or head-parallel x ring on a 2-D mesh
PARALLEL_MODES = ("ring", "ulysses", "hybrid")


class RingDilatedAttention(nn.Module):
    """Ring dilated attention on shards q, k, v (B, N/P, H, D) -> (B, N/P, H, D).

    ring_size=None: one ring over all ranks of `group` (default: the world); otherwise consecutive
    rings of ring_size ranks (it must divide the group size), each holding one sequence. timeout_s
    bounds every wait of the ring (None: $HILBERT_LAB_RING_TIMEOUT_S or 120 s). parallel="ulysses": the
    ranks of `group` exchange heads instead (ulysses_dilated_attention; H divisible by the group size,
    ring_size None). parallel="hybrid": head-parallel groups around rings on `mesh`, a 2-D DeviceMesh of
    dimensions MESH_DIMS ("ring" of R ranks, "ulysses" of U; H divisible by U; group and ring_size None), rank
    (r, u) holding the shard of positions hybrid_positions(r, u, R, U, N, layout) (hybrid_dilated_attention).
    mesh is given with parallel="hybrid" only.
    """

    def __init__(
        self,
        segment_lengths: Sequence[int],
        dilation_rates: Sequence[int],
        *,
        causal: bool = False,
        mode: str = "longnet",
        backend: str = "auto",
        scale: Optional[float] = None,
        group: Optional[dist.ProcessGroup] = None,
        ring_size: Optional[int] = None,
        layout: str = "contiguous",
        timeout_s: Optional[float] = None,
        parallel: str = "ring",
        mesh: Optional[DeviceMesh] = None,
    ) -> None:
        super().__init__()
        self.pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
        if parallel not in PARALLEL_MODES:
            raise ValueError(f"parallel must be one of {PARALLEL_MODES}, got {parallel!r}")
        if parallel == "ulysses" and ring_size is not None:
            raise ValueError(f"ring_size must be None with parallel='ulysses' (the heads are exchanged over the "
                             f"whole group), got {ring_size!r}")
        if parallel == "hybrid":
            if mesh is None:
                raise ValueError(f"mesh must be a 2-D DeviceMesh with dimensions named {MESH_DIMS} with "
                                 f"parallel='hybrid', got None")
            check_mesh(mesh)
            for name, value in (("ring_size", ring_size), ("group", group)):
                if value is not None:
                    raise ValueError(f"{name} must be None with parallel='hybrid' (the mesh's dimensions give the "
                                     f"rings and head-parallel groups), got {value!r}")
        elif mesh is not None:
            raise ValueError(f"mesh must be None with parallel={parallel!r} (a mesh is taken with "
                             f"parallel='hybrid' only), got {type(mesh).__name__}")
        self.parallel, self.mesh = parallel, mesh
        if ring_size is not None and (isinstance(ring_size, bool) or not isinstance(ring_size, numbers.Integral)
                                      or ring_size < 1):
            raise ValueError(f"ring_size must be None (the group size) or a positive integer, got {ring_size!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if timeout_s is not None:
            resolve_timeout(timeout_s)
        self.backend, self.scale, self.group, self.layout, self.timeout_s = backend, scale, group, layout, timeout_s
        self.ring_size = None if ring_size is None else int(ring_size)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: Optional[bool] = None,
                return_lse: bool = False, cu_seqlens: Optional[torch.Tensor] = None):
        """Shards (B, N/P, H, D) -> out shard (B, N/P, H, D) [, lse (B, H, N/P)]; cu_seqlens: the whole row's
        packed documents [0, n1, ..., N] (B = 1), the same on every rank (see ring_dilated_attention)."""
        p = self.pattern
        if self.parallel == "hybrid":
            return hybrid_dilated_attention(
                q, k, v, segment_lengths=p.segment_lengths, dilation_rates=p.dilation_rates, mesh=self.mesh,
                causal=p.causal if causal is None else causal, mode=p.mode, layout=self.layout, backend=self.backend,
                scale=self.scale, return_lse=return_lse, timeout_s=self.timeout_s, cu_seqlens=cu_seqlens,
            )
        if self.parallel == "ulysses":
            return ulysses_dilated_attention(
                q, k, v, segment_lengths=p.segment_lengths, dilation_rates=p.dilation_rates,
                causal=p.causal if causal is None else causal, mode=p.mode, group=self.group, layout=self.layout,
                backend=self.backend, scale=self.scale, return_lse=return_lse, timeout_s=self.timeout_s,
                cu_seqlens=cu_seqlens,
            )
        return ring_dilated_attention(
            q, k, v, segment_lengths=p.segment_lengths, dilation_rates=p.dilation_rates,
            causal=p.causal if causal is None else causal, mode=p.mode, group=self.group,
            ring_size=self.ring_size, layout=self.layout, backend=self.backend, scale=self.scale,
            return_lse=return_lse, timeout_s=self.timeout_s, cu_seqlens=cu_seqlens,
        )

    def extra_repr(self) -> str:
        p = self.pattern
        return (f"segment_lengths={list(p.segment_lengths)}, dilation_rates={list(p.dilation_rates)}, "
                f"mode={p.mode!r}, causal={p.causal}, ring_size={self.ring_size}, layout={self.layout!r}, "
                f"parallel={self.parallel!r}" + ("" if self.mesh is None else f", mesh={self.mesh!r}"))


class RingMultiheadDilatedAttention(MultiheadDilatedAttention):
    """Multi-head ring dilated attention: x shard (B, N/P, E) -> (B, N/P, E).

    The projections, their initialisation and forward are MultiheadDilatedAttention's (so a single-process
    state_dict loads directly; num_kv_heads: grouped-query key/value heads, as there); only the inner
    attention is the ring (or head-parallel: parallel="ulysses"; or head-parallel x ring on a 2-D DeviceMesh:
    parallel="hybrid", mesh=..., x then the shard of hybrid_positions; see RingDilatedAttention).
    forward(x, cu_seqlens=...) takes the whole row's packed documents.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        segment_lengths: Sequence[int],
        dilation_rates: Sequence[int],
        *,
        bias: bool = True,
        causal: bool = False,
        mode: str = "longnet",
        backend: str = "auto",
        group: Optional[dist.ProcessGroup] = None,
        ring_size: Optional[int] = None,
        layout: str = "contiguous",
        timeout_s: Optional[float] = None,
        num_kv_heads: Optional[int] = None,
        parallel: str = "ring",
        mesh: Optional[DeviceMesh] = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(embed_dim, num_heads, segment_lengths, dilation_rates, bias=bias, causal=causal, mode=mode,
                         backend=backend, num_kv_heads=num_kv_heads, device=device, dtype=dtype)
        self.attention = RingDilatedAttention(segment_lengths, dilation_rates, causal=causal, mode=mode,
                                              backend=backend, group=group, ring_size=ring_size, layout=layout,
                                              timeout_s=timeout_s, parallel=parallel, mesh=mesh)
