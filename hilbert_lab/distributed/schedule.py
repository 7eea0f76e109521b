"""The schedule of one ring branch on this rank: selections, bundles, packets, kernel calls and routes.

- selections: per member and head group, the member's storage rows that the branch selects (w, r, offset);
  one part per run of the layout when causal (runs are ordered by position), else one part for the whole
  shard. A part's rows are a slice where they form an arithmetic progression (a view, no gather; always
  when the dilation divides the shard), else an index tensor.
- bundles: head groups whose selected counts agree on every member (usually all of them). Their rows
  stack along the head axis, so one kernel call serves the bundle (heads are independent): one group is
  its rows and heads sliced; several one-head groups whose rows and heads shift by constant steps are one
  diagonal strided view; other bundles are gathered.
- packets: per bundle the K then V rows of all of a member's parts, stored (B, h, L, D) (the kernels'
  layout, so that neither the calls nor the dK/dV sums copy) in one uint8 buffer (comm.unpack's layout).
- calls: per packet the kernel calls that attend (masked cells skipped), joined by the layout's algorithm.
- routes: holders[j], the members that hold member j's packet, in hop order: the algorithm's routes without the
  members that attend none of its keys.
"""
from __future__ import annotations

import functools
from typing import Callable, Union

import torch

from hilbert_lab.attention.pattern import is_selected
from hilbert_lab.distributed.branches import RingBranch, RingLayout
from hilbert_lab.distributed.comm import packed_size, unpack

Rows = Union[slice, torch.Tensor]  # storage rows of a shard: a slice, or an int64 index tensor
QUERY, KEY = "query", "key"  # which heads of a group: its query heads, or the key/value heads they read


def _as_slice(index: torch.Tensor) -> slice | None:
    """An ascending int64 index as a slice when it is an arithmetic progression (a view, no gather)."""
    count = index.numel()
    if count == 0:
        return slice(0, 0)
    first = int(index[0])
    if count == 1:
        return slice(first, first + 1)
    step = int(index[1] - index[0])
    if step > 0 and bool((index[1:] - index[:-1] == step).all()):
        return slice(first, int(index[-1]) + 1, step)
    return None


def count_rows(rows: Rows) -> int:
    return len(range(rows.stop)[rows]) if isinstance(rows, slice) else rows.numel()


def _join(first: Rows, second: Rows, device: torch.device) -> Rows:
    """The rows of two consecutive parts as one selection (a slice where the steps continue)."""
    if not count_rows(second):
        return first
    if not count_rows(first):
        return second
    if isinstance(first, slice) and isinstance(second, slice) and (first.step or 1) == (second.step or 1) and \
            second.start == first.start + count_rows(first) * (first.step or 1):
        return slice(first.start, second.stop, first.step)
    as_index = [torch.arange(x.start, x.stop, x.step or 1, device=device) if isinstance(x, slice) else x
                for x in (first, second)]
    return torch.cat(as_index)


@functools.lru_cache(maxsize=1024)
def member_runs(geometry: RingLayout, member: int, segment: int, causal: bool,
                span: tuple[int, int] | None = None) -> tuple[tuple[int, slice, int], ...]:
    """((chunk id, storage slice, segment index), ...): the member's parts before selection, one per run of the
    layout (runs lie inside one segment of a ring branch), or one for the whole shard when not causal and every
    run lies in one segment; a span is one segment (index 0). Cached."""
    runs = geometry.runs(member)
    # chunk ids order positions: chunk c holds [c * length, (c + 1) * length)
    segments = [0 if span is not None else chunk * (run.stop - run.start) // segment for chunk, run in runs]
    if not causal and len(set(segments)) == 1:
        return ((runs[0][0], slice(0, geometry.shard_len), segments[0]),)
    return tuple((chunk, run, index) for (chunk, run), index in zip(runs, segments))


@functools.lru_cache(maxsize=4096)
def member_parts(geometry: RingLayout, member: int, segment: int, rate: int, offset: int, causal: bool,
                 device: torch.device, span: tuple[int, int] | None = None) -> tuple[tuple[int, Rows], ...]:
    """((chunk id, selected storage rows), ...) of a member for one (branch, offset), one per part of
    `member_runs`; cached. span: the positions [a, b) of one segment starting at a (a document's), else
    segments start at multiples of `segment`."""
    positions = geometry.positions(member)
    parts = []
    for chunk, run, _ in member_runs(geometry, member, segment, causal, span):
        held = positions[run]
        if span is None:
            selected = is_selected(held, segment, rate, offset)
        else:
            selected = (held >= span[0]) & (held < span[1]) & is_selected(held - span[0], segment, rate, offset)
        index = selected.nonzero().flatten() + run.start
        rows = _as_slice(index)
        parts.append((chunk, index.to(device) if rows is None else rows))
    return tuple(parts)


class BranchSchedule:
    """Everything this rank needs to run one ring branch (see the module docstring); q fixes the batch,
    head dim and device."""

    def __init__(self, branch: RingBranch, geometry: RingLayout, causal: bool, q: torch.Tensor):
        self.branch, self.geometry, self.causal = branch, geometry, causal
        self.me = branch.members.index(geometry.index)
        self.size = len(branch.members)
        self.batch, self.head_dim, self.device = q.shape[0], q.shape[3], q.device
        # parts[j][g]: ((chunk id, selected rows), ...) of member j for head group g; segments[j]: their segments
        self.parts = [[member_parts(geometry, member, branch.segment_length, branch.dilation_rate, group.offset,
                                    causal, q.device, branch.span) for group in branch.groups]
                      for member in branch.members]
        self.segments = [tuple(index for _, _, index in member_runs(geometry, member, branch.segment_length, causal,
                                                                    branch.span)) for member in branch.members]
        bundles: dict[tuple, list[int]] = {}
        for g, group in enumerate(branch.groups):  # stacked groups keep query head j reading kv head j // ratio
            key = tuple(count_rows(rows) for j in range(self.size) for _, rows in self.parts[j][g])
            bundles.setdefault(key + (group.num_heads // group.num_kv_heads,), []).append(g)
        self.bundles = tuple(tuple(groups) for groups in bundles.values())
        # a packet passes over the members that attend none of its keys (e.g. zigzag's earlier holders of a segment)
        self.holders = [[m for m in route if m == j or any(self.cells(m, j, b) for b in range(len(self.bundles)))]
                        for j, route in enumerate(geometry.algorithm.routes(self.size, causal))]
        self._bytes: dict[tuple[int, torch.dtype], int] = {}

    @property
    def label(self) -> str:
        span = self.branch.span
        return f"branch{self.branch.branch}" + ("" if span is None else f"[{span[0]}:{span[1]}]")

    # -- rows of a bundle -------------------------------------------------------------------------------
    def chunks(self, member: int, b: int) -> list[tuple[int, int]]:
        """[(chunk id, selected count)] per part of the member (the same for every group of bundle b)."""
        return [(chunk, count_rows(rows)) for chunk, rows in self.parts[member][self.bundles[b][0]]]

    def every(self, member: int, b: int) -> tuple[int, ...]:
        return tuple(range(len(self.parts[member][self.bundles[b][0]])))

    def span(self, member: int, b: int, parts: tuple[int, ...]) -> slice:
        """Where consecutive `parts` lie along L in the member's stacked rows of bundle b."""
        counts = [count for _, count in self.chunks(member, b)]
        start = sum(counts[: parts[0]])
        return slice(start, start + sum(counts[p] for p in parts))

    def heads(self, b: int, role: str = QUERY) -> int:
        """Heads of bundle b stacked: its groups' query heads, or (role KEY) the key/value heads they read."""
        groups = [self.branch.groups[g] for g in self.bundles[b]]
        return sum(group.num_heads if role == QUERY else group.num_kv_heads for group in groups)

    def _rows(self, member: int, b: int, parts: tuple[int, ...]) -> list[Rows]:
        """Per group of bundle b, the member's selected rows of `parts` (ascending)."""
        own = self.parts[member]
        selections = []
        for g in self.bundles[b]:
            joined = own[g][parts[0]][1]
            for p in parts[1:]:
                joined = _join(joined, own[g][p][1], self.device)
            selections.append(joined)
        return selections

    def _view(self, x: torch.Tensor, b: int, selections: list[Rows], role: str) -> torch.Tensor | None:
        """The bundle's rows of x (B, n, H, ...) as one strided view (B, L, h, ...), or None."""
        if not all(isinstance(rows, slice) for rows in selections):
            return None
        groups = [self.branch.groups[g] for g in self.bundles[b]]
        heads = [group.heads if role == QUERY else group.kv_heads for group in groups]
        if len(groups) == 1:
            return x[:, selections[0], heads[0]]
        if any(len(range(h.start, h.stop, h.step)) != 1 for h in heads) or \
                len({rows.step or 1 for rows in selections}) != 1:
            return None
        starts, firsts = [rows.start for rows in selections], [h.start for h in heads]
        row_step, head_step = starts[1] - starts[0], firsts[1] - firsts[0]
        if any(later - earlier != row_step for earlier, later in zip(starts, starts[1:])) or \
                any(later - earlier != head_step for earlier, later in zip(firsts, firsts[1:])):
            return None
        s_b, s_n, s_h, *rest = x.stride()
        if row_step * s_n + head_step * s_h <= 0 or head_step <= 0:  # no view; a kv head read by several groups
            return None  # is gathered, so that writes into a view never alias
        size = (x.shape[0], count_rows(selections[0]), len(groups), *x.shape[3:])
        stride = (s_b, (selections[0].step or 1) * s_n, row_step * s_n + head_step * s_h, *rest)
        return x.as_strided(size, stride, x.storage_offset() + starts[0] * s_n + firsts[0] * s_h)

    def _pieces(self, b: int, role: str):
        """[(heads of the group in (B, n, H, ...), its heads in the stacked bundle)] of bundle b."""
        pieces, start = [], 0
        for g in self.bundles[b]:
            group = self.branch.groups[g]
            heads, count = (group.heads, group.num_heads) if role == QUERY else (group.kv_heads, group.num_kv_heads)
            pieces.append((heads, slice(start, start + count)))
            start += count
        return pieces

    def gather(self, x: torch.Tensor, b: int, parts: tuple[int, ...], member: int | None = None,
               role: str = QUERY) -> torch.Tensor:
        """x (B, n, H, ...) (role KEY: (B, n, H_kv, ...)) -> bundle b's selected rows of `parts`, heads
        stacked: (B, L, h, ...) (a view where one exists)."""
        selections = self._rows(self.me if member is None else member, b, parts)
        view = self._view(x, b, selections, role)
        if view is not None:
            return view
        return torch.cat([x[:, rows, heads] for rows, (heads, _) in zip(selections, self._pieces(b, role))], dim=2)

    def scatter(self, dst: torch.Tensor, value: torch.Tensor, b: int, parts: tuple[int, ...],
                write: Callable[[torch.Tensor, torch.Tensor], None], role: str = QUERY) -> None:
        """write(view, piece) for this rank's rows `parts` of bundle b in dst (B, n, H, ...) (role KEY:
        H_kv heads), value (B, L, h, ...) stacked; a group's slice rows are written in place (a view), index rows
        are read, written and stored back."""
        selections = self._rows(self.me, b, parts)
        view = self._view(dst, b, selections, role)
        if view is not None:
            write(view, value)
            return
        for rows, (heads, stacked) in zip(selections, self._pieces(b, role)):
            piece = dst[:, rows, heads]
            write(piece, value[:, :, stacked])
            if not isinstance(rows, slice):
                dst[:, rows, heads] = piece

    def dense(self, x: torch.Tensor, b: int) -> torch.Tensor:
        """This rank's rows of x for bundle b, (B, L, h, ...) stored as (B, h, L, ...) (the kernels' layout)."""
        return self.gather(x, b, self.every(self.me, b)).transpose(1, 2).contiguous().transpose(1, 2)

    # -- packets --------------------------------------------------------------------------------------------
    def specs(self, origin: int, dtype: torch.dtype) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """Packet layout of member `origin`: per bundle K then V of all its parts, (B, h_kv, L, D) each."""
        specs = []
        for b in range(len(self.bundles)):
            shape = (self.batch, self.heads(b, KEY), sum(count for _, count in self.chunks(origin, b)), self.head_dim)
            specs += [(shape, dtype), (shape, dtype)]
        return specs

    def packet_bytes(self, origin: int, dtype: torch.dtype) -> int:
        if (origin, dtype) not in self._bytes:
            self._bytes[(origin, dtype)] = packed_size(self.specs(origin, dtype))
        return self._bytes[(origin, dtype)]

    def pack(self, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """This rank's packet: its selected K and V rows of every bundle, copied into one uint8 buffer."""
        packet = torch.empty(self.packet_bytes(self.me, k.dtype), dtype=torch.uint8, device=k.device)
        tensors = unpack(packet, self.specs(self.me, k.dtype))
        for b in range(len(self.bundles)):
            every = self.every(self.me, b)
            tensors[2 * b].transpose(1, 2).copy_(self.gather(k, b, every, role=KEY))
            tensors[2 * b + 1].transpose(1, 2).copy_(self.gather(v, b, every, role=KEY))
        return packet

    def split(self, tensors: list[torch.Tensor], origin: int, b: int,
              parts: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """Unpacked [k, v, k, v, ...] (B, h, L, D) -> the (k, v) rows of the origin's `parts` of bundle b,
        as (B, L, h, D) views."""
        rows = self.span(origin, b, parts)
        return tensors[2 * b][:, :, rows].transpose(1, 2), tensors[2 * b + 1][:, :, rows].transpose(1, 2)

    # -- calls and routes -----------------------------------------------------------------------------------
    def cells(self, member: int, origin: int, b: int) -> dict[tuple[int, int], str]:
        """(query part of `member`, key part of `origin`) -> "diagonal" or "full" for every pair of parts of
        bundle b that attends: both hold rows, of one segment, the keys not after the queries when causal."""
        cells = {}
        for qi, ((q_chunk, q_count), q_segment) in enumerate(zip(self.chunks(member, b), self.segments[member])):
            for ki, ((k_chunk, k_count), k_segment) in enumerate(zip(self.chunks(origin, b), self.segments[origin])):
                if q_count and k_count and q_segment == k_segment and not (self.causal and k_chunk > q_chunk):
                    cells[(qi, ki)] = "diagonal" if self.causal and k_chunk == q_chunk else "full"
        return cells

    def calls(self, origin: int):
        """(bundle, query parts, key parts, causal) of the kernel calls for the origin's packet."""
        for b in range(len(self.bundles)):
            for q_parts, k_parts, causal in self.geometry.algorithm.join(self.cells(self.me, origin, b)):
                yield b, q_parts, k_parts, causal

    def origins(self, dtype: torch.dtype) -> list[int]:
        """Members whose packet holds anything."""
        return [j for j in range(self.size) if self.packet_bytes(j, dtype) > 0]

    def forward_hops(self, step: int, dtype: torch.dtype) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """This rank's (sends, receives) at forward step `step` as (peer member, origin): every packet moves
        one hop along its holders."""
        sends, recvs = [], []
        for j in self.origins(dtype):
            holders = self.holders[j]
            if step >= len(holders):
                continue
            if holders[step - 1] == self.me:
                sends.append((holders[step], j))
            if holders[step] == self.me:
                recvs.append((holders[step - 1], j))
        return sends, recvs

    def num_steps(self) -> int:
        """Forward steps: one per hop of the longest holder list."""
        return max(len(h) for h in self.holders) - 1
