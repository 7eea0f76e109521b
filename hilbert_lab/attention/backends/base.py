"""Backend record and the autograd wrapper shared by all backend adapters.

A backend works on dense blocks: q, k, v (B, L, H, D) -> (out (B, L, H, D), lse (B, H, L)), LSE in
float32 (float64 for float64 inputs). key_padding_mask: optional bool (B, L), True marks a padded
key that gets no weight (torch.nn.MultiheadAttention's convention). Causal masks are top-left
aligned (query i sees keys j <= i). A query row with no keys gives out 0 and lse -inf.

`forward` returns (out, lse, aux) without autograd; `backward(grad_out, grad_lse, q, k, v, out,
lse, aux, ...)` returns (dq, dk, dv) for the given out/lse. Called with a *merged* out and lse
(a softmax over a union of key sets), it returns exactly this block's share of the merged
gradients; grad_lse (or None) is the upstream gradient of the LSE. `attend` is differentiable.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch


class BackendUnavailableError(ImportError, ValueError):
    """A backend cannot run here (missing package, device or dtype); catchable as either base."""


@dataclass(frozen=True)
class Backend:
    """An attention backend adapter (see the module docstring for the calling convention)."""

    name: str
    forward: Callable[..., tuple[torch.Tensor, torch.Tensor, Any]]
    backward: Optional[Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]
    unavailable_reason: Callable[[Optional[torch.device], Optional[torch.dtype]], Optional[str]]
    differentiable_forward: Optional[Callable[..., tuple[torch.Tensor, torch.Tensor]]] = None
    # Optional fused path over the original layout: (q, k, v, pattern, *, scale) -> (out, lse),
    # differentiable; when present the engine hands it the whole pattern instead of gathering blocks.
    whole_pattern: Optional[Callable[..., tuple[torch.Tensor, torch.Tensor]]] = None

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool,
        scale: float | None = None,
        key_padding_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention on dense blocks (B, L, H, D) -> (out, lse (B, H, L)); differentiable."""
        check_block_inputs(q, k, v, key_padding_mask)
        scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
        reason = self.unavailable_reason(q.device, q.dtype)
        if reason is not None:
            raise BackendUnavailableError(f"backend {self.name!r} cannot run here: {reason}")
        if self.backward is None:
            return self.differentiable_forward(q, k, v, causal=causal, scale=scale, key_padding_mask=key_padding_mask)
        return _Attend.apply(q, k, v, self, bool(causal), scale, key_padding_mask)


def check_block_inputs(q, k, v, key_padding_mask=None) -> None:
    """ValueError unless q, k, v are (B, L, H, D) blocks of one dtype and device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4D tensor (B, L, H, D), got {getattr(t, 'shape', type(t))}")
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(f"q, k, v shapes do not match: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must share a device, got {q.device}, {k.device}, {v.device}")
    if key_padding_mask is not None and (
        key_padding_mask.dtype != torch.bool or key_padding_mask.shape != (k.shape[0], k.shape[1])
    ):
        raise ValueError(
            f"key_padding_mask must be bool (B, L) = {(k.shape[0], k.shape[1])}, got "
            f"{key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
        )


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """LSE dtype for inputs of `dtype`: float64 for float64, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class _Attend(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, backend, causal, scale, key_padding_mask):
        out, lse, aux = backend.forward(q, k, v, causal=causal, scale=scale, key_padding_mask=key_padding_mask)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.backend, ctx.causal, ctx.scale, ctx.mask, ctx.aux = backend, causal, scale, key_padding_mask, aux
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        dq, dk, dv = ctx.backend.backward(
            grad_out, grad_lse, q, k, v, out, lse, ctx.aux,
            causal=ctx.causal, scale=ctx.scale, key_padding_mask=ctx.mask,
        )
        return dq, dk, dv, None, None, None, None
