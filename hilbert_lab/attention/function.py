"""The one attention autograd function: partials -> one merge -> backward with the merged out and LSE.

A job is a list of parts, each an executor (attention.executors) and the plan it runs: the engine's job is
one part; the ring's job is its local plan plus one part per ring branch (distributed), whose "executor"
moves keys and values between ranks. Forward: every part writes its branches' (out, LSE) into slots
(outs (P, B, Nq, H, D) in q's dtype, lses (P, B, Nq, H) in the LSE precision); the slots merge once by
LSE (attention.merge.merge_slots; one slot is the result itself). Backward: every part adds its exact
share of dq, dk, dv for the *merged* out and LSE (each block's kernel backward with the merged values).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence

import torch

from hilbert_lab.attention.executors.base import Executor, Grads, Merged, Slots, lse_dtype, zero_whole
from hilbert_lab.attention.merge import fused_merge, merge_slots
from hilbert_lab.attention.plan import Plan
from hilbert_lab.attention.target import device_facts
from hilbert_lab.kernels.beside import Beside


class PartExecutor(Protocol):
    """What a job part runs its plan with: an attention executor (executors.base.Executor) or the ring's step
    pipeline (distributed.steps.RingSteps); see executors.base for the two operations."""

    def forward(self, plan: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: Slots, *,
                scale: float) -> Any: ...

    def backward(self, plan: Any, state: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, merged: Merged,
                 grads: Grads, *, scale: float) -> None: ...


@dataclass(frozen=True)
class Part:
    """One executor and what it runs (a Plan, or a ring branch's schedule: opaque here, handed to the
    executor). branches: the pattern's branches whose results it writes; whole: it writes their merged
    result into one slot; merges: some (query, head) gets results from several of its branches (so the
    part's shares add up); covered: its calls write every output entry. first_branch: a branch whose calls
    cover every entry and run first (its gradient shares are written, not added); clear: zeroes the entries
    no call writes (Plan.clear_unselected); both None where unknown (ring parts). prepares_slots: its executor
    initialises the slots itself (Executor.prepares_slots)."""

    executor: PartExecutor
    plan: Any
    branches: tuple[int, ...]
    whole: bool = False
    merges: bool = False
    covered: bool = False
    first_branch: Optional[int] = None
    clear: Optional[Callable[..., torch.Tensor]] = None
    prepares_slots: bool = False


@dataclass(frozen=True)
class Job:
    """The parts of one attention call and the layout of their slots: slot_of[branch] -> slot."""

    parts: tuple[Part, ...]
    slot_of: dict
    num_slots: int
    scale: float

    @property
    def accumulates(self) -> bool:
        """Whether gradient shares add up (several parts, or a part whose branches merge)."""
        return len(self.parts) > 1 or any(p.merges for p in self.parts)


def make_job(parts: Sequence[Part], scale: float) -> Job:
    """Slots for the parts: one per branch, except that a whole part's branches share one; a single part
    that does not merge writes one slot, which is the result itself. Parts that write one branch (at
    disjoint rows: the ring's local blocks and its segments crossing shard borders) share its slot."""
    slot_of: dict[int, int] = {}
    count = 0
    single = len(parts) == 1 and (parts[0].whole or not parts[0].merges)
    for part in parts:
        if single or part.whole:
            for branch in part.branches:
                slot_of[branch] = count
            count += 1
        else:
            for branch in part.branches:
                if branch not in slot_of:
                    slot_of[branch] = count
                    count += 1
    return Job(tuple(parts), slot_of, max(count, 1), float(scale))


def plan_part(executor: Executor, plan: Plan) -> Part:
    """The job part of an executor running a plan."""
    branches = tuple(sorted({blk.branch for blk in plan.blocks})) or (0,)
    return Part(executor, plan, branches, whole=executor.capabilities.whole_pattern,
                merges=plan.merge or plan.kv_shared, covered=plan.covered, first_branch=plan.first_branch,
                clear=plan.clear_unselected, prepares_slots=executor.prepares_slots)


def run_forward(job: Job, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, need_lse: bool = True, *,
                result_in_slots: bool = False):
    """(out (B, Nq, H, D), lse (B, H, Nq), states): every part's forward into the slots, merged once.
    result_in_slots: the merge may write the result over the first slot (merge.merge_slots' over_first), so out and
    lse may be views of the slot buffers and keep them alive: for a result no backward keeps."""
    batch, queries, heads, _ = q.shape
    # One slot is the result: rows no block covers must read 0. Several slots: the merge never reads an
    # entry whose LSE is -inf, so they need no zeros.
    outs = torch.empty((job.num_slots, batch, queries, heads, q.shape[3]), dtype=q.dtype, device=q.device)
    lses = torch.empty((job.num_slots, batch, queries, heads), dtype=lse_dtype(q.dtype), device=q.device)
    first = job.parts[0]
    clear = (first.clear or zero_whole) if job.num_slots == 1 and not first.covered and not first.whole else None

    need_lse = need_lse or job.num_slots > 1  # several slots merge by LSE

    def prepare(beside: Optional[Beside] = None) -> None:
        if clear is not None:  # the plan's fill of exactly the entries no call writes may go beside the calls
            clear(outs[0], beside=beside)
        if need_lse:  # else no one reads them (the result's LSE is not wanted)
            lses.fill_(float("-inf"))

    # one part that prepares its slots may also run the merge after its last write (inside its captured region)
    pending = fused_merge(outs, lses, q.dtype, over_first=result_in_slots) \
        if len(job.parts) == 1 and first.prepares_slots else None
    slots = Slots(outs, lses, job.slot_of, need_lse, prepare, finish=None if pending is None else pending[2],
                  results=() if pending is None else pending[:2])
    states = []
    for part in job.parts:
        if not part.prepares_slots:
            slots.take_prepare()()
        states.append(part.executor.forward(part.plan, q, k, v, slots, scale=job.scale))
    if pending is None:
        out, lse = merge_slots(outs, lses, q.dtype, over_first=result_in_slots)
        return out, lse, states
    finish = slots.take_finish()
    if finish is not None:  # the executor left it
        finish()
    return pending[0], pending[1], states


def run_backward(job: Job, states: Optional[list], q, k, v, out, lse, grad_out: Optional[torch.Tensor],
                 grad_lse: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of the merged (out, lse) for upstream gradients grad_out / grad_lse (None: zero).
    states: run_forward's, or None where the forward ran elsewhere (the custom op): every executor then
    rebuilds its states from the plan and the shapes."""
    states = states if states is not None else [None] * len(job.parts)
    merged = Merged(out, lse, grad_out, grad_lse)
    single = job.parts[0] if len(job.parts) == 1 else None
    # Shares of half-precision CUDA kernels are rounded to the input dtype already; they add up in it (one
    # rounding per share), which saves the float32 totals' fill, adds and final conversion.
    low = device_facts(q)[0] == "cuda" and q.dtype in (torch.float16, torch.bfloat16)
    own = single is not None and not single.whole  # a single part writing per-branch entries
    grads = Grads((q, k, v), accumulate=job.accumulates, dtype=q.dtype if low else lse_dtype(q.dtype),
                  written=single is not None and single.covered, first_branch=single.first_branch if own else None,
                  clear=single.clear if own else None)
    order = sorted(range(len(job.parts)), key=lambda i: not job.parts[i].whole)  # whole-tensor shares first
    for i in order:
        part = job.parts[i]
        part.executor.backward(part.plan, states[i], q, k, v, merged, grads, scale=job.scale)
    return grads.results()


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, job: Job, need_lse: bool):
        out, lse, states = run_forward(job, q, k, v, need_lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.job, ctx.states = job, states
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        if grad_out is None and grad_lse is None:
            return None, None, None, None, None
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = run_backward(ctx.job, ctx.states, q, k, v, out, lse, grad_out, grad_lse)
        return dq, dk, dv, None, None


@torch.compiler.disable  # a job holds Python objects (ring parts, Executor objects): compiled code runs it eagerly
def attention(job: Job, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, need_lse: bool = True):
    """(out (B, Nq, H, D), lse (B, H, Nq)) of the job; differentiable (exact gradients) when any input
    requires grad. need_lse=False (no gradient, LSE not wanted) lets kernels skip the LSE where nothing
    merges; the returned lse is then meaningless. The compilable entry of the engine is attention.op."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _Attention.apply(q, k, v, job, True)
    out, lse, _ = run_forward(job, q, k, v, need_lse, result_in_slots=True)
    return out, lse
