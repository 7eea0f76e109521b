"""Dilated attention as a `torch.library` custom op: compiled graphs and CUDA graphs hold a call as one op.

The op `hilbert_lab::dilated_attention(q, k, v, boundaries, config)` -> (out (B, Nq, H, D), lse (B, H, Nq)) and its
backward `hilbert_lab::dilated_attention_backward(grad_out, grad_lse, q, k, v, out, lse, boundaries, config)` ->
(dq, dk, dv) (both under torch.ops), paired by one autograd Function (`dilated_attention_call`). `config`
(`call_config`) holds the call's plain values: segment lengths, dilation rates, mode, causality, the backend's name,
the scale, whether the LSE is wanted, training, and which global heads q's heads are (global_heads). `boundaries`:
a packed row's [0, n1, ..., N] as an int64 tensor in host memory (or None), read when the op runs: no device
synchronisation, and a compiled graph does not specialize on its values, so a new packing reuses the graph (as
flash-attn's varlen entries take cu_seqlens as a tensor). The plan (plan.cached_plan) and the executor
(selection.resolve_executor; forward and backward resolve alike) are found inside from those values. As in
flash-attn's interface, forward and backward are separate ops, so the backward gets no Python state from its forward:
every executor rebuilds its per-call states from the plan and the shapes (function.run_backward with states None).
On CUDA a call's job (executor, plan, slot layout) is built once per call key and reused by later calls and by
the backward, as the executor's resolution is (selection.resolve_executor).
Fake implementations give shapes and strides, so torch.compile traces through the op without running it.
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import torch

from hilbert_lab.attention.executors.base import Executor, lse_dtype
from hilbert_lab.attention.function import Job, make_job, plan_part, run_backward, run_forward
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import Plan, cached_plan
from hilbert_lab.attention.selection import resolve_executor
from hilbert_lab.attention.validation import concrete, packed_row_documents


def call_executor(backend: str | Executor, q: torch.Tensor, k: torch.Tensor, pattern: DilatedPattern, *,
                  training: bool, packed: bool) -> Executor:
    """The executor of a call (resolve_executor); ValueError when it runs whole patterns and the call is not one
    sequence with one key/value head per query head and as many queries as keys. A call's forward and backward
    resolve alike: `auto`'s one reading of the device (whether in-place buffers fit) is kept per shape."""
    plain = not packed and k.shape[2] == q.shape[2] and q.shape[1] == k.shape[1]
    chosen = resolve_executor(backend, q, pattern, training=training, whole_pattern=plain, packed=packed)
    if chosen.capabilities.whole_pattern and not plain:
        what = ("cu_seqlens (packed documents)" if packed else
                f"{k.shape[2]} key/value heads for {q.shape[2]}" if k.shape[2] != q.shape[2] else
                f"{q.shape[1]} queries for {k.shape[1]} keys")
        raise ValueError(f"backend {chosen.name!r} runs the whole pattern on one sequence with one key/value head "
                         f"per query head; it does not take {what}: use backend 'auto', 'sdpa', 'fa4' or 'manual'")
    return chosen


def call_plan(pattern: DilatedPattern, q: torch.Tensor, k: torch.Tensor,
              documents: Optional[tuple[tuple[int, int], ...]],
              global_heads: Optional[tuple[int, int]] = None) -> Plan:
    """The plan of a call on q (B, Nq, H, D), k (B, N, H_kv, D): grouped heads, fewer queries, packed documents,
    q's heads a run of a larger layer's heads (global_heads (start, total))."""
    return cached_plan(pattern, k.shape[1], q.shape[2], num_kv_heads=None if k.shape[2] == q.shape[2] else k.shape[2],
                       documents=documents, query_len=q.shape[1] if q.shape[1] < k.shape[1] else None,
                       global_heads=global_heads)


def call_config(segment_lengths: Sequence[int], dilation_rates: Sequence[int], mode: str, causal: bool, backend: str,
                scale: float, need_lse: bool, training: bool,
                global_heads: Optional[tuple[int, int]] = None) -> str:
    """The op's non-tensor argument: every plain value of a call in one string (a short schema keeps the
    dispatcher's per-call cost down; `repr` of the scale round-trips exactly). global_heads: (start, total) when
    q's heads are the heads [start, start + H) of a layer of `total` heads (validation.validate_global_heads), or
    None. A packed row's documents are the op's `boundaries` tensor instead (a value a compiled graph does not
    specialize)."""
    if torch.compiler.is_compiling():  # symbolic values are specialized (concrete) into the string
        return _config_string(segment_lengths, dilation_rates, mode, causal, backend, scale, need_lse, training,
                              global_heads)
    return _plain_config(tuple(segment_lengths), tuple(dilation_rates), mode, bool(causal), backend, float(scale),
                         bool(need_lse), bool(training), None if global_heads is None else tuple(global_heads))


def _config_string(segment_lengths, dilation_rates, mode, causal, backend, scale, need_lse, training,
                   global_heads) -> str:
    whole = lambda value: concrete(int(value))  # noqa: E731  (a string holds values: symbolic ones specialized)
    heads = "-" if global_heads is None else f"{whole(global_heads[0])}:{whole(global_heads[1])}"
    return ";".join([",".join(str(whole(w)) for w in segment_lengths), ",".join(str(whole(r)) for r in dilation_rates),
                     mode, str(int(bool(causal))), backend, repr(concrete(float(scale))), str(int(bool(need_lse))),
                     str(int(bool(training))), heads])


_plain_config = functools.lru_cache(maxsize=1024)(_config_string)  # eager calls: plain values, built once


@functools.lru_cache(maxsize=1024)
def _parsed(config: str) -> tuple[DilatedPattern, str, float, bool, bool, Optional[tuple[int, int]]]:
    """(pattern, backend, scale, need_lse, training, global_heads) of a `call_config` string."""
    segments, rates, mode, causal, backend, scale, need_lse, training, heads = config.split(";")
    pattern = DilatedPattern.create([int(x) for x in segments.split(",")], [int(x) for x in rates.split(",")],
                                    mode=mode, causal=causal == "1")
    global_heads = None if heads == "-" else tuple(int(x) for x in heads.split(":"))
    return pattern, backend, float(scale), need_lse == "1", training == "1", global_heads


def _job(q: torch.Tensor, k: torch.Tensor, boundaries: Optional[torch.Tensor], config: str) -> tuple[Job, bool, bool]:
    """(the call's job, whether the LSE is wanted, whether a backward follows). boundaries: a packed row's
    [0, ..., N] in host memory (read here, when the op runs: no device synchronisation; checked by
    validation.packed_row_documents)."""
    pattern, backend, scale, need_lse, training, global_heads = _parsed(config)
    values = None if boundaries is None else tuple(boundaries.tolist())
    documents = None if values is None else packed_row_documents(values, k.shape[0], q.shape[1], k.shape[1])
    executor = call_executor(backend, q, k, pattern, training=training, packed=documents is not None)
    key = None
    if q.device.type == "cuda":  # where the executor's resolution is kept per call key (selection.resolve_executor)
        key = (config, executor, q.device, q.dtype, k.dtype, q.shape, k.shape, values)
        hit = _JOBS.get(key)
        if hit is not None:
            return hit
    plan = call_plan(pattern, q, k, documents, global_heads)
    job = make_job([plan_part(executor, plan)], scale), need_lse or training, training
    if key is not None:
        if len(_JOBS) >= _MAX_JOBS:
            _JOBS.clear()
        _JOBS[key] = job
    return job


# (config, executor, device, dtypes, shapes, a packed row's boundaries) -> _job's result on CUDA: a call's job is a
# function of these, and its plan, part and slot layout are then built once (tens of microseconds of host time per
# call otherwise, twice per training step, which small steps feel). Bounded as plan.cached_plan is: a packing per
# step keeps no more plans alive than that cache does.
_JOBS: dict[tuple, tuple[Job, bool, bool]] = {}
_MAX_JOBS = 128


def _lse_layout(lse: torch.Tensor) -> torch.Tensor:
    """lse (B, H, Nq) stored token-major ((B, Nq, H) memory), the layout the slots write (no copy then)."""
    return lse if lse.transpose(1, 2).is_contiguous() else lse.transpose(1, 2).contiguous().transpose(1, 2)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, boundaries: Optional[torch.Tensor],
             config: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, Nq, H, D) contiguous, lse (B, H, Nq) token-major) of one dilated-attention call."""
    job, need_lse, training = _job(q, k, boundaries, config)
    # without a backward the result may be written over the first slot (a view keeping the slots alive while it
    # lives); a result saved for the backward owns its memory
    out, lse, _ = run_forward(job, q, k, v, need_lse, result_in_slots=not training)
    return out.contiguous(), _lse_layout(lse)


def _forward_fake(q, k, v, boundaries, config):
    batch, queries, heads, dim = q.shape
    out = q.new_empty((batch, queries, heads, dim))
    lse = q.new_empty((batch, queries, heads), dtype=lse_dtype(q.dtype)).transpose(1, 2)
    return out, lse


def _backward(grad_out: Optional[torch.Tensor], grad_lse: Optional[torch.Tensor], q: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, boundaries: Optional[torch.Tensor],
              config: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), contiguous, of the call's merged (out, lse) for upstream gradients (None: zero)."""
    job, _, _ = _job(q, k, boundaries, config)  # a backward runs only for a call made with training=True
    grads = run_backward(job, None, q, k, v, out, lse, grad_out, grad_lse)
    return tuple(g.contiguous() for g in grads)


def _backward_fake(grad_out, grad_lse, q, k, v, out, lse, boundaries, config):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# Defined through torch.library.Library, not custom_op: the dispatcher then calls the implementation with no
# Python wrapper of its own (alias checks, autograd glue), which a host-bound step of many small blocks feels.
_LIBRARY = torch.library.Library("hilbert_lab", "DEF")
_LIBRARY.define("dilated_attention(Tensor q, Tensor k, Tensor v, Tensor? boundaries, str config) -> (Tensor, Tensor)")
_LIBRARY.define("dilated_attention_backward(Tensor? grad_out, Tensor? grad_lse, Tensor q, Tensor k, Tensor v, "
                "Tensor out, Tensor lse, Tensor? boundaries, str config) -> (Tensor, Tensor, Tensor)")
for _name, _impl, _fake in (("dilated_attention", _forward, _forward_fake),
                            ("dilated_attention_backward", _backward, _backward_fake)):
    _LIBRARY.impl(_name, _impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"hilbert_lab::{_name}", _fake, lib=_LIBRARY)
dilated_attention_op = torch.ops.hilbert_lab.dilated_attention.default
dilated_attention_backward_op = torch.ops.hilbert_lab.dilated_attention_backward.default


class _DilatedAttention(torch.autograd.Function):
    """The two ops as one differentiable call (as flash-attn's interface pairs its forward and backward ops)."""

    @staticmethod
    def forward(ctx, q, k, v, boundaries, config: str):
        out, lse = dilated_attention_op(q, k, v, boundaries, config)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.boundaries, ctx.config = boundaries, config
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: no zero-gradient kernel calls
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        if grad_out is None and grad_lse is None:
            return None, None, None, None, None
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = dilated_attention_backward_op(grad_out, grad_lse, q, k, v, out, lse, ctx.boundaries, ctx.config)
        return dq, dk, dv, None, None


def dilated_attention_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, boundaries: Optional[torch.Tensor],
                           config: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of the op for `call_config(...)` and a packed row's `boundaries` (None, or int64 [0, ..., N] in
    host memory: validation.host_boundaries); differentiable when an input requires grad."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        # one tensor passed twice (self-attention on x, x, x) enters as views: compiled graphs take an
        # autograd Function's inputs only when they are distinct
        k = k.view_as(k) if k is q else k
        v = v.view_as(v) if v is q or v is k else v
        return _DilatedAttention.apply(q, k, v, boundaries, config)
    return dilated_attention_op(q, k, v, boundaries, config)
