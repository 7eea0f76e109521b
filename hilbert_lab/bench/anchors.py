"""The strongest simple compositions a skilled user would write, timed beside the engine.

All read the plan's blocks as strided views of (B, N, H, D) (no index_select gathers):
- `kernel_floor`: the SDPA kernel alone on pre-gathered contiguous blocks, one batched call per
  block length (`gather_blocks` prepares them outside the timed region);
- `strided_composition`: per block a strided view, one SDPA call, the result written back into
  the output view; no LSE and no merge (head_groups / single-branch patterns);
- `torchscale_composition`: per block a strided view, the cuDNN/flash kernel with its LSE, written
  into per-branch buffers, merged with weights computed under no_grad (microsoft/torchscale's
  LongNet recipe: cheaper, and its gradients skip the merge weights);
- `fa4_floor`: FlashAttention-4 on every block, read and written in place as strided views (per-branch outputs
  and gradients, no merge, nothing else, in the fewest calls the views allow): the floor of in-place work.
`kernel` picks the SDPA kernel ("cudnn", "flash", "efficient", "math"); benchmarks time each that
runs and keep the fastest, so the anchor is the GPU's best.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import Plan, cached_plan
from hilbert_lab.attention.views import KEY, QUERY, plan_units, unit_views

_KERNELS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
aten = torch.ops.aten


def _plan(pattern: DilatedPattern, q: torch.Tensor) -> Plan:
    return cached_plan(pattern, q.shape[1], q.shape[2])


def gather_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: DilatedPattern) -> list[tuple]:
    """Contiguous (batch, 1, L, D) q, k, v per distinct block length L: every block's heads folded into
    the batch, as the kernel floor's input (built once, outside any timing)."""
    by_length: dict[int, list] = {}
    for blk in _plan(pattern, q).blocks:
        parts = [blk.read(t).permute(0, 2, 1, 3).reshape(-1, 1, blk.length, t.shape[3]) for t in (q, k, v)]
        by_length.setdefault(blk.length, []).append(parts)
    return [tuple(torch.cat([p[i] for p in parts]).contiguous() for i in range(3)) for parts in by_length.values()]


def kernel_floor(blocks: list[tuple], *, causal: bool, scale: float, kernel: str = "cudnn") -> list[torch.Tensor]:
    """One SDPA call per pre-gathered block length: the kernel's own time for the pattern's work."""
    with sdpa_kernel(_KERNELS[kernel]):
        return [F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale) for q, k, v in blocks]


def strided_composition(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: DilatedPattern, *,
                        scale: float, kernel: str = "cudnn") -> torch.Tensor:
    """Blocks as strided views, SDPA per block, written back into the output's view (no merge)."""
    plan = _plan(pattern, q)
    if plan.merge:
        raise ValueError("strided_composition has no merge: use torchscale_composition for overlapping branches")
    out = torch.zeros_like(q)
    with sdpa_kernel(_KERNELS[kernel]):
        for blk in plan.blocks:
            qb, kb, vb = (blk.read(t).transpose(1, 2) for t in (q, k, v))
            res = F.scaled_dot_product_attention(qb, kb, vb, is_causal=pattern.causal, scale=scale)
            blk.view(out).copy_(res.transpose(1, 2).unflatten(0, (q.shape[0], blk.count)))
    return out


def _attention_with_lse(q, k, v, causal: bool, scale: float, kernel: str):
    if kernel == "cudnn":
        out, lse = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)[:2]
        return out, lse.squeeze(-1)
    if kernel == "flash":
        out, lse = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)[:2]
        return out, lse
    out, lse = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=scale)[:2]
    return out, lse[:, :, : q.shape[2]]


def torchscale_composition(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: DilatedPattern, *,
                           scale: float, kernel: str = "cudnn") -> torch.Tensor:
    """Per branch: strided block views, kernel with LSE, scatter; merge weights under no_grad."""
    plan = _plan(pattern, q)
    batch, seq_len, num_heads, _ = q.shape
    outs = [torch.zeros_like(q) for _ in range(plan.num_branches)]
    lses = [torch.full((batch, seq_len, num_heads), float("-inf"), device=q.device) for _ in range(plan.num_branches)]
    for blk in plan.blocks:
        qb, kb, vb = (blk.read(t).transpose(1, 2) for t in (q, k, v))
        res, lse = _attention_with_lse(qb, kb, vb, pattern.causal, scale, kernel)
        blk.view(outs[blk.branch]).copy_(res.transpose(1, 2).unflatten(0, (batch, blk.count)))
        blk.view(lses[blk.branch]).copy_(lse.detach().transpose(1, 2).unflatten(0, (batch, blk.count)))
    if len(outs) == 1:
        return outs[0]
    with torch.no_grad():
        stacked = torch.stack(lses)
        peak = stacked.amax(0)
        weights = torch.exp(stacked - torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak)))
        weights = weights / weights.sum(0).clamp_min(torch.finfo(weights.dtype).tiny)
    out = outs[0] * weights[0].unsqueeze(-1).to(q.dtype)
    for part, weight in zip(outs[1:], weights[1:]):
        out = out + part * weight.unsqueeze(-1).to(q.dtype)
    return out


def fa4_floor(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: DilatedPattern, *, scale: float,
              grad_out: torch.Tensor | None = None):
    """FlashAttention-4 on the plan's work, reading q, k, v and writing the outputs (and, with grad_out, the
    gradients) as strided views of per-branch (B, N, H, D) buffers: the kernels alone, with no merge and no
    copies, in the fewest calls that strided views allow (attention.views: a branch's offsets fold into one call's
    heads, its segments into the batch); the calls write LSEs where a merge or the backward needs them. Returns the
    per-branch outputs (P, B, N, H, D) and gradients (P, 3, B, N, H, D) (None without grad_out)."""
    from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd

    plan = _plan(pattern, q)
    parts = plan.num_branches if plan.merge else 1
    outs = torch.empty((parts, *q.shape), dtype=q.dtype, device=q.device)
    grads = None if grad_out is None else torch.empty((parts, 3, *q.shape), dtype=q.dtype, device=q.device)
    calls = []
    for unit in plan_units(plan):
        slot = unit.branch if plan.merge else 0
        tensors = [(q, QUERY), (k, KEY), (v, KEY), (outs[slot], QUERY)]
        if grads is not None:
            tensors += [(grad_out, QUERY), (grads[slot, 0], QUERY), (grads[slot, 1], KEY), (grads[slot, 2], KEY)]
        calls += unit_views(unit, tensors, plan.query_start)[1]
    # the LSE where the backward reads it or branches merge (an exact merge needs it): a head_groups forward alone
    # writes the outputs, as ours does then
    need_lse = grad_out is not None or plan.merge
    lses = [_flash_attn_fwd(*views[:3], softmax_scale=scale, causal=pattern.causal, return_lse=need_lse,
                            out=views[3])[1] for views in calls]
    if grads is not None:
        for (qv, kv, vv, ov, gv, dq, dk, dv), lse in zip(calls, lses):
            _flash_attn_bwd(qv, kv, vv, ov, gv, lse, softmax_scale=scale, causal=pattern.causal, dq=dq, dk=dk, dv=dv)
    return outs, grads
