"""Packed documents in few kernel calls: a plan's blocks grouped into packs, each one varlen kernel call.

The plan of a packed row has blocks per document. A pack holds the blocks of one (branch, offset,
query heads, key/value heads, step) whose runs (one segment of one document each: positions
p0 + j * step, j < length) start at positions of one residue modulo the step. Every run is then a
range of consecutive rows of the row's residue view x[0, residue::step] (strided, no copy), so one
call of a kernel that takes sequences of different lengths reads them all in place: cu_seqlens[i]
is the row where run i starts, seqused[i] its length (given only where the runs leave rows between
them: other residues' documents, ragged last segments). The kernel writes outputs, LSEs and
gradients at the runs' rows only.

A `VarlenKernel` is such a kernel (FlashAttention-4's varlen entry points, executors.fa4);
`per_sequence(kernel)` runs any dense kernel run by run through kernel.call_forward / call_backward
(the exact reference of this path on the CPU). Packs replace the plan's units where they need at most
half their kernel calls (rows of many documents); a single sequence keeps its units.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from hilbert_lab.attention.executors.base import Grads, Merged, Slots
from hilbert_lab.attention.executors.kernel import (
    DenseKernel, call_backward, call_forward, call_state, run_plan_graph,
)
from hilbert_lab.attention.plan import Plan
from hilbert_lab.attention.views import KEY, QUERY, plan_cached, plan_units
from hilbert_lab.kernels.triton_rows import ROW_DTYPES, put_rows
from hilbert_lab.kernels.triton_support import runs_on

__all__ = ["Pack", "Runs", "VarlenKernel", "pack_runs", "packed_backward", "packed_forward", "packs_for",
           "per_sequence", "plan_packs", "write_rows"]


def _count(heads: slice) -> int:
    return len(range(heads.start, heads.stop, heads.step or 1))


@dataclass(frozen=True)
class Pack:
    """Runs of one (branch, offset, heads, kv_heads, step) on the rows of one residue view.

    Row i of the pack's view is position first + i * step; run j covers rows [starts[j],
    starts[j] + lengths[j]) (increasing, disjoint). heads / kv_heads: the query heads and the key/value
    heads they read (call head j reads kv head j // (h / h_kv))."""

    branch: int
    heads: slice
    kv_heads: slice
    step: int
    first: int
    rows: int
    starts: tuple[int, ...]
    lengths: tuple[int, ...]

    @property
    def gaps(self) -> bool:
        """Whether some row of the view belongs to no run."""
        return sum(self.lengths) != self.rows

    @property
    def max_length(self) -> int:
        return max(self.lengths)

    def geometry(self, shape, stride, storage_offset: int, role: str) -> tuple[tuple, tuple, int]:
        """(size, stride, storage offset) of the pack's view (rows, h, *rest) of a (1, N, H, *rest) tensor."""
        s_n, s_h, *rest = stride[1:]
        heads = self.heads if role == QUERY else self.kv_heads
        size = (self.rows, _count(heads), *shape[3:])
        return size, (self.step * s_n, (heads.step or 1) * s_h, *rest), storage_offset + self.first * s_n + heads.start * s_h

    def view(self, x: torch.Tensor, role: str) -> torch.Tensor:
        """The pack's rows of x (1, N, H, *rest) as a strided view (rows, h, *rest); no copy."""
        return x.as_strided(*self.geometry(tuple(x.shape), x.stride(), x.storage_offset(), role))


def plan_packs(plan: Plan) -> tuple[Pack, ...]:
    """The plan's blocks as packs (plans whose queries are all positions), in the order of their blocks."""
    runs: dict[tuple, list[tuple[int, int]]] = {}
    for blk in plan.blocks:
        kv = blk.key_heads
        for s in range(blk.count):
            p0 = blk.start + s * blk.seg + blk.offset
            key = (blk.branch, blk.heads.start, blk.heads.stop, blk.heads.step or 1, kv.start, kv.stop, kv.step or 1,
                   blk.step, p0 % blk.step)
            runs.setdefault(key, []).append((p0 // blk.step, blk.length))
    packs = []  # the first branch's first (its shares are written before others add), then by branch
    for (branch, h0, h1, hs, k0, k1, ks, step, residue), members in runs.items():
        members.sort()
        begin = members[0][0]
        end = max(row + length for row, length in members)
        packs.append(Pack(branch, slice(h0, h1, hs), slice(k0, k1, ks), step, residue + begin * step, end - begin,
                          tuple(row - begin for row, _ in members), tuple(length for _, length in members)))
    return tuple(sorted(packs, key=lambda pack: (pack.branch != plan.first_branch, pack.branch)))


def _pack_keys(plan: Plan) -> int:
    """How many packs the plan makes, counted without listing runs (a segment run's residue cycles with
    period step / gcd(seg, step))."""
    keys = set()
    for blk in plan.blocks:
        kv = blk.key_heads
        for s in range(min(blk.count, blk.step)):
            keys.add((blk.branch, blk.heads.start, blk.heads.stop, blk.heads.step, kv.start, kv.stop, kv.step,
                      blk.step, (blk.start + s * blk.seg + blk.offset) % blk.step))
    return len(keys)


def packs_for(plan: Plan, q: torch.Tensor) -> Optional[tuple[Pack, ...]]:
    """The plan's packs when they replace its units here: one batch element, queries at every position,
    data on a device, and at most half the units' kernel calls; else None."""
    if q.shape[0] != 1 or q.device.type == "meta" or plan.query_len is not None or not plan.blocks:
        return None

    def decide():
        unit_calls = sum(unit.calls_per_piece for unit in plan_units(plan))
        return plan_packs(plan) if 2 * _pack_keys(plan) <= unit_calls else None

    return plan_cached((id(plan), "packs"), plan, decide)


@dataclass(frozen=True)
class Runs:
    """A pack's runs on a device: cu (int32 (n + 1,)): the row where each run starts, then the view's rows;
    used (int32 (n,)) the runs' lengths and index (int64) the rows they cover, both None when the runs
    tile the view; max_length the longest run (a host integer)."""

    starts: tuple[int, ...]
    lengths: tuple[int, ...]
    rows: int
    cu: torch.Tensor
    used: Optional[torch.Tensor]
    index: Optional[torch.Tensor]
    max_length: int


_ALIGN_INTS = 4  # int32 entries in 16 bytes: kernels copy a metadata tensor that starts off a 16-byte boundary


def _aligned(values: list[int], ints: list[int]) -> int:
    """Append `values` to `ints` at the next 16-byte boundary; where they start."""
    ints.extend([0] * (-len(ints) % _ALIGN_INTS))
    start = len(ints)
    ints.extend(values)
    return start


def pack_runs(plan: Plan, packs: tuple[Pack, ...], device: torch.device) -> tuple[Runs, ...]:
    """Every pack's Runs on `device`, moved there in one copy per dtype (cached per plan and device); each
    int32 tensor starts on a 16-byte boundary."""

    def build():
        ints: list[int] = []
        longs, spans = [], []
        used_rows = 0
        for pack in packs:
            cu = list(pack.starts) + [pack.rows]
            used = list(pack.lengths) if pack.gaps else []
            covered = sum(pack.lengths) if pack.gaps else 0
            spans.append((_aligned(cu, ints), len(cu), _aligned(used, ints), len(used), used_rows, covered))
            if pack.gaps:
                starts, lengths = torch.tensor(pack.starts), torch.tensor(pack.lengths)
                first = torch.cumsum(lengths, 0) - lengths  # where each run begins in the index
                longs.append(torch.arange(covered) + torch.repeat_interleave(starts - first, lengths))
            used_rows += covered
        int_tensor = torch.tensor(ints, dtype=torch.int32).to(device)
        long_tensor = (torch.cat(longs) if longs else torch.empty(0, dtype=torch.int64)).to(device)
        out = []
        for pack, (i0, n_cu, u0, n_used, l0, n_index) in zip(packs, spans):
            out.append(Runs(pack.starts, pack.lengths, pack.rows, int_tensor[i0:i0 + n_cu],
                            int_tensor[u0:u0 + n_used] if n_used else None,
                            long_tensor[l0:l0 + n_index] if n_index else None, pack.max_length))
        return tuple(out)

    return plan_cached((id(plan), "runs", str(device)), plan, build)


@dataclass(frozen=True)
class VarlenKernel:
    """A kernel over many sequences of one call (see the module docstring).

    forward(q (rows, h, D), k, v (rows, h_kv, D), runs, *, causal, scale, out (rows, h, D), lse (rows, h))
    -> state: writes each run's output and LSE into out and lse at the runs' rows only.
    backward(state, grad_out (rows, h, D) or None, q, k, v, out, lse (rows, h), runs, *, causal, scale,
    grad_lse (rows, h) or None, into (dq, dk, dv) or None) -> (dq, dk, dv) for the given (merged) out and
    LSE at the runs' rows: the `into` tensors themselves where it wrote them (at the runs' rows only,
    leaving the others as they were), else tensors of its own, which hold zeros at the other rows only
    where `into` was given. state: the forward's, or None (rebuilt from shapes).
    graphs: its forward returns None and its calls read no device value on the host, so a row's calls may be
    captured and replayed as one CUDA graph (`GRAPH_REGIONS`)."""

    name: str
    forward: Callable[..., Any]
    backward: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    graphs: bool = False


def _groups(runs: Runs) -> list[tuple[int, int, int]]:
    """(first row, runs, length): maximal spans of adjacent runs of one length (one batched dense call each)."""
    groups: list[list[int]] = []
    for start, length in zip(runs.starts, runs.lengths):
        last = groups[-1] if groups else None
        if last is not None and last[2] == length and last[0] + last[1] * length == start:
            last[1] += 1
        else:
            groups.append([start, 1, length])
    return [tuple(g) for g in groups]


def _batched(x: torch.Tensor, start: int, count: int, length: int) -> torch.Tensor:
    return x[start:start + count * length].unflatten(0, (count, length))


def per_sequence(kernel: DenseKernel) -> VarlenKernel:
    """A VarlenKernel running `kernel` on each span of adjacent runs of one length (batched), through
    call_forward / call_backward (fallbacks, grouped-query heads, the LSE gradient, non-finite inputs)."""

    def forward(q, k, v, runs: Runs, *, causal: bool, scale: float, out, lse):
        states = []
        for start, count, length in _groups(runs):
            o, l, state = call_forward(kernel, *(_batched(t, start, count, length) for t in (q, k, v)), causal=causal,
                                       scale=scale)
            _batched(out, start, count, length).copy_(o)
            _batched(lse, start, count, length).copy_(l.transpose(1, 2))
            states.append(state)
        return states

    def backward(states, grad_out, q, k, v, out, lse, runs: Runs, *, causal: bool, scale: float, grad_lse=None,
                 into=None):
        shares = [torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v)]
        groups = _groups(runs)
        for (start, count, length), state in zip(groups, states if states is not None else [None] * len(groups),
                                                 strict=True):
            part = lambda t: None if t is None else _batched(t, start, count, length)  # noqa: E731
            if state is None:  # rebuilt from shapes (kernel.call_state)
                state = call_state(kernel, part(q), part(k), causal=causal)
            glse = None if grad_lse is None else part(grad_lse).transpose(1, 2)
            results = call_backward(state, part(grad_out), part(q), part(k), part(v), part(out),
                                    part(lse).transpose(1, 2), causal=causal, scale=scale, grad_lse=glse)
            for share, result in zip(shares, results):
                part(share).copy_(result)
        return tuple(shares)

    return VarlenKernel(f"{kernel.name}_per_sequence", forward, backward)


def packed_forward(plan: Plan, packs: tuple[Pack, ...], q, k, v, slots: Slots, *, scale: float,
                   kernel: VarlenKernel) -> list:
    """One call per pack, each writing its runs' output and LSE into its branch's slot; the states (None each
    where the kernel declares `graphs`: the calls then run as one region of `GRAPH_REGIONS`)."""
    runs_of = pack_runs(plan, packs, q.device)

    def launch():
        return [kernel.forward(pack.view(q, QUERY), pack.view(k, KEY), pack.view(v, KEY), runs, causal=plan.causal,
                               scale=scale, out=pack.view(slots.out(pack.branch), QUERY),
                               lse=pack.view(slots.lse(pack.branch), QUERY))
                for pack, runs in zip(packs, runs_of)]

    if not kernel.graphs:
        return launch()
    run_plan_graph("packs forward", (plan,), (kernel.name, scale, tuple(sorted(slots.slot_of.items()))),
                   (q, k, v, slots.outs, slots.lses), launch, keep=runs_of)
    return [None] * len(packs)


def _rows_kernel_runs(total: torch.Tensor, *others: torch.Tensor) -> bool:
    """Whether `put_rows` takes these: Triton on a CUDA device (or its interpreter), a total of a dtype a float32 sum
    rounds to once, (rows, h) of any strides or (rows, h, D) with its last dim contiguous."""
    return runs_on(total.device) and total.dtype in ROW_DTYPES and \
        (total.dim() == 2 or total.dim() == 3 and total.stride(-1) == 1) and all(t.shape == total.shape for t in others)


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    """t with a contiguous last dim (itself where it has one)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def write_rows(view: torch.Tensor, share: torch.Tensor, rows: Optional[torch.Tensor]) -> None:
    """view (rows, ...) <- share at the rows `rows` (int64; every row when None), in the view's dtype: one launch of
    `put_rows` where Triton runs, else a gather and an indexed write."""
    if rows is None:
        view.copy_(share)
    elif _rows_kernel_runs(view, share):
        if view.dim() == 2:  # (rows, h) as (rows, h, 1): any strides
            view, share = view.unsqueeze(-1), share.unsqueeze(-1)
        put_rows([(view, _unit_last(share))], rows, accumulate=False)
    else:
        view.index_copy_(0, rows, share.index_select(0, rows).to(view.dtype))


def _zeros_like_views(views: tuple[torch.Tensor, ...], dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Zeroed (dq, dk, dv) shaped as the views, in `dtype`: dk and dv share one allocation."""
    dq = torch.zeros(views[0].shape, dtype=dtype, device=views[0].device)
    return (dq, *torch.zeros((2, *views[1].shape), dtype=dtype, device=views[1].device).unbind(0))


def packed_backward(plan: Plan, packs: tuple[Pack, ...], states: list, q, k, v, merged: Merged, grads: Grads, *,
                    scale: float, kernel: VarlenKernel) -> None:
    """Every pack's share of dq, dk, dv for the merged (out, lse), written or added into `grads`.

    The first branch's shares are written into the totals' views at the runs' rows. A later branch's are added:
    at the runs' rows only where Triton runs (`kernels.triton_rows.put_rows`: one launch per pack, no atomics);
    elsewhere they land in zeroed buffers (zero between the runs) added whole; a pack whose runs tile its view
    adds its shares whole. On a kernel declaring `graphs` the calls run as one region of `GRAPH_REGIONS`."""
    out = merged.out if merged.out.stride(-1) == 1 else merged.dense("out")
    grad_out = merged.grad_out
    if grad_out is not None and grad_out.stride(-1) != 1:
        grad_out = merged.dense("grad_out")
    lse = merged.lse.transpose(1, 2).contiguous()  # (1, N, H): views of it follow the queries' geometry
    grad_lse = None if merged.grad_lse is None else merged.grad_lse.transpose(1, 2).contiguous()
    totals = (grads.dq, grads.dk, grads.dv)  # allocated here, before any graph region
    states = states if states is not None else [None] * len(packs)  # None: each kernel rebuilds its own
    runs_of = pack_runs(plan, packs, q.device)

    def launch() -> None:
        for pack, runs, state in zip(packs, runs_of, states, strict=True):
            _pack_backward(plan, pack, runs, state, q, k, v, out, grad_out, lse, grad_lse, grads, totals,
                           scale=scale, kernel=kernel)

    if not kernel.graphs:
        launch()
        return
    run_plan_graph("packs backward", (plan,), (kernel.name, scale, grads.accumulate, grads.first_branch, grads.dtype),
                   (q, k, v, out, grad_out, lse, grad_lse, *totals), launch, keep=runs_of)


def _pack_backward(plan: Plan, pack: Pack, runs: Runs, state, q, k, v, out, grad_out, lse, grad_lse, grads: Grads,
                   totals: tuple[torch.Tensor, ...], *, scale: float, kernel: VarlenKernel) -> None:
    """One pack's shares of dq, dk, dv, written or added into the totals' views (packed_backward)."""
    views = (pack.view(totals[0], QUERY), pack.view(totals[1], KEY), pack.view(totals[2], KEY))
    owned = grads.owned(pack.branch)
    by_rows = not owned and runs.index is not None and all(_rows_kernel_runs(view) for view in views)
    if owned and all(view.dtype == q.dtype for view in views):
        into = views  # written in place at the runs' rows
    elif not owned and runs.index is not None and not by_rows:
        into = _zeros_like_views(views, q.dtype)  # zero between the runs: added whole, with no index
    else:
        into = None
    shares = kernel.backward(state, None if grad_out is None else pack.view(grad_out, QUERY), pack.view(q, QUERY),
                             pack.view(k, KEY), pack.view(v, KEY), pack.view(out, QUERY), pack.view(lse, QUERY),
                             runs, causal=plan.causal, scale=scale,
                             grad_lse=None if grad_lse is None else pack.view(grad_lse, QUERY), into=into)
    if by_rows:  # shares valid at the runs' rows only: one launch adds the three there
        put_rows([(view, _unit_last(share)) for view, share in zip(views, shares)], runs.index)
        return
    for index, (view, share) in enumerate(zip(views, shares)):
        if share is view:
            continue
        if owned:
            write_rows(view, share, runs.index)
        else:
            grads.store(index, view, share, pack.branch)
