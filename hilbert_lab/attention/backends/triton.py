"""Backend "triton": translate a DilatedPattern into the fused Triton kernel's plain arguments.

Two entry points:
- `dilated_attention(q, k, v, pattern, scale=None)`: the whole dilated pattern (all branches, both
  modes, causal, ragged N) in one fused pass over the original (B, N, H, D) layout, merged across
  branches by one online softmax; returns (out (B, N, H, D), lse (B, H, N) float32); differentiable
  (exact gradients, also through the merge weights and the lse output). Layout orderings need no
  work here: the kernel addresses tokens by original position, so any ordering gives the same result.
- `BACKEND`: the dense-block adapter (`attend` on (B, L, H, D) blocks) for the engine's generic
  gather path; it runs the same kernel with one branch (w = L, r = 1). key_padding_mask is not
  supported there (ValueError); use `dilated_attention`, which handles ragged segments itself.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from hilbert_lab.attention.backends.base import Backend
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.kernels import triton_dilated

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def unavailable_reason(device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None) -> Optional[str]:
    """None when the fused kernel can run on `device` with `dtype`, else why not."""
    if not triton_dilated.HAVE_TRITON:
        return "the 'triton' package is not installed (pip install triton)"
    interpreting = triton_dilated.interpreting()
    if device is not None and torch.device(device).type != "cuda" and not interpreting:
        return f"it needs a CUDA device (got {device}); TRITON_INTERPRET=1 runs it slowly on the CPU"
    if device is None and not torch.cuda.is_available() and not interpreting:
        return "no CUDA device is available"
    if dtype is not None and dtype not in SUPPORTED_DTYPES:
        return f"dtype must be one of float16, bfloat16, float32; got {dtype}"
    return None


def head_offsets_tensor(pattern: DilatedPattern, num_heads: int, device: torch.device | str) -> torch.Tensor:
    """int32 (num_branches, H): each head's offset per branch, -1 where the head is not in it (cached)."""
    return _head_offsets_cached(pattern, num_heads, torch.device(device))


@functools.lru_cache(maxsize=128)
def _head_offsets_cached(pattern: DilatedPattern, num_heads: int, device: torch.device) -> torch.Tensor:
    rows = [torch.as_tensor(a, dtype=torch.int32) for a in pattern.head_offsets(num_heads)]
    return torch.stack(rows).to(device)


def dilated_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: DilatedPattern, *,
    scale: float | None = None, dropout_p: float = 0.0, allow_tf32: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused dilated attention for `pattern`: q, k, v (B, N, H, D) -> (out, lse (B, H, N))."""
    if dropout_p:
        raise ValueError(f"dropout_p must be 0.0 for backend 'triton' (no dropout in the fused kernel); got {dropout_p}")
    reason = unavailable_reason(q.device, q.dtype)
    if reason is not None:
        raise RuntimeError(f"backend 'triton' cannot run here: {reason}")
    offsets = head_offsets_tensor(pattern, q.shape[2], q.device)
    return triton_dilated.fused_dilated_attention(
        q, k, v, segment_lengths=_kernel_segments(pattern, q.shape[1]), dilation_rates=pattern.dilation_rates,
        head_offsets=offsets, causal=pattern.causal, scale=scale, allow_tf32=allow_tf32,
    )


def _branch_offsets(pattern: DilatedPattern, num_heads: int, device, branches: Optional[tuple[int, ...]]):
    offsets = head_offsets_tensor(pattern, num_heads, device)
    if branches is None:
        return offsets
    keep = torch.zeros(offsets.shape[0], dtype=torch.bool, device=offsets.device)
    keep[list(branches)] = True
    return torch.where(keep[:, None], offsets, torch.full_like(offsets, -1))  # -1: the head is not in the branch


def pattern_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: DilatedPattern, *, scale: float,
                    branches: Optional[tuple[int, ...]] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The fused kernel's forward, no autograd: merged (out (B, N, H, D), lse (B, H, N) float32) of the
    pattern's `branches` (default: all)."""
    return triton_dilated.dilated_attention_forward(
        q, k, v, segment_lengths=_kernel_segments(pattern, q.shape[1]), dilation_rates=pattern.dilation_rates,
        head_offsets=_branch_offsets(pattern, q.shape[2], q.device, branches), causal=pattern.causal, scale=scale)


def pattern_backward(grad_out: Optional[torch.Tensor], grad_lse: Optional[torch.Tensor], q, k, v, out, lse,
                     pattern: DilatedPattern, *, scale: float, branches: Optional[tuple[int, ...]] = None):
    """(dq, dk, dv) of the pattern's `branches` for a merged (out, lse) that may include other keys too
    (each block's exact share, as the engine's backward); grad_out / grad_lse may be None."""
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    return triton_dilated.dilated_attention_backward(
        grad_out, q, k, v, out, lse, grad_lse=grad_lse, segment_lengths=_kernel_segments(pattern, q.shape[1]),
        dilation_rates=pattern.dilation_rates, head_offsets=_branch_offsets(pattern, q.shape[2], q.device, branches),
        causal=pattern.causal, scale=scale)


def _kernel_segments(pattern: DilatedPattern, seq_len: int) -> tuple[int, ...]:
    """Segment lengths for the kernel's int32 arithmetic: a segment longer than the sequence (such as
    1 << 40, "the whole sequence") selects the same tokens as one of max(N, r) tokens."""
    return tuple(w if w <= seq_len else max(seq_len, r) for w, r in zip(pattern.segment_lengths, pattern.dilation_rates))


def _dense_args(q: torch.Tensor, key_padding_mask: Optional[torch.Tensor]) -> dict:
    if key_padding_mask is not None:
        raise ValueError("key_padding_mask must be None for backend 'triton' on dense blocks; "
                         "use hilbert_lab.attention.backends.triton.dilated_attention for ragged segments")
    if q.shape[1] == 0:
        raise ValueError("block length L must be >= 1")
    offsets = torch.zeros((1, q.shape[2]), dtype=torch.int32, device=q.device)
    return dict(segment_lengths=(q.shape[1],), dilation_rates=(1,), head_offsets=offsets)


def _block_forward(q, k, v, *, causal, scale, key_padding_mask=None):
    if q.shape != k.shape:
        raise ValueError(f"backend 'triton' needs q and k of one shape (B, L, H, D); got {tuple(q.shape)}, {tuple(k.shape)}")
    args = _dense_args(q, key_padding_mask)
    out, lse = triton_dilated.dilated_attention_forward(q, k, v, causal=causal, scale=scale, **args)
    return out, lse, None


def _block_backward(grad_out, grad_lse, q, k, v, out, lse, aux=None, *, causal, scale, key_padding_mask=None):
    args = _dense_args(q, key_padding_mask)
    return triton_dilated.dilated_attention_backward(grad_out, q, k, v, out, lse, grad_lse=grad_lse,
                                                     causal=causal, scale=scale, **args)


BACKEND = Backend("triton", _block_forward, _block_backward, unavailable_reason)
