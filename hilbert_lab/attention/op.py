"""Dilated attention as a `torch.library` custom op: compiled graphs and CUDA graphs hold a call as one op.

`torch.ops.hilbert_lab.dilated_attention(q, k, v, segment_lengths, dilation_rates, mode, causal, backend,
scale, need_lse, training, cu_seqlens)` -> (out (B, Nq, H, D), lse (B, H, Nq)), and its backward
`torch.ops.hilbert_lab.dilated_attention_backward(grad_out, grad_lse, q, k, v, out, lse, ...)` -> (dq, dk,
dv). Both take tensors and plain values only (backend a name; cu_seqlens the document boundaries as host
integers, as flash-attn's varlen entries take max_seqlen): the plan (plan.cached_plan) and the executor
(selection.resolve_executor; forward and backward resolve alike) are found
inside from those values. As in flash-attn's interface, forward and backward are separate ops, so the
backward gets no Python state from its forward: every executor rebuilds its per-call states from the
plan and the shapes (function.run_backward with states None). Fake implementations give shapes and
strides, so torch.compile traces through the op without running it.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from hilbert_lab.attention.executors.base import Executor, lse_dtype
from hilbert_lab.attention.function import Job, make_job, plan_part, run_backward, run_forward
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import cached_plan
from hilbert_lab.attention.selection import resolve_executor

def check_whole_pattern(executor: Executor, q: torch.Tensor, k: torch.Tensor, packed: bool) -> None:
    """ValueError unless `executor` takes the call's geometry (a whole-pattern executor takes one sequence,
    one key/value head per query head and as many queries as keys)."""
    if not executor.capabilities.whole_pattern or not (packed or k.shape[2] != q.shape[2] or q.shape[1] < k.shape[1]):
        return
    what = ("cu_seqlens (packed documents)" if packed else
            f"{k.shape[2]} key/value heads for {q.shape[2]}" if k.shape[2] != q.shape[2] else
            f"{q.shape[1]} queries for {k.shape[1]} keys")
    raise ValueError(f"backend {executor.name!r} runs the whole pattern on one sequence with one key/value head per "
                     f"query head; it does not take {what}: use backend 'auto', 'sdpa', 'fa4' or 'manual'")


def call_executor(backend: str, q: torch.Tensor, k: torch.Tensor, pattern: DilatedPattern, *, training: bool,
                  packed: bool) -> Executor:
    """The executor of a call (resolve_executor), checked to take its geometry. A call's forward and backward
    resolve alike: `auto`'s one reading of the device (whether in-place buffers fit) is kept per shape."""
    plain = not packed and k.shape[2] == q.shape[2] and q.shape[1] == k.shape[1]
    chosen = resolve_executor(backend, q, pattern, training=training, whole_pattern=plain, packed=packed)
    check_whole_pattern(chosen, q, k, packed)
    return chosen


def documents_of(cu_seqlens: Optional[Sequence[int]]) -> Optional[tuple[tuple[int, int], ...]]:
    """((start, length), ...) of the non-empty documents between boundaries [0, n1, ..., N]; None for one."""
    if cu_seqlens is None:
        return None
    documents = tuple((a, b - a) for a, b in zip(cu_seqlens, cu_seqlens[1:]) if b > a)
    return None if len(documents) == 1 else documents


def _job(q, k, segment_lengths, dilation_rates, mode, causal, backend, scale, training, cu_seqlens) -> Job:
    pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
    documents = documents_of(cu_seqlens)
    executor = call_executor(backend, q, k, pattern, training=training, packed=documents is not None)
    plan = cached_plan(pattern, k.shape[1], q.shape[2], num_kv_heads=None if k.shape[2] == q.shape[2] else k.shape[2],
                       documents=documents, query_len=q.shape[1] if q.shape[1] < k.shape[1] else None)
    return make_job([plan_part(executor, plan)], scale)


def _lse_layout(lse: torch.Tensor) -> torch.Tensor:
    """lse (B, H, Nq) stored token-major ((B, Nq, H) memory), the layout the slots write (no copy then)."""
    return lse if lse.transpose(1, 2).is_contiguous() else lse.transpose(1, 2).contiguous().transpose(1, 2)


@torch.library.custom_op("hilbert_lab::dilated_attention", mutates_args=())
def dilated_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segment_lengths: list[int],
                         dilation_rates: list[int], mode: str, causal: bool, backend: str, scale: float,
                         need_lse: bool, training: bool,
                         cu_seqlens: Optional[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, Nq, H, D) contiguous, lse (B, H, Nq) token-major) of one dilated-attention call."""
    job = _job(q, k, segment_lengths, dilation_rates, mode, causal, backend, scale, training, cu_seqlens)
    out, lse, _ = run_forward(job, q, k, v, need_lse or training)
    return out.contiguous(), _lse_layout(lse)


@dilated_attention_op.register_fake
def _(q, k, v, segment_lengths, dilation_rates, mode, causal, backend, scale, need_lse, training, cu_seqlens):
    batch, queries, heads, dim = q.shape
    out = q.new_empty((batch, queries, heads, dim))
    lse = q.new_empty((batch, queries, heads), dtype=lse_dtype(q.dtype)).transpose(1, 2)
    return out, lse


@torch.library.custom_op("hilbert_lab::dilated_attention_backward", mutates_args=())
def dilated_attention_backward_op(grad_out: Optional[torch.Tensor], grad_lse: Optional[torch.Tensor], q: torch.Tensor,
                                  k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                                  segment_lengths: list[int], dilation_rates: list[int], mode: str, causal: bool,
                                  backend: str, scale: float,
                                  cu_seqlens: Optional[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), contiguous, of the call's merged (out, lse) for upstream gradients (None: zero)."""
    job = _job(q, k, segment_lengths, dilation_rates, mode, causal, backend, scale, True, cu_seqlens)
    grads = run_backward(job, None, q, k, v, out, lse, grad_out, grad_lse)
    return tuple(g.contiguous() for g in grads)


@dilated_attention_backward_op.register_fake
def _(grad_out, grad_lse, q, k, v, out, lse, segment_lengths, dilation_rates, mode, causal, backend, scale,
      cu_seqlens):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, segment_lengths, dilation_rates, mode, causal, backend, scale, _, _, cu_seqlens = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.arguments = (segment_lengths, dilation_rates, mode, causal, backend, scale, cu_seqlens)
    ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zero-gradient kernel calls


def _backward(ctx, grad_out, grad_lse):
    nothing = (None,) * 9
    if grad_out is None and grad_lse is None:
        return (None, None, None, *nothing)
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = dilated_attention_backward_op(grad_out, grad_lse, q, k, v, out, lse, *ctx.arguments)
    return (dq, dk, dv, *nothing)


dilated_attention_op.register_autograd(_backward, setup_context=_setup_context)
