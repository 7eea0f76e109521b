"""Eager dense attention, chunked so that memory stays O(chunk): the "manual", "reference" and
"sdpa_math" executors' kernel, the fallback of kernels that refuse a call, and the dropout path.

Calls take q (b, Lq, h, D), k, v (b, L, h_kv, D) with h a multiple of h_kv (query head j reads key head
j // (h / h_kv)); causal masks align at the bottom right (query i is position L - Lq + i).
"""
from __future__ import annotations

from typing import Optional

import torch

from hilbert_lab.attention.executors.base import Capabilities, lse_dtype
from hilbert_lab.attention.executors.kernel import DenseKernel, allowed_pairs
from hilbert_lab.attention.merge import merge_lse, shifted_exp

# Score elements (batch x heads x query rows x keys) materialised at once per chunk.
MAX_SCORE_ELEMENTS = 1 << 24


def _compute_dtype(dtype: torch.dtype, force: Optional[torch.dtype]) -> torch.dtype:
    if force is not None:
        return force
    return torch.float64 if dtype == torch.float64 else torch.float32


def _chunks(batch: int, heads: int, rows: int, keys: int, max_elements: int):
    per_row = heads * keys
    rows_per_chunk = max(1, min(rows, max_elements // max(per_row, 1)))
    batch_per_chunk = max(1, min(batch, max_elements // max(per_row * rows, 1)))
    for b0 in range(0, batch, batch_per_chunk):
        for r0 in range(0, rows, rows_per_chunk):
            yield slice(b0, min(b0 + batch_per_chunk, batch)), slice(r0, min(r0 + rows_per_chunk, rows))


def _grouped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cd: torch.dtype):
    """q (b, Lq, h, D) -> (b, h_kv, g, Lq, D); k, v (b, L, h_kv, D) -> (b, h_kv, 1, L, D), in dtype cd."""
    groups = q.shape[2] // k.shape[2]
    qg = q.transpose(1, 2).to(cd).unflatten(1, (k.shape[2], groups))
    return qg, k.transpose(1, 2).to(cd).unsqueeze(2), v.transpose(1, 2).to(cd).unsqueeze(2)


def _scores(qg, kg, scale, allowed):
    scores = torch.matmul(qg, kg.transpose(-1, -2)) * scale
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores


def _softmax_parts(qg, kg, scale, allowed):
    """shifted_exp's (weights, total, lse) of the scores scale * q k^T (-inf where `allowed` is False). A scale
    <= 1 multiplies the scores before the row max is subtracted (a scale below the dtype's range gives scores
    0, whose weights 1 are what exp of the true scores rounds to); a larger one multiplies the differences to
    the max (<= 0), so no weight overflows where the scaled scores would (their LSE is then inf)."""
    small = scale <= 1.0
    scores = _scores(qg, kg, scale if small else 1.0, allowed)
    return shifted_exp(scores, dim=-1, scale=1.0 if small else scale)


def dense_forward(q, k, v, *, causal, scale, need_lse=True, compute_dtype=None, max_elements=MAX_SCORE_ELEMENTS):
    """(out (b, Lq, h, D), lse (b, h, Lq), None) by chunked masked softmax; no autograd."""
    batch, rows, heads, _ = q.shape
    keys = k.shape[1]
    cd = _compute_dtype(q.dtype, compute_dtype)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(batch, heads, rows, dtype=lse_dtype(q.dtype), device=q.device)
    allowed_all = allowed_pairs(rows, keys, causal, q.device) if causal else None
    with torch.no_grad():
        for bs, rs in _chunks(batch, heads, rows, keys, max_elements):
            qg, kg, vg = _grouped(q[bs, rs], k[bs], v[bs], cd)
            weights, total, lse_c = _softmax_parts(qg, kg, scale, None if allowed_all is None else allowed_all[rs])
            out[bs, rs] = (torch.matmul(weights, vg) / total).flatten(1, 2).transpose(1, 2).to(q.dtype)
            lse[bs, :, rs] = lse_c.flatten(1, 2).to(lse.dtype)
    return out, lse, None


def dense_backward(grad_out, q, k, v, out, lse, aux=None, *, causal, scale, grad_lse=None, compute_dtype=None,
                   max_elements=MAX_SCORE_ELEMENTS):
    """(dq, dk, dv) for the given out and lse (rows without keys: +inf): ds = p * (dO v^T - rowsum(dO * out)
    + grad_lse); dk, dv summed over the query heads of each key head."""
    batch, rows, heads, _ = q.shape
    keys, kv_heads = k.shape[1], k.shape[2]
    cd = _compute_dtype(q.dtype, compute_dtype)
    dq = torch.empty(q.shape, dtype=cd, device=q.device)
    dk = torch.zeros(k.shape, dtype=cd, device=q.device)
    dv = torch.zeros(v.shape, dtype=cd, device=q.device)
    allowed_all = allowed_pairs(rows, keys, causal, q.device) if causal else None
    with torch.no_grad():
        for bs, rs in _chunks(batch, heads, rows, keys, max_elements):
            qg, kg, vg = _grouped(q[bs, rs], k[bs], v[bs], cd)
            dog = grad_out[bs, rs].transpose(1, 2).to(cd).unflatten(1, (kv_heads, -1))
            og = out[bs, rs].transpose(1, 2).to(cd).unflatten(1, (kv_heads, -1))
            scores = _scores(qg, kg, scale, None if allowed_all is None else allowed_all[rs])
            lse_g = lse[bs, :, rs].to(cd).unflatten(1, (kv_heads, -1)).unsqueeze(-1)
            probs = torch.exp(scores - lse_g)
            delta = (dog * og).sum(-1, keepdim=True)
            if grad_lse is not None:
                delta = delta - grad_lse[bs, :, rs].to(cd).unflatten(1, (kv_heads, -1)).unsqueeze(-1)
            dscores = probs * (torch.matmul(dog, vg.transpose(-1, -2)) - delta)
            dq[bs, rs] = (torch.matmul(dscores, kg) * scale).flatten(1, 2).transpose(1, 2)
            dk[bs] += (torch.matmul(dscores.transpose(-1, -2), qg) * scale).sum(2).transpose(1, 2)
            dv[bs] += torch.matmul(probs.transpose(-1, -2), dog).sum(2).transpose(1, 2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def eager_attention(q, k, v, *, causal, scale, dropout_p=0.0, compute_dtype=None):
    """Differentiable (autograd) masked softmax on one call with optional dropout on the weights.

    Returns (out (b, Lq, h, D), lse (b, h, Lq)); dropout never changes the LSE. Not chunked.
    """
    rows, keys = q.shape[1], k.shape[1]
    cd = _compute_dtype(q.dtype, compute_dtype)
    qg, kg, vg = _grouped(q, k, v, cd)
    allowed = allowed_pairs(rows, keys, causal, q.device) if causal else None
    weights, total, lse = _softmax_parts(qg, kg, scale, allowed)
    probs = weights / total
    if dropout_p > 0.0:
        probs = torch.nn.functional.dropout(probs, p=dropout_p, training=True)
    out = torch.matmul(probs, vg).flatten(1, 2).transpose(1, 2).to(q.dtype)
    return out, lse.flatten(1, 2).to(lse_dtype(q.dtype))


def dropout_attention(plan, q, k, v, *, scale: float, dropout_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The plan with dropout on the attention weights, by autograd through eager blocks and the merge:
    (out (B, Nq, H, D), lse (B, H, Nq)). Dropout never changes the LSE."""
    parts = plan.num_branches if plan.merge else 1
    batch, rows, heads, _ = q.shape
    outs = [torch.zeros(q.shape, dtype=q.dtype, device=q.device) for _ in range(parts)]
    lses = [torch.full((batch, heads, rows), float("-inf"), dtype=lse_dtype(q.dtype), device=q.device)
            for _ in range(parts)]
    for blk in plan.blocks:
        qb = blk.read(q, "query", plan.query_start)
        out_b, lse_b = eager_attention(qb, blk.read(k), blk.read(v), causal=plan.causal, scale=scale,
                                       dropout_p=dropout_p)
        slot = blk.branch if plan.merge else 0
        outs[slot] = _written(outs[slot], blk, out_b, plan.query_start)
        lses[slot] = _written(lses[slot].transpose(1, 2), blk, lse_b.transpose(1, 2), plan.query_start).transpose(1, 2)
    return merge_lse(outs, lses) if plan.merge else (outs[0], lses[0])


def _written(dst: torch.Tensor, blk, value: torch.Tensor, query_start: int) -> torch.Tensor:
    """dst with the block's query view replaced by value (b * count, Lq, h, *): out of place, for autograd."""
    dst = dst.clone()
    view = blk.view(dst, "query", query_start)
    view.copy_(value.reshape(view.shape))
    return dst


def _chunk_sizes(batch: int, heads: int, rows: int, keys: int, max_elements: int) -> tuple[int, int, int]:
    """(batch per chunk, rows per chunk, number of chunks) exactly as `_chunks` walks them."""
    per_row = heads * keys
    rows_per_chunk = max(1, min(rows, max_elements // max(per_row, 1)))
    batch_per_chunk = max(1, min(batch, max_elements // max(per_row * rows, 1)))
    return batch_per_chunk, rows_per_chunk, -(-batch // batch_per_chunk) * -(-rows // rows_per_chunk)


def _eager_workspace(compute_bytes: Optional[int], max_elements: int):
    """The eager kernel's working bytes beyond its outputs for one call (q (b, Lq, h, D), k (b, L, h_kv, D)):
    score-sized tensors of one chunk (forward 3 alive: scores, exponentials, result; backward 4: scores,
    probabilities, dO V^T, its shifted copy; while the second chunk computes, one of the first chunk's is
    still alive, which tops the first chunk's own when the second is as large); where
    the input dtype is narrower than the compute dtype, the chunk's copies in the compute dtype (forward q, k,
    v; backward q, k, v, dO and out) and the backward's dq, dk, dv accumulators, which are the outputs' size
    in the compute dtype (the outputs themselves count apart)."""

    def workspace(q: torch.Tensor, k: torch.Tensor, backward: bool) -> int:
        compute = compute_bytes or (8 if q.dtype == torch.float64 else 4)
        batch, rows, heads, dim = q.shape
        keys = k.shape[1]
        batch_chunk, rows_chunk, chunks = _chunk_sizes(batch, heads, rows, keys, max_elements)
        scores = batch_chunk * heads * rows_chunk * keys * compute
        alive = 4 if backward else 3
        working = alive * scores
        if chunks > 1:  # the second chunk: a whole one, or what the first left of its batch or rows
            second = (min(batch_chunk, batch - batch_chunk) * rows_chunk if rows_chunk == rows
                      else min(rows_chunk, rows - rows_chunk))
            working = max(working, alive * scores * second // (batch_chunk * rows_chunk) + scores)
        if q.element_size() == compute:
            return working
        query_copy = batch_chunk * heads * rows_chunk * dim * compute
        key_copy = batch_chunk * k.shape[2] * keys * dim * compute
        if not backward:
            return working + query_copy + 2 * key_copy
        accumulators = (q.numel() + 2 * k.numel()) * (compute - q.element_size())
        return working + 3 * query_copy + 2 * key_copy + accumulators

    return workspace


def _reference_forward(q, k, v, *, causal, scale, need_lse=True):
    return dense_forward(q, k, v, causal=causal, scale=scale, compute_dtype=torch.float64, max_elements=1 << 62)


def _reference_backward(grad_out, q, k, v, out, lse, aux=None, *, causal, scale, grad_lse=None):
    return dense_backward(grad_out, q, k, v, out, lse, aux, causal=causal, scale=scale, grad_lse=grad_lse,
                          compute_dtype=torch.float64, max_elements=1 << 62)


# Dry runs (attention.memory) count their outputs and take the chunks' working set from `workspace`: walking
# the chunks of a long sequence on meta tensors would cost a Python step per chunk.
MANUAL_KERNEL = DenseKernel("manual", dense_forward, dense_backward, gqa=True, bottom_right=True, grad_lse=True,
                            workspace=_eager_workspace(None, MAX_SCORE_ELEMENTS), meta=False)
REFERENCE_KERNEL = DenseKernel("reference", _reference_forward, _reference_backward, gqa=True, bottom_right=True,
                               grad_lse=True, workspace=_eager_workspace(8, 1 << 62), meta=False)
EAGER_CAPABILITIES = Capabilities(gqa=True, bottom_right=True, grad_lse=True, dropout=True)
