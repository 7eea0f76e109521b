"""Dilated attention engine: validate, plan, pick an executor, run the one attention function.

The plan (attention.plan) says which tokens of which heads form each block; an executor (attention.
executors) runs it, reading the blocks as strided views of the original (B, N, H, D) tensors and writing
each branch's output and LSE into slots; the slots merge once by LSE (longnet mode), or the one slot is
the result (head_groups mode, one branch, a whole-pattern executor). Backward: the merged result is one
softmax over the union of the branches' keys, so each block's kernel backward called with the *merged*
output and LSE gives exactly its share of dQ, dK, dV (gradients through the merge weights included);
shares are summed (attention.function).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from hilbert_lab.attention.executors import BACKENDS, Executor, get_executor
from hilbert_lab.attention.executors.manual import dropout_attention
from hilbert_lab.attention.function import attention, make_job, plan_part
from hilbert_lab.attention.layout import read_through_layout
from hilbert_lab.attention.op import call_config, call_executor, call_plan, dilated_attention_call
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import IDENTITY_ORDERINGS, Plan
from hilbert_lab.attention.validation import (
    boundary_values, concrete, host_boundaries, kernel_layout, packed_row_documents, validate_attention_inputs,
    validate_global_heads,
)
from hilbert_lab.curves import ORDERINGS
from hilbert_lab.curves.layouts import layout_permutation, permute_sequence


def execute_plan(plan: Plan, executor: Executor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                 need_lse: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, Nq, H, D), lse (B, H, Nq)) of `plan` on `executor`; differentiable with exact gradients."""
    return attention(make_job([plan_part(executor, plan)], scale), q, k, v, need_lse=need_lse)


def dilated_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    segment_lengths: Sequence[int],
    dilation_rates: Sequence[int],
    causal: bool = False,
    mode: str = "longnet",
    backend: str | Executor = "auto",
    ordering: Optional[str] = None,
    scale: Optional[float] = None,
    dropout_p: float = 0.0,
    return_lse: bool = False,
    hilbert_pattern: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    global_heads: Optional[tuple[int, int]] = None,
):
    """LongNet dilated attention on q (B, N, H, D), k, v (B, N, H_kv, D) -> out (B, N, H, D) [, lse (B, H, N)].

    q may have fewer rows than k and v (decoding): q (B, Nq, H, D) with Nq <= N holds the queries of the
    last Nq positions (bottom-right, as flash-attn aligns them) -> out (B, Nq, H, D), lse (B, H, Nq),
    equal to the last Nq rows of the full computation (pattern positions are the original positions).
    The fused "triton" executor and hilbert_pattern=True take Nq == N only (ValueError).

    segment_lengths / dilation_rates: one entry per branch (see pattern.py for the semantics on
    original positions, incl. ragged N and w > N). mode: "longnet" or "head_groups". backend: a name
    from executors.BACKENDS or "auto". ordering: a memory layout of the tokens inside each block of
    max(segment_lengths) tokens (hilbert_lab.curves.ORDERINGS): q, k, v are stored in that layout and read
    back through its index map (`read_through_layout`; executors address tokens by their original
    position), so the result is unchanged and the cost is the layout's memory traffic. hilbert_pattern=True is a
    *different pattern* (the predecessor's): the sequence is permuted by `ordering` (default "hilbert")
    and dilation/segments/causality are then applied to layout positions; the output is returned in
    original order. scale defaults to D**-0.5. dropout_p > 0 drops attention weights (callers pass 0 in
    eval; modules do) and runs the eager autograd path. LSE is float32 (float64 for float64 inputs);
    rows with no keys give out 0 and lse -inf; a row's output and LSE depend only on the keys it attends
    (on the CPU also for NaN/inf inputs; see executors.kernel). Any strides are accepted; inputs whose
    last dimension is not contiguous are copied once.

    A call with a backend name runs as one custom op (attention.op), so torch.compile(fullgraph=True) and
    CUDA graphs hold it; an Executor object or dropout_p > 0 runs the same executors eagerly.

    Grouped-query attention: k and v may have H_kv heads (H % H_kv == 0); query head h reads key/value
    head h // (H / H_kv) (LongNet head offsets belong to the query heads). K/V are never repeated to H
    heads; their gradients sum over the query heads of a group.
    cu_seqlens: packed documents (the flash-attn convention): a 1-D integer tensor [0, n1, n1 + n2, ..., N]
    on q's device or in host memory (cpu) with B = 1, or those boundaries as a list of host integers. A CPU
    tensor needs no device synchronisation and a compiled graph takes every packing of as many documents
    without recompiling (the op reads it when it runs); a device tensor is copied to the host once. Each
    document is attended as its own sequence (positions, segments, dilation offsets and causality restart at
    its start; its last segment is ragged; a segment longer than the document is the document); no query
    sees a key of another document. Executors declaring `varlen` run the blocks of all documents in a few
    kernel calls (auto prefers them for packed rows).
    global_heads: (start, total) when q's H heads are the heads [start, start + H) of a layer of `total`
    heads (a head-parallel rank's share): each head keeps the global head's offsets (longnet and head_groups
    modes), so the result is those heads' slice of the whole layer's; grouped-query heads pair locally
    (local query head j reads local key/value head j // (H / H_kv)).
    """
    if isinstance(q, torch.Tensor) and q.device.type in ("cpu", "cuda") and torch.is_autocast_enabled(q.device.type):
        # Like SDPA under autocast: run in the autocast dtype, with autocast off inside (explicit casts).
        low = torch.get_autocast_dtype(q.device.type)
        q, k, v = (t.to(low) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in (q, k, v))
        with torch.autocast(q.device.type, enabled=False):
            return dilated_attention(q, k, v, segment_lengths=segment_lengths, dilation_rates=dilation_rates,
                                     causal=causal, mode=mode, backend=backend, ordering=ordering, scale=scale,
                                     dropout_p=dropout_p, return_lse=return_lse, hilbert_pattern=hilbert_pattern,
                                     cu_seqlens=cu_seqlens, global_heads=global_heads)
    scale = validate_attention_inputs(q, k, v, scale=scale, dropout_p=dropout_p, grouped_heads=True,
                                      fewer_queries=True)
    if isinstance(cu_seqlens, torch.Tensor) and torch.compiler.is_compiling() and dropout_p == 0.0 \
            and isinstance(backend, str):
        # the op reads the boundaries when it runs (host memory: no device synchronisation), so a compiled graph
        # does not specialize on them: a new packing reuses it
        documents, boundaries = None, host_boundaries(cu_seqlens, k)
    elif cu_seqlens is None:
        documents, boundaries = None, None
    else:  # read once on the host; the check is memoized on the values (every layer passes the same ones)
        values = boundary_values(cu_seqlens, k)
        # dynamo traces through a cache wrapper (warning that it does): host integers there take the plain check
        check = packed_row_documents.__wrapped__ if torch.compiler.is_compiling() else packed_row_documents
        documents = check(values, q.shape[0], q.shape[1], k.shape[1])
        host = isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.device.type == "cpu"  # else read once above
        boundaries = None if documents is None else \
            cu_seqlens.to(torch.int64) if host else torch.tensor(values, dtype=torch.int64)
    packed = boundaries is not None
    global_heads = validate_global_heads(global_heads, q.shape[2])
    query_len = q.shape[1] if q.shape[1] < k.shape[1] else None  # queries at the last positions
    pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
    allowed = tuple(ORDERINGS)
    if ordering not in IDENTITY_ORDERINGS and ordering not in allowed:
        raise ValueError(f"ordering must be None or one of {allowed}, got {ordering!r}")
    if not isinstance(hilbert_pattern, bool):
        raise ValueError(f"hilbert_pattern must be True or False, got {hilbert_pattern!r}")
    if not isinstance(return_lse, bool):
        raise ValueError(f"return_lse must be True or False, got {return_lse!r}")
    if hilbert_pattern and packed:
        raise ValueError("hilbert_pattern=True permutes the whole row; it does not apply with cu_seqlens (packed "
                         "documents): use hilbert_pattern=False")
    q, k, v = kernel_layout(q), kernel_layout(k), kernel_layout(v)
    training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    seq_len = concrete(k.shape[1]) if hilbert_pattern else k.shape[1]  # its permutation: a compiled graph's constant
    if query_len is not None and hilbert_pattern:
        raise ValueError("hilbert_pattern=True needs q, k, v of one length (the pattern permutes the whole "
                         f"sequence), got {q.shape[1]} queries and {k.shape[1]} keys")
    if not isinstance(backend, (str, Executor)):
        raise ValueError(f"backend must be 'auto', one of {BACKENDS} or an Executor, got {backend!r}")
    if isinstance(backend, str) and backend != "auto":
        get_executor(backend)  # an unknown name fails here, naming the allowed ones
    if hilbert_pattern:
        order = "hilbert" if ordering in IDENTITY_ORDERINGS else ordering
        perm, inverse = layout_permutation(seq_len, min(max(pattern.segment_lengths), seq_len), order, device=q.device)
        q, k, v = (permute_sequence(t, perm) for t in (q, k, v))
    elif ordering not in IDENTITY_ORDERINGS:
        q, k, v = (read_through_layout(t, ordering, max(pattern.segment_lengths)) for t in (q, k, v))
    need_lse = return_lse or training or hilbert_pattern
    if dropout_p > 0.0 or isinstance(backend, Executor):
        # weights dropped inside the softmax (the eager autograd path, whatever the executor), or an executor
        # object (not a name the op can carry): the one attention function on the plan
        plan = call_plan(pattern, q, k, documents, global_heads)
        if dropout_p > 0.0:
            out, lse = dropout_attention(plan, q, k, v, scale=scale, dropout_p=float(dropout_p))
        else:
            executor = call_executor(backend, q, k, pattern, training=training, packed=packed)
            out, lse = execute_plan(plan, executor, q, k, v, scale, need_lse=need_lse)
    else:
        out, lse = dilated_attention_call(q, k, v, boundaries, call_config(
            pattern.segment_lengths, pattern.dilation_rates, pattern.mode, pattern.causal, backend, scale, need_lse,
            training, global_heads))
    if hilbert_pattern:
        out, lse = permute_sequence(out, inverse), permute_sequence(lse, inverse, dim=2)
    return (out, lse) if return_lse else out
