"""Per-rank checks of ring dilated attention against the single-process engine (float64, gloo)."""
from __future__ import annotations

import itertools
import os
import random

import torch
import torch.distributed as dist

from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.distributed import comm
from hilbert_lab.distributed.ring import ring_dilated_attention
from hilbert_lab.distributed.sharding import shard_positions
from ring_worlds import check

ATOL = 1e-10


def single_process(q, k, v, segment_lengths, dilation_rates, mode, causal, cu_seqlens=None):
    """(out, lse) of the single-process engine on the full sequence (its documents: cu_seqlens)."""
    from hilbert_lab.attention.engine import dilated_attention

    return dilated_attention(q, k, v, segment_lengths=segment_lengths, dilation_rates=dilation_rates,
                             causal=causal, mode=mode, return_lse=True, cu_seqlens=cu_seqlens)


def _finite(lse):
    """LSE with -inf (rows without keys) replaced by 0, so that it can enter a loss."""
    return torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))


def _full_inputs(seed, batch, seq_len, heads, dim):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(batch, seq_len, heads, dim, generator=gen, dtype=torch.float64) for _ in range(4))
    return q, k, v, grad


def compare(rank, world, seq_len, segment_lengths, dilation_rates, mode, causal, *, layout="contiguous",
            heads=4, dim=3, batch=2, seed=0, cu_seqlens=None, kv_heads=None):
    """Assert this rank's output, LSE and q/k/v gradients equal the engine's (atol 1e-10); cu_seqlens: a
    packed row's documents (a list; batch 1); kv_heads: k and v with fewer heads (grouped-query)."""
    if cu_seqlens is not None:
        cu_seqlens, batch = torch.tensor(cu_seqlens), 1
    q, k, v, grad = _full_inputs(seed, batch, seq_len, heads, dim)
    if kv_heads is not None:
        k, v = k[:, :, :kv_heads].contiguous(), v[:, :, :kv_heads].contiguous()
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref_out, ref_lse = single_process(*leaves, segment_lengths, dilation_rates, mode, causal, cu_seqlens)
    grad_lse = torch.randn(ref_lse.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    ((ref_out * grad).sum() + (_finite(ref_lse) * grad_lse).sum()).backward()  # LSE is an output too
    positions = shard_positions(rank, world, seq_len, layout)
    local = [t[:, positions].clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = ring_dilated_attention(*local, segment_lengths=segment_lengths, dilation_rates=dilation_rates,
                                      causal=causal, mode=mode, layout=layout, return_lse=True, cu_seqlens=cu_seqlens)
    ((out * grad[:, positions]).sum() + (_finite(lse) * grad_lse[:, :, positions]).sum()).backward()
    what = f"rank {rank}/{world} N={seq_len} w={segment_lengths} r={dilation_rates} {mode} causal={causal} {layout}"
    if cu_seqlens is not None:
        what += f" cu_seqlens={cu_seqlens.tolist()}"
    if kv_heads is not None:
        what += f" kv_heads={kv_heads}"
    torch.testing.assert_close(out, ref_out[:, positions], atol=ATOL, rtol=0, msg=lambda m: f"out {what}: {m}")
    ref_lse_local = ref_lse[:, :, positions]
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse_local)), f"lse -inf rows differ {what}"
    finite = torch.isfinite(ref_lse_local)
    torch.testing.assert_close(lse[finite], ref_lse_local[finite], atol=ATOL, rtol=0, msg=lambda m: f"lse {what}: {m}")
    for name, mine, full in zip("qkv", local, leaves):
        torch.testing.assert_close(mine.grad, full.grad[:, positions], atol=ATOL, rtol=0,
                                   msg=lambda m, name=name: f"d{name} {what}: {m}")
    return out, ref_lse_local


# Sizes per world: shard length n = N / P. Segment lengths cover < n, == n, > n (spanning
# several ranks), == N and > N; a dilation larger than the shard (16 > 8 on 4 ranks) leaves some
# ranks with no selected token for some heads.
CASES = {
    2: (24, [([4, 12, 24], [1, 2, 3]), ([6, 48], [2, 4]), ([24], [1])]),
    3: (24, [([4, 8, 16, 24], [1, 2, 4, 3]), ([8, 100], [2, 2])]),
    4: (32, [([4, 16, 32], [2, 2, 4]), ([8, 16], [1, 4]), ([2, 64], [1, 8]), ([2, 32], [1, 16])]),
}


@check
def check_matches_engine(rank, world):
    seq_len, cases = CASES[world]
    for (segment_lengths, dilation_rates), mode, causal in itertools.product(cases, ("longnet", "head_groups"), (False, True)):
        compare(rank, world, seq_len, segment_lengths, dilation_rates, mode, causal)


@check
def check_rows_without_keys(rank, world):
    # All dilations > 1: in longnet mode a head with offset o sees no key at rows with other offsets.
    seq_len = 8 * world
    _, ref_lse = compare(rank, world, seq_len, [4, 8 * world], [2, 4], "longnet", True, heads=4)
    assert torch.isinf(ref_lse).any(), "the case must contain rows with no keys"


@check
def check_zigzag(rank, world):
    seq_len = 8 * world
    for causal, mode in itertools.product((False, True), ("longnet", "head_groups")):
        compare(rank, world, seq_len, [2, 4, seq_len], [1, 2, 2], mode, causal, layout="zigzag")
    # chunks of 3 tokens: on rank 1 the offset-1 head's rows start before the offset-0 head's
    compare(rank, world, 6 * world, [6 * world], [2], "longnet", False, layout="zigzag", heads=2, dim=2, batch=1)


@check
def check_any_segment_on_every_layout(rank, world):
    """Segments that cross shard (or zigzag chunk) borders at other places than whole shards: 1.5 shards,
    a ragged last segment, a length that divides neither, zigzag's two chunks; every branch kind beside them
    in one pattern; grouped-query heads."""
    n = 12
    seq_len = n * world
    cases = [([18], [1]), ([4, 18], [1, 2]), ([6, 18, seq_len], [1, 2, 3]), ([5, 30], [1, 3]), ([2 * n, 9], [2, 1])]
    for layout, ((segments, rates), mode, causal) in itertools.product(
            ("contiguous", "zigzag"), itertools.product(cases, ("longnet", "head_groups"), (False, True))):
        compare(rank, world, seq_len, segments, rates, mode, causal, layout=layout)
    compare(rank, world, seq_len, [4, 18], [1, 2], "longnet", True, layout="zigzag", heads=4, kv_heads=2)


def _count_sent(prefix):
    counts = torch.tensor([comm.STATS.messages_for(prefix), comm.STATS.bytes_for(prefix)], dtype=torch.int64)
    dist.all_reduce(counts)
    return counts.tolist()


@check
def check_message_counts(rank, world):
    """Zero messages for shard-local branches; exact messages and bytes for a spanning branch."""
    n, batch, heads, dim = 8, 2, 4, 3
    seq_len = n * world
    comm.reset_stats()
    compare(rank, world, seq_len, [2, 4, 8], [1, 2, 4], "longnet", True, heads=heads, dim=dim, batch=batch)
    compare(rank, world, seq_len, [8, 4], [2, 1], "head_groups", False, heads=heads, dim=dim, batch=batch)
    assert comm.STATS.messages == 0 and comm.STATS.bytes == 0, f"local branches sent {comm.STATS.by_label}"
    pattern = DilatedPattern.create([4, 2 * n], [1, 2], mode="longnet")
    w, r, m = 2 * n, 2, 2  # branch 1 spans pairs of ranks
    offsets = pattern.head_offsets(heads)[1]

    def packet_bytes(member):  # K and V of the member's selected tokens for each head, float64
        pos = shard_positions(member, world, seq_len)
        return sum(2 * batch * dim * 8 * int(((pos % w) % r == offsets[h]).sum()) for h in range(heads))

    subrings = [list(range(s, min(s + m, world))) for s in range(0, world, m)]  # odd world: last has 1
    for causal in (False, True):
        comm.reset_stats()
        compare(rank, world, seq_len, [4, 2 * n], [1, 2], "longnet", causal, heads=heads, dim=dim, batch=batch)
        forward, backward = _count_sent("forward/branch1"), _count_sent("backward/branch1")
        exp_fwd, exp_bwd = [0, 0], [0, 0]
        for members in subrings:
            for j, origin in enumerate(members):
                hops = (len(members) - 1 - j) if causal else (len(members) - 1)  # members that need origin's keys
                exp_fwd[0] += hops
                exp_fwd[1] += hops * packet_bytes(origin)
                # K/V travel ahead (hops messages); the dK/dV sum follows from the 2nd holder on, one
                # message per later holder plus the return home (hops messages); float64: same size
                exp_bwd[0] += 2 * hops
                exp_bwd[1] += 2 * hops * packet_bytes(origin)
        assert forward == exp_fwd, f"causal={causal}: forward sent {forward}, expected {exp_fwd}"
        assert backward == exp_bwd, f"causal={causal}: backward sent {backward}, expected {exp_bwd}"
        assert _count_sent("forward/branch0") == [0, 0] and _count_sent("backward/branch0") == [0, 0]



@check
def check_world_one_is_engine(rank, world):
    """A 1-rank ring returns exactly (bitwise) the single-process engine's result."""
    from hilbert_lab.attention.engine import dilated_attention

    q, k, v, _ = _full_inputs(3, 2, 20, 4, 3)  # N = 20 with w = 8: a ragged last segment
    for mode, causal in itertools.product(("longnet", "head_groups"), (False, True)):
        args = dict(segment_lengths=[4, 8, 40], dilation_rates=[1, 2, 4], causal=causal, mode=mode, return_lse=True)
        out, lse = ring_dilated_attention(q, k, v, **args)
        ref_out, ref_lse = dilated_attention(q, k, v, **args)
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse), f"1-rank ring differs ({mode}, causal={causal})"
        packed = dict(args, cu_seqlens=torch.tensor([0, 7, 8, 20]))
        out, lse = ring_dilated_attention(q[:1], k[:1], v[:1], **packed)
        ref_out, ref_lse = dilated_attention(q[:1], k[:1], v[:1], **packed)
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse), f"1-rank packed ring differs ({mode})"
    compare(rank, world, 20, [4, 8, 40], [1, 2, 4], "longnet", True)


@check
def check_constraints_raise(rank, world):
    """Misaligned segments and bad arguments raise ValueError naming the constraint (no hang)."""
    n = 6
    q = torch.zeros(1, n, 2, 2, dtype=torch.float64)
    bad = [
        (dict(segment_lengths=[4], dilation_rates=[1], layout="diagonal"), "layout must be one of"),
        (dict(segment_lengths=[6], dilation_rates=[1], ring_size=world + 1), "ring_size"),
        (dict(segment_lengths=[6], dilation_rates=[7]), "dilation_rates"),
    ]
    if world == 1:  # a single rank holds the whole sequence: segment alignment does not apply
        bad = bad[1:]
    else:  # rank 0 holds more tokens than the others: every rank must raise (not hang)
        uneven = torch.zeros(1, n + 2 * (rank == 0), 2, 2, dtype=torch.float64)
        try:
            ring_dilated_attention(uneven, uneven, uneven, segment_lengths=[2], dilation_rates=[1])
        except ValueError as error:
            message = str(error)
            assert "N must be divisible by the" in message and "rank 0: (1, 8, 2, 2)" in message, error
            assert f"rank{'s' if world > 2 else ''} {', '.join(map(str, range(1, world)))}: (1, 6, 2, 2)" in message
        else:
            raise AssertionError("unequal shards did not raise ValueError")
    for kwargs, needle in bad:
        try:
            ring_dilated_attention(q, q, q, **kwargs)
        except ValueError as error:
            assert needle in str(error), f"{kwargs}: message {error!s} does not name {needle!r}"
        else:
            raise AssertionError(f"{kwargs} did not raise ValueError")


def _raises_everywhere(call, *needles):
    """call() raises ValueError on this rank with every needle in it, and the message is the same on all ranks."""
    try:
        call()
    except ValueError as error:
        message = str(error)
    else:
        raise AssertionError(f"no ValueError; expected one naming {needles}")
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    messages = [None] * dist.get_world_size()
    dist.all_gather_object(messages, message)
    assert len(set(messages)) == 1, f"ranks raised different messages: {messages}"
    return message


@check
def check_agreement_of_a_group_without_gloo(rank, world):
    """A group without gloo (NCCL on GPUs) agrees over a gloo group of the same ranks, made once: a matching
    call gives the engine's result, a mismatch still raises everywhere."""
    from hilbert_lab.distributed import agreement

    original = agreement._has_gloo
    agreement._has_gloo = lambda group: group not in (None, dist.group.WORLD) and original(group)  # WORLD as NCCL
    try:
        compare(rank, world, 6 * world, [3, 6 * world], [1, 2], "longnet", True)
        made = agreement._HOST_GROUPS[dist.group.WORLD]
        assert made is not dist.group.WORLD and dist.get_process_group_ranks(made) == list(range(world))
        q = torch.zeros(1, 6, 2, 2, dtype=torch.float64)
        _raises_everywhere(lambda: ring_dilated_attention(q, q, q, segment_lengths=[3], dilation_rates=[1],
                                                          causal=rank == 0), "disagree", "causal", "rank 0: True")
        assert agreement._HOST_GROUPS[dist.group.WORLD] is made
    finally:
        agreement._has_gloo = original


@check
def check_configuration_agreement(rank, world):
    """Ranks that disagree on any part of the configuration all raise the same ValueError before data moves."""
    n = 6
    seq_len = n * world
    q, k, v, _ = _full_inputs(11, 1, seq_len, 2, 4)
    pos = shard_positions(rank, world, seq_len)
    local = [t[:, pos] for t in (q, k, v)]
    base = dict(segment_lengths=[3, seq_len], dilation_rates=[1, 2], causal=False)
    last = world - 1
    others = ", ".join(map(str, range(1, world)))
    ranks_word = "ranks" if world > 2 else "rank"
    # dtype: rank 0 float64, the others float32 (this used to give a wrong result on one rank, an abort on the other)
    mixed = [t if rank == 0 else t.float() for t in local]
    _raises_everywhere(lambda: ring_dilated_attention(*mixed, **base), "disagree", "dtype",
                       "rank 0: torch.float64", f"{ranks_word} {others}: torch.float32")
    rates = dict(base, dilation_rates=[1, 3] if rank == last else [1, 2])
    _raises_everywhere(lambda: ring_dilated_attention(*local, **rates), "dilation_rates", f"rank {last}: (1, 3)")
    scaled = dict(base, scale=0.25 if rank == 0 else None)  # the others: D**-0.5 = 0.5
    _raises_everywhere(lambda: ring_dilated_attention(*local, **scaled), "scale", "rank 0: 0.25", "0.5")
    flipped = dict(base, causal=rank == 0)
    _raises_everywhere(lambda: ring_dilated_attention(*local, **flipped), "causal", "rank 0: True")
    laid = dict(base, layout="zigzag" if rank == last else "contiguous")
    _raises_everywhere(lambda: ring_dilated_attention(*local, **laid), "layout", f"rank {last}: 'zigzag'")
    moded = dict(base, mode="head_groups" if rank == 0 else "longnet")
    _raises_everywhere(lambda: ring_dilated_attention(*local, **moded), "mode", "rank 0: 'head_groups'")
    backends = dict(base, backend="manual" if rank == 0 else "sdpa")
    _raises_everywhere(lambda: ring_dilated_attention(*local, **backends), "backend", "rank 0: manual on cpu")
    # packed rows: the documents differ on the last rank; one rank without documents; ends at the shard length
    cu = torch.tensor([0, 2, seq_len - 1, seq_len] if rank == last else [0, 2, 5, seq_len])
    packed = dict(base, cu_seqlens=cu)
    _raises_everywhere(lambda: ring_dilated_attention(*local, **packed), "disagree", "cu_seqlens",
                       f"rank {last}: 4 entries, digest")
    some = dict(base, cu_seqlens=None if rank == 0 else torch.tensor([0, 5, seq_len]))
    _raises_everywhere(lambda: ring_dilated_attention(*local, **some), "cu_seqlens", "rank 0: None")
    short = dict(base, cu_seqlens=torch.tensor([0, 2, n]))
    _raises_everywhere(lambda: ring_dilated_attention(*local, **short), f"cu_seqlens must end at N = {seq_len}",
                       f"{n} tokens per shard x {world} ranks")
    if world == 4:
        sized = dict(base, segment_lengths=[3, 2 * n], ring_size=2 if rank == 0 else None)
        _raises_everywhere(lambda: ring_dilated_attention(*local, **sized), "ring_size", "rank 0: 2")
    # nothing moved: the group still works, exactly
    compare(rank, world, seq_len, base["segment_lengths"], base["dilation_rates"], "longnet", False, heads=2, dim=4)


@check
def check_local_part_runs_while_the_agreement_travels(rank, world):
    """The ring queues its local part before the ranks' configuration rows arrive (a late rank does not delay
    it), returns only once every rank has agreed, and the result is the engine's."""
    import time

    import hilbert_lab.distributed.ring as ring_module

    seq_len = 8 * world
    q, k, v, _ = _full_inputs(3, 1, seq_len, 2, 4)
    pos = shard_positions(rank, world, seq_len)
    local = [t[:, pos] for t in (q, k, v)]
    entered = []
    original = ring_module.attention

    def spy(*args, **kwargs):
        entered.append(time.perf_counter())
        return original(*args, **kwargs)

    ring_module.attention = spy
    try:
        dist.barrier()
        if rank != 0:
            time.sleep(0.5)
        start = time.perf_counter()
        out = ring_dilated_attention(*local, segment_lengths=[4, 8], dilation_rates=[1, 2])  # inside the shards
        returned = time.perf_counter()
    finally:
        ring_module.attention = original
    if rank == 0:
        assert entered[0] - start < 0.25, f"the local part waited {entered[0] - start:.3f} s for the late rank"
        assert returned - start >= 0.4, f"returned after {returned - start:.3f} s, before the late rank agreed"
    ref, _ = single_process(q, k, v, [4, 8], [1, 2], "longnet", False)
    torch.testing.assert_close(out, ref[:, pos], atol=ATOL, rtol=0)


@check
def check_ring_size_disagreement(rank, world):
    """Rank 0 asks for a ring of one rank, the others for the whole group: every rank raises one ValueError
    naming ring_size in bounded time (the agreement runs before the one-rank shortcut), then the group works."""
    if world == 1:
        return
    n = 4
    q, k, v, _ = _full_inputs(13, 1, n * world, 2, 2)
    local = [t[:, rank * n:(rank + 1) * n] for t in (q, k, v)]
    args = dict(segment_lengths=[2, n * world], dilation_rates=[1, 2], ring_size=1 if rank == 0 else None, timeout_s=20)
    others = ", ".join(map(str, range(1, world)))
    _raises_everywhere(lambda: ring_dilated_attention(*local, **args), "ring_size", "rank 0: 1",
                       f"rank{'s' if world > 2 else ''} {others}: {world}")
    compare(rank, world, n * world, [2, n * world], [1, 2], "longnet", True, heads=2, dim=2, batch=1)


@check
def check_nonfinite_like_engine(rank, world):
    """A NaN in a later rank's value and an inf in a key show up on the ring exactly where the engine shows
    them: a row's output and LSE depend only on the keys it attends (CPU semantics of every kernel call)."""
    from hilbert_lab.attention.engine import dilated_attention

    n = 6
    seq_len = n * world
    q, k, v, _ = _full_inputs(14, 1, seq_len, 4, 3)
    v[0, seq_len - 2, :, 1] = float("nan")  # on the last rank
    k[0, min(n + 1, seq_len - 1), 2, 0] = float("inf")  # on rank 1 (a world of one: rank 0)
    for causal, layout in ((True, "contiguous"), (False, "contiguous"), (True, "zigzag")):
        args = dict(segment_lengths=[3, seq_len], dilation_rates=[1, 2], causal=causal, return_lse=True)
        ref_out, ref_lse = dilated_attention(q, k, v, **args)
        pos = shard_positions(rank, world, seq_len, layout)
        out, lse = ring_dilated_attention(q[:, pos], k[:, pos], v[:, pos], layout=layout, **args)
        what = f"rank {rank}/{world} causal={causal} {layout}"
        torch.testing.assert_close(out, ref_out[:, pos], atol=ATOL, rtol=0, equal_nan=True, msg=lambda m: f"out {what}: {m}")
        torch.testing.assert_close(lse, ref_lse[:, :, pos], atol=ATOL, rtol=0, equal_nan=True,
                                   msg=lambda m: f"lse {what}: {m}")
        assert ref_out.isnan().any() and not ref_out.isnan().all(), "the case must hold NaN and finite rows"


@check
def check_inputs_validated(rank, world):
    """Bad inputs (int64, bad scale, empty shards) raise ValueError on every rank count, also on one rank only."""
    n = 4
    seq_len = n * world
    x = torch.randn(1, n, 2, 2, dtype=torch.float64)
    args = dict(segment_lengths=[2, seq_len], dilation_rates=[1, 2])
    _raises_everywhere(lambda: ring_dilated_attention(x.long(), x.long(), x.long(), **args), "floating dtype")
    for scale in (-1.0, 0.0, float("inf"), float("nan")):
        _raises_everywhere(lambda: ring_dilated_attention(x, x, x, scale=scale, **args), "scale must be", "finite")
    empty = x[:, :0]
    _raises_everywhere(lambda: ring_dilated_attention(empty, empty, empty, **args), "non-empty")
    if world > 1:  # only one rank is wrong: it raises its own error, every other rank one naming it
        last = world - 1
        bad = x.long() if rank == last else x
        try:
            ring_dilated_attention(bad, bad, bad, **args)
        except ValueError as error:
            assert "floating dtype" in str(error), error
            if rank != last:
                assert f"rank {last} of the ring rejected its inputs" in str(error), error
        else:
            raise AssertionError("int64 inputs on one rank did not raise")
        lonely = empty if rank == 0 else x
        try:
            ring_dilated_attention(lonely, lonely, lonely, **args)
        except ValueError as error:
            assert "non-empty" in str(error) and (rank == 0 or "rank 0 of the ring rejected" in str(error)), error
        else:
            raise AssertionError("an empty shard on rank 0 did not raise")
    compare(rank, world, seq_len, args["segment_lengths"], args["dilation_rates"], "longnet", True, heads=2, dim=2)


@check
def check_sub_rings(rank, world):
    """ring_size=2 splits the world into rings that each hold (and attend over) their own sequence."""
    ring_size, n = 2, 6
    ring = rank // ring_size
    q, k, v, grad = _full_inputs(10 + ring, 1, ring_size * n, 4, 2)  # each ring: a different sequence
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    args = dict(segment_lengths=[3, 2 * n], dilation_rates=[1, 2], causal=True)
    ref = single_process(*leaves, args["segment_lengths"], args["dilation_rates"], "longnet", True)[0]
    (ref * grad).sum().backward()
    part = slice((rank % ring_size) * n, (rank % ring_size + 1) * n)
    local = [t[:, part].clone().requires_grad_(True) for t in (q, k, v)]
    out = ring_dilated_attention(*local, ring_size=ring_size, **args)
    (out * grad[:, part]).sum().backward()
    torch.testing.assert_close(out, ref[:, part], atol=ATOL, rtol=0)
    for mine, full in zip(local, leaves):
        torch.testing.assert_close(mine.grad, full.grad[:, part], atol=ATOL, rtol=0)
    # a segment of 1.5 shards: split per segment inside each ring
    spans = dict(segment_lengths=[9, 2 * n], dilation_rates=[1, 2], causal=True)
    ref = single_process(q, k, v, spans["segment_lengths"], spans["dilation_rates"], "longnet", True)[0]
    out = ring_dilated_attention(*(t.detach() for t in local), ring_size=ring_size, **spans)
    torch.testing.assert_close(out, ref[:, part], atol=ATOL, rtol=0)
    # packed rows: each ring its own documents (agreed within the ring only)
    cu = torch.tensor([0, n - 1 - ring, 2 * n])
    packed = dict(args, cu_seqlens=cu)
    ref = single_process(q, k, v, args["segment_lengths"], args["dilation_rates"], "longnet", True, cu)[0]
    out = ring_dilated_attention(*(t.detach() for t in local), ring_size=ring_size, **packed)
    torch.testing.assert_close(out, ref[:, part], atol=ATOL, rtol=0)
    odd = dict(packed, cu_seqlens=cu + (rank == ring_size) * torch.tensor([0, 1, 0]))  # rank 2 disagrees with rank 3
    _raises_everywhere(lambda: ring_dilated_attention(*(t.detach() for t in local), ring_size=ring_size, **odd),
                       "cu_seqlens", "rank 2: 3 entries")


@check
def check_modules(rank, world):
    """RingMultiheadDilatedAttention with a single-process module's weights gives its outputs and grads."""
    from hilbert_lab.attention.modules import MultiheadDilatedAttention
    from hilbert_lab.distributed.modules import RingMultiheadDilatedAttention

    n, embed, heads = 6, 8, 4
    seq_len = n * world
    torch.manual_seed(5)
    kwargs = dict(causal=True, mode="head_groups", dtype=torch.float64, num_kv_heads=2)
    single = MultiheadDilatedAttention(embed, heads, [3, seq_len], [1, 2], **kwargs)
    ring = RingMultiheadDilatedAttention(embed, heads, [3, seq_len], [1, 2], **kwargs)
    ring.load_state_dict(single.state_dict())
    x = torch.randn(2, seq_len, embed, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    grad = torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    x_full = x.clone().requires_grad_(True)
    (single(x_full) * grad).sum().backward()
    part = slice(rank * n, (rank + 1) * n)
    x_local = x[:, part].clone().requires_grad_(True)
    out = ring(x_local)
    (out * grad[:, part]).sum().backward()
    torch.testing.assert_close(out, single(x)[:, part], atol=ATOL, rtol=0)
    torch.testing.assert_close(x_local.grad, x_full.grad[:, part], atol=ATOL, rtol=0)
    cu = torch.tensor([0, n - 1, n + 1, seq_len])  # a packed row: one document across the first border
    torch.testing.assert_close(ring(x[:1, part], cu_seqlens=cu), single(x[:1], cu_seqlens=cu)[:, part], atol=ATOL,
                               rtol=0)
    # Parameter gradients are per-rank partial sums: their all-reduce is the single-process gradient.
    for (name, p_ring), p_single in zip(ring.named_parameters(), single.parameters()):
        total = p_ring.grad.clone()
        dist.all_reduce(total)
        torch.testing.assert_close(total, p_single.grad, atol=ATOL, rtol=0, msg=lambda m, name=name: f"{name}: {m}")


@check
def check_eight_ranks(rank, world):
    """Smoke check for 8 ranks: spanning (2, 4, 8 ranks) and local branches, causal, vs the engine."""
    compare(rank, world, 32, [2, 8, 16, 32], [1, 2, 2, 4], "longnet", True, heads=4, dim=2, batch=1)
    compare(rank, world, 32, [4, 32], [2, 2], "head_groups", False, heads=4, dim=2, batch=1)
    compare(rank, world, 32, [4, 32], [2, 8], "longnet", True, heads=8, dim=2, batch=1)  # r = 8 > shard 4


@check
def check_deadlock_on_purpose(rank, world):
    """Rank 0 waits for a message nobody sends: the harness must fail this at its deadline."""
    if rank == 0:
        dist.recv(torch.zeros(1), src=1)


@check
def check_example(rank, world):
    """The torchrun example's self-check passes and its timing step reports the ring's messages."""
    from hilbert_lab.examples.ring import self_check, time_forward_backward

    assert self_check(torch.device("cpu")) <= ATOL
    stats = time_forward_backward(32 * world, torch.device("cpu"), heads=2, head_dim=4, segment_lengths=[8, 1024],
                                  dilation_rates=[1, 2], causal=False, mode="longnet", dtype=torch.float32, iters=1)
    # one spanning branch (the whole sequence): forward P-1 K/V messages; backward P-1 K/V messages and
    # P-1 dK/dV sums (passed on, or home) per rank
    assert stats["messages_sent"] == 3 * (world - 1), stats
    assert stats["shard_len"] == 32 and stats["tokens_per_s"] > 0


@check
def check_low_precision(rank, world):
    """float32 and bfloat16 shards (odd byte counts: packets padded, dK/dV travel in float32)."""
    from hilbert_lab.attention.engine import dilated_attention

    seq_len, args = 10 * world, dict(segment_lengths=[5, 10 * world], dilation_rates=[1, 3], causal=True)
    pos = shard_positions(rank, world, seq_len)
    for dtype, atol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        q, k, v, grad = (t.to(dtype) for t in _full_inputs(4, 1, seq_len, 3, 3))
        full = [t.clone().requires_grad_(True) for t in (q, k, v)]
        ref = dilated_attention(*full, **args)
        ref.backward(grad)
        local = [t[:, pos].clone().requires_grad_(True) for t in (q, k, v)]
        out = ring_dilated_attention(*local, **args)
        out.backward(grad[:, pos])
        assert out.dtype == dtype and all(t.grad.dtype == dtype for t in local)
        torch.testing.assert_close(out.float(), ref[:, pos].float(), atol=atol, rtol=0)
        for mine, theirs in zip(local, full):
            torch.testing.assert_close(mine.grad.float(), theirs.grad[:, pos].float(), atol=atol, rtol=0)


@check
def check_ring_comm(rank, world):
    """RingComm passes a tensor around the ring in P-1 steps and counts exactly those sends."""
    ring = comm.RingComm()
    comm.reset_stats()
    held = torch.full((3,), float(rank), dtype=torch.float64)
    seen = [rank]
    for _ in range(world - 1):
        incoming = torch.empty(3, dtype=torch.float64)
        ring.send_recv(held, incoming, label="test").wait()
        held = incoming
        seen.append(int(held[0]))
    assert sorted(seen) == list(range(world)) and seen[1:] == [(rank - s) % world for s in range(1, world)], seen
    assert ring.stats.messages == world - 1 and ring.stats.bytes == 24 * (world - 1)
    assert comm.STATS.messages_for("test") == world - 1 and comm.STATS.bytes_for("test") == 24 * (world - 1)


@check
def check_nccl_gpus(rank, world):
    """On GPUs with NCCL: float64 exact against the engine; bf16 within twice the engine's own bf16 error.
    Cases: local + sub-ring + whole-sequence branches (causal); a dilation-16 whole-sequence branch over 12
    heads (one diagonal view per bundle) with a loss on the LSE too; dense causal attention in zigzag."""
    from hilbert_lab.attention.engine import dilated_attention

    device = torch.device("cuda", rank)
    n, dim = 256, 64
    seq_len = n * world
    cases = [
        (dict(segment_lengths=[64, 2 * n, 4 * seq_len], dilation_rates=[1, 2, 4], causal=True), 4, "contiguous"),
        (dict(segment_lengths=[64, 1 << 40], dilation_rates=[1, 16], causal=False), 12, "contiguous"),
        (dict(segment_lengths=[seq_len], dilation_rates=[1], causal=True), 4, "zigzag"),
    ]
    for args, heads, layout in cases:
        pos = shard_positions(rank, world, seq_len, layout).to(device)
        results = {}
        for dtype in (torch.float64, torch.bfloat16):
            q, k, v, grad = (t.to(device, dtype) for t in _full_inputs(8, 1, seq_len, heads, dim))
            grad_lse = torch.randn(1, heads, seq_len, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
            grad_lse = grad_lse.to(device, torch.float32 if dtype != torch.float64 else dtype)
            full = [t.clone().requires_grad_(True) for t in (q, k, v)]
            ref, ref_lse = dilated_attention(*full, **args, return_lse=True)
            torch.autograd.backward((ref, ref_lse), (grad, grad_lse))
            local = [t[:, pos].clone().requires_grad_(True) for t in (q, k, v)]
            out, lse = ring_dilated_attention(*local, **args, layout=layout, return_lse=True)
            torch.autograd.backward((out, lse), (grad[:, pos], grad_lse[:, :, pos].contiguous()))
            results[dtype] = ([out.detach()] + [t.grad for t in local],
                              [ref.detach()[:, pos]] + [t.grad[:, pos] for t in full])
        for mine, theirs in zip(*results[torch.float64]):
            torch.testing.assert_close(mine, theirs, atol=ATOL, rtol=0)
        exact = results[torch.float64][1]
        for name, mine, theirs, truth in zip(("out", "dq", "dk", "dv"), *results[torch.bfloat16], exact):
            ring_error = (mine.double() - truth).abs().max().item()
            engine_error = (theirs.double() - truth).abs().max().item()
            assert ring_error <= 2 * engine_error + 1e-3, \
                f"{args} {layout} {name}: ring bf16 error {ring_error} vs engine {engine_error}"


def packed_rows(world):
    """cu_seqlens of 24-token rows over `world` ranks (shards of 24 / world): a document longer than a shard,
    length-1 documents on both sides of every shard border, and one document that is the whole row."""
    n = 24 // world
    borders = [b * n for b in range(1, world)]
    around = sorted({0, 24} | {b + d for b in borders for d in (-1, 0, 1)})
    return [[0, 3, 4, 19, 22, 24], around, [0, 24]]


@check
def check_packed_documents(rank, world):
    """Packed rows (cu_seqlens) whose documents cross shard borders: exact against the engine on the whole
    row, causal and not, both modes, segment lengths that divide no shard, zigzag too."""
    rows = packed_rows(world)
    patterns = [([4, 8, 100], [1, 2, 3]), ([5, 1 << 40], [2, 4])]
    for cu_seqlens, (segment_lengths, dilation_rates), causal in itertools.product(rows[:2], patterns, (False, True)):
        compare(rank, world, 24, segment_lengths, dilation_rates, "longnet", causal, cu_seqlens=cu_seqlens)
    compare(rank, world, 24, [4, 8, 100], [1, 2, 3], "head_groups", True, heads=6, cu_seqlens=rows[0])
    compare(rank, world, 24, [6, 24], [1, 2], "longnet", True, cu_seqlens=rows[2])  # one document: a plain row
    for causal in (False, True):
        compare(rank, world, 24, [4, 8, 100], [1, 2, 3], "longnet", causal, layout="zigzag", cu_seqlens=rows[0])
    # messages: documents inside shards send nothing; a causal document across a border sends its earlier
    # rank's K/V once forward, and K/V plus the dK/dV sum back once backward
    n = 24 // world
    comm.reset_stats()
    compare(rank, world, 24, [4, 100], [1, 2], "longnet", True, cu_seqlens=list(range(0, 25, n)))
    assert _count_sent("forward") == [0, 0] and _count_sent("backward") == [0, 0], comm.STATS.by_label
    comm.reset_stats()
    compare(rank, world, 24, [100], [1], "longnet", True, cu_seqlens=[0, n - 1, n + 1, 24])  # 3 ranks: [9, 24) too
    sent = _count_sent("forward")[0], _count_sent("backward")[0]
    assert sent == (world - 1, 2 * (world - 1)), (sent, comm.STATS.by_label)
    # grouped-query heads: 6 query heads read 2 key/value heads (offset groups that straddle kv heads split)
    compare(rank, world, 24, [4, 8, 100], [1, 4, 3], "longnet", True, heads=6, kv_heads=2, cu_seqlens=rows[0])
    compare(rank, world, 24, [5, 100], [2, 4], "head_groups", False, heads=6, kv_heads=3, cu_seqlens=rows[1])


@check
def check_grouped_heads(rank, world):
    """k, v with fewer heads than q on plain rows: local branches, sub-rings and the whole sequence."""
    n = 8
    seq_len = n * world
    compare(rank, world, seq_len, [4, 2 * n, seq_len], [1, 4, 2], "longnet", True, heads=6, kv_heads=2)
    compare(rank, world, seq_len, [2, seq_len], [1, 2], "longnet", False, heads=4, kv_heads=1, batch=1)
    compare(rank, world, seq_len, [2, seq_len], [1, 2], "head_groups", True, heads=4, kv_heads=2, layout="zigzag",
            batch=1)


def random_cases(world, count, seed=0):
    """`count` random (seq_len, segments, rates, mode, causal, layout, heads, kv_heads, cu_seqlens) of a world,
    the same on every rank: segments inside a shard, across borders and longer than the row; grouped heads; packed
    rows whose documents cross shard borders (some empty)."""
    rng = random.Random(1000 * world + seed)
    for _ in range(count):
        layout = rng.choice(["contiguous", "zigzag"])
        seq_len = world * (rng.choice([2, 4, 6, 8, 10]) if layout == "zigzag" else rng.randint(1, 10))
        segments = [rng.choice([1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 24, seq_len, 2 * seq_len])
                    for _ in range(rng.randint(1, 3))]
        rates = [rng.randint(1, min(w, 6)) for w in segments]
        heads = rng.choice([2, 3, 4, 6])
        kv_heads = rng.choice([None, None] + [h for h in (1, 2) if heads % h == 0])
        cu_seqlens = None
        if rng.random() < 0.3:
            cu_seqlens = [0, *sorted(rng.randint(0, seq_len) for _ in range(rng.randint(1, 3))), seq_len]
        yield (seq_len, segments, rates, rng.choice(["longnet", "head_groups"]), rng.random() < 0.5, layout, heads,
               kv_heads, cu_seqlens)


@check
def check_random_patterns(rank, world):
    """Random patterns, layouts, grouped heads and packed rows (random_cases), each against the engine: 12 of a
    fixed seed, or with HILBERT_LAB_FUZZ_EXAMPLES=N (make fuzz) N of a seed rank 0 draws anew (a failure names its
    case)."""
    count, seed = 12, 0
    examples = os.environ.get("HILBERT_LAB_FUZZ_EXAMPLES")
    if examples:
        drawn = torch.tensor([random.SystemRandom().randrange(1, 2 ** 31) if rank == 0 else 0])
        dist.broadcast(drawn, 0)
        count, seed = int(examples), int(drawn)
    for seq_len, segments, rates, mode, causal, layout, heads, kv_heads, cu_seqlens in random_cases(world, count,
                                                                                                    seed):
        compare(rank, world, seq_len, segments, rates, mode, causal, layout=layout, heads=heads, kv_heads=kv_heads,
                cu_seqlens=cu_seqlens, batch=1 if cu_seqlens is not None else 2)
