"""Dilated attention engine: gather each (branch, offset) group, run a block backend, scatter, merge.

The engine owns the layout; backends see dense blocks (B * segments, L, heads, D). Without an
ordering every group is read through strided views (segments x dilation x head step), so the
common case copies nothing but what the backend needs; a ragged last segment is its own shorter
block (no padding, no mask). Branches are merged by their LSEs (longnet mode); in head_groups
mode every head has one branch and results are written in place.

Backward (custom autograd.Function): the merged result is one softmax over the union of the
branches' keys, so each block's standard backward called with the *merged* output and LSE gives
exactly its share of dQ, dK, dV (gradients through the merge weights included); shares are summed.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from hilbert_lab.attention.backends import Backend, get_backend
from hilbert_lab.attention.backends.base import lse_dtype
from hilbert_lab.attention.backends.manual import dense_attention_eager
from hilbert_lab.attention.inplace import (
    add_lse_share, backward_into, forward_into, fused_merge_applies, inplace_attention, inplace_kernel, merge_into_one,
)
from hilbert_lab.attention.merge import merge_lse
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import IDENTITY_ORDERINGS, Plan, cached_plan
from hilbert_lab.attention.validation import validate_attention_inputs
from hilbert_lab.curves import ORDERINGS
from hilbert_lab.curves.layouts import layout_permutation, permute_sequence


def resolve_backend(backend: str | Backend, q: torch.Tensor, segment_lengths: Sequence[int] = (), *,
                    mode: str = "longnet", causal: bool = False, training: bool = False,
                    whole_pattern: bool = True) -> Backend:
    """The adapter for `backend` ("auto" asks selection.select_backend), checked to run on q.
    whole_pattern=False: the caller runs dense blocks only (auto then never picks the fused kernel)."""
    if isinstance(backend, Backend):
        chosen = backend
    elif backend == "auto":
        from hilbert_lab.attention.selection import select_backend

        chosen = get_backend(select_backend(q.device, q.dtype, shape=tuple(q.shape), segment_lengths=tuple(segment_lengths),
                                            mode=mode, causal=causal, training=training,
                                            whole_pattern=whole_pattern))
    else:
        chosen = get_backend(backend)
    reason = chosen.unavailable_reason(q.device, q.dtype)
    if reason is not None:
        from hilbert_lab.attention.backends import BackendUnavailableError

        raise BackendUnavailableError(f"backend {chosen.name!r} cannot run on {q.device} / {q.dtype}: {reason}")
    return chosen


def dilated_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    segment_lengths: Sequence[int],
    dilation_rates: Sequence[int],
    causal: bool = False,
    mode: str = "longnet",
    backend: str | Backend = "auto",
    ordering: Optional[str] = None,
    scale: Optional[float] = None,
    dropout_p: float = 0.0,
    return_lse: bool = False,
    hilbert_pattern: bool = False,
):
    """LongNet dilated attention on q, k, v (B, N, H, D) -> out (B, N, H, D) [, lse (B, H, N)].

    segment_lengths / dilation_rates: one entry per branch (see pattern.py for the semantics on
    original positions, incl. ragged N and w > N). mode: "longnet" or "head_groups". backend:
    a name from backends.BACKENDS or "auto". ordering: memory layout of the tokens inside each
    block of max(segment_lengths) (clipped to N) tokens (hilbert_lab.curves.ORDERINGS); it never
    changes the result. hilbert_pattern=True is a *different pattern* (the predecessor's): the
    sequence is permuted by `ordering` (default "hilbert") and dilation/segments/causality are then
    applied to layout positions; the output is returned in original order. scale defaults to
    D**-0.5. dropout_p > 0 drops attention weights (callers pass 0 in eval; modules do) and runs
    the eager autograd path. LSE is float32 (float64 for float64 inputs); rows with no keys give
    out 0 and lse -inf.
    """
    if isinstance(q, torch.Tensor) and torch.is_autocast_enabled(q.device.type):
        # Like SDPA under autocast: run in the autocast dtype, with autocast off inside (explicit casts).
        low = torch.get_autocast_dtype(q.device.type)
        q, k, v = (t.to(low) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in (q, k, v))
        with torch.autocast(q.device.type, enabled=False):
            return dilated_attention(q, k, v, segment_lengths=segment_lengths, dilation_rates=dilation_rates,
                                     causal=causal, mode=mode, backend=backend, ordering=ordering, scale=scale,
                                     dropout_p=dropout_p, return_lse=return_lse, hilbert_pattern=hilbert_pattern)
    validate_attention_inputs(q, k, v, scale=scale, dropout_p=dropout_p)
    pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
    allowed = tuple(ORDERINGS)
    if ordering not in IDENTITY_ORDERINGS and ordering not in allowed:
        raise ValueError(f"ordering must be None or one of {allowed}, got {ordering!r}")
    if not isinstance(hilbert_pattern, bool):
        raise ValueError(f"hilbert_pattern must be True or False, got {hilbert_pattern!r}")
    if not isinstance(return_lse, bool):
        raise ValueError(f"return_lse must be True or False, got {return_lse!r}")
    training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    chosen = resolve_backend(backend, q, pattern.segment_lengths, mode=pattern.mode, causal=pattern.causal,
                             training=training)
    batch, seq_len, num_heads, head_dim = q.shape
    scale = head_dim**-0.5 if scale is None else float(scale)
    block = min(max(pattern.segment_lengths), seq_len)

    fused = chosen.whole_pattern is not None and dropout_p == 0.0
    # A fused kernel addresses tokens by original position: a layout ordering cannot change its
    # result, so it is not materialised there.
    permuted = hilbert_pattern or (ordering not in IDENTITY_ORDERINGS and not fused)
    if permuted:
        order = "hilbert" if ordering in IDENTITY_ORDERINGS else ordering
        perm, inverse = layout_permutation(seq_len, block, order, device=q.device)
        q, k, v = (permute_sequence(t, perm) for t in (q, k, v))
    if fused:
        out, lse = chosen.whole_pattern(q, k, v, pattern, scale=scale)
    else:
        # hilbert_pattern: selection on layout positions (plain plan on the permuted tensors);
        # ordering: selection on original positions, read through the layout (plan with index).
        layout = ordering if permuted and not hilbert_pattern else None
        plan = cached_plan(pattern, seq_len, num_heads, layout, str(q.device))
        out, lse = execute_plan(plan, chosen, q, k, v, scale, causal, float(dropout_p),
                                need_lse=return_lse or training or permuted)
    if permuted:
        out, lse = permute_sequence(out, inverse), permute_sequence(lse, inverse, dim=2)
    return (out, lse) if return_lse else out


def execute_plan(plan: Plan, backend: Backend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                 causal: bool, dropout_p: float = 0.0, need_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Run every block of `plan` on `backend` (dense-block adapter) and merge: (out (B, N, H, D), lse (B, H, N)).

    Differentiable; exact gradients through the merge (see the module docstring). need_lse=False (no
    gradient, LSE not wanted) lets the in-place executor skip the LSE where no merge needs it; the
    returned lse is then meaningless."""
    if dropout_p > 0.0 or backend.backward is None:
        return _forward_autograd(plan, backend, q, k, v, scale, causal, dropout_p)
    kernel = inplace_kernel(backend.name, q) if backend.name.startswith("sdpa") else None
    if kernel is not None and all(blk.index is None for blk in plan.blocks):
        return inplace_attention(plan, kernel, q, k, v, scale, causal, need_lse=need_lse)
    return _DilatedFunction.apply(q, k, v, plan, backend, scale, causal)


def _empty_results(plan: Plan, q: torch.Tensor, dtype: torch.dtype):
    batch, seq_len, num_heads, _ = q.shape
    parts = plan.num_branches if plan.merge else 1
    outs = [torch.zeros(q.shape, dtype=dtype, device=q.device) for _ in range(parts)]
    lses = [torch.full((batch, num_heads, seq_len), float("-inf"), dtype=lse_dtype(q.dtype), device=q.device)
            for _ in range(parts)]
    return outs, lses


def _forward_autograd(plan: Plan, backend: Backend, q, k, v, scale, causal, dropout_p):
    """Differentiable path (dropout, or backends without a backward): autograd through attend and merge."""
    outs, lses = _empty_results(plan, q, q.dtype)
    for blk in plan.blocks:
        qb, kb, vb = blk.read(q), blk.read(k), blk.read(v)
        if dropout_p > 0.0:
            out_b, lse_b = dense_attention_eager(qb, kb, vb, causal=causal, scale=scale, dropout_p=dropout_p)
        else:
            out_b, lse_b = backend.attend(qb, kb, vb, causal=causal, scale=scale)
        slot = blk.branch if plan.merge else 0
        blk.write(outs[slot], out_b)
        blk.write(lses[slot].transpose(1, 2), lse_b.transpose(1, 2))
    return merge_lse(outs, lses) if plan.merge else (outs[0], lses[0])


class _DilatedFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, plan: Plan, backend: Backend, scale: float, causal: bool):
        # Branch results that still get merged are kept in the LSE precision (float32 for half inputs).
        outs, lses = _empty_results(plan, q, lse_dtype(q.dtype) if plan.merge else q.dtype)
        auxes = []
        for blk in plan.blocks:
            out_b, lse_b, aux = backend.forward(blk.read(q), blk.read(k), blk.read(v), causal=causal, scale=scale)
            slot = blk.branch if plan.merge else 0
            blk.write(outs[slot], out_b)
            blk.write(lses[slot].transpose(1, 2), lse_b.transpose(1, 2))
            auxes.append(aux)
        out, lse = merge_lse(outs, lses) if plan.merge else (outs[0], lses[0])
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan, ctx.backend, ctx.scale, ctx.causal, ctx.auxes = plan, backend, scale, causal, auxes
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = backward_blocks(ctx.plan, ctx.backend, grad_out, grad_lse, q, k, v, out, lse, ctx.scale,
                                     ctx.causal, ctx.auxes)
        return dq, dk, dv, None, None, None, None


def backward_blocks(plan: Plan, backend: Backend, grad_out, grad_lse, q, k, v, out, lse, scale: float, causal: bool,
                    auxes=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact (dq, dk, dv) of a plan's merged (out, lse): each block's backward with the merged out and LSE.
    auxes: the backend's per-block forward state (None: the backend recomputes what it needs)."""
    # Blocks that share a (position, head) (merged branches) accumulate in the LSE precision; otherwise
    # every block owns its gradient entries and writes them in the input dtype.
    acc = lse_dtype(q.dtype) if plan.merge else q.dtype
    grads = tuple(torch.zeros(t.shape, dtype=acc, device=t.device) for t in (q, k, v))
    _blocks_backward_into(plan, backend, auxes, grads, grad_out, grad_lse, q, k, v, out, lse, scale, causal,
                          accumulate=plan.merge)
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))


def _blocks_backward_into(plan: Plan, backend: Backend, auxes, grads, grad_out, grad_lse, q, k, v, out, lse,
                          scale: float, causal: bool, accumulate: bool) -> None:
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    lse_t = lse.transpose(1, 2)
    glse_t = None if grad_lse is None else grad_lse.transpose(1, 2)
    for i, blk in enumerate(plan.blocks):
        block_grad_lse = None if glse_t is None else blk.read(glse_t).transpose(1, 2)
        shares = backend.backward(
            blk.read(grad_out), block_grad_lse, blk.read(q), blk.read(k), blk.read(v), blk.read(out),
            blk.read(lse_t).transpose(1, 2), None if auxes is None else auxes[i], causal=causal, scale=scale,
        )
        for total, share in zip(grads, shares):
            blk.write(total, share, accumulate=accumulate)


# Partial results of a plan, for callers that merge them with their own (the ring): per slot (a branch,
# or several merged), outs (P, B, N, H, D) and lses (P, B, N, H); one (executor, state) per forward.


def partial_buffers(num_slots: int, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty slot buffers (outs (P, B, N, H, D), lses (P, B, N, H)) for `num_slots` partial results of q's
    shape: outs in q's dtype for half precision on CUDA (what the kernels return), else in the LSE
    precision; lses in the LSE precision, starting at -inf."""
    half_on_cuda = q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
    dtype = q.dtype if half_on_cuda else lse_dtype(q.dtype)
    fused = fused_merge_applies(q.device, dtype, lse_dtype(q.dtype))
    outs = (torch.empty if fused else torch.zeros)((num_slots, *q.shape), dtype=dtype, device=q.device)
    batch, seq_len, num_heads, _ = q.shape
    lses = torch.full((num_slots, batch, seq_len, num_heads), float("-inf"), dtype=lse_dtype(q.dtype),
                      device=q.device)
    return outs, lses


def forward_partials(plan: Plan, backend: Backend, q, k, v, scale: float, causal: bool, outs: torch.Tensor,
                     lses: torch.Tensor, slots: dict[int, int]) -> tuple:
    """Write every block's (out, lse) into slot slots[branch] of (outs, lses) (see `partial_buffers`);
    returns the state `backward_partials` needs."""
    kernel = inplace_kernel(backend.name, q) if backend.name.startswith("sdpa") else None
    if kernel is not None and backend.backward is not None and all(blk.index is None for blk in plan.blocks):
        return ("inplace", kernel, forward_into(plan, kernel, q, k, v, scale, causal, outs, lses, slots=slots))
    auxes = []
    for blk in plan.blocks:
        out_b, lse_b, aux = backend.forward(blk.read(q), blk.read(k), blk.read(v), causal=causal, scale=scale)
        blk.write(outs[slots[blk.branch]], out_b)
        blk.write(lses[slots[blk.branch]], lse_b.transpose(1, 2))
        auxes.append(aux)
    return ("blocks", None, auxes)


def merge_partials(outs: torch.Tensor, lses: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The merged (out (B, N, H, D) in `dtype`, lse (B, H, N)) of slot partials."""
    return merge_into_one(outs, lses, dtype)


def backward_partials(plan: Plan, backend: Backend, state: tuple, grads: tuple[torch.Tensor, ...], q, k, v,
                      out: torch.Tensor, lse: torch.Tensor, grad_out, grad_lse, scale: float, causal: bool) -> None:
    """Add the plan's share of (dq, dk, dv) for the *merged* (out, lse (B, H, N)) into grads (float
    accumulators of q's shape). out and grad_out must be contiguous."""
    executor, kernel, auxes = state
    if executor == "inplace":
        lse_bnh = lse.transpose(1, 2).contiguous()
        if grad_out is not None:
            backward_into(plan, kernel, auxes, grads, q, k, v, out, grad_out, lse_bnh, scale, causal, accumulate=True)
        if grad_lse is not None:
            add_lse_share(plan, kernel, auxes, grads, q, k, grad_lse, lse_bnh, scale, causal)
        return
    _blocks_backward_into(plan, backend, auxes, grads, grad_out, grad_lse, q, k, v, out, lse, scale, causal,
                          accumulate=True)
