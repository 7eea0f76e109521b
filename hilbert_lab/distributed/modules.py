"""torch.nn modules over ring attention: RingDilatedAttention and RingMultiheadDilatedAttention.

Both take this rank's shard of the sequence; parameter names match hilbert_lab.attention.modules so
a single-process MultiheadDilatedAttention state_dict loads into RingMultiheadDilatedAttention.
Dropout is not supported in the ring (it would need a shared RNG stream per block).
"""
from __future__ import annotations

import numbers
from typing import Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.distributed.ring import ring_dilated_attention
from hilbert_lab.distributed.sharding import LAYOUTS


class RingDilatedAttention(nn.Module):
    """Ring dilated attention on shards q, k, v (B, N/P, H, D) -> (B, N/P, H, D).

    ring_size=None: one ring over all ranks of `group` (default: the world); otherwise consecutive
    rings of ring_size ranks (it must divide the group size), each holding one sequence.
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
    ) -> None:
        super().__init__()
        self.pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
        if ring_size is not None and (isinstance(ring_size, bool) or not isinstance(ring_size, numbers.Integral)
                                      or ring_size < 1):
            raise ValueError(f"ring_size must be None (the group size) or a positive integer, got {ring_size!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        self.backend, self.scale, self.group, self.layout = backend, scale, group, layout
        self.ring_size = None if ring_size is None else int(ring_size)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: Optional[bool] = None,
                return_lse: bool = False):
        """Shards (B, N/P, H, D) -> out shard (B, N/P, H, D) [, lse (B, H, N/P)]."""
        p = self.pattern
        return ring_dilated_attention(
            q, k, v, segment_lengths=p.segment_lengths, dilation_rates=p.dilation_rates,
            causal=p.causal if causal is None else causal, mode=p.mode, group=self.group,
            ring_size=self.ring_size, layout=self.layout, backend=self.backend, scale=self.scale,
            return_lse=return_lse,
        )

    def extra_repr(self) -> str:
        p = self.pattern
        return (f"segment_lengths={list(p.segment_lengths)}, dilation_rates={list(p.dilation_rates)}, "
                f"mode={p.mode!r}, causal={p.causal}, ring_size={self.ring_size}, layout={self.layout!r}")


class RingMultiheadDilatedAttention(nn.Module):
    """Multi-head ring dilated attention with q/k/v/out projections: x shard (B, N/P, E) -> (B, N/P, E)."""

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
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        self.embed_dim, self.num_heads, self.head_dim = int(embed_dim), int(num_heads), int(embed_dim) // int(num_heads)
        factory = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.attention = RingDilatedAttention(segment_lengths, dilation_rates, causal=causal, mode=mode,
                                              backend=backend, group=group, ring_size=ring_size, layout=layout)
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(proj.weight)
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)

    def forward(self, query: torch.Tensor, key: Optional[torch.Tensor] = None, value: Optional[torch.Tensor] = None,
                *, causal: Optional[bool] = None) -> torch.Tensor:
        """query shard (B, N/P, E) (key/value default to query) -> (B, N/P, E)."""
        key = query if key is None else key
        value = key if value is None else value
        if query.dim() != 3 or query.shape[-1] != self.embed_dim:
            raise ValueError(f"query must be (B, N/P, {self.embed_dim}), got {tuple(query.shape)}")
        split = lambda x: x.unflatten(-1, (self.num_heads, self.head_dim))  # noqa: E731
        out = self.attention(split(self.q_proj(query)), split(self.k_proj(key)), split(self.v_proj(value)), causal=causal)
        return self.out_proj(out.flatten(-2))
