"""Input checks shared by every attention entry point (the engine and the ring): one place, one wording."""
from __future__ import annotations

import math
import numbers
from typing import Optional

import torch


def validate_attention_inputs(q, k, v, *, scale: Optional[float] = None, dropout_p: float = 0.0,
                              shape: str = "(B, N, H, D)", fewer_queries: bool = False) -> float:
    """ValueError naming the argument unless q, k, v are valid attention inputs; returns the scale to use.

    q, k, v: non-empty 4D floating tensors of one shape `shape` (e.g. "(B, N/P, H, D)" for ring
    shards), dtype and device. scale: None (then D**-0.5) or a finite number > 0. dropout_p: a
    number in [0, 1). fewer_queries=True: q may have fewer rows than k and v (q (B, Nq, H, D) with
    Nq <= N, the queries at the last Nq positions).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4D tensor {shape}, got {getattr(t, 'shape', type(t))}")
        if t.layout != torch.strided:
            raise ValueError(f"{name} must be a dense (strided) tensor, got layout {t.layout}; call .to_dense() first")
        if t.is_meta:
            raise ValueError(f"{name} must hold data (a CPU or CUDA tensor), got a tensor on the meta device")
        if t.is_complex() or not t.is_floating_point():
            raise ValueError(f"{name} must have a floating dtype (float16, bfloat16, float32, float64), got {t.dtype}")
    if fewer_queries and k.shape == v.shape and q.dim() == 4 and q.shape[1] <= k.shape[1] \
            and (q.shape[0], *q.shape[2:]) == (k.shape[0], *k.shape[2:]):
        pass  # queries fewer than keys: (B, Nq, H, D) against (B, N, H, D)
    elif fewer_queries:
        raise ValueError(f"q, k, v must have the same shape {shape}, except that q may have fewer rows (B, Nq, H, D) "
                         f"with Nq <= N, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    elif not (q.shape == k.shape == v.shape):
        raise ValueError(f"q, k, v must have the same shape {shape}, got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must share a device, got {q.device}, {k.device}, {v.device}")
    if min(q.shape) == 0:
        raise ValueError(f"q, k, v must be non-empty, got shape {tuple(q.shape)} {shape}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")
    if scale is None:
        return q.shape[3] ** -0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale) or not scale > 0:
        raise ValueError(f"scale must be None (D**-0.5) or a finite float > 0, got {scale!r}")
    return float(scale)


def kernel_layout(x: torch.Tensor) -> torch.Tensor:
    """x itself when its last dimension is contiguous (every kernel reads such views in place), else one
    contiguous copy: kernels read rows of D elements at unit stride."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()
