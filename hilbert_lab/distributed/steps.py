"""The steps of a ring branch as a part of the one attention function (attention.function): two pipelines.

`RingSteps(comm, kernel, in_place, ready)` is the executor of every ring branch's job part; its plan is the
branch's schedule (schedule.BranchSchedule). Every kernel call goes through executors.kernel.call_forward /
call_backward with the dense kernel of the resolved executor, so a ring step gets the fallbacks, grouped
query heads and the non-finite semantics of the engine's blocks.

forward(schedule, q, k, v, slots, *, scale): this rank packs its selected K/V rows; the packets travel
along their holders, the transfer of step t overlapping the calls on the packets that arrived at step
t-1. Each call attends this rank's selected query rows to (part of) a packet; its (out, lse) merges into
the rows' running result in the LSE dtype (attention.merge.merge_into), written into the branch's slot
(slots.out / slots.lse, token-major) at the end. Returns the calls' states.

backward(schedule, states, q, k, v, merged, grads, *, scale): every call's kernel backward with the
*merged* out and LSE of the whole job (exact gradients, through the merge weights too). K/V packets
travel one step ahead of the calls; the dK/dV sum of each packet travels one hop behind, each holder
adding its share (in the LSE dtype; the owner keeps its own share, the chain of sums starts at the second
holder and the last holder sends the sum home). dq, dk, dv go into the job's totals (Grads.store).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from hilbert_lab.attention.executors.base import Grads, Merged, Slots, lse_dtype
from hilbert_lab.attention.executors.kernel import DenseKernel, call_backward, call_forward
from hilbert_lab.attention.merge import merge_into
from hilbert_lab.distributed.comm import RingComm, unpack
from hilbert_lab.distributed.schedule import KEY, BranchSchedule


def _copy(view: torch.Tensor, value: torch.Tensor) -> None:
    view.copy_(value)


def _kernel_layout(like: torch.Tensor, dtype: torch.dtype, make=torch.zeros) -> torch.Tensor:
    """A tensor of like's shape (B, L, h, D) stored (B, h, L, D), the kernels' layout."""
    return make(like.transpose(1, 2).shape, dtype=dtype, device=like.device).transpose(1, 2)


@dataclass
class _QueryRows:
    """This rank's rows of one bundle for the backward: q (a view where one exists), the merged out, its
    gradient, lse and its gradient (kernel layouts), and the dq sum in the LSE dtype."""

    q: torch.Tensor
    out: torch.Tensor
    grad_out: Optional[torch.Tensor]
    lse: torch.Tensor  # (B, h, L)
    grad_lse: Optional[torch.Tensor]
    dq: torch.Tensor


class RingSteps:
    """The job part executor of ring branches: sends and receives through `comm`, calls `kernel`."""

    def __init__(self, comm: RingComm, kernel: DenseKernel, in_place: bool = True,
                 ready: Optional[Callable[[], None]] = None):
        self.comm, self.kernel, self.in_place, self.ready = comm, kernel, in_place, ready

    def _readable(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tensors if self.in_place else tuple(t.contiguous() for t in tensors)

    def _exchange(self, schedule: BranchSchedule, sends, recvs, label: str, step: int):
        """Post [(peer member, tensor)] sends and receives of one step (after `ready()`, e.g. the ranks'
        agreement, which raises where they disagree); a handle to wait on."""
        if self.ready is not None:
            self.ready()
        peer = lambda member: self.comm.global_rank(schedule.branch.members[member])  # noqa: E731
        return self.comm.exchange([(peer(p), t) for p, t in sends], [(peer(p), t) for p, t in recvs],
                                  label=f"{label}/{schedule.label}", step=step)

    def forward(self, schedule: BranchSchedule, q, k, v, slots: Slots, *, scale: float) -> dict:
        acc_dtype, me = lse_dtype(q.dtype), schedule.me
        specs = [schedule.specs(j, q.dtype) for j in range(schedule.size)]
        running: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (bundle, q part) -> (out, lse)
        states: dict[tuple, object] = {}

        def compute(origin: int, packet: torch.Tensor) -> None:
            tensors = unpack(packet, specs[origin])
            for b, q_parts, k_parts, causal in schedule.calls(origin):
                keys, values = schedule.split(tensors, origin, b, k_parts)
                out, lse, state = call_forward(self.kernel, *self._readable(schedule.gather(q, b, q_parts), keys, values),
                                               causal=causal, scale=scale)
                states[(b, q_parts, origin, k_parts)] = state
                start = 0
                for part in q_parts:
                    rows = slice(start, start + schedule.chunks(me, b)[part][1])
                    start = rows.stop
                    if (b, part) in running:
                        merge_into(*running[(b, part)], out[:, rows], lse[:, :, rows])
                    else:  # the running result, stored (B, h, L, D) in the LSE dtype
                        acc = _kernel_layout(out[:, rows], acc_dtype, torch.empty)
                        acc.copy_(out[:, rows])
                        running[(b, part)] = acc, lse[:, :, rows].to(acc_dtype).contiguous()

        held = {me: schedule.pack(k, v)}  # packets to pass on at the next step
        pending = list(held.items())  # packets to compute while the next ones travel
        for step in range(1, schedule.num_steps() + 1):
            sends, recvs = schedule.forward_hops(step, q.dtype)
            buffers = {j: torch.empty(schedule.packet_bytes(j, q.dtype), dtype=torch.uint8, device=q.device)
                       for _, j in recvs}
            handle = self._exchange(schedule, [(p, held[j]) for p, j in sends], [(p, buffers[j]) for p, j in recvs],
                                    "forward", step)
            for origin, packet in pending:  # overlaps the transfer above
                compute(origin, packet)
            handle.wait()
            held, pending = dict(buffers), list(buffers.items())
        for origin, packet in pending:
            compute(origin, packet)
        branch = schedule.branch.branch
        for (b, part), (acc, acc_lse) in running.items():
            schedule.scatter(slots.out(branch), acc, b, (part,), _copy)
            schedule.scatter(slots.lse(branch), acc_lse.transpose(1, 2), b, (part,), _copy)
        return states

    def _query_rows(self, schedule: BranchSchedule, b: int, q, merged: Merged, acc_dtype) -> _QueryRows:
        every = schedule.every(schedule.me, b)
        q_rows = schedule.gather(q, b, every)
        lse = schedule.gather(merged.lse.transpose(1, 2), b, every).transpose(1, 2).contiguous()
        grad_lse = None if merged.grad_lse is None else \
            schedule.gather(merged.grad_lse.transpose(1, 2), b, every).transpose(1, 2).contiguous()
        grad_out = None if merged.grad_out is None else schedule.dense(merged.grad_out, b)
        return _QueryRows(q_rows, schedule.dense(merged.out, b), grad_out, lse, grad_lse,
                          _kernel_layout(q_rows, acc_dtype))

    def backward(self, schedule: BranchSchedule, states: dict, q, k, v, merged: Merged, grads: Grads, *,
                 scale: float) -> None:
        acc_dtype, me = lse_dtype(q.dtype), schedule.me
        specs = [schedule.specs(j, q.dtype) for j in range(schedule.size)]
        acc_specs = [schedule.specs(j, acc_dtype) for j in range(schedule.size)]
        rows = [self._query_rows(schedule, b, q, merged, acc_dtype) for b in range(len(schedule.bundles))]

        def compute(origin: int, packet: torch.Tensor, sums: list[torch.Tensor]) -> None:
            tensors = unpack(packet, specs[origin])
            for b, q_parts, k_parts, causal in schedule.calls(origin):
                keys, values = schedule.split(tensors, origin, b, k_parts)
                dk_sum, dv_sum = schedule.split(sums, origin, b, k_parts)
                mine, span = rows[b], schedule.span(me, b, q_parts)
                grad_out = None if mine.grad_out is None else mine.grad_out[:, span]
                grad_lse = None if mine.grad_lse is None else mine.grad_lse[:, :, span]
                dq, dk, dv = call_backward(states[(b, q_parts, origin, k_parts)], grad_out,
                                           *self._readable(mine.q[:, span], keys, values), mine.out[:, span],
                                           mine.lse[:, :, span], causal=causal, scale=scale, grad_lse=grad_lse)
                mine.dq[:, span] += dq
                dk_sum += dk
                dv_sum += dv

        own_share = self._backward_pipeline(schedule, q, k, v, compute, acc_dtype)
        own = unpack(own_share, acc_specs[me])
        for b, mine in enumerate(rows):
            every = schedule.every(me, b)
            schedule.scatter(grads.dq, mine.dq, b, every, lambda view, share: grads.store(0, view, share))
            dk_share, dv_share = schedule.split(own, me, b, every)
            schedule.scatter(grads.dk, dk_share, b, every, lambda view, share: grads.store(1, view, share), KEY)
            schedule.scatter(grads.dv, dv_share, b, every, lambda view, share: grads.store(2, view, share), KEY)

    def _backward_pipeline(self, schedule: BranchSchedule, q, k, v, compute, acc_dtype) -> torch.Tensor:
        """Run every call of the backward on the packets this rank holds, step by step; returns this rank's
        packed dK/dV total (its own share plus the sum of every other holder's, sent home)."""
        me = schedule.me
        kv_bytes = {j: schedule.packet_bytes(j, q.dtype) for j in range(schedule.size)}
        sum_bytes = {j: schedule.packet_bytes(j, acc_dtype) for j in range(schedule.size)}
        acc_specs = [schedule.specs(j, acc_dtype) for j in range(schedule.size)]
        origins = schedule.origins(q.dtype)
        kv_held = {me: schedule.pack(k, v)} if kv_bytes[me] else {}
        passing: dict[int, torch.Tensor] = {}  # origin -> dK/dV sum (packed) to pass on at the next step
        own_share = torch.zeros(sum_bytes[me], dtype=torch.uint8, device=q.device)
        returned = None
        last = max((len(schedule.holders[j]) for j in origins), default=0)
        for step in range(last + 1):
            sends, recvs, kv_next, arriving = [], [], {}, {}
            for j in origins:
                holders = schedule.holders[j]
                if step + 1 < len(holders):  # K/V one step ahead of the calls
                    if holders[step] == me:
                        sends.append((holders[step + 1], kv_held[j]))
                    if holders[step + 1] == me:
                        kv_next[j] = torch.empty(kv_bytes[j], dtype=torch.uint8, device=q.device)
                        recvs.append((holders[step], kv_next[j]))
                if 2 <= step <= len(holders):  # the sum of step - 1 one hop behind: to the next holder, or home
                    destination = holders[step] if step < len(holders) else j
                    if holders[step - 1] == me:
                        sends.append((destination, passing.pop(j)))
                    if destination == me:
                        arriving[j] = torch.empty(sum_bytes[j], dtype=torch.uint8, device=q.device)
                        recvs.append((holders[step - 1], arriving[j]))
            handle = self._exchange(schedule, sends, recvs, "backward", step)
            computed = {}
            for j in origins:  # overlaps the transfers above
                if step < len(schedule.holders[j]) and schedule.holders[j][step] == me:
                    computed[j] = own_share if j == me else torch.zeros(sum_bytes[j], dtype=torch.uint8,
                                                                         device=q.device)
                    compute(j, kv_held[j], unpack(computed[j], acc_specs[j]))
            handle.wait()
            for j, buffer in arriving.items():
                if j in computed:
                    computed[j].view(acc_dtype).add_(buffer.view(acc_dtype))
                else:  # home: the sum over every other holder of this rank's K/V
                    returned = buffer
            passing.update({j: total for j, total in computed.items() if j != me})
            kv_held = kv_next
        if returned is not None:
            own_share.view(acc_dtype).add_(returned.view(acc_dtype))
        return own_share
