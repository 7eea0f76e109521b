"""Eager dense-block attention, chunked so that memory stays O(chunk), plus the float64 "reference" backend."""
from __future__ import annotations

from typing import Optional

import torch

from hilbert_lab.attention.backends.base import Backend, lse_dtype
from hilbert_lab.attention.merge import shifted_exp

# Score elements (batch x heads x query rows x keys) materialised at once per chunk.
MAX_SCORE_ELEMENTS = 1 << 24


def _compute_dtype(dtype: torch.dtype, force: Optional[torch.dtype]) -> torch.dtype:
    if force is not None:
        return force
    return torch.float64 if dtype == torch.float64 else torch.float32


def _allowed(q_rows: range, num_keys: int, causal: bool, key_padding_mask, device) -> Optional[torch.Tensor]:
    """bool (b or 1, 1, rows, keys) of allowed (query, key) pairs, or None when all are allowed."""
    allowed = None
    if causal:
        rows = torch.arange(q_rows.start, q_rows.stop, device=device)
        allowed = (torch.arange(num_keys, device=device)[None, :] <= rows[:, None])[None, None]
    if key_padding_mask is not None:
        keep = (~key_padding_mask)[:, None, None, :]
        allowed = keep if allowed is None else allowed & keep
    return allowed


def _chunks(batch: int, heads: int, rows: int, keys: int, max_elements: int):
    per_row = heads * keys
    rows_per_chunk = max(1, min(rows, max_elements // max(per_row, 1)))
    batch_per_chunk = max(1, min(batch, max_elements // max(per_row * rows, 1)))
    for b0 in range(0, batch, batch_per_chunk):
        for r0 in range(0, rows, rows_per_chunk):
            yield slice(b0, min(b0 + batch_per_chunk, batch)), range(r0, min(r0 + rows_per_chunk, rows))


def _scores(qc, kc, scale, allowed):
    scores = torch.matmul(qc, kc.transpose(-1, -2)) * scale
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores


def dense_forward(q, k, v, *, causal, scale, key_padding_mask=None, compute_dtype=None, max_elements=MAX_SCORE_ELEMENTS):
    """(out (B, L, H, D), lse (B, H, L), None) by chunked masked softmax; no autograd."""
    batch, rows, heads, _ = q.shape
    keys = k.shape[1]
    cd = _compute_dtype(q.dtype, compute_dtype)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, heads, rows, dtype=lse_dtype(q.dtype), device=q.device)
    with torch.no_grad():
        for bs, rs in _chunks(batch, heads, rows, keys, max_elements):
            kpm = None if key_padding_mask is None else key_padding_mask[bs]
            qc = q[bs, rs.start : rs.stop].transpose(1, 2).to(cd)
            kc, vc = (t[bs].transpose(1, 2).to(cd) for t in (k, v))
            scores = _scores(qc, kc, scale, _allowed(rs, keys, causal, kpm, q.device))
            weights, total, lse_c = shifted_exp(scores, dim=-1)
            out[bs, rs.start : rs.stop] = (torch.matmul(weights, vc) / total).transpose(1, 2).to(q.dtype)
            lse[bs, :, rs.start : rs.stop] = lse_c.to(lse.dtype)
    return out, lse, None


def dense_backward(grad_out, grad_lse, q, k, v, out, lse, aux=None, *, causal, scale, key_padding_mask=None,
                   compute_dtype=None, max_elements=MAX_SCORE_ELEMENTS):
    """(dq, dk, dv) for the given out and lse: ds = p * (dO v^T - rowsum(dO * out) + grad_lse)."""
    batch, rows, heads, _ = q.shape
    keys = k.shape[1]
    cd = _compute_dtype(q.dtype, compute_dtype)
    dq = torch.empty(q.shape, dtype=cd, device=q.device)
    dk = torch.zeros(k.shape, dtype=cd, device=q.device)
    dv = torch.zeros(v.shape, dtype=cd, device=q.device)
    with torch.no_grad():
        for bs, rs in _chunks(batch, heads, rows, keys, max_elements):
            r = slice(rs.start, rs.stop)
            kpm = None if key_padding_mask is None else key_padding_mask[bs]
            qc = q[bs, r].transpose(1, 2).to(cd)
            kc, vc = (t[bs].transpose(1, 2).to(cd) for t in (k, v))
            doc = grad_out[bs, r].transpose(1, 2).to(cd)
            oc = out[bs, r].transpose(1, 2).to(cd)
            scores = _scores(qc, kc, scale, _allowed(rs, keys, causal, kpm, q.device))
            # lse = -inf (row without keys) -> +inf so that p = 0 without NaN.
            probs = torch.exp(scores - _finite_or(lse[bs, :, r].to(cd), float("inf")).unsqueeze(-1))
            delta = (doc * oc).sum(-1, keepdim=True)
            if grad_lse is not None:
                delta = delta - grad_lse[bs, :, r].to(cd).unsqueeze(-1)
            dscores = probs * (torch.matmul(doc, vc.transpose(-1, -2)) - delta)
            dq[bs, r] = (torch.matmul(dscores, kc) * scale).transpose(1, 2)
            dk[bs] += (torch.matmul(dscores.transpose(-1, -2), qc) * scale).transpose(1, 2)
            dv[bs] += torch.matmul(probs.transpose(-1, -2), doc).transpose(1, 2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def dense_attention_eager(q, k, v, *, causal, scale, key_padding_mask=None, dropout_p=0.0, compute_dtype=None):
    """Differentiable (autograd) masked softmax on blocks with optional dropout on the weights.

    Returns (out (B, L, H, D), lse (B, H, L)); dropout never changes the LSE. Not chunked.
    """
    rows, keys = q.shape[1], k.shape[1]
    cd = _compute_dtype(q.dtype, compute_dtype)
    qc, kc, vc = (t.transpose(1, 2).to(cd) for t in (q, k, v))
    scores = _scores(qc, kc, scale, _allowed(range(rows), keys, causal, key_padding_mask, q.device))
    weights, total, lse = shifted_exp(scores, dim=-1)
    probs = weights / total
    if dropout_p > 0.0:
        probs = torch.nn.functional.dropout(probs, p=dropout_p, training=True)
    out = torch.matmul(probs, vc).transpose(1, 2).to(q.dtype)
    return out, lse.to(lse_dtype(q.dtype))


def _finite_or(x: torch.Tensor, fill: float) -> torch.Tensor:
    return torch.where(torch.isfinite(x), x, torch.full_like(x, fill))


def _always(device=None, dtype=None) -> Optional[str]:
    return None


def _reference_forward(q, k, v, *, causal, scale, key_padding_mask=None):
    return dense_forward(q, k, v, causal=causal, scale=scale, key_padding_mask=key_padding_mask,
                         compute_dtype=torch.float64, max_elements=1 << 62)


def _reference_backward(grad_out, grad_lse, q, k, v, out, lse, aux=None, *, causal, scale, key_padding_mask=None):
    return dense_backward(grad_out, grad_lse, q, k, v, out, lse, aux, causal=causal, scale=scale,
                          key_padding_mask=key_padding_mask, compute_dtype=torch.float64, max_elements=1 << 62)


MANUAL = Backend("manual", dense_forward, dense_backward, _always, dense_attention_eager)
REFERENCE = Backend("reference", _reference_forward, _reference_backward, _always)
