"""Ring dilated attention: each rank's shard of exactly the single-process engine's output.

Sharding: q, k, v are this rank's (B, N/P, H, D) shard of a length-N sequence split over the P ranks
of a ring (the ranks of `group`, or consecutive blocks of `ring_size` of them), in the
"contiguous" layout (rank i holds [i*N/P, (i+1)*N/P)) or "zigzag" (see sharding.py).

Per branch i (effective segment w = min(segment_lengths[i], N), shard length n = N/P):
- local branch (contiguous: n % w == 0; zigzag: (n/2) % w == 0): every segment lies inside one
  shard; they run as the engine runs them on the shard ("auto": the in-place executor on the plan of
  these branches, or the fused kernel on the pattern restricted to them); no communication at all.
- ring branch (contiguous: w % n == 0, the w/n consecutive ranks of a segment form a sub-ring;
  zigzag: only w == N, all ranks): each rank packs only its *selected* (dilated) keys and values of
  the branch's heads, in the kernels' (B, h, L, D) layout; the packets travel around the sub-ring
  (non-causal: to every other member; causal contiguous: only forward along the chain, since later
  keys are masked), the transfer of step t overlapping the compute of step t-1. This rank's rows
  are read in place (slices, or one diagonal view for consecutive head offsets); running results
  merge by a fused LSE pass.
One autograd function (`_RingAttention`) holds every part: each writes its (out, LSE) into a slot,
merged once; the backward calls every block's kernel backward with the *merged* out and LSE (exact,
as in the engine). Ring branches pipeline it: K/V packets travel one step ahead, the float32
(float64) dK/dV sums one hop behind, each holder adding its share; the last holder sends the sum
home. Per-rank memory stays O(N/P). Anything else -> ValueError naming the constraint.

Safety: inputs are checked by the engine's `validate_attention_inputs` on every rank count; before
any data moves, one all_gather of a fixed-size row per rank (a digest and the text of each field of
the configuration) makes every rank raise when the ranks disagree or one rejected its inputs; every
wait of the ring is bounded (comm.RingComm, `timeout_s`).
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

from hilbert_lab.attention.backends.base import Backend, lse_dtype
from hilbert_lab.attention.engine import (
    backward_partials, dilated_attention, forward_partials, merge_partials, partial_buffers,
)
from hilbert_lab.attention.backends.triton import pattern_backward as fused_pattern_backward
from hilbert_lab.attention.backends.triton import pattern_forward as fused_pattern_forward
from hilbert_lab.attention.engine import resolve_backend as engine_resolve_backend
from hilbert_lab.attention.plan import Plan, cached_plan
from hilbert_lab.attention.merge import merge_lse
from hilbert_lab.attention.pattern import DilatedPattern, is_selected
from hilbert_lab.attention.validation import validate_attention_inputs
from hilbert_lab.distributed.comm import (
    DEFAULT_TIMEOUT_S, RingComm, pack, packed_size, resolve_timeout, unpack, wait_bounded,
)
from hilbert_lab.distributed.sharding import LAYOUTS, check_divisible, shard_positions
from hilbert_lab.kernels import triton_merge


@dataclass(frozen=True)
class _GroupSpec:
    """Heads of one branch that share a dilation offset."""

    offset: int
    heads: slice


@dataclass(frozen=True)
class _BranchPlan:
    """How one branch is computed on this rank (local, or on a sub-ring of `members`)."""

    branch: int
    segment_length: int  # effective: min(w, N)
    dilation_rate: int
    groups: tuple[_GroupSpec, ...]
    members: tuple[int, ...]  # ring indices sharing this rank's segment(s); (me,) when local
    local: bool


@dataclass(frozen=True)
class RingLayout:
    """Geometry of the sharded sequence: ring size P, this rank's index, N and the layout."""

    ring_size: int
    index: int
    seq_len: int
    layout: str

    @property
    def shard_len(self) -> int:
        return self.seq_len // self.ring_size

    def positions(self, member: int) -> torch.Tensor:
        return shard_positions(member, self.ring_size, self.seq_len, self.layout)

    def runs(self, member: int) -> list[tuple[int, slice]]:
        """(chunk id, storage slice) of the member's contiguous runs; chunk ids order positions."""
        n = self.shard_len
        if self.layout == "contiguous":
            return [(member, slice(0, n))]
        c = n // 2
        return [(member, slice(0, c)), (2 * self.ring_size - 1 - member, slice(c, n))]


def _group_specs(pattern: DilatedPattern, branch: int, num_heads: int) -> tuple[_GroupSpec, ...]:
    offsets = pattern.head_offsets(num_heads)[branch]
    specs = []
    for offset in sorted(set(int(o) for o in offsets[offsets >= 0])):
        heads = [int(h) for h in (offsets == offset).nonzero()[0]]
        step = heads[1] - heads[0] if len(heads) > 1 else 1
        if heads != list(range(heads[0], heads[-1] + 1, step)):
            raise AssertionError(f"heads of a group must be an arithmetic progression, got {heads}")
        specs.append(_GroupSpec(offset, slice(heads[0], heads[-1] + 1, step)))
    return tuple(specs)


def plan_branches(pattern: DilatedPattern, geometry: RingLayout, num_heads: int) -> list[_BranchPlan]:
    """Per branch: local or ring, its sub-ring; ValueError naming the violated constraint."""
    n, N, P = geometry.shard_len, geometry.seq_len, geometry.ring_size
    plans = []
    for b, (w_raw, r) in enumerate(zip(pattern.segment_lengths, pattern.dilation_rates)):
        w = min(w_raw, N)
        groups = _group_specs(pattern, b, num_heads)
        me = geometry.index
        if geometry.layout == "contiguous":
            if n % w == 0:
                plans.append(_BranchPlan(b, w, r, groups, (me,), True))
                continue
            if w % n != 0:
                raise ValueError(
                    f"segment_lengths[{b}] = {w_raw}: with {P} ranks holding {n} tokens each (N = {N}), "
                    f"every segment length must divide the shard length {n}, be a multiple of it, or "
                    f"be >= N (constraint: {n} % w == 0 or w % {n} == 0)"
                )
            per_segment = w // n
            first = (me // per_segment) * per_segment
            last = min(first + per_segment, P)
            plans.append(_BranchPlan(b, w, r, groups, tuple(range(first, last)), False))
        else:
            chunk = n // 2
            if chunk % w == 0:
                plans.append(_BranchPlan(b, w, r, groups, (me,), True))
            elif w == N:
                plans.append(_BranchPlan(b, w, r, groups, tuple(range(P)), False))
            else:
                raise ValueError(
                    f"segment_lengths[{b}] = {w_raw}: the zigzag layout with {P} ranks (chunks of "
                    f"{chunk} tokens, N = {N}) needs every segment length to divide the chunk length "
                    f"{chunk} or be >= N (use layout='contiguous' for segments spanning a few ranks)"
                )
    return plans


def _selected(positions: torch.Tensor, w: int, r: int, offset: int) -> torch.Tensor:
    """Storage indices whose positions are selected by (w, r, offset)."""
    return is_selected(positions, w, r, offset).nonzero().flatten()


def _as_slice(idx: torch.Tensor) -> slice | None:
    """idx (int64, ascending) as a slice when it is an arithmetic progression (a view, no gather)."""
    count = idx.numel()
    if count == 0:
        return slice(0, 0)
    first = int(idx[0])
    if count == 1:
        return slice(first, first + 1)
    step = int(idx[1] - idx[0])
    if step > 0 and bool((idx[1:] - idx[:-1] == step).all()):
        return slice(first, int(idx[-1]) + 1, step)
    return None


def _count(sel) -> int:
    return len(range(sel.stop)[sel]) if isinstance(sel, slice) else sel.numel()


@functools.lru_cache(maxsize=4096)
def _parts(geometry: RingLayout, member: int, segment_length: int, dilation_rate: int, offset: int, causal: bool,
           device: torch.device) -> tuple[tuple[int, slice | torch.Tensor], ...]:
    """((chunk id, selected storage rows), ...) of the member; one part unless causal zigzag. Rows are a
    slice where they form an arithmetic progression (always when the dilation divides the shard), else
    an index tensor on `device`. Cached."""
    positions = geometry.positions(member)
    runs = geometry.runs(member)
    if not causal:
        runs = [(runs[0][0], slice(0, geometry.shard_len))]
    parts = []
    for chunk_id, run in runs:
        idx = _selected(positions[run], segment_length, dilation_rate, offset) + run.start
        sel = _as_slice(idx)
        parts.append((chunk_id, idx.to(device) if sel is None else sel))
    return tuple(parts)


def _routes(members: int, chain: bool) -> list[list[int]]:
    """holders[j]: the members that hold origin j's packet, in hop order (j first)."""
    if chain:  # causal, contiguous: keys only matter to later members
        return [list(range(j, members)) for j in range(members)]
    return [[(j + s) % members for s in range(members)] for j in range(members)]


class _BranchContext:
    """Everything a rank needs to run one ring branch: selections, bundles, packets, schedule.

    A bundle is a set of the branch's head groups whose selected token counts agree on every
    member (the usual case: all of them); their tokens are stacked along the head axis so that one
    backend call serves the whole bundle (heads are independent in attention).
    """

    def __init__(self, q, plan: _BranchPlan, geometry: RingLayout, causal: bool, comm: RingComm):
        self.plan, self.geometry, self.causal, self.comm = plan, geometry, causal, comm
        self.me = plan.members.index(geometry.index)
        self.m = len(plan.members)
        self.holders = _routes(self.m, causal and geometry.layout == "contiguous")
        self.batch, self.head_dim = q.shape[0], q.shape[3]
        self.dtype, self.device = q.dtype, q.device
        self.acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        # parts[j][g]: [(chunk id, selected storage indices)] of member j for group g
        self.parts = [[_parts(geometry, plan.members[j], plan.segment_length, plan.dilation_rate, g.offset, causal,
                              q.device) for g in plan.groups] for j in range(self.m)]
        bundles: dict[tuple, list[int]] = {}
        for g in range(len(plan.groups)):
            key = tuple(_count(sel) for j in range(self.m) for _, sel in self.parts[j][g])
            bundles.setdefault(key, []).append(g)
        self.bundles = list(bundles.values())
        self._bytes: dict[tuple[int, torch.dtype], int] = {}

    def heads(self, g: int) -> int:
        s = self.plan.groups[g].heads
        return len(range(s.start, s.stop, s.step))

    def head_spans(self, bundle: list[int]) -> list[tuple[int, slice, slice]]:
        """[(group, its heads in the (B, N, H, D) tensors, its heads in the stacked bundle)]."""
        spans, start = [], 0
        for g in bundle:
            spans.append((g, self.plan.groups[g].heads, slice(start, start + self.heads(g))))
            start += self.heads(g)
        return spans

    def chunks(self, member: int, bundle: list[int]) -> list[tuple[int, int]]:
        """[(chunk id, selected count)] per part of the member (the same for all groups of a bundle)."""
        return [(chunk_id, _count(sel)) for chunk_id, sel in self.parts[member][bundle[0]]]

    def rows(self, member: int | None, bundle: list[int], parts: int | tuple[int, ...]) -> list:
        """Per group of the bundle, the member's selected storage rows of `parts` (ascending): one slice
        where they form an arithmetic progression, else an index tensor."""
        own = self.parts[self.me if member is None else member]
        parts = (parts,) if isinstance(parts, int) else parts
        out = []
        for g in bundle:
            sels = [own[g][p][1] for p in parts]
            joined = sels[0]
            for sel in sels[1:]:
                if isinstance(joined, slice) and isinstance(sel, slice) and _count(sel) and _count(joined) and \
                        (sel.step or 1) == (joined.step or 1) and sel.start == joined.start + _count(joined) * (joined.step or 1):
                    joined = slice(joined.start, sel.stop, joined.step)
                elif _count(sel):
                    as_index = [torch.arange(x.start, x.stop, x.step or 1, device=self.device) if isinstance(x, slice)
                                else x for x in (joined, sel)]
                    joined = torch.cat(as_index)
            out.append(joined)
        return out

    def _view(self, x: torch.Tensor, bundle: list[int], sels: list) -> torch.Tensor | None:
        """The bundle's rows `sels` as one strided view of x (B, n, H, ...) -> (B, L, h_bundle, ...), or None
        when they do not form one (then they are gathered). One group: its rows and heads sliced; several
        one-head groups whose rows and heads shift by constant steps: one diagonal view."""
        if not all(isinstance(sel, slice) for sel in sels):
            return None
        if len(bundle) == 1:
            return x[:, sels[0], self.plan.groups[bundle[0]].heads]
        heads = [self.plan.groups[g].heads for g in bundle]
        if any(self.heads(g) != 1 for g in bundle) or len({(sel.step or 1) for sel in sels}) != 1:
            return None
        starts, firsts = [sel.start for sel in sels], [h.start for h in heads]
        row_step, head_step = starts[1] - starts[0], firsts[1] - firsts[0]
        if any(b - a != row_step for a, b in zip(starts, starts[1:])) or \
                any(b - a != head_step for a, b in zip(firsts, firsts[1:])):
            return None
        s_b, s_n, s_h, *rest = x.stride()
        size = (x.shape[0], _count(sels[0]), len(bundle), *x.shape[3:])
        stride = (s_b, (sels[0].step or 1) * s_n, row_step * s_n + head_step * s_h, *rest)
        return x.as_strided(size, stride, x.storage_offset() + starts[0] * s_n + firsts[0] * s_h)

    def gather(self, x: torch.Tensor, bundle: list[int], parts: int | tuple[int, ...],
               member: int | None = None) -> torch.Tensor:
        """x (B, n, H, ...) -> the bundle's selected rows of `parts`, heads stacked: (B, L, h_bundle, ...)
        (a view where one exists)."""
        sels = self.rows(member, bundle, parts)
        view = self._view(x, bundle, sels)
        if view is not None:
            return view
        return torch.cat([x[:, sel, heads] for sel, (_, heads, _) in zip(sels, self.head_spans(bundle))], dim=2)

    def scatter(self, dst: torch.Tensor, value: torch.Tensor, bundle: list[int], parts: int | tuple[int, ...],
                member: int | None = None, add: bool = False) -> None:
        """Write (or add) a stacked (B, L, h_bundle, ...) block into dst (B, n, H, ...)."""
        sels = self.rows(member, bundle, parts)
        view = self._view(dst, bundle, sels)
        if view is not None:
            if add and view.dtype != value.dtype:  # a low-precision total: one rounding of the exact sum
                view.copy_(view.to(value.dtype) + value)
            elif add:
                view.add_(value)
            else:
                view.copy_(value)
            return
        for sel, (_, heads, stacked) in zip(sels, self.head_spans(bundle)):
            piece = value[:, :, stacked]
            if add:
                dst[:, sel, heads] = (dst[:, sel, heads].to(piece.dtype) + piece).to(dst.dtype)
            else:
                dst[:, sel, heads] = piece.to(dst.dtype)

    def dense(self, x: torch.Tensor, bundle: list[int], parts: int | tuple[int, ...]) -> torch.Tensor:
        """This rank's rows of x for a bundle's parts, (B, L, h, ...) stored as (B, h, L, ...) (the kernels'
        layout, so that the backend takes it without another copy)."""
        return self.gather(x, bundle, parts).transpose(1, 2).contiguous().transpose(1, 2)

    def specs(self, origin: int, dtype: torch.dtype) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """Packet layout: per bundle, K then V of all the origin's parts, stored as (B, h, L, D) (the kernels'
        layout, so that neither the kernels nor the dK/dV sums copy)."""
        specs = []
        for bundle in self.bundles:
            h = sum(self.heads(g) for g in bundle)
            shape = (self.batch, h, sum(count for _, count in self.chunks(origin, bundle)), self.head_dim)
            specs += [(shape, dtype), (shape, dtype)]
        return specs

    def pack_kv(self, k, v) -> torch.Tensor:
        tensors = []
        for bundle in self.bundles:
            every = tuple(range(len(self.chunks(self.me, bundle))))
            tensors += [self.gather(k, bundle, every).transpose(1, 2), self.gather(v, bundle, every).transpose(1, 2)]
        return pack(tensors)

    def split(self, tensors: list[torch.Tensor], origin: int, bundle_index: int,
              parts: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """Unpacked flat [k, v, k, v, ...] (B, h, L, D) -> the (k, v) rows of the origin's `parts` (consecutive)
        of one bundle, as (B, L, h, D) views."""
        counts = [count for _, count in self.chunks(origin, self.bundles[bundle_index])]
        start = sum(counts[: parts[0]])
        stop = start + sum(counts[p] for p in parts)
        k_all, v_all = tensors[2 * bundle_index], tensors[2 * bundle_index + 1]
        return k_all[:, :, start:stop].transpose(1, 2), v_all[:, :, start:stop].transpose(1, 2)

    def calls(self, origin: int):
        """(bundle index, q parts, k parts, causal) of the kernel calls for the origin's packet: the blocks
        that attend (masked ones skipped), joined where a rectangle of parts is one call (zigzag causal:
        the own packet is one causal call; a remote packet one full call)."""
        for b, bundle in enumerate(self.bundles):
            q_chunks, k_chunks = self.chunks(self.me, bundle), self.chunks(origin, bundle)
            cells = {}
            for qi, (q_chunk, q_count) in enumerate(q_chunks):
                for ki, (k_chunk, k_count) in enumerate(k_chunks):
                    if q_count and k_count and not (self.causal and k_chunk > q_chunk):
                        cells[(qi, ki)] = "diagonal" if self.causal and k_chunk == q_chunk else "full"
            if len(q_chunks) == 2 and len(k_chunks) == 2:
                if cells == {(0, 0): "diagonal", (1, 0): "full", (1, 1): "diagonal"}:
                    yield b, (0, 1), (0, 1), True
                    continue
                if cells == {(0, 0): "full", (1, 0): "full"}:
                    yield b, (0, 1), (0,), False
                    continue
                if cells == {(1, 0): "full", (1, 1): "full"}:
                    yield b, (1,), (0, 1), False
                    continue
            for (qi, ki), kind in cells.items():
                yield b, (qi,), (ki,), kind == "diagonal"

    def step_ops(self, t: int):
        """This rank's forward (sends, recvs) at step t as lists of (peer member, origin): K/V packets
        move one hop along their holders."""
        sends, recvs = [], []
        for j, holders in enumerate(self.holders):
            if self.packet_bytes(j, self.dtype) == 0 or t >= len(holders):
                continue
            if holders[t - 1] == self.me:
                sends.append((holders[t], j))
            if holders[t] == self.me:
                recvs.append((holders[t - 1], j))
        return sends, recvs

    def packet_bytes(self, origin: int, dtype: torch.dtype) -> int:
        if (origin, dtype) not in self._bytes:
            self._bytes[(origin, dtype)] = packed_size(self.specs(origin, dtype))
        return self._bytes[(origin, dtype)]

    def num_steps(self) -> int:
        """Forward steps: one per hop of the longest holder list."""
        return max(len(h) for h in self.holders) - 1


def _forward_branch(ctx: _BranchContext, q, k, v, backend: Backend, scale: float, out_slot: torch.Tensor,
                    lse_slot: torch.Tensor) -> dict:
    """One ring branch: its (out, lse) written into this rank's slot views out_slot (B, n, H, D) and
    lse_slot (B, n, H); returns the backend's state per block."""
    acc_lse_dtype = lse_dtype(q.dtype)
    label = f"forward/branch{ctx.plan.branch}"
    state: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    auxes = {}
    kv_specs = [ctx.specs(j, q.dtype) for j in range(ctx.m)]
    fused = q.is_cuda and triton_merge.HAVE_TRITON and acc_lse_dtype == torch.float32

    def merge_into(key: tuple[int, int], o_bhld: torch.Tensor, lse: torch.Tensor) -> None:
        """Fold one call's rows of a q part, o (B, h, L, D) and lse (B, h, L), into its running result."""
        if key not in state:  # running result (B, h, L, D) in the LSE precision, lse (B, h, L)
            state[key] = (o_bhld.to(acc_lse_dtype).contiguous(), lse.to(acc_lse_dtype).contiguous())
        elif fused:
            acc, acc_lse = state[key]
            triton_merge.accumulate(acc.view(-1, acc.shape[-1]), acc_lse.view(-1),
                                    o_bhld.contiguous().view(-1, acc.shape[-1]), lse.float().contiguous().view(-1))
        else:
            acc, acc_lse = state[key]
            merged, merged_lse = merge_lse([acc.transpose(1, 2), o_bhld.transpose(1, 2).to(acc_lse_dtype)],
                                           [acc_lse, lse.to(acc_lse_dtype)])
            state[key] = (merged.transpose(1, 2).contiguous(), merged_lse.contiguous())

    def compute(origin: int, packet: torch.Tensor) -> None:
        tensors = unpack(packet, kv_specs[origin])
        for b, q_parts, k_parts, causal in ctx.calls(origin):
            k_blk, v_blk = ctx.split(tensors, origin, b, k_parts)
            o, lse, aux = backend.forward(ctx.gather(q, ctx.bundles[b], q_parts), k_blk, v_blk, causal=causal,
                                          scale=scale)
            auxes[(b, q_parts, origin, k_parts)] = aux
            start, o_bhld = 0, o.transpose(1, 2)
            for qi in q_parts:
                count = ctx.chunks(ctx.me, ctx.bundles[b])[qi][1]
                merge_into((b, qi), o_bhld[:, :, start:start + count], lse[:, :, start:start + count])
                start += count

    own = ctx.pack_kv(k, v)
    held = {ctx.me: own}
    pending = [(ctx.me, own)]
    for t in range(1, ctx.num_steps() + 1):
        sends, recvs = ctx.step_ops(t)
        buffers = {j: torch.empty(ctx.packet_bytes(j, q.dtype), dtype=torch.uint8, device=q.device)
                   for _, j in recvs}
        handle = ctx.comm.exchange(
            [(ctx.comm.global_rank(ctx.plan.members[peer]), held[j]) for peer, j in sends],
            [(ctx.comm.global_rank(ctx.plan.members[peer]), buffers[j]) for peer, j in recvs],
            label=label, step=t,
        )
        for origin, packet in pending:  # overlaps the transfer above
            compute(origin, packet)
        handle.wait()
        held = dict(buffers)
        pending = list(buffers.items())
    for origin, packet in pending:
        compute(origin, packet)
    for (b, qi), (o, l) in state.items():
        ctx.scatter(out_slot, o.transpose(1, 2), ctx.bundles[b], qi)
        ctx.scatter(lse_slot, l.transpose(1, 2), ctx.bundles[b], qi)
    return auxes


def _backward_branch(ctx: _BranchContext, q, k, v, out, lse, grad_out, grad_lse, auxes, backend: Backend,
                     scale: float, grads: tuple[torch.Tensor, ...]) -> None:
    """Add one ring branch's share of (dq, dk, dv) for the *merged* (out, lse (B, H, n)) into grads."""
    acc = ctx.acc_dtype
    label = f"backward/branch{ctx.plan.branch}"
    kv_specs = [ctx.specs(j, q.dtype) for j in range(ctx.m)]
    acc_specs = [ctx.specs(j, acc) for j in range(ctx.m)]
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    lse_rows = lse.transpose(1, 2)
    glse_rows = None if grad_lse is None else grad_lse.transpose(1, 2)
    # This rank's rows of every set of q parts a call reads, gathered once for all steps (kernel layout).
    rows: dict[tuple[int, tuple[int, ...]], tuple] = {}

    def rows_of(b: int, q_parts: tuple[int, ...]) -> tuple:
        if (b, q_parts) not in rows:
            bundle = ctx.bundles[b]
            q_rows = ctx.gather(q, bundle, q_parts)
            rows[(b, q_parts)] = (
                q_rows, ctx.dense(out, bundle, q_parts), ctx.dense(grad_out, bundle, q_parts),
                ctx.gather(lse_rows, bundle, q_parts).transpose(1, 2).contiguous(),
                None if glse_rows is None else ctx.gather(glse_rows, bundle, q_parts).transpose(1, 2).contiguous(),
                torch.zeros(q_rows.transpose(1, 2).shape, dtype=acc, device=q.device).transpose(1, 2),
            )
        return rows[(b, q_parts)]

    def compute(origin: int, packet: torch.Tensor, dkv: list[torch.Tensor]) -> None:
        tensors = unpack(packet, kv_specs[origin])
        for b, q_parts, k_parts, causal in ctx.calls(origin):
            k_blk, v_blk = ctx.split(tensors, origin, b, k_parts)
            dk_acc, dv_acc = ctx.split(dkv, origin, b, k_parts)
            q_rows, o_rows, do_rows, l_rows, dl_rows, dq_acc = rows_of(b, q_parts)
            dq_blk, dk_blk, dv_blk = backend.backward(
                do_rows, dl_rows, q_rows, k_blk, v_blk, o_rows, l_rows, auxes.get((b, q_parts, origin, k_parts)),
                causal=causal, scale=scale,
            )
            dq_acc += dq_blk
            dk_acc += dk_blk
            dv_acc += dv_blk

    # Pipelined like the forward: at step t each holder computes its share of the packets it holds while
    # the K/V packets for step t + 1 travel ahead and the dK/dV sums of step t - 1 travel one hop behind
    # (the receiver adds them to its own share once both are there); the owner keeps its own share, the
    # chain of sums starts at the second holder and the last holder sends the sum home.
    kv_bytes = {j: ctx.packet_bytes(j, q.dtype) for j in range(ctx.m)}
    acc_bytes = {j: ctx.packet_bytes(j, acc) for j in range(ctx.m)}
    origins = [j for j in range(ctx.m) if kv_bytes[j] > 0]
    kv_held = {ctx.me: ctx.pack_kv(k, v)} if kv_bytes[ctx.me] else {}
    sums: dict[int, torch.Tensor] = {}  # origin -> dK/dV sum (packed, uint8) to pass on at the next step
    own_share = own_returned = None
    last = max((len(ctx.holders[j]) for j in origins), default=0)
    for t in range(last + 1):
        sends, recvs, kv_next, arriving = [], [], {}, {}
        for j in origins:
            holders = ctx.holders[j]
            if t + 1 < len(holders):
                if holders[t] == ctx.me:
                    sends.append((holders[t + 1], kv_held[j]))
                if holders[t + 1] == ctx.me:
                    kv_next[j] = torch.empty(kv_bytes[j], dtype=torch.uint8, device=q.device)
                    recvs.append((holders[t], kv_next[j]))
            if 2 <= t <= len(holders):
                dst = holders[t] if t < len(holders) else j  # next holder, or home
                if holders[t - 1] == ctx.me:
                    sends.append((dst, sums.pop(j)))
                if dst == ctx.me:
                    arriving[j] = torch.empty(acc_bytes[j], dtype=torch.uint8, device=q.device)
                    recvs.append((holders[t - 1], arriving[j]))
        handle = ctx.comm.exchange([(ctx.comm.global_rank(ctx.plan.members[p]), x) for p, x in sends],
                                   [(ctx.comm.global_rank(ctx.plan.members[p]), x) for p, x in recvs],
                                   label=label, step=t)
        computed = {}
        for j in origins:
            if t < len(ctx.holders[j]) and ctx.holders[j][t] == ctx.me:
                computed[j] = torch.zeros(acc_bytes[j], dtype=torch.uint8, device=q.device)
                compute(j, kv_held[j], unpack(computed[j], acc_specs[j]))  # overlaps the transfers above
        handle.wait()
        for j, buffer in arriving.items():
            if j in computed:
                computed[j].view(acc).add_(buffer.view(acc))
            else:  # home: the sum over every other holder of our K/V
                own_returned = buffer
        for j, total in computed.items():
            if j == ctx.me:
                own_share = total
            else:
                sums[j] = total
        kv_held = kv_next
    if own_share is None:
        own_share = torch.zeros(acc_bytes[ctx.me], dtype=torch.uint8, device=q.device)
    if own_returned is not None:
        own_share.view(acc).add_(own_returned.view(acc))
    own_grads = unpack(own_share, acc_specs[ctx.me])

    dq, dk, dv = grads
    for (b, q_parts), (*_, dq_acc) in rows.items():
        ctx.scatter(dq, dq_acc, ctx.bundles[b], q_parts, add=True)
    for b, bundle in enumerate(ctx.bundles):
        every = tuple(range(len(ctx.chunks(ctx.me, bundle))))
        dk_part, dv_part = ctx.split(own_grads, ctx.me, b, every)
        ctx.scatter(dk, dk_part, bundle, every, add=True)
        ctx.scatter(dv, dv_part, bundle, every, add=True)


@dataclass(frozen=True)
class _RingRun:
    """What one call computes on this rank: the branches inside the shard (run by the engine's executor
    `local_backend`: the fused kernel on the pattern restricted to them, or the plan's blocks) and the
    ring branches' contexts; every part writes into its slot, all merged into one result."""

    pattern: DilatedPattern
    local_branches: tuple[int, ...]
    local_plan: Plan | None
    local_backend: Backend
    contexts: tuple[_BranchContext, ...]
    backend: Backend
    scale: float
    causal: bool
    slots: dict  # branch -> slot (every local branch shares one slot under the fused kernel)
    num_slots: int

    @property
    def local_fused(self) -> bool:
        return bool(self.local_branches) and self.local_backend.whole_pattern is not None


def _ring_forward(q, k, v, run: _RingRun):
    """(out, lse, local executor state, ring branch states): every part's result in its slot, merged once."""
    if run.local_fused and not run.contexts:  # every branch inside the shard: the fused kernel's own result
        out, lse = fused_pattern_forward(q, k, v, run.pattern, scale=run.scale, branches=run.local_branches)
        return out, lse, ("fused", None, None), []
    outs, lses = partial_buffers(run.num_slots, q)
    local_state = None
    if run.local_fused:
        o, l = fused_pattern_forward(q, k, v, run.pattern, scale=run.scale, branches=run.local_branches)
        slot = run.slots[run.local_branches[0]]
        outs[slot].copy_(o)
        lses[slot].copy_(l.transpose(1, 2))
        del o, l
        local_state = ("fused", None, None)
    elif run.local_branches:
        local_state = forward_partials(run.local_plan, run.local_backend, q, k, v, run.scale, run.causal, outs, lses,
                                       run.slots)
    ring_states = [_forward_branch(c, q, k, v, run.backend, run.scale, outs[run.slots[c.plan.branch]],
                                   lses[run.slots[c.plan.branch]]) for c in run.contexts]
    out, lse = merge_partials(outs, lses, q.dtype)
    return out, lse, local_state, ring_states


class _RingAttention(torch.autograd.Function):
    """(q, k, v) shards -> merged (out, lse (B, H, n)) of every branch. Backward: every block's backward
    (local blocks: the engine's executors; ring blocks: step by step) with the merged out and LSE."""

    @staticmethod
    def forward(autograd_ctx, q, k, v, run: _RingRun):
        out, lse, local_state, ring_states = _ring_forward(q, k, v, run)
        autograd_ctx.save_for_backward(q, k, v, out, lse)
        autograd_ctx.run, autograd_ctx.local_state, autograd_ctx.ring_states = run, local_state, ring_states
        autograd_ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(autograd_ctx, grad_out, grad_lse):
        q, k, v, out, lse = autograd_ctx.saved_tensors
        if grad_out is None and grad_lse is None:
            return None, None, None, None
        run = autograd_ctx.run
        grad_out = None if grad_out is None else grad_out.contiguous()
        out = out.contiguous()
        if run.local_fused:
            # The fused kernel's shares (input dtype) hold the totals: the ring branches, which touch only
            # their dilated rows, add theirs (summed in float32) into them; no full-size accumulators.
            grads = fused_pattern_backward(grad_out, grad_lse, q, k, v, out, lse, run.pattern, scale=run.scale,
                                           branches=run.local_branches)
            for context, auxes in zip(run.contexts, autograd_ctx.ring_states):
                _backward_branch(context, q, k, v, out, lse, grad_out, grad_lse, auxes, run.backend, run.scale, grads)
            return tuple(grads) + (None,)
        grads = tuple(torch.zeros(t.shape, dtype=lse_dtype(q.dtype), device=t.device) for t in (q, k, v))
        if run.local_branches:
            backward_partials(run.local_plan, run.local_backend, autograd_ctx.local_state, grads, q, k, v, out, lse,
                              grad_out, grad_lse, run.scale, run.causal)
        for context, auxes in zip(run.contexts, autograd_ctx.ring_states):
            _backward_branch(context, q, k, v, out, lse, grad_out, grad_lse, auxes, run.backend, run.scale, grads)
        return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v))) + (None,)


def resolve_backend(backend: str | Backend, q: torch.Tensor, segment_lengths: Sequence[int] = ()) -> Backend:
    """The engine's block backend for q ("auto" as in the engine); it must have a block backward."""
    adapter = engine_resolve_backend(backend, q, segment_lengths, whole_pattern=False)
    if adapter.backward is None:
        raise ValueError(f"backend {adapter.name!r} has no block backward; ring attention needs one (e.g. 'manual', 'sdpa')")
    return adapter


def ring_members(group: dist.ProcessGroup | None, ring_size: int | None) -> list[int]:
    """Global ranks of this process's ring: consecutive blocks of `ring_size` ranks of `group`."""
    world = [dist.get_global_rank(group, r) if group is not None else r for r in range(dist.get_world_size(group))]
    size = len(world) if ring_size is None else ring_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1 or len(world) % size:
        raise ValueError(f"ring_size must be None or a positive divisor of the group size {len(world)}, got {ring_size!r}")
    me = world.index(dist.get_rank())
    first = (me // size) * size
    return world[first : first + size]


_CONFIG_FIELDS = ("segment_lengths", "dilation_rates", "mode", "causal", "dtype", "scale", "shard shape", "layout",
                  "ring size", "backend")
_VALUE_BYTES = 64  # each field's value travels as text (truncated) so that the error can show every rank's
_ERROR_BYTES = 512  # the first bytes of a rank's own input error


def _text_row(text: str, size: int) -> list[int]:
    """`text` as UTF-8, cut or zero-padded to `size` bytes, as size/8 int64 values."""
    raw = text.encode("utf-8")[:size].ljust(size, b"\0")
    return torch.frombuffer(bytearray(raw), dtype=torch.int64).tolist()


def _row_text(values: torch.Tensor) -> str:
    return values.cpu().contiguous().numpy().tobytes().rstrip(b"\0").decode("utf-8", errors="replace")


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little", signed=True)


@functools.lru_cache(maxsize=256)
def _fields_row(values: tuple[str, ...]) -> list[int]:
    """Per field value: its digest, then its text (cached: a model calls with few configurations)."""
    row = []
    for text in values:
        row += [_digest(text)] + _text_row(text, _VALUE_BYTES)
    return row


def _collective_device(group: dist.ProcessGroup | None) -> torch.device:
    backend = str(dist.get_backend(group))
    if "nccl" in backend and "gloo" not in backend:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _agree_on_configuration(fields: dict[str, str], error: Exception | None, group: dist.ProcessGroup | None,
                            timeout_s: float) -> None:
    """Raise on every rank of `group` unless all ranks hold equal `fields` and none rejected its inputs.

    One all_gather of a fixed-size int64 row per rank: an error flag and the error's text, then per
    field a digest and the value's text. A rank that rejected its inputs raises its own error, the
    others a ValueError naming it; unequal fields give every rank the same ValueError naming the
    fields and which ranks hold which value. Bounded by timeout_s (RingTimeoutError).
    """
    words = _VALUE_BYTES // 8
    row = [int(error is not None)] + _text_row("" if error is None else str(error), _ERROR_BYTES)
    row += _fields_row(tuple(fields[name] for name in _CONFIG_FIELDS))
    device = _collective_device(group)
    mine = torch.tensor(row, dtype=torch.int64, device=device)
    world = dist.get_world_size(group)
    rows = [torch.empty_like(mine) for _ in range(world)]
    work = dist.all_gather(rows, mine, group=group, async_op=True)
    ranks = [dist.get_global_rank(group, r) if group is not None else r for r in range(world)]
    wait_bounded([(work, f"gather the configuration of the ranks {ranks}")], timeout_s,
                 f"rank {dist.get_rank()}: ring configuration check")
    table = torch.stack(rows).cpu()
    rejected = [r for r, line in zip(ranks, table) if line[0] != 0]
    if rejected:
        if error is not None:
            raise error
        first = table[ranks.index(rejected[0])]
        others = f" (and ranks {rejected[1:]})" if len(rejected) > 1 else ""
        raise ValueError(f"rank {rejected[0]}{others} of the ring rejected its inputs, so every rank stops: "
                         f"{_row_text(first[1 : 1 + _ERROR_BYTES // 8])}")
    base = 1 + _ERROR_BYTES // 8
    problems = []
    for index, name in enumerate(_CONFIG_FIELDS):
        start = base + index * (1 + words)
        holders: dict[int, list[int]] = {}
        for r, line in zip(ranks, table):
            holders.setdefault(int(line[start]), []).append(r)
        if len(holders) > 1:
            values = []
            for members in holders.values():
                text = _row_text(table[ranks.index(members[0])][start + 1 : start + 1 + words])
                values.append(f"rank{'s' if len(members) > 1 else ''} {', '.join(map(str, members))}: {text}")
            hint = (" (all ranks must hold equal shards: the sequence length N must be divisible by the number of "
                    "ranks P)") if name == "shard shape" else ""
            problems.append(f"{name}{hint}: " + "; ".join(values))
    if problems:
        raise ValueError("the ranks of the ring disagree on their configuration (every rank must call "
                         "ring_dilated_attention with the same arguments, dtype and shard shape): "
                         + " | ".join(problems))


def _name(value) -> str:
    """Text of an argument for the configuration check, the same on every rank for equal arguments."""
    if isinstance(value, (list, tuple)):
        return repr(tuple(value))
    if isinstance(value, Backend):
        return value.name
    return repr(value)


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
    backend: str | Backend = "auto",
    scale: float | None = None,
    return_lse: bool = False,
    check_config: bool = True,
    timeout_s: float | None = None,
):
    """This rank's shard of the single-process engine's dilated attention over the whole sequence.

    q, k, v: (B, N/P, H, D) shards (layout "contiguous" or "zigzag") of a length-N sequence over the
    P ranks of this ring (`group`'s ranks, split into consecutive rings of `ring_size`). Returns
    out (B, N/P, H, D) (and lse (B, H, N/P) if return_lse), differentiable with exact gradients.

    Every rank of the ring must call it with the same arguments and equal shards. check_config
    (one small all_gather over `group` before any data moves) makes every rank raise a ValueError
    when the ranks disagree (pattern, dtype, scale, shard shape, layout, ring size, backend) or
    when one rank's inputs are invalid, instead of a wrong result or a hang. timeout_s bounds every
    wait of the ring (default $HILBERT_LAB_RING_TIMEOUT_S or 120 s; inf: none): a rank that stalls
    or dies makes the others raise RingTimeoutError / RingCommError naming rank, branch and step.
    """
    error: Exception | None = None
    members: list[int] | None = None
    pattern = adapter = None
    plans: list[_BranchPlan] = []
    resolved_scale, timeout = scale, DEFAULT_TIMEOUT_S
    try:
        timeout = resolve_timeout(timeout_s)
        members = ring_members(group, ring_size)
        pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        resolved_scale = validate_attention_inputs(q, k, v, scale=scale, shape="(B, N/P, H, D)")
        if not isinstance(check_config, bool):
            raise ValueError(f"check_config must be True or False, got {check_config!r}")
        P = len(members)
        geometry = RingLayout(P, members.index(dist.get_rank()), q.shape[1] * P, layout)
        check_divisible(geometry.seq_len, P, layout)
        if P > 1:
            adapter = resolve_backend(backend, q, pattern.segment_lengths)
            plans = plan_branches(pattern, geometry, q.shape[2])
    except (ValueError, TypeError) as exc:
        error = exc
    ring = len(members) if members is not None else dist.get_world_size(group)
    if check_config is not False and ring > 1:
        fields = {
            "segment_lengths": _name(pattern.segment_lengths if pattern is not None else segment_lengths),
            "dilation_rates": _name(pattern.dilation_rates if pattern is not None else dilation_rates),
            "mode": _name(pattern.mode if pattern is not None else mode),
            "causal": _name(pattern.causal if pattern is not None else causal),
            "dtype": str(getattr(q, "dtype", type(q).__name__)),
            "scale": _name(resolved_scale),
            "shard shape": str(tuple(q.shape)) if isinstance(q, torch.Tensor) else type(q).__name__,
            "layout": _name(layout),
            "ring size": str(ring),
            "backend": (f"{adapter.name} on {q.device.type}" if adapter is not None else _name(backend)),
        }
        _agree_on_configuration(fields, error, group, timeout)
    if error is not None:
        raise error
    if len(members) == 1:  # one rank holds the whole sequence: exactly the local engine
        return dilated_attention(q, k, v, segment_lengths=segment_lengths, dilation_rates=dilation_rates,
                                 causal=causal, mode=mode, backend=backend, scale=resolved_scale,
                                 return_lse=return_lse)
    comm = RingComm(members, group, timeout_s=timeout)
    local = tuple(plan.branch for plan in plans if plan.local)
    training = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    # The branches inside the shard run as the engine would run them on the shard ("auto": its rule).
    local_backend = engine_resolve_backend(backend, q, pattern.segment_lengths, mode=pattern.mode, causal=causal,
                                           training=training) if local else adapter
    fused = bool(local) and local_backend.whole_pattern is not None
    slots: dict[int, int] = {}
    for branch in local:
        slots[branch] = 0 if fused else len(slots)
    first_ring = 1 if fused else len(local)
    ring_plans = [plan for plan in plans if not plan.local]
    for i, plan in enumerate(ring_plans):
        slots[plan.branch] = first_ring + i
    run = _RingRun(
        pattern=pattern, local_branches=local,
        local_plan=cached_plan(pattern, q.shape[1], q.shape[2], None, str(q.device), branches=local)
        if local and not fused else None,
        local_backend=local_backend,
        contexts=tuple(_BranchContext(q, plan, geometry, causal, comm) for plan in ring_plans),
        backend=adapter, scale=resolved_scale, causal=causal, slots=slots, num_slots=first_ring + len(ring_plans),
    )
    if training:
        out, lse = _RingAttention.apply(q, k, v, run)
    else:
        out, lse = _ring_forward(q, k, v, run)[:2]
    return (out, lse) if return_lse else out
