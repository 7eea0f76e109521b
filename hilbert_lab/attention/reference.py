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
    float64); rows with no keys give out 0 and lse -inf. A row's output and LSE depend only on the
    keys it attends: a NaN/inf in its query or in a key it attends makes its output and LSE NaN; a
    NaN/inf in a value it attends makes that output entry the IEEE sum of the non-finite values it
    attends (NaN, +inf or -inf); nothing it does not attend changes it. Differentiable w.r.t. q, k, v
    (for finite inputs).
    """
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must share a (B, N, H, D) shape, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    batch, seq_len, num_heads, head_dim = q.shape
    scale = head_dim**-0.5 if scale is None else float(scale)
    mult = pattern.multiplicity(seq_len, num_heads).to(q.device)
    allowed = mult > 0  # (H, N, N)
    log_mult = torch.where(allowed, mult.double().log(), torch.full(mult.shape, float("-inf"), dtype=torch.float64, device=q.device))
    q64, k64, v64 = (t.to(torch.float64).transpose(1, 2) for t in (q, k, v))  # (B, H, N, D)
    finite = [torch.where(t.isfinite(), t, torch.zeros((), dtype=t.dtype, device=t.device)) for t in (q64, k64, v64)]
    scores = torch.matmul(finite[0], finite[1].transpose(-1, -2)) * scale
    scores = torch.where(allowed, scores, torch.full_like(scores, float("-inf"))) + torch.where(
        allowed, log_mult, torch.zeros_like(log_mult)
    )
    weights, total, lse = shifted_exp(scores, dim=-1)  # lse (B, H, N)
    probs = weights / total
    out = torch.matmul(probs, finite[2])
    if not all(bool(t.isfinite().all()) for t in (q64, k64, v64)):
        out, lse = _nonfinite(out, lse, allowed, q64, k64, v64)
    return out.transpose(1, 2), lse


def _nonfinite(out, lse, allowed, q, k, v):
    """Each row's non-finite result from what it attends alone (out (B, H, N, D), lse (B, H, N))."""
    attend = allowed.to(torch.float64)  # (H, N, N)

    def seen(indicator: torch.Tensor) -> torch.Tensor:  # (B, H, N, ...) over keys -> per query row
        return torch.einsum("hnm,bhm...->bhn...", attend, indicator.to(torch.float64)) > 0

    bad_rows = (~q.isfinite().all(-1) | seen(~k.isfinite().all(-1))) & allowed.any(-1)  # (B, H, N)
    nan, inf = float("nan"), float("inf")
    plus, minus = seen(v == inf), seen(v == -inf)
    out = torch.where(seen(v.isnan()) | (plus & minus), nan, torch.where(plus, inf, torch.where(minus, -inf, out)))
    return torch.where(bad_rows[..., None], nan, out), torch.where(bad_rows, nan, lse)
