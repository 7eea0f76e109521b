"""The plan executor over a dense kernel: every unit of the plan is one or a few kernel calls on strided views.

Each call reads q, k, v as views of the caller's tensors (attention.views; no gather) and writes its
output and LSE into views of the caller's slots; its backward is the kernel's backward with the *merged*
output and LSE (exact gradients, through the merge weights too), its shares written into views of the
gradient totals. Kernels that cannot read strided views (capability in_place False) get contiguous
copies of each call's q, k, v. Every call goes through kernel.call_forward / call_backward (fallbacks,
grouped-query heads, bottom-right causal, the LSE gradient, non-finite inputs). An executor whose
kernel takes many sequences in one call (capability varlen) runs the plan of a packed row as packs
(executors.varlen: one call for the blocks of many documents) where that saves most of the calls. The plan's
small blocks (one segment of few keys: ragged tails, short sequences) run together in one batched pass
(executors.small_blocks) instead of a call each, except on the oracle executor.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from hilbert_lab.attention.executors.base import Capabilities, Executor, Grads, Merged, Slots
from hilbert_lab.attention.executors.kernel import (
    DenseKernel, all_finite, call_backward, call_forward, call_state, guard_lse, run_plan_graph,
)
from hilbert_lab.attention.executors.small_blocks import small_backward, small_forward, split_small
from hilbert_lab.attention.executors.varlen import VarlenKernel, packed_backward, packed_forward, packs_for
from hilbert_lab.attention.plan import Plan
from hilbert_lab.attention.views import KEY, QUERY, plan_units, plan_views
from hilbert_lab.kernels.beside import Beside


def _readable(x: torch.Tensor, in_place: bool) -> torch.Tensor:
    return x if in_place else x.contiguous()


def blockwise_forward(plan: Plan, q, k, v, slots: Slots, *, scale: float, kernel: DenseKernel,
                      in_place: bool = True) -> tuple:
    """Run every unit of the plan, writing each call's (out, lse) into its branch's slot; returns the
    per-unit batch folds and per-call states for `blockwise_backward`."""
    units = plan_units(plan)
    outs, lses = slots.outs.unbind(0), slots.lses.unbind(0)
    need_lse = slots.need_lse or plan.merge
    states = []
    # Views of the slots per branch: the geometry is the same for every slot, so slot 0's layout serves all.
    fold_flags, views = plan_views(plan, [(q, QUERY), (k, KEY), (v, KEY), (outs[0], QUERY), (lses[0], QUERY)])
    for unit, unit_views_ in zip(units, views):
        slot = slots.slot_of[unit.branch]
        unit_states = []
        for qv, kv, vv, ov, lv in unit_views_:
            if slot:
                ov = outs[slot].as_strided(ov.shape, ov.stride(), ov.storage_offset() + slot * outs[0].numel())
                lv = lses[slot].as_strided(lv.shape, lv.stride(), lv.storage_offset() + slot * lses[0].numel())
            out_b, lse_b, state = call_forward(kernel, _readable(qv, in_place), _readable(kv, in_place),
                                               _readable(vv, in_place), causal=plan.causal, scale=scale,
                                               need_lse=need_lse, out=ov)
            if out_b is not ov:
                ov.copy_(out_b)
            if lse_b is not None:
                lv.copy_(lse_b.transpose(1, 2))
            unit_states.append(state)
        states.append(unit_states)
    return fold_flags, states


def backward_inputs(merged: Merged, dense_out_lse: bool) -> tuple:
    """(out, grad_out, lse (B, Nq, H) with +inf for rows without keys, grad_lse (B, Nq, H)) as the calls of
    `blockwise_backward` read them: out and grad_out contiguous where a kernel wants them dense or they are not."""
    out = merged.dense("out") if dense_out_lse or not merged.out.is_contiguous() else merged.out
    grad_out = merged.grad_out
    if grad_out is not None and (dense_out_lse or not grad_out.is_contiguous()):
        grad_out = merged.dense("grad_out")
    lse = guard_lse(merged.lse).transpose(1, 2).contiguous()  # (B, Nq, H): views follow the queries' geometry
    grad_lse = None if merged.grad_lse is None else merged.grad_lse.transpose(1, 2).contiguous()
    return out, grad_out, lse, grad_lse


def blockwise_backward(plan: Plan, state: Optional[tuple], q, k, v, inputs: tuple, grads: Grads, *, scale: float,
                       kernel: DenseKernel, in_place: bool = True,
                       after_first: Optional[Callable[[], None]] = None) -> None:
    """Add (or write) every call's share of dq, dk, dv for the merged (out, lse) into `grads`. state: the
    forward's (batch folds, call states), or None to rebuild the call states from shapes (kernel.call_state).
    inputs: `backward_inputs(merged, kernel.dense_out_lse)`. after_first: run once the first branch's calls (whose
    shares are written, Grads.first_branch; every document's) are done and before any other share is added."""
    fold_flags, states = state if state is not None else (None, None)
    out, grad_out, lse, grad_lse = inputs
    tensors = [(q, QUERY), (k, KEY), (v, KEY), (out, QUERY), (lse, QUERY), (grads.dq, QUERY), (grads.dk, KEY),
               (grads.dv, KEY)]
    if grad_out is not None:
        tensors.append((grad_out, QUERY))
    if grad_lse is not None:
        tensors.append((grad_lse, QUERY))
    _, views = plan_views(plan, tensors, fold_flags)
    units = plan_units(plan)
    # the first branch's calls (of every document: its shares are written, so no other share may land before them)
    # first, then after_first, then the rest
    first = [i for i, unit in enumerate(units) if unit.branch == grads.first_branch]
    order = first + ([None] if after_first is not None else []) + \
        [i for i, unit in enumerate(units) if unit.branch != grads.first_branch]
    for index_unit in order:
        if index_unit is None:
            after_first()
            continue
        unit, unit_views_ = units[index_unit], views[index_unit]
        owned = grads.owned(unit.branch)
        unit_states = states[index_unit] if states is not None else [None] * len(unit_views_)
        for call_views, state_of_call in zip(unit_views_, unit_states, strict=True):
            qv, kv, vv, ov, lv, dqv, dkv, dvv, *upstream = call_views
            if state_of_call is None:
                state_of_call = call_state(kernel, qv, kv, causal=plan.causal)
            gv = upstream.pop(0) if grad_out is not None else None
            glv = upstream.pop(0).transpose(1, 2) if grad_lse is not None else None
            shares = call_backward(state_of_call, gv, _readable(qv, in_place), _readable(kv, in_place),
                                   _readable(vv, in_place), ov, lv.transpose(1, 2), causal=plan.causal, scale=scale,
                                   grad_lse=glv, into=(dqv, dkv, dvv) if owned else None, guarded=True)
            grads.store_shares([(view, share) for view, share in zip((dqv, dkv, dvv), shares) if share is not view],
                               unit.branch, fused=kernel.graphs)


def _split(plan: Plan, capabilities: Capabilities, q, k, v) -> tuple[Plan, tuple]:
    """(the plan its kernel calls run, the small blocks of the batched pass (executors.small_blocks)): none for
    the oracle, for non-finite CPU inputs (whose rows the kernel calls keep apart, kernel.call_forward) and in dry
    runs on meta tensors (which would count the pass's index tensors, cached per plan, on the first run only; the
    per-call path they count instead differs by the few small calls' buffers)."""
    if capabilities.oracle or q.device.type == "meta" or \
            (q.device.type == "cpu" and not all(all_finite(t) for t in (q, k, v))):
        return plan, ()
    return split_small(plan, q.shape[0], q.shape[-1])


def blockwise_executor(name: str, kernel_for: Callable[[torch.Tensor], DenseKernel], capabilities: Capabilities,
                       unavailable=None, description: str = "",
                       varlen_for: Optional[Callable[[torch.Tensor], VarlenKernel]] = None) -> Executor:
    """An Executor running plans with the dense kernel `kernel_for(q)` picks for the inputs; with
    `varlen_for` (capabilities.varlen) the plans of packed rows run as packs on `varlen_for(q)`."""
    if capabilities.varlen != (varlen_for is not None):
        raise ValueError(f"executor {name!r}: capabilities.varlen must be declared exactly when varlen_for is given")

    def forward(plan: Plan, q, k, v, slots: Slots, *, scale: float):
        prepare = slots.take_prepare()  # run first inside the region: its fills cost no host time on a replay
        packs = packs_for(plan, q) if varlen_for is not None else None
        if packs is not None:
            varlen = varlen_for(q)
            prepare()
            return varlen, packs, packed_forward(plan, packs, q, k, v, slots, scale=scale, kernel=varlen), ()
        kernel = kernel_for(q)
        calls, small = _split(plan, capabilities, q, k, v)
        finish = slots.take_finish() if kernel.graphs else None  # the merge, last in the region

        def launch():
            beside = Beside(q.device)  # the zeros of the entries no call writes, under the calls
            try:
                prepare(beside)
                states = blockwise_forward(calls, q, k, v, slots, scale=scale, kernel=kernel,
                                           in_place=capabilities.in_place)
                if small:
                    small_forward(plan, small, q, k, v, slots, scale=scale)
            finally:  # also on an error: nothing may still write the slots once they are freed
                beside.join()
            if finish is not None:
                finish()
            return states

        if not kernel.graphs:
            return kernel, None, launch(), small
        run_plan_graph("blocks forward", (plan, calls), (name, scale, tuple(sorted(slots.slot_of.items())),
                                                          slots.need_lse, finish is not None),
                       (q, k, v, slots.outs, slots.lses, *slots.results), launch)
        return kernel, None, None, small  # the backward rebuilds the call states from shapes

    def backward(plan: Plan, state, q, k, v, merged: Merged, grads: Grads, *, scale: float) -> None:
        if state is None:  # rebuilt from the plan and shapes: the forward's choices are functions of them
            packs = packs_for(plan, q) if varlen_for is not None else None
            state = (varlen_for(q), packs, None, ()) if packs is not None else \
                (kernel_for(q), None, None, _split(plan, capabilities, q, k, v)[1])
        kernel, packs, states, small = state
        if packs is not None:
            packed_backward(plan, packs, states, q, k, v, merged, grads, scale=scale, kernel=kernel)
            return
        calls = split_small(plan, q.shape[0], q.shape[-1])[0] if small else plan
        after = (lambda: small_backward(plan, small, q, k, v, merged, grads, scale=scale)) \
            if small else None
        clear_totals = grads.allocate()  # allocated here, before the region; zeroed in it

        def launch():
            beside = Beside(q.device)
            try:
                clear_totals(beside)
                inputs = backward_inputs(merged, kernel.dense_out_lse)  # temporaries of the region (its pool)
                blockwise_backward(calls, states, q, k, v, inputs, grads, scale=scale, kernel=kernel,
                                   in_place=capabilities.in_place, after_first=after)
            finally:
                beside.join()

        if not kernel.graphs:
            launch()
            return
        totals = (grads.dq, grads.dk, grads.dv)
        run_plan_graph("blocks backward", (plan, calls),
                       (name, scale, grads.accumulate, grads.first_branch, grads.dtype),
                       (q, k, v, merged.out, merged.lse, merged.grad_out, merged.grad_lse, *totals), launch)

    extra = {} if unavailable is None else {"unavailable": unavailable}
    return Executor(name, capabilities, forward, backward, description=description, kernel_for=kernel_for,
                    prepares_slots=True, **extra)
