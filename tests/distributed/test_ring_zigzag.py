"""The zigzag layout's branches whose segments are whole chunks, and the routes that skip ranks attending none
of a packet's keys: planner, work per rank and routes against references computed from positions (pure), and
exactness against the engine on gloo worlds (zigzag_checks.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from hilbert_lab.attention.pattern import DilatedPattern, is_selected  # noqa: E402
from hilbert_lab.attention.plan import cached_plan  # noqa: E402
from hilbert_lab.distributed.branches import RingLayout, plan_branches  # noqa: E402
from hilbert_lab.distributed.ring import plan_ring  # noqa: E402
from hilbert_lab.distributed.schedule import BranchSchedule  # noqa: E402
from ring_worlds import run_world  # noqa: E402

NO_GLOO = not dist.is_available() or not dist.is_gloo_available()


def _holders_of_chunks(world: int, first: int, count: int) -> tuple[int, ...]:
    """The ranks holding zigzag chunks [first, first + count): rank i holds chunks i and 2P-1-i."""
    return tuple(sorted({min(c, 2 * world - 1 - c) for c in range(first, first + count)}))


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_planner_runs_segments_of_whole_chunks_around_their_holders(world):
    """w = m chunks with m dividing 2P: a ring over the ranks holding the segment of the rank's early chunk (its
    late chunk's segment has the same holders), local where that is the rank alone; other multiples split."""
    chunk = 6
    seq_len = 2 * world * chunk
    wholes = [m for m in range(2, 2 * world + 1) if (2 * world) % m == 0]
    misaligned = [m for m in range(2, 2 * world) if (2 * world) % m]
    pattern = DilatedPattern.create([m * chunk for m in wholes + misaligned], [1] * (len(wholes) + len(misaligned)))
    for rank in range(world):
        plans = plan_branches(pattern, RingLayout(world, rank, seq_len, "zigzag"), num_heads=2)
        for plan, m in zip(plans, wholes):
            holders = _holders_of_chunks(world, (rank // m) * m, m)
            late = 2 * world - 1 - rank
            assert holders == _holders_of_chunks(world, (late // m) * m, m)
            assert (plan.local, plan.per_segment, plan.members) == \
                ((True, False, (rank,)) if holders == (rank,) else (False, False, holders)), (world, rank, m)
        assert all(p.per_segment and not p.local for p in plans[len(wholes):])


def _pairs_of_call(schedule, origin, b, q_parts, k_parts, causal) -> int:
    lq = sum(schedule.chunks(schedule.me, b)[p][1] for p in q_parts)
    lk = sum(schedule.chunks(origin, b)[p][1] for p in k_parts)
    per_head = lq * (lk - lq) + lq * (lq + 1) // 2 if causal else lq * lk
    return schedule.batch * schedule.heads(b) * per_head


def _work(pattern, geometry, heads):
    """(plan, query-key pairs this rank computes, forward kernel calls per ring branch) of the ring's job."""
    plan = plan_ring(pattern, geometry, heads)
    pairs = sum(blk.pairs(pattern.causal) * blk.num_heads for blk in plan.local_plan.blocks)
    q = torch.empty(1, geometry.shard_len, heads, 1)
    calls = {}
    for branch in plan.branches:
        schedule = BranchSchedule(branch, geometry, pattern.causal, q)
        for origin in range(schedule.size):
            if schedule.me in schedule.holders[origin]:
                for call in schedule.calls(origin):
                    pairs += _pairs_of_call(schedule, origin, *call)
                    calls[branch.branch] = calls.get(branch.branch, 0) + 1
    return plan, pairs, calls


def test_zigzag_on_four_ranks_keeps_the_causal_balance_without_splitting():
    """The benchmark's pattern scaled down (segments 1/256 ... 1/4 of N and N, dilations 1 ... 16): on 4 ranks the
    N/P branch (2 chunks) is a ring of 2 ranks, nothing is split per segment, every rank computes exactly 1/P of
    the engine's causal query-key pairs, with 3 calls (2 diagonal, 1 full) for that branch and P for the whole
    sequence; contiguous computes the same pairs in all, unevenly."""
    seq_len, heads = 8192, 12
    pattern = DilatedPattern.create([32, 128, 512, 2048, seq_len], [1, 2, 4, 8, 16], causal=True)
    total = sum(blk.pairs(True) * blk.num_heads for blk in cached_plan(pattern, seq_len, heads).blocks)
    for layout in ("zigzag", "contiguous"):
        found = []
        for rank in range(4):
            plan, pairs, calls = _work(pattern, RingLayout(4, rank, seq_len, layout), heads)
            found.append(pairs)
            if layout == "zigzag":
                assert not plan.split and plan.local_plan == cached_plan(pattern, seq_len // 4, heads, (0, 1, 2))
                assert [(b.branch, b.members) for b in plan.branches] == \
                    [(3, (0, 1) if rank < 2 else (2, 3)), (4, (0, 1, 2, 3))]
                assert calls == {3: 3, 4: 4}
        assert sum(found) == total, layout
        if layout == "zigzag":
            assert found == [total // 4] * 4
        else:
            assert len(set(found)) == 4


def _needs(geometry, branch, member, origin, causal) -> bool:
    """Whether `member` attends some key that `origin` holds, from positions: a selected query and key of one
    segment (a span, or the same multiple of w), the key not after the query when causal."""
    queries, keys = geometry.positions(member), geometry.positions(origin)
    start, stop = branch.span if branch.span is not None else (0, geometry.seq_len)
    w = branch.segment_length
    for group in branch.groups:
        q = queries[(queries >= start) & (queries < stop) & is_selected(queries - start, w, branch.dilation_rate,
                                                                         group.offset)]
        k = keys[(keys >= start) & (keys < stop) & is_selected(keys - start, w, branch.dilation_rate, group.offset)]
        same = (q[:, None] - start) // w == (k[None, :] - start) // w
        if bool((same & ((k[None, :] <= q[:, None]) if causal else True)).any()):
            return True
    return False


@pytest.mark.parametrize("layout,world,segments", [
    ("zigzag", 4, [3, 18, 48]), ("zigzag", 4, [12, 24]), ("zigzag", 3, [5, 20]), ("contiguous", 4, [18, 48]),
    ("zigzag", 2, [2, 24]),
])
def test_routes_skip_the_members_that_attend_none_of_a_packet(layout, world, segments):
    """Every packet travels to exactly the members that attend some of its keys (a reference from positions),
    for ring branches and for segments split per segment, causal or not; a causal zigzag segment's earlier
    holders receive nothing from later ones."""
    seq_len, heads = 12 * world, 4
    for causal in (False, True):
        pattern = DilatedPattern.create(segments, [1, 2, 3][:len(segments)], causal=causal)
        for rank in range(world):
            geometry = RingLayout(world, rank, seq_len, layout)
            plan = plan_ring(pattern, geometry, heads)
            for branch in plan.branches:
                schedule = BranchSchedule(branch, geometry, causal, torch.empty(1, geometry.shard_len, heads, 1))
                for j, origin in enumerate(branch.members):
                    expected = {branch.members[i] for i in range(schedule.size) if i != j and
                                _needs(geometry, branch, branch.members[i], origin, causal)}
                    holders = schedule.holders[j]
                    assert holders[0] == j and len(set(holders)) == len(holders)
                    assert {branch.members[i] for i in holders[1:]} == expected, (causal, rank, branch, origin)


@pytest.mark.skipif(NO_GLOO, reason="torch.distributed with gloo is not available in this torch build")
@pytest.mark.parametrize("world_size", [2, pytest.param(3, marks=pytest.mark.slow),
                                        pytest.param(4, marks=pytest.mark.slow)])
def test_zigzag_chunk_segments_match_engine(tmp_path, world_size):
    run_world(world_size, tmp_path, ["check_zigzag_chunk_segments"])



def test_the_gloo_check_holds_every_kind_of_branch():
    """The gloo check's first case on 4 ranks holds a local, a 2-rank and a whole-sequence branch."""
    plans = plan_branches(DilatedPattern.create([2, 8, 32], [1, 2, 4]), RingLayout(4, 1, 32, "zigzag"), 4)
    assert [(p.local, p.members) for p in plans] == [(True, (1,)), (False, (0, 1)), (False, (0, 1, 2, 3))]


@pytest.mark.parametrize("segment", [3 * 1024, 5 * 1024])
def test_split_local_part_is_one_block_per_shard_block(segment):
    """A branch split per segment (3 or 5 zigzag chunks on 4 ranks): the other branches' blocks in a rank's two
    chunks continue each other in storage and are one block each, exactly the blocks of the shard's own plan."""
    seq_len, heads = 8192, 12
    pattern = DilatedPattern.create([32, 128, 512, segment, seq_len], [1, 2, 4, 8, 16], causal=True)
    reference = cached_plan(pattern, seq_len // 4, heads, (0, 1, 2))
    for rank in range(4):
        plan = plan_ring(pattern, RingLayout(4, rank, seq_len, "zigzag"), heads)
        assert plan.split
        local = [blk for blk in plan.local_plan.blocks if blk.branch < 3]
        assert sorted(map(repr, local)) == sorted(map(repr, reference.blocks)), rank
