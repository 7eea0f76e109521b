"""Guarded log-sum-exp merge of partial attention results (-inf safe, differentiable)."""
from __future__ import annotations

from typing import Sequence

import torch


def safe_logsumexp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """logsumexp over `dim` that returns -inf for all -inf slices with finite (zero) gradients."""
    peak = x.detach().amax(dim=dim, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak))
    total = torch.exp(x - peak).sum(dim=dim, keepdim=True)
    positive = total > 0
    lse = peak + torch.log(torch.where(positive, total, torch.ones_like(total)))
    lse = torch.where(positive, lse, torch.full_like(lse, float("-inf")))
    return lse.squeeze(dim)


def merge_lse(
    outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge partial attention results over disjoint (multi)sets of keys.

    outs: each (B, N, H, D), the normalised partial outputs; lses: each (B, H, N), their
    log-sum-exps (-inf where a part saw no keys). Returns (out (B, N, H, D), lse (B, H, N)) with
    L = logsumexp_i lse_i and out = sum_i exp(lse_i - L) * out_i; rows with no keys in any part
    give out 0 and lse -inf without NaN in forward or backward. Gradients flow through the merge
    weights. Weights and the sum are computed in the LSE dtype (float32 or float64).
    """
    if len(outs) != len(lses) or not outs:
        raise ValueError(f"outs and lses must be non-empty and of equal length, got {len(outs)} and {len(lses)}")
    for o, l in zip(outs, lses):
        if o.dim() != 4 or l.shape != (o.shape[0], o.shape[2], o.shape[1]):
            raise ValueError(
                f"outs must be (B, N, H, D) and lses (B, H, N); got {tuple(o.shape)} and {tuple(l.shape)}"
            )
    if len(outs) == 1:
        return outs[0], lses[0]
    stacked = torch.stack(list(lses), dim=0)  # (P, B, H, N)
    lse = safe_logsumexp(stacked, dim=0)
    lse_safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    weights = torch.exp(stacked - lse_safe)  # 0 where lse_i = -inf
    out = None
    for weight, part in zip(weights, outs):
        term = weight.transpose(1, 2).unsqueeze(-1) * part.to(weight.dtype)
        out = term if out is None else out + term
    return out.to(outs[0].dtype), lse
