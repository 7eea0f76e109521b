"""Float64 dense oracle: one masked softmax over the multiset union of the branches' keys."""
from __future__ import annotations

import torch

from hilbert_lab.attention.merge import shifted_exp
from hilbert_lab.attention.pattern import DilatedPattern


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pattern: DilatedPattern,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense dilated attention in float64 (small N only; O(H N^2) memory).

    q, k, v: (B, N, H, D). Scores are weighted by `pattern.multiplicity` (a key allowed by m
    branches counts m times): out[n] = sum_m mult * exp(s_nm) v_m / sum_m mult * exp(s_nm),
    lse[n] = log sum_m mult * exp(s_nm). Returns (out (B, N, H, D) float64, lse (B, H, N)
    float64); rows with no keys give out 0 and lse -inf. Differentiable w.r.t. q, k, v.
    """
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must share a (B, N, H, D) shape, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    batch, seq_len, num_heads, head_dim = q.shape
    scale = head_dim**-0.5 if scale is None else float(scale)
    mult = pattern.multiplicity(seq_len, num_heads).to(q.device)
    log_mult = torch.where(mult > 0, mult.double().log(), torch.full(mult.shape, float("-inf"), dtype=torch.float64, device=q.device))
    q64, k64, v64 = (t.to(torch.float64).transpose(1, 2) for t in (q, k, v))  # (B, H, N, D)
    scores = torch.matmul(q64, k64.transpose(-1, -2)) * scale
    scores = torch.where(mult > 0, scores, torch.full_like(scores, float("-inf"))) + torch.where(
        mult > 0, log_mult, torch.zeros_like(log_mult)
    )
    weights, total, lse = shifted_exp(scores, dim=-1)  # lse (B, H, N)
    probs = weights / total
    out = torch.matmul(probs, v64).transpose(1, 2)
    return out, lse
