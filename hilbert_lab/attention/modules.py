"""torch.nn modules: DilatedAttention (the engine as a module) and MultiheadDilatedAttention (with projections)."""
from __future__ import annotations

import math
import numbers
from typing import Optional, Sequence

import torch
from torch import nn

from hilbert_lab.attention.executors import BACKENDS, Executor
from hilbert_lab.attention.engine import dilated_attention
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.curves import ORDERINGS


def check_device(name: str, x: torch.Tensor, parameter: torch.Tensor, owner: str = "module") -> None:
    """ValueError naming both devices unless the input `name` lives on the device of the owner's `parameter`."""
    if x.device != parameter.device:
        raise ValueError(f"{name} on device '{x.device}' does not match the {owner}'s parameters on device "
                         f"'{parameter.device}': move one to the other ({owner}.to('{x.device}') or "
                         f"{name}.to('{parameter.device}'))")


def _check_dropout(dropout) -> float:
    if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be a float in [0, 1), got {dropout!r}")
    return float(dropout)


def _check_options(backend, ordering, scale, hilbert_pattern) -> Optional[float]:
    """ValueError naming the argument for a bad backend / ordering / scale / hilbert_pattern; the scale."""
    if not isinstance(backend, Executor) and (not isinstance(backend, str) or backend not in ("auto",) + BACKENDS):
        raise ValueError(f"backend must be 'auto', one of {BACKENDS} or an Executor, got {backend!r}")
    if ordering is not None and (not isinstance(ordering, str) or ordering not in ORDERINGS):
        raise ValueError(f"ordering must be None or one of {ORDERINGS}, got {ordering!r}")
    if scale is not None and (isinstance(scale, (bool, torch.Tensor)) or not isinstance(scale, numbers.Real)
                              or not math.isfinite(scale) or scale <= 0):
        raise ValueError(f"scale must be None or a finite float > 0, got {scale!r}")
    if not isinstance(hilbert_pattern, bool):
        raise ValueError(f"hilbert_pattern must be True or False, got {hilbert_pattern!r}")
    return None if scale is None else float(scale)


def _check_heads(num_kv_heads, num_heads: Optional[int] = None) -> Optional[int]:
    """ValueError naming num_kv_heads unless it is None or a positive integer dividing num_heads."""
    if num_kv_heads is None:
        return None
    if isinstance(num_kv_heads, bool) or not isinstance(num_kv_heads, numbers.Integral) or num_kv_heads <= 0:
        raise ValueError(f"num_kv_heads must be None or a positive integer, got {num_kv_heads!r}")
    if num_heads is not None and num_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads}): query head h reads "
                         f"key/value head h // (num_heads / num_kv_heads)")
    return int(num_kv_heads)


class DilatedAttention(nn.Module):
    """Dilated attention on q (B, N, H, D), k, v (B, N, H_kv, D) -> (B, N, H, D); dropout only in training mode.

    Arguments as in `hilbert_lab.attention.engine.dilated_attention`; `dropout` is the attention
    weight dropout probability applied when `self.training`. num_kv_heads: the key/value heads the
    module expects (None: any count dividing H, grouped-query attention when fewer than H); forward
    checks k and v against it. forward(..., cu_seqlens=...) attends the documents of a packed row.
    """

    def __init__(
        self,
        segment_lengths: Sequence[int],
        dilation_rates: Sequence[int],
        *,
        causal: bool = False,
        mode: str = "longnet",
        backend: str = "auto",
        ordering: Optional[str] = None,
        scale: Optional[float] = None,
        dropout: float = 0.0,
        hilbert_pattern: bool = False,
        num_kv_heads: Optional[int] = None,
    ) -> None:
        super().__init__()
        self.pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
        self.num_kv_heads = _check_heads(num_kv_heads)
        self.scale = _check_options(backend, ordering, scale, hilbert_pattern)
        self.backend, self.ordering = backend, ordering
        self.dropout = _check_dropout(dropout)
        self.hilbert_pattern = hilbert_pattern

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: Optional[bool] = None,
                return_lse: bool = False, cu_seqlens: Optional[torch.Tensor] = None):
        """q (B, N, H, D), k, v (B, N, H_kv, D) -> out (B, N, H, D) [, lse (B, H, N)]; `causal` overrides the
        default; cu_seqlens [0, n1, ..., N] (B = 1) packs documents (see dilated_attention)."""
        if self.num_kv_heads is not None:
            for name, t in (("k", k), ("v", v)):
                if isinstance(t, torch.Tensor) and t.dim() == 4 and t.shape[2] != self.num_kv_heads:
                    raise ValueError(f"{name} must have num_kv_heads={self.num_kv_heads} heads (B, N, H_kv, D), got "
                                     f"shape {tuple(t.shape)}")
        return dilated_attention(
            q, k, v,
            segment_lengths=self.pattern.segment_lengths, dilation_rates=self.pattern.dilation_rates,
            causal=self.pattern.causal if causal is None else causal, mode=self.pattern.mode,
            backend=self.backend, ordering=self.ordering, scale=self.scale,
            dropout_p=self.dropout if self.training else 0.0, return_lse=return_lse,
            hilbert_pattern=self.hilbert_pattern, cu_seqlens=cu_seqlens,
        )

    def extra_repr(self) -> str:
        p = self.pattern
        kv = "" if self.num_kv_heads is None else f", num_kv_heads={self.num_kv_heads}"
        return (f"segment_lengths={list(p.segment_lengths)}, dilation_rates={list(p.dilation_rates)}, mode={p.mode!r}, "
                f"causal={p.causal}, backend={self.backend!r}, ordering={self.ordering!r}, dropout={self.dropout}{kv}")


class MultiheadDilatedAttention(nn.Module):
    """Multi-head dilated attention with q/k/v/out projections: x (B, N, E) -> (B, N, E).

    MultiheadDilatedAttention(embed_dim, num_heads, segment_lengths, dilation_rates, ...); `dim` and
    `heads` are accepted as aliases of embed_dim and num_heads. embed_dim must be divisible by
    num_heads. num_kv_heads (default num_heads) must divide num_heads: k_proj and v_proj then map to
    num_kv_heads * head_dim features (grouped-query attention; K/V are never repeated to num_heads).
    Other keywords go to DilatedAttention (scale defaults to head_dim**-0.5). Every argument is
    checked here, in __init__ (ValueError naming it), not at the first forward.
    """

    def __init__(
        self,
        embed_dim: Optional[int] = None,
        num_heads: Optional[int] = None,
        segment_lengths: Optional[Sequence[int]] = None,
        dilation_rates: Optional[Sequence[int]] = None,
        *,
        dim: Optional[int] = None,
        heads: Optional[int] = None,
        dropout: float = 0.0,
        bias: bool = True,
        causal: bool = False,
        mode: str = "longnet",
        backend: str = "auto",
        ordering: Optional[str] = None,
        hilbert_pattern: bool = False,
        scale: Optional[float] = None,
        num_kv_heads: Optional[int] = None,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        embed_dim = _alias(embed_dim, dim, "embed_dim", "dim")
        num_heads = _alias(num_heads, heads, "num_heads", "heads")
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        if segment_lengths is None or dilation_rates is None:
            raise ValueError("segment_lengths and dilation_rates are required (lists of positive integers)")
        if not isinstance(bias, bool):
            raise ValueError(f"bias must be True or False, got {bias!r}")
        self.embed_dim, self.num_heads, self.head_dim = int(embed_dim), int(num_heads), int(embed_dim) // int(num_heads)
        self.num_kv_heads = _check_heads(num_kv_heads, self.num_heads) or self.num_heads
        kv_dim = self.num_kv_heads * self.head_dim
        factory = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.k_proj = nn.Linear(embed_dim, kv_dim, bias=bias, **factory)
        self.v_proj = nn.Linear(embed_dim, kv_dim, bias=bias, **factory)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self.attention = DilatedAttention(segment_lengths, dilation_rates, causal=causal, mode=mode, backend=backend,
                                          ordering=ordering, scale=scale, dropout=dropout,
                                          hilbert_pattern=hilbert_pattern, num_kv_heads=self.num_kv_heads)
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(proj.weight)
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)

    def stacked_in_projection(self, dtype: Optional[torch.dtype] = None
                              ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """The q, k and v projections as one: (weight (E + 2 E_kv, E), bias (E + 2 E_kv,) or None) in `dtype`
        (default the parameters'), a copy detached from them. F.linear(x, weight, bias).split((E, E_kv, E_kv), -1)
        is (q_proj(x), k_proj(x), v_proj(x)) in one GEMM (a decoding step's three GEMVs read their weights at
        about half the bandwidth of one stacked GEMV)."""
        projections = (self.q_proj, self.k_proj, self.v_proj)
        dtype = self.q_proj.weight.dtype if dtype is None else dtype
        weight = torch.cat([proj.weight.detach() for proj in projections]).to(dtype)
        bias = None if self.q_proj.bias is None else torch.cat([proj.bias.detach() for proj in projections]).to(dtype)
        return weight, bias

    def forward(self, query: torch.Tensor, key: Optional[torch.Tensor] = None, value: Optional[torch.Tensor] = None,
                *, causal: Optional[bool] = None, cu_seqlens: Optional[torch.Tensor] = None) -> torch.Tensor:
        """query (B, N, E) (key/value default to query) -> (B, N, E); a query (B, Nq, E) shorter than key and
        value holds their last Nq positions; cu_seqlens [0, n1, ..., N] (B = 1) attends the documents of a
        packed row each as its own sequence."""
        key = query if key is None else key
        value = key if value is None else value
        weight = self.q_proj.weight
        for name, x in (("query", query), ("key", key), ("value", value)):
            if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.embed_dim:
                raise ValueError(f"{name} must be a (B, N, {self.embed_dim}) tensor, got "
                                 f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
            check_device(name, x, weight)
            if x.dtype != weight.dtype and not torch.is_autocast_enabled(x.device.type):
                raise ValueError(f"{name} must be {weight.dtype} like the module's parameters, got {x.dtype} (cast "
                                 f"the input or use module.to({weight.dtype}))")
        if value.shape[:2] != key.shape[:2] or query.shape[0] != key.shape[0] or query.shape[1] > key.shape[1]:
            raise ValueError(f"query, key and value must share (B, N) (query may be shorter: the last positions), got "
                             f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}")
        split = lambda x: x.unflatten(-1, (-1, self.head_dim))  # noqa: E731
        out = self.attention(split(self.q_proj(query)), split(self.k_proj(key)), split(self.v_proj(value)), causal=causal,
                             cu_seqlens=cu_seqlens)
        return self.out_proj(out.flatten(-2))


def _alias(value, alias, name: str, alias_name: str):
    if alias is not None and value is not None and alias != value:
        raise ValueError(f"{name}={value!r} and its alias {alias_name}={alias!r} disagree")
    return value if value is not None else alias
