"""Ring dilated attention: this rank's shard of exactly the single-process engine's output.

q, k, v are this rank's (B, N/P, H, D) shard of a length-N sequence over the P ranks of a ring (the ranks
of `group`, or consecutive blocks of `ring_size` of them), laid out "contiguous" or "zigzag"
(sharding.py). One call is one job of the one attention function (attention.function):
- the local part: the branches whose segments lie inside a shard (branches.py), planned on the shard and
  run by the executor the engine picks for the shard ("auto": its rule, e.g. the fused whole-pattern
  kernel); it sends nothing;
- one part per ring branch: its schedule (schedule.py) run by `RingSteps` (steps.py) on the dense kernel
  of `resolve_step_executor`; only the dilated K/V rows of the ranks sharing a segment travel, around
  their sub-ring.
A packed row (cu_seqlens) is split per segment instead (documents.py): the local part runs the blocks of
the whole row's plan that lie inside this rank's shard (any executor declaring no whole pattern), and
every segment crossing a shard border is a sub-ring part of its own, run by `RingSteps` the same way. A
plain row whose segments cross shard borders off the layout's sub-rings (branches.py: per segment) is split
the same way, as one document.
Every part writes its (out, LSE) into a slot, the slots merge once, and the backward runs every part's
backward with the merged out and LSE (exact gradients). Per-rank memory stays O(N/P).

Safety: the inputs are checked as the engine checks them; the configuration agreement (agreement.py) runs
over the whole group before a rank computes anything (also before the one-rank shortcut), so ranks that
disagree raise the same ValueError together; every wait is bounded (comm.RingComm, `timeout_s`).
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch
import torch.distributed as dist

from hilbert_lab.attention.engine import dilated_attention
from hilbert_lab.attention.selection import resolve_executor
from hilbert_lab.attention.executors import Executor
from hilbert_lab.attention.function import Job, Part, attention, make_job, plan_part
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import Plan, cached_plan
from hilbert_lab.attention.validation import (
    kernel_layout, validate_attention_inputs, validate_cu_seqlens, validate_global_heads,
)
from hilbert_lab.distributed.agreement import configuration_fields, describe, post_agreement
from hilbert_lab.distributed.branches import RingBranch, RingLayout, plan_branches
from hilbert_lab.distributed.comm import DEFAULT_TIMEOUT_S, RingComm, resolve_timeout
from hilbert_lab.distributed.documents import split_documents
from hilbert_lab.distributed.schedule import BranchSchedule
from hilbert_lab.distributed.sharding import LAYOUTS, check_divisible
from hilbert_lab.distributed.steps import RingSteps


def resolve_step_executor(backend: str | Executor, q: torch.Tensor, pattern: DilatedPattern | None = None, *,
                          training: bool = False) -> Executor:
    """The executor whose dense kernel runs the ring's steps: `backend` as the engine resolves it for callers
    that run their own dense calls ("auto": never a whole-pattern executor); ValueError for one without a
    dense kernel."""
    executor = resolve_executor(backend, q, pattern, training=training, whole_pattern=False)
    if executor.kernel_for is None:
        raise ValueError(f"backend {executor.name!r} runs whole patterns only; the ring's steps need an executor with "
                         f"a dense kernel (e.g. 'sdpa', 'manual' or 'auto')")
    return executor


def _local_executor(backend: str | Executor, q: torch.Tensor, pattern: DilatedPattern, training: bool,
                    refused: str | None, packed: bool = False) -> Executor:
    """The executor of the local part: the engine's choice for the shard; `refused`: what the plan holds that
    a whole-pattern executor does not take (packed documents, fewer key/value heads), then none is chosen."""
    executor = resolve_executor(backend, q, pattern, training=training, whole_pattern=refused is None, packed=packed)
    if refused is not None and executor.capabilities.whole_pattern:
        raise ValueError(f"backend {executor.name!r} runs the whole pattern on one sequence with one key/value head "
                         f"per query head; it does not take {refused}: use backend 'auto', 'sdpa', 'fa4' or 'manual'")
    return executor


def ring_members(group: dist.ProcessGroup | None, ring_size: int | None) -> list[int]:
    """Global ranks of this process's ring: consecutive blocks of `ring_size` ranks of `group`."""
    world = [dist.get_global_rank(group, r) if group is not None else r for r in range(dist.get_world_size(group))]
    size = len(world) if ring_size is None else ring_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1 or len(world) % size:
        raise ValueError(f"ring_size must be None or a positive divisor of the group size {len(world)}, got {ring_size!r}")
    first = (world.index(dist.get_rank()) // size) * size
    return world[first: first + size]


class RingPlan(NamedTuple):
    """What one rank runs: the local part's plan on its storage rows (or None), the parts that communicate
    (ring branches, then segments crossing shard borders, in the order every rank runs them), what the local
    plan holds that a whole-pattern executor does not take (or None), and whether the row is split per segment
    (then some rank may hold a crossing segment that another lacks)."""

    local_plan: Optional[Plan]
    branches: list[RingBranch]
    refused: Optional[str]
    split: bool


def plan_ring(pattern: DilatedPattern, geometry: RingLayout, num_heads: int, num_kv_heads: int | None = None,
              documents: tuple[tuple[int, int], ...] | None = None,
              global_heads: tuple[int, int] | None = None) -> RingPlan:
    """This rank's RingPlan; documents: a packed row's (start, length) documents; global_heads: the heads are a
    run of a layer's heads keeping their offsets."""
    if documents is not None:
        local_plan, spans = split_documents(pattern, geometry, num_heads, documents, num_kv_heads,
                                            global_heads=global_heads)
        return RingPlan(local_plan, list(spans), "cu_seqlens (packed documents)", True)
    branches = plan_branches(pattern, geometry, num_heads, num_kv_heads, global_heads)
    if any(b.per_segment for b in branches):
        # Split as a packed row of one document: the per-segment branches' crossing segments become sub-rings
        # of their own, their other segments and the local branches one local part.
        local_plan, spans = split_documents(pattern, geometry, num_heads, ((0, geometry.seq_len),), num_kv_heads,
                                            tuple(b.branch for b in branches if b.local or b.per_segment),
                                            global_heads)
        return RingPlan(local_plan, [b for b in branches if not (b.local or b.per_segment)] + list(spans),
                        "segments crossing shard borders", True)
    inside = tuple(b.branch for b in branches if b.local)
    if not inside:
        return RingPlan(None, branches, None, False)
    local_plan = cached_plan(pattern, geometry.shard_len, num_heads, inside, num_kv_heads=num_kv_heads,
                             global_heads=global_heads)
    refused = None if num_kv_heads is None else f"{num_kv_heads} key/value heads for {num_heads}"
    return RingPlan(local_plan, [b for b in branches if not b.local], refused, False)


def ring_job(pattern: DilatedPattern, plan: RingPlan, geometry: RingLayout, q: torch.Tensor,
             local: Executor | None, steps: RingSteps | None, scale: float) -> Job:
    """The job of one ring call: the local part (if this rank's plan has one) and one part per ring branch or
    crossing segment."""
    parts = [] if plan.local_plan is None else [plan_part(local, plan.local_plan)]
    for branch in plan.branches:
        parts.append(Part(steps, BranchSchedule(branch, geometry, pattern.causal, q), (branch.branch,)))
    return make_job(parts, scale)


def ring_dilated_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    segment_lengths: Sequence[int],
    dilation_rates: Sequence[int],
    causal: bool = False,
    mode: str = "longnet",
    group: dist.ProcessGroup | None = None,
    ring_size: int | None = None,
    layout: str = "contiguous",
    backend: str | Executor = "auto",
    scale: float | None = None,
    return_lse: bool = False,
    check_config: bool = True,
    timeout_s: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    global_heads: tuple[int, int] | None = None,
):
    """This rank's shard of the single-process engine's dilated attention over the whole sequence.

    q, k, v: (B, N/P, H, D) shards (layout "contiguous" or "zigzag") of a length-N sequence over the P
    ranks of this ring (`group`'s ranks, split into consecutive rings of `ring_size`); k and v may have
    H_kv heads (grouped-query attention as in dilated_attention; the K/V rows that travel carry H_kv
    heads). Returns out (B, N/P, H, D) (and lse (B, H, N/P) if return_lse), differentiable with exact
    gradients. Any segment lengths work on both layouts: a branch whose segments divide N/P (zigzag:
    N/2P) sends nothing, one whose segments are multiples of N/P (zigzag: m chunks N/2P, m dividing 2P) runs
    around sub-rings of the ranks holding them, and any other runs each segment that crosses a shard border
    around the ranks holding it.

    Every rank of the group must call it with the same arguments and equal shards. check_config (one
    small all_gather over `group`, posted first and waited for before any data moves; the local part is
    queued meanwhile) makes every rank raise a ValueError when the
    ranks disagree (pattern, dtype, scale, shard shape, layout, ring_size, backend, cu_seqlens) or one
    rank's inputs are invalid, instead of a wrong result or a hang. timeout_s bounds every wait of the
    ring (default $HILBERT_LAB_RING_TIMEOUT_S or 120 s; inf: none): a rank that stalls or dies makes the
    others raise RingTimeoutError / RingCommError naming rank, branch and step.

    cu_seqlens: packed documents of the whole row (B = 1), as dilated_attention takes them: every rank of
    the ring passes the same full-row tensor [0, n1, n1 + n2, ..., N] (N = shard length x P) on its device
    (rings of `ring_size` ranks each hold their own row and documents). Each
    document is attended as its own sequence; documents may span shards, and any segment length works
    (a segment crossing a shard border is a sub-ring of the ranks holding it: documents.py). The
    configuration check compares its length and a digest of its values.

    global_heads: (start, total) when the H heads are the heads [start, start + H) of a layer of `total` heads
    (head-parallel groups around rings: hybrid.py); each keeps the global head's offsets, as in dilated_attention.
    """
    if not dist.is_initialized():
        raise RuntimeError("ring_dilated_attention needs torch.distributed to be initialised (dist.init_process_group)")
    error: Exception | None = None
    members: list[int] | None = None
    pattern = local = step = documents = plan = None
    resolved_scale, timeout, pending = scale, DEFAULT_TIMEOUT_S, None
    training = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
    try:
        timeout = resolve_timeout(timeout_s)
        if not isinstance(check_config, bool):
            raise ValueError(f"check_config must be True or False, got {check_config!r}")
        members = ring_members(group, ring_size)
        pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        resolved_scale = validate_attention_inputs(q, k, v, scale=scale, shape="(B, N/P, H, D)", grouped_heads=True)
        grouped = None if k.shape[2] == q.shape[2] else k.shape[2]  # key/value heads of grouped-query attention
        geometry = RingLayout(len(members), members.index(dist.get_rank()), q.shape[1] * len(members), layout)
        check_divisible(geometry.seq_len, len(members), layout)
        documents = validate_cu_seqlens(cu_seqlens, q, seq_len=geometry.seq_len)
        global_heads = validate_global_heads(global_heads, q.shape[2])
        if cu_seqlens is not None and documents is None:  # one document: still the packed path (any segment length)
            documents = ((0, geometry.seq_len),)
        if len(members) > 1:
            plan = plan_ring(pattern, geometry, q.shape[2], grouped, documents, global_heads)
            # A split row resolves both on every rank (the configuration check compares them), whatever this
            # rank's share of the crossing segments.
            if plan.local_plan is not None or plan.split:
                local = _local_executor(backend, q, pattern, training, plan.refused, packed=documents is not None)
            if plan.split or plan.branches:
                step = resolve_step_executor(backend, q, pattern, training=training)
    except (ValueError, TypeError) as exc:
        error = exc
    if check_config is not False and dist.get_world_size(group) > 1:
        resolved = step or local
        fields = configuration_fields(
            q, k, pattern, segment_lengths=segment_lengths, dilation_rates=dilation_rates, mode=mode, causal=causal,
            scale=resolved_scale, layout=layout, backend=backend, cu_seqlens=cu_seqlens, documents=documents,
            error=error, placement={"ring_size": str(len(members)) if members is not None else describe(ring_size)},
            resolved=resolved, global_heads=global_heads)
        pending = post_agreement(fields, error, group, timeout, ring=-1 if members is None else members[0])
    agreed = (lambda: None) if pending is None else pending.wait
    if error is not None:
        agreed()  # raises this rank's error, as every other rank raises naming it
        raise error
    # The work that moves no data (the one-rank shortcut, the local part) is queued while the agreement's rows
    # travel; every rank waits for them before its first exchange and before it returns.
    if len(members) == 1:  # one rank holds the whole sequence: exactly the local engine
        result = dilated_attention(q, k, v, segment_lengths=segment_lengths, dilation_rates=dilation_rates,
                                   causal=causal, mode=mode, backend=backend, scale=resolved_scale,
                                   return_lse=return_lse, cu_seqlens=cu_seqlens, global_heads=global_heads)
        agreed()
        return result
    q, k, v = kernel_layout(q), kernel_layout(k), kernel_layout(v)
    steps = None
    if step is not None:
        steps = RingSteps(RingComm(members, group, timeout_s=timeout), step.kernel_for(q),
                          step.capabilities.in_place, ready=agreed)
    job = ring_job(pattern, plan, geometry, q, local, steps, resolved_scale)
    out, lse = attention(job, q, k, v, need_lse=return_lse or training or job.num_slots > 1)
    agreed()
    return (out, lse) if return_lse else out
