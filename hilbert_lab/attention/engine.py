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

import functools
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from hilbert_lab.attention.backends import Backend, get_backend
from hilbert_lab.attention.backends.base import lse_dtype
from hilbert_lab.attention.backends.manual import dense_attention_eager
from hilbert_lab.attention.merge import merge_lse
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.validation import validate_attention_inputs

IDENTITY_ORDERINGS = (None, "identity")
_CONTRACT_ORDERINGS = ("identity", "hilbert", "morton", "snake")


@dataclass(frozen=True)
class Block:
    """Segments [start, start + count * seg) of one (branch, offset) group, read as (B * count, L, h, ...).

    Token j of segment s is original position start + s * seg + offset + j * step. With a layout
    permutation, `index` (count * L,) holds the layout slots of those tokens instead.
    """

    branch: int
    heads: slice
    start: int
    count: int
    seg: int
    offset: int
    step: int
    length: int
    index: Optional[torch.Tensor] = None

    def read(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, N, H, *rest) -> (B * count, L, h, *rest) (a view when possible)."""
        if self.index is not None:
            picked = x.index_select(1, self.index)[:, :, self.heads]
            return picked.unflatten(1, (self.count, self.length)).flatten(0, 1)
        return self._view(x).flatten(0, 1)

    def write(self, dst: torch.Tensor, value: torch.Tensor, accumulate: bool = False) -> None:
        """Store (or add) `value` (B * count, L, h, *rest) into dst (B, N, H, *rest) in place."""
        value = value.unflatten(0, (dst.shape[0], self.count))
        if self.index is not None:
            value = value.flatten(1, 2).to(dst.dtype)
            if accumulate:
                dst[:, self.index, self.heads] += value
            else:
                dst[:, self.index, self.heads] = value
            return
        view = self._view(dst)
        if accumulate:
            view.add_(value.to(dst.dtype))
        else:
            view.copy_(value)

    def _view(self, x: torch.Tensor) -> torch.Tensor:
        part = x[:, self.start : self.start + self.count * self.seg].unflatten(1, (self.count, self.seg))
        return part[:, :, self.offset :: self.step][:, :, :, self.heads]


@dataclass(frozen=True)
class Plan:
    """Blocks of a (pattern, seq_len, num_heads, layout) and whether branches must be merged."""

    blocks: tuple[Block, ...]
    num_branches: int
    merge: bool


def _plan(pattern: DilatedPattern, seq_len: int, num_heads: int, inverse: Optional[torch.Tensor]) -> Plan:
    blocks = []
    branches_per_head = [0] * num_heads
    for group in pattern.groups(seq_len, num_heads):
        for h in group.heads:
            branches_per_head[h] += 1
        seg, step, offset = group.segment_length, group.dilation_rate, group.offset
        full = seq_len // seg
        parts = [(0, full, seg)] if full else []
        if seq_len - full * seg:
            parts.append((full * seg, 1, seq_len - full * seg))
        for start, count, length in parts:
            selected = len(range(offset, length, step))
            if selected == 0:
                continue
            index = None
            if inverse is not None:
                local = torch.arange(offset, length, step, device=inverse.device)
                segments = torch.arange(count, device=inverse.device)
                positions = (start + segments[:, None] * length + local[None, :]).reshape(-1)
                index = inverse[positions]
            blocks.append(Block(group.branch, group.head_slice, start, count, length, offset, step, selected, index))
    return Plan(tuple(blocks), pattern.num_branches, max(branches_per_head) > 1)


@torch.compiler.disable  # planning is Python/numpy work: keep it out of compiled graphs
@functools.lru_cache(maxsize=128)
def _cached_plan(pattern: DilatedPattern, seq_len: int, num_heads: int, ordering: Optional[str], block: int,
                 device: str = "cpu") -> Plan:
    inverse = None
    if ordering not in IDENTITY_ORDERINGS:
        inverse = layout_permutation(seq_len, block, ordering)[1].to(device)
    return _plan(pattern, seq_len, num_heads, inverse)


@torch.compiler.disable
@functools.lru_cache(maxsize=64)
def layout_permutation(seq_len: int, block: int, ordering: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(perm, inverse) LongTensors (N,): `ordering` applied inside each block of `block` tokens.

    x_layout = x[:, perm], x = x_layout[:, inverse]; a shorter last block gets its own permutation
    (hilbert_lab.curves.segment_permutation).
    """
    from hilbert_lab.curves import segment_permutation

    perm = torch.empty(seq_len, dtype=torch.int64)
    for start in range(0, seq_len, block):
        length = min(block, seq_len - start)
        local, _ = segment_permutation(length, ordering)
        perm[start : start + length] = torch.tensor(local, dtype=torch.int64) + start
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(seq_len, dtype=torch.int64)
    if not torch.equal(torch.sort(perm).values, torch.arange(seq_len)):
        raise ValueError(f"segment_permutation({block}, {ordering!r}) did not return a permutation")
    return perm, inverse


def _orderings() -> tuple[str, ...]:
    try:
        from hilbert_lab.curves import ORDERINGS
    except ImportError:
        return _CONTRACT_ORDERINGS
    return tuple(ORDERINGS)


def resolve_backend(backend: str | Backend, q: torch.Tensor, segment_lengths: Sequence[int] = (), *,
                    mode: str = "longnet", whole_pattern: bool = True) -> Backend:
    """The adapter for `backend` ("auto" asks selection.select_backend), checked to run on q.
    whole_pattern=False: the caller runs dense blocks only (auto then never picks the fused kernel)."""
    if isinstance(backend, Backend):
        chosen = backend
    elif backend == "auto":
        from hilbert_lab.attention.selection import select_backend

        chosen = get_backend(select_backend(q.device, q.dtype, shape=tuple(q.shape), segment_lengths=tuple(segment_lengths),
                                            mode=mode, whole_pattern=whole_pattern))
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
    allowed = _orderings()
    if ordering not in IDENTITY_ORDERINGS and ordering not in allowed:
        raise ValueError(f"ordering must be None or one of {allowed}, got {ordering!r}")
    if not isinstance(hilbert_pattern, bool):
        raise ValueError(f"hilbert_pattern must be True or False, got {hilbert_pattern!r}")
    if not isinstance(return_lse, bool):
        raise ValueError(f"return_lse must be True or False, got {return_lse!r}")
    chosen = resolve_backend(backend, q, pattern.segment_lengths, mode=pattern.mode)
    batch, seq_len, num_heads, head_dim = q.shape
    scale = head_dim**-0.5 if scale is None else float(scale)
    block = min(max(pattern.segment_lengths), seq_len)

    fused = chosen.whole_pattern is not None and dropout_p == 0.0
    # A fused kernel addresses tokens by original position: a layout ordering cannot change its
    # result, so it is not materialised there.
    permuted = hilbert_pattern or (ordering not in IDENTITY_ORDERINGS and not fused)
    if permuted:
        order = "hilbert" if ordering in IDENTITY_ORDERINGS else ordering
        perm, inverse = (t.to(q.device) for t in layout_permutation(seq_len, block, order))
        q, k, v = (t.index_select(1, perm) for t in (q, k, v))
    if fused:
        out, lse = chosen.whole_pattern(q, k, v, pattern, scale=scale)
    else:
        # hilbert_pattern: selection on layout positions (plain plan on the permuted tensors);
        # ordering: selection on original positions, read through the layout (plan with index).
        layout = ordering if permuted and not hilbert_pattern else None
        plan = _cached_plan(pattern, seq_len, num_heads, layout, block, str(q.device))
        out, lse = _run(plan, chosen, q, k, v, scale, causal, float(dropout_p))
    if permuted:
        out, lse = out.index_select(1, inverse), lse.index_select(2, inverse)
    return (out, lse) if return_lse else out


def _run(plan: Plan, backend: Backend, q, k, v, scale: float, causal: bool, dropout_p: float):
    if dropout_p > 0.0 or backend.backward is None:
        return _forward_autograd(plan, backend, q, k, v, scale, causal, dropout_p)
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
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        acc = torch.float64 if q.dtype == torch.float64 else torch.float32
        grads = [torch.zeros(t.shape, dtype=acc, device=t.device) for t in (q, k, v)]
        lse_t = lse.transpose(1, 2)
        glse_t = None if grad_lse is None else grad_lse.transpose(1, 2)
        for blk, aux in zip(ctx.plan.blocks, ctx.auxes):
            block_grad_lse = None if glse_t is None else blk.read(glse_t).transpose(1, 2)
            shares = ctx.backend.backward(
                blk.read(grad_out), block_grad_lse, blk.read(q), blk.read(k), blk.read(v), blk.read(out),
                blk.read(lse_t).transpose(1, 2), aux, causal=ctx.causal, scale=ctx.scale,
            )
            for total, share in zip(grads, shares):
                blk.write(total, share, accumulate=True)
        dq, dk, dv = (g.to(t.dtype) for g, t in zip(grads, (q, k, v)))
        return dq, dk, dv, None, None, None, None
