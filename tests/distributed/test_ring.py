"""Ring dilated attention on spawned gloo worlds (1, 2, 3, 4, 8 ranks) against the single-process engine.

The per-rank checks live in ring_checks.py; each world runs many of them to amortise process
start-up (packed rows, whose documents cross shard borders, and grouped-query heads on 2 and 3 ranks). Random
patterns, layouts, grouped heads and packed rows (ring_checks.random_cases) run in worlds of their own: `make fuzz`
draws many new ones.
Pure (single-process) tests cover sharding, packet buffers, the branch planner, the split of a packed
row's plan and the per-rank memory model (against a dry run of the ring job on meta tensors).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from hilbert_lab.attention.pattern import DilatedPattern  # noqa: E402
from hilbert_lab.distributed import comm  # noqa: E402
from hilbert_lab.distributed.branches import RingLayout, plan_branches  # noqa: E402
from hilbert_lab.distributed.sharding import (  # noqa: E402
    check_divisible, shard, shard_positions, unshard, zigzag_shard, zigzag_unshard,
)
from ring_worlds import WORLD_TIMEOUT_S, run_world  # noqa: E402

NO_GLOO = not dist.is_available() or not dist.is_gloo_available()
NO_TWO_GPUS = not torch.cuda.is_available() or torch.cuda.device_count() < 2 or not dist.is_nccl_available()
pytestmark = pytest.mark.skipif(NO_GLOO, reason="torch.distributed with gloo is not available in this torch build")

ALL_CHECKS = ["check_matches_engine", "check_rows_without_keys", "check_zigzag", "check_any_segment_on_every_layout",
              "check_message_counts", "check_constraints_raise", "check_modules", "check_example",
              "check_low_precision", "check_ring_comm", "check_configuration_agreement",
              "check_agreement_of_a_group_without_gloo", "check_inputs_validated", "check_ring_size_disagreement",
              "check_nonfinite_like_engine", "check_local_part_runs_while_the_agreement_travels"]


@pytest.mark.slow  # make test keeps one gloo world: two ranks, below
def test_world_of_one_is_the_engine(tmp_path):
    run_world(1, tmp_path, ["check_world_one_is_engine", "check_constraints_raise", "check_inputs_validated"])


@pytest.mark.parametrize("world_size", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_world_matches_engine(tmp_path, world_size):
    run_world(world_size, tmp_path, ALL_CHECKS + ["check_packed_documents", "check_grouped_heads"])


@pytest.mark.slow
def test_world_of_four_matches_engine_and_sub_rings(tmp_path):
    run_world(4, tmp_path, ALL_CHECKS + ["check_sub_rings"])


@pytest.mark.slow
def test_world_of_eight_smoke(tmp_path):
    run_world(8, tmp_path, ["check_eight_ranks"])


@pytest.mark.property  # make fuzz: HILBERT_LAB_FUZZ_EXAMPLES cases per world, of a seed drawn anew
@pytest.mark.parametrize("world_size", [2, pytest.param(3, marks=pytest.mark.slow), pytest.param(4, marks=pytest.mark.slow)])
def test_random_patterns_match_engine(tmp_path, world_size):
    examples = int(os.environ.get("HILBERT_LAB_FUZZ_EXAMPLES") or 12)
    run_world(world_size, tmp_path, ["check_random_patterns"], timeout_s=WORLD_TIMEOUT_S * max(1.0, examples / 12))


@pytest.mark.slow  # waits out its deadline
def test_harness_reports_a_deadlock(tmp_path):
    with pytest.raises(TimeoutError, match="deadlock"):
        run_world(2, tmp_path, ["check_deadlock_on_purpose"], timeout_s=12)


def test_contiguous_shard_round_trip():
    x = torch.arange(2 * 12 * 3).reshape(2, 12, 3)
    parts = [shard(x, rank, 4) for rank in range(4)]
    assert torch.equal(parts[1], x[:, 3:6])
    assert torch.equal(unshard(parts), x)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_zigzag_round_trip_and_positions(world_size):
    seq_len = 4 * world_size
    x = torch.randn(2, seq_len, 3)
    parts = [zigzag_shard(x, rank, world_size) for rank in range(world_size)]
    assert torch.equal(zigzag_unshard(parts), x)
    for rank, part in enumerate(parts):
        assert torch.equal(part, x[:, shard_positions(rank, world_size, seq_len, "zigzag")])
    # every position held exactly once; rank 0 holds the first and the last chunk
    held = torch.cat([shard_positions(r, world_size, seq_len, "zigzag") for r in range(world_size)])
    assert torch.equal(held.sort().values, torch.arange(seq_len))
    assert shard_positions(0, world_size, seq_len, "zigzag")[-1] == seq_len - 1


def test_uneven_shards_raise_naming_the_constraint():
    with pytest.raises(ValueError, match=r"must be divisible by the number of ranks = 4 \(equal shards"):
        shard(torch.zeros(1, 10, 2), 0, 4)
    with pytest.raises(ValueError, match=r"2 x the number of ranks \(zigzag chunks\) = 6"):
        zigzag_shard(torch.zeros(1, 9, 2), 0, 3)
    with pytest.raises(ValueError, match="rank must be an integer in"):
        shard(torch.zeros(1, 8, 2), 4, 4)
    with pytest.raises(ValueError, match="layout must be one of"):
        check_divisible(8, 2, "striped")


def test_planner_local_and_spanning_branches():
    pattern = DilatedPattern.create([4, 8, 16, 64, 32], [1, 2, 2, 4, 8])
    plans = plan_branches(pattern, RingLayout(ring_size=4, index=2, seq_len=32, layout="contiguous"), num_heads=8)
    # shard length 8: w=4, 8 local; w=16 -> ranks {2, 3}; w=64 and 32 (= N) -> all ranks
    assert [p.local for p in plans] == [True, True, False, False, False]
    assert [p.members for p in plans] == [(2,), (2,), (2, 3), (0, 1, 2, 3), (0, 1, 2, 3)]
    assert [p.segment_length for p in plans] == [4, 8, 16, 32, 32]
    # head offsets follow the pattern: dilation 8 over 8 heads -> one head per offset
    assert [g.offset for g in plans[4].groups] == list(range(8))
    odd = plan_branches(DilatedPattern.create([16], [1]), RingLayout(3, 2, 24, "contiguous"), num_heads=2)
    assert odd[0].members == (2,) and not odd[0].local  # last segment [16, 24) lies on rank 2 alone


def test_planner_splits_misaligned_segments_per_segment():
    geometry = RingLayout(ring_size=4, index=0, seq_len=48, layout="contiguous")  # shard length 12
    plans = plan_branches(DilatedPattern.create([4, 8, 18, 24], [1, 1, 1, 2]), geometry, num_heads=2)
    assert [(p.local, p.per_segment, p.members) for p in plans] == [
        (True, False, (0,)), (False, True, ()), (False, True, ()), (False, False, (0, 1))]
    zigzag = RingLayout(ring_size=4, index=0, seq_len=48, layout="zigzag")  # chunks of 6
    plans = plan_branches(DilatedPattern.create([3, 18, 48], [1, 1, 1]), zigzag, num_heads=2)
    assert [(p.local, p.per_segment, p.members) for p in plans] == [
        (True, False, (0,)), (False, True, ()), (False, False, (0, 1, 2, 3))]  # 3 chunks do not divide 8


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_per_segment_split_of_a_plain_row_covers_every_run_once(layout):
    """The per-segment branches of a plain row split as one document: every (branch, head, position) of the
    branch is in exactly one rank's local blocks or one span; a span's members are the ranks holding it."""
    from hilbert_lab.attention.plan import cached_plan
    from hilbert_lab.distributed.documents import split_documents

    world_size, seq_len, heads = 4, 48, 4
    pattern = DilatedPattern.create([4, 18, 9], [1, 2, 3], causal=True)
    split = (1, 2)
    expected = {(b.branch, h, int(p)) for b in cached_plan(pattern, seq_len, heads).blocks if b.branch in split
                for h in range(b.heads.start, b.heads.stop, b.heads.step or 1) for p in b.positions().flatten()}
    found = []
    for rank in range(world_size):
        geometry = RingLayout(world_size, rank, seq_len, layout)
        local, spans = split_documents(pattern, geometry, heads, ((0, seq_len),), None, split)
        held = geometry.positions(rank)
        for blk in local.blocks if local is not None else ():
            found += [(blk.branch, h, int(p)) for h in range(blk.heads.start, blk.heads.stop, blk.heads.step or 1)
                      for p in held[blk.positions()].flatten()]
        for span in spans:
            a, b = span.span
            holding = tuple(m for m in range(world_size) if bool(((geometry.positions(m) >= a) &
                                                                   (geometry.positions(m) < b)).any()))
            assert span.members == holding and rank in holding and span.branch in split
            if rank == span.members[0]:
                found += [(span.branch, h, p) for group in span.groups for h in group.head_indices
                          for p in range(a + group.offset, b, span.dilation_rate)]
    assert len(found) == len(set(found)) and set(found) == expected


def test_unpack_views_round_trip_mixed_dtypes():
    tensors = [torch.randn(3, 5).to(torch.bfloat16), torch.randn(2, 3, dtype=torch.float64),
               torch.randn(7), torch.zeros(0, 4)]
    specs = [(tuple(t.shape), t.dtype) for t in tensors]
    buffer = torch.empty(comm.packed_size(specs), dtype=torch.uint8)
    assert buffer.numel() == 8 * (4 + 6 + 4 + 0)  # each part 8-byte aligned
    for view, original in zip(comm.unpack(buffer, specs), tensors):
        view.copy_(original)
    for original, restored in zip(tensors, comm.unpack(buffer.clone(), specs)):
        assert restored.dtype == original.dtype and torch.equal(restored, original)
    with pytest.raises(ValueError, match="bytes but the specs describe"):
        comm.unpack(buffer[:-8], specs)


@pytest.mark.gpu
@pytest.mark.skipif(NO_TWO_GPUS, reason="needs 2 CUDA GPUs and NCCL")
def test_two_gpus_nccl(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    run_world(2, tmp_path, ["check_nccl_gpus"], timeout_s=300, backend="nccl")


class _Silent:
    """A communicator that moves nothing (receive buffers keep what they hold), for dry runs."""

    class _Done:
        def wait(self) -> None:
            return None

    def exchange(self, sends=(), recvs=(), label="", step=None):
        return self._Done()

    def global_rank(self, member: int) -> int:
        return member


def _ring_dry_run(config, index: int) -> tuple[int, int]:
    """(forward, forward+backward) peaks of rank `index`'s ring job on meta tensors (attention.dry_run's counter)."""
    from hilbert_lab.attention.dry_run import Allocations, estimate_target
    from hilbert_lab.attention.executors import get_executor
    from hilbert_lab.attention.function import attention
    from hilbert_lab.attention.target import estimating
    from hilbert_lab.distributed.ring import plan_ring, ring_job
    from hilbert_lab.distributed.steps import RingSteps

    n = config.seq_len // config.world_size
    shape = (config.batch_size, n, config.num_heads, config.head_dim)
    q, k, v, upstream = (torch.empty(shape, dtype=getattr(torch, config.dtype), device="meta") for _ in range(4))
    geometry = RingLayout(config.world_size, index, config.seq_len, "contiguous")
    plan = plan_ring(config.pattern, geometry, config.num_heads)
    executor = get_executor(config.backend)
    peaks = []
    for training in (False, True):
        for t in (q, k, v):
            t.requires_grad_(training)
        tracker = Allocations()
        tracker.exclude(q, k, v, upstream)
        with estimating(*estimate_target(config.device), tracker.workspace), tracker, torch.set_grad_enabled(training):
            steps = RingSteps(_Silent(), executor.kernel_for(q), executor.capabilities.in_place)
            job = ring_job(config.pattern, plan, geometry, q, executor, steps, config.head_dim ** -0.5)
            out, _ = attention(job, q, k, v, need_lse=training or job.num_slots > 1)
            if training:
                out.backward(upstream)
            del out
        peaks.append(tracker.peak)
    return peaks[0], peaks[1]


@pytest.mark.parametrize("case", [
    dict(seq_len=16384, segment_lengths=(2048, 16384), dilation_rates=(1, 2), num_heads=4, head_dim=32),
    dict(seq_len=32768, segment_lengths=(2048, 32768), dilation_rates=(1, 4), num_heads=8, head_dim=64,
         dtype="bfloat16"),
    dict(seq_len=8192, segment_lengths=(512, 8192), dilation_rates=(1, 2), num_heads=4, head_dim=32, backend="manual"),
    dict(seq_len=16384, segment_lengths=(1024, 16384), dilation_rates=(1, 2), num_heads=6, head_dim=32,
         mode="head_groups"),
    dict(seq_len=16384, segment_lengths=(1024, 8192, 16384), dilation_rates=(1, 2, 8), num_heads=8, head_dim=32,
         causal=True, world_size=4),
    dict(seq_len=12288, segment_lengths=(12288,), dilation_rates=(2,), num_heads=4, head_dim=32, world_size=3,
         dtype="float64"),
])
def test_ring_memory_model_matches_a_dry_run_of_the_ring_job(case):
    """distributed.memory places the ring pipelines' buffers by hand (attention code runs as a dry run, the pipelines
    do not): a dry run of the ring's own job (meta tensors, a communicator that moves nothing; the allocation
    count, so the CUDA estimate) on every rank must agree with it."""
    from hilbert_lab.attention.memory import MemoryConfig
    from hilbert_lab.distributed.memory import estimate_memory_per_rank

    config = MemoryConfig(**{"backend": "sdpa", "world_size": 2, "device": "cuda", **case})
    estimate = estimate_memory_per_rank(config)
    peaks = [_ring_dry_run(config, index) for index in range(config.world_size)]
    forward, forward_backward = (max(p[i] for p in peaks) for i in range(2))
    assert 0.97 * estimate.forward_bytes <= forward <= estimate.forward_bytes * 1.01, (forward, estimate)
    assert 0.97 * estimate.forward_backward_bytes <= forward_backward <= estimate.forward_backward_bytes * 1.01, \
        (forward_backward, estimate)


@pytest.mark.parametrize("case", [
    dict(seq_len=16384, segment_lengths=(2048, 6144), dilation_rates=(1, 2), num_heads=4, head_dim=32),
    dict(seq_len=16384, segment_lengths=(3000,), dilation_rates=(1,), num_heads=4, head_dim=32),
    dict(seq_len=32768, segment_lengths=(2048, 12288, 32768), dilation_rates=(1, 2, 4), num_heads=8, head_dim=64,
         dtype="bfloat16", world_size=4),
    dict(seq_len=16384, segment_lengths=(1024, 6144), dilation_rates=(1, 2), num_heads=8, head_dim=32, causal=True,
         world_size=4, mode="head_groups"),
    dict(seq_len=12288, segment_lengths=(1000, 5000), dilation_rates=(1, 3), num_heads=4, head_dim=32, world_size=3,
         dtype="float64"),
])
def test_ring_memory_model_bounds_a_dry_run_of_segments_crossing_shards(case):
    """Branches the ring splits per segment: the model counts each crossing segment's largest member for every
    member, so it bounds the dry run of the ring's own job from above, and by at most 25%."""
    from hilbert_lab.attention.memory import MemoryConfig
    from hilbert_lab.distributed.memory import estimate_memory_per_rank

    config = MemoryConfig(**{"backend": "sdpa", "world_size": 2, "device": "cuda", **case})
    estimate = estimate_memory_per_rank(config)
    peaks = [_ring_dry_run(config, index) for index in range(config.world_size)]
    forward, forward_backward = (max(p[i] for p in peaks) for i in range(2))
    assert forward <= estimate.forward_bytes <= 1.25 * forward, (forward, estimate)
    assert forward_backward <= estimate.forward_backward_bytes <= 1.25 * forward_backward, (forward_backward, estimate)


@pytest.mark.parametrize("layout,world_size", [("contiguous", 2), ("contiguous", 3), ("zigzag", 3)])
def test_packed_row_split_covers_every_run_once(layout, world_size):
    """A packed row's plan split over the ranks (documents.split_documents): every (branch, head, position) of
    the whole row's plan is in exactly one rank's local blocks or one span; spans are listed in the same order
    on all their members; a document shorter than a shard crosses one border at most."""
    from hilbert_lab.attention.plan import cached_plan
    from hilbert_lab.distributed.documents import split_documents

    pattern = DilatedPattern.create([4, 8, 100], [1, 2, 3], causal=True)
    documents = ((0, 3), (3, 1), (4, 15), (19, 3), (22, 2))
    seq_len, heads = 24, 4

    def entries(blk, positions):
        return {(blk.branch, h, int(p)) for h in range(blk.heads.start, blk.heads.stop, blk.heads.step or 1)
                for p in positions.flatten()}

    expected = set().union(*(entries(b, b.positions()) for b in cached_plan(pattern, seq_len, heads,
                                                                              documents=documents).blocks))
    found, orders = [], {}
    for rank in range(world_size):
        geometry = RingLayout(world_size, rank, seq_len, layout)
        local, spans = split_documents(pattern, geometry, heads, documents)
        held = geometry.positions(rank)
        for blk in local.blocks:
            found += sorted(entries(blk, held[blk.positions()]))
        for span in spans:
            orders.setdefault(span.members, []).append([s.span for s in spans if s.members == span.members])
            if rank == span.members[0]:  # each span once: its selected positions of every head group
                a, b = span.span
                for group in span.groups:
                    found += [(span.branch, h, p) for h in group.head_indices for p in range(a + group.offset, b,
                                                                                             span.dilation_rate)]
            start, stop = span.span
            if any(d0 <= start and stop <= d0 + n for d0, n in documents if n < seq_len // world_size):
                assert len(span.members) == 2, span
    assert len(found) == len(set(found)) and set(found) == expected
    for lists in orders.values():
        assert all(order == lists[0] for order in lists)
