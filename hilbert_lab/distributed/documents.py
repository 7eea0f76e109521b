"""Packed documents on a ring: the plan of the whole row split into this rank's local blocks and the
segments that cross a shard border.

With documents (cu_seqlens) segments start at each document, so a branch no longer sorts as a whole into
local and ring. The plan of the whole row (attention.plan.cached_plan with its documents) is split per
segment of each block instead:
- a segment inside one of this rank's pieces (positions stored as consecutive rows: the shard, or a zigzag
  chunk; rank P-1's two zigzag chunks are one piece) is a block of the local plan, moved from positions to
  storage rows (a block's parts in consecutive pieces that continue each other in storage are one block); the
  local plan runs on the engine's executor as one job part, and sends nothing;
- a segment crossing a piece border is a span [a, b) whose keys sit on the ranks holding it: a sub-ring
  (`branches.RingBranch` with `span=(a, b)`) run by `steps.RingSteps` like a ring branch of a plain row,
  one job part each. Its members select the positions p of [a, b) with (p - a) % r == offset for each
  head group, and pass those K/V rows along the layout's routes (contiguous and causal: to later ranks
  only), writing (out, LSE) into the branch's slot; the backward sends the dK/dV sums back.
A document shorter than a shard crosses at most one border. Every rank derives the same spans from the same
plan, and runs its spans in one global order (branch, then alternating borders), so no two ranks wait on
each other in a cycle.
"""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import Optional

from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import Plan, cached_plan
from hilbert_lab.distributed.branches import RingBranch, RingLayout, head_groups

Piece = tuple[int, int, int]  # (first position, end position, storage row of the first position)


def pieces(geometry: RingLayout, member: int) -> tuple[Piece, ...]:
    """The member's positions as runs stored in consecutive rows, in storage order (chunks that follow
    each other in position and in storage joined)."""
    out: list[Piece] = []
    for chunk, rows in geometry.runs(member):
        length = rows.stop - rows.start
        first = chunk * length  # chunk ids order positions: chunk c holds [c * length, (c + 1) * length)
        if out and out[-1][1] == first and out[-1][2] + out[-1][1] - out[-1][0] == rows.start:
            out[-1] = (out[-1][0], first + length, out[-1][2])
        else:
            out.append((first, first + length, rows.start))
    return tuple(out)


def holders(geometry: RingLayout, start: int, end: int) -> tuple[int, ...]:
    """The members holding some position of [start, end), ascending."""
    return tuple(m for m in range(geometry.ring_size)
                 if any(first < end and start < stop for first, stop, _ in pieces(geometry, m)))


def _border_index(geometry: RingLayout, position: int) -> int:
    """Index of the piece holding `position` among all pieces ordered by position."""
    firsts = sorted(first for m in range(geometry.ring_size) for first, _, _ in pieces(geometry, m))
    return sum(1 for first in firsts if first <= position) - 1


@functools.lru_cache(maxsize=64)
def split_documents(pattern: DilatedPattern, geometry: RingLayout, num_heads: int,
                    documents: tuple[tuple[int, int], ...], num_kv_heads: Optional[int] = None,
                    branches: Optional[tuple[int, ...]] = None, global_heads: Optional[tuple[int, int]] = None,
                    ) -> tuple[Optional[Plan], tuple[RingBranch, ...]]:
    """(the local plan on this rank's storage rows, or None when no segment lies inside a piece; the spans
    this rank takes part in, in the order every member runs them); see the module docstring. branches: split
    only these (default all). A plain row is one document (0, N). global_heads: the heads are a run of a layer's
    heads keeping their offsets (attention.plan). Cached."""
    plan = cached_plan(pattern, geometry.seq_len, num_heads, num_kv_heads=num_kv_heads, documents=documents,
                       global_heads=global_heads)
    mine = pieces(geometry, geometry.index)
    local = []
    spans: set[tuple[int, int, int]] = set()
    for blk in plan.blocks:
        if branches is not None and blk.branch not in branches:
            continue
        for first, stop, row in mine:
            inside_from = max(0, -(-(first - blk.start) // blk.seg))  # first segment starting in the piece
            inside_to = min(blk.count, (stop - blk.start) // blk.seg)  # past the last segment ending in it
            if inside_from < inside_to:
                local.append(replace(blk, start=blk.start + inside_from * blk.seg - first + row,
                                     count=inside_to - inside_from))
            for border in (first, stop):
                into = border - blk.start
                if 0 < into < blk.count * blk.seg and into % blk.seg:
                    begin = blk.start + (into // blk.seg) * blk.seg
                    spans.add((blk.branch, begin, begin + blk.seg))
    found = []
    for branch, begin, end in sorted(spans, key=lambda s: (s[0], _border_index(geometry, s[1]) % 2, s[1])):
        found.append(RingBranch(branch, end - begin, pattern.dilation_rates[branch],
                                head_groups(pattern, branch, num_heads, num_kv_heads, global_heads),
                                holders(geometry, begin, end),
                                local=False, span=(begin, end)))
    return _local_plan(plan, tuple(local), geometry.shard_len), tuple(found)


def _coalesce(blocks: tuple) -> tuple:
    """Blocks whose segments continue each other in storage (a block's part in one piece, then in the next) as
    one block: one kernel call instead of one per piece."""
    out: list = []
    for blk in blocks:
        last = out[-1] if out else None
        if last is not None and blk.start == last.start + last.count * last.seg and \
                replace(blk, start=last.start, count=last.count) == last:
            out[-1] = replace(last, count=last.count + blk.count)
        else:
            out.append(blk)
    return tuple(out)


def _local_plan(plan: Plan, blocks: tuple, shard_len: int) -> Optional[Plan]:
    """A plan of `blocks` (coalesced) on a shard: merge where some head has blocks of several branches; coverage
    and cleared entries are not known (the executors then clear and zero what they own)."""
    if not blocks:
        return None
    blocks = _coalesce(blocks)
    branches_of: dict[int, set[int]] = {}
    for blk in blocks:
        for h in range(blk.heads.start, blk.heads.stop, blk.heads.step or 1):
            branches_of.setdefault(h, set()).add(blk.branch)
    merge = any(len(found) > 1 for found in branches_of.values())
    return Plan(blocks, plan.num_branches, merge, shard_len, plan.num_heads, plan.pattern,
                num_kv_heads=plan.num_kv_heads, kv_shared=plan.kv_shared, global_heads=plan.global_heads)
