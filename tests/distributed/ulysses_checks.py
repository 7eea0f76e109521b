"""Per-rank checks of head-parallel dilated attention against the float64 dense reference (gloo)."""
from __future__ import annotations

import torch

from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.reference import reference_attention
from hilbert_lab.distributed.sharding import shard_positions
from hilbert_lab.distributed.ulysses import ulysses_dilated_attention
from ring_worlds import check

ATOL = 1e-10


def _finite(lse):
    return torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))


def _reference(q, k, v, pattern, cu_seqlens):
    """(out, lse) of the whole sequence: the dense oracle (k, v repeated to q's heads), or per document."""
    per_kv = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(per_kv, 2), v.repeat_interleave(per_kv, 2)
    if cu_seqlens is None:
        return reference_attention(q, k, v, pattern)
    parts = [reference_attention(q[:, a:b], k[:, a:b], v[:, a:b], pattern) for a, b in zip(cu_seqlens, cu_seqlens[1:])
             if b > a]  # empty documents hold no row
    return torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 2)


def compare(rank, world, seq_len, segment_lengths, dilation_rates, mode, causal, *, layout="contiguous", heads=4,
            kv_heads=None, batch=2, dim=3, seed=0, cu_seqlens=None, positions=None, call=None, **options):
    """Assert this rank's output, LSE and q/k/v gradients (random upstream gradients of both) equal its shard of
    the dense reference's on the whole sequence (atol 1e-10). call: the function under test (default
    ulysses_dilated_attention; options go to it), positions: this rank's (default shard_positions')."""
    if cu_seqlens is not None:
        batch = 1
    gen = torch.Generator().manual_seed(seed)
    q, k, v, grad = (torch.randn(batch, seq_len, heads, dim, generator=gen, dtype=torch.float64) for _ in range(4))
    if kv_heads is not None:
        k, v = k[:, :, :kv_heads].contiguous(), v[:, :, :kv_heads].contiguous()
    pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref_out, ref_lse = _reference(*leaves, pattern, cu_seqlens)
    grad_lse = torch.randn(ref_lse.shape, generator=gen, dtype=torch.float64)
    ((ref_out * grad).sum() + (_finite(ref_lse) * grad_lse).sum()).backward()
    positions = shard_positions(rank, world, seq_len, layout) if positions is None else positions
    local = [t[:, positions].clone().requires_grad_(True) for t in (q, k, v)]
    out, lse = (call or ulysses_dilated_attention)(
        *local, segment_lengths=segment_lengths, dilation_rates=dilation_rates, causal=causal, mode=mode,
        layout=layout, return_lse=True, cu_seqlens=None if cu_seqlens is None else torch.tensor(cu_seqlens), **options)
    ((out * grad[:, positions]).sum() + (_finite(lse) * grad_lse[:, :, positions]).sum()).backward()
    what = (f"rank {rank}/{world} N={seq_len} w={segment_lengths} r={dilation_rates} {mode} causal={causal} "
            f"{layout} H={heads} H_kv={kv_heads} cu_seqlens={cu_seqlens}")
    torch.testing.assert_close(out, ref_out[:, positions], atol=ATOL, rtol=0, msg=lambda m: f"out {what}: {m}")
    ref_lse = ref_lse[:, :, positions]
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)), f"lse -inf rows differ {what}"
    torch.testing.assert_close(_finite(lse), _finite(ref_lse), atol=ATOL, rtol=0, msg=lambda m: f"lse {what}: {m}")
    for name, mine, full in zip("qkv", local, leaves):
        torch.testing.assert_close(mine.grad, full.grad[:, positions], atol=ATOL, rtol=0,
                                   msg=lambda m, name=name: f"d{name} {what}: {m}")


@check
def check_ulysses_matches_reference(rank, world):
    """Segments inside a shard, spanning ranks and the whole sequence; both modes; causal zigzag and
    non-causal contiguous."""
    n = 8
    seq_len = n * world
    spanning = ([4, 2 * n, seq_len], [1, 2, 4])
    compare(rank, world, seq_len, *spanning, "longnet", False)
    compare(rank, world, seq_len, *spanning, "longnet", True, layout="zigzag")
    compare(rank, world, seq_len, [4, 2 * n, 3 * n], [1, 2, 4], "head_groups", True, layout="zigzag", heads=2 * world)
    compare(rank, world, seq_len, [4, 2 * n], [2, 4], "head_groups", False, heads=world)


@check
def check_ulysses_grouped_heads(rank, world):
    """Key/value heads fewer than the ranks (replicated to the ranks whose query heads read them), not
    dividing the ranks, and dividing them (sent as head shards)."""
    n = 8
    seq_len = n * world
    compare(rank, world, seq_len, [4, seq_len], [1, 2], "longnet", True, layout="zigzag", heads=4, kv_heads=1)
    compare(rank, world, seq_len, [4, 2 * n], [2, 4], "head_groups", False, heads=6 * world // 2, kv_heads=3)
    compare(rank, world, seq_len, [4, seq_len], [1, 4], "longnet", False, heads=2 * world, kv_heads=world)


@check
def check_ulysses_packed_rows(rank, world):
    """A packed row's documents, crossing shard borders: each attended as its own sequence."""
    n = 8
    seq_len = n * world
    bounds = [0, 3, n + 2, seq_len]
    compare(rank, world, seq_len, [4, 2 * n], [1, 2], "longnet", True, layout="zigzag", cu_seqlens=bounds)


@check
def check_ulysses_refuses_bad_input(rank, world):
    """Heads not divisible by the ranks, on every rank, one ValueError naming num_heads and the degree; a
    rank that disagrees makes every rank raise naming the field; a bad layout names layout."""
    x = torch.randn(1, 4, world + 1, 2, dtype=torch.float64)
    try:
        ulysses_dilated_attention(x, x, x, segment_lengths=[4], dilation_rates=[1])
    except ValueError as error:
        assert "num_heads" in str(error) and f"degree {world}" in str(error), error
    else:
        raise AssertionError("heads not divisible by the ranks were accepted")
    y = torch.randn(1, 4, world, 2, dtype=torch.float64)
    try:
        ulysses_dilated_attention(y, y, y, segment_lengths=[4], dilation_rates=[1], causal=rank == world - 1)
    except ValueError as error:
        assert "causal" in str(error) and "ulysses_dilated_attention" in str(error), error
    else:
        raise AssertionError("ranks that disagree on causal were accepted")
    try:
        ulysses_dilated_attention(y, y, y, segment_lengths=[4], dilation_rates=[1], layout="striped")
    except ValueError as error:
        assert "layout" in str(error) and "zigzag" in str(error), error
    else:
        raise AssertionError("an unknown layout was accepted")


@check
def check_ulysses_module(rank, world):
    """RingMultiheadDilatedAttention(parallel="ulysses") with a single-process module's weights gives its
    outputs and input gradients on zigzag shards."""
    from hilbert_lab.attention.modules import MultiheadDilatedAttention
    from hilbert_lab.distributed.modules import RingMultiheadDilatedAttention

    n, embed, heads = 6, 8, 2 * world
    seq_len = n * world
    torch.manual_seed(5)
    kwargs = dict(causal=True, mode="longnet", dtype=torch.float64, num_kv_heads=1)
    single = MultiheadDilatedAttention(embed, heads, [3, seq_len], [1, 2], **kwargs)
    parallel = RingMultiheadDilatedAttention(embed, heads, [3, seq_len], [1, 2], layout="zigzag", parallel="ulysses",
                                             **kwargs)
    parallel.load_state_dict(single.state_dict())
    gen = torch.Generator().manual_seed(6)
    x, grad = (torch.randn(2, seq_len, embed, dtype=torch.float64, generator=gen) for _ in range(2))
    x_full = x.clone().requires_grad_(True)
    (single(x_full) * grad).sum().backward()
    positions = shard_positions(rank, world, seq_len, "zigzag")
    x_local = x[:, positions].clone().requires_grad_(True)
    out = parallel(x_local)
    (out * grad[:, positions]).sum().backward()
    torch.testing.assert_close(out, single(x)[:, positions], atol=ATOL, rtol=0)
    torch.testing.assert_close(x_local.grad, x_full.grad[:, positions], atol=ATOL, rtol=0)


@check
def check_ring_of_a_run_of_heads(rank, world):
    """The ring on heads [a, b) of H (global_heads) gives those heads' slice of the whole layer's result."""
    from hilbert_lab.distributed.ring import ring_dilated_attention

    n = 8
    seq_len = n * world
    for start, count, kv_heads in ((2, 2, None), (4, 2, 1)):
        _slice_of_heads(rank, world, seq_len, start, count, kv_heads, ring_dilated_attention)


def _slice_of_heads(rank, world, seq_len, start, count, kv_heads, call, **options):
    heads = 6
    gen = torch.Generator().manual_seed(start)
    q, k, v, grad = (torch.randn(1, seq_len, heads, 3, generator=gen, dtype=torch.float64) for _ in range(4))
    pattern = DilatedPattern.create([4, 12, seq_len], [1, 2, 3], mode="longnet", causal=True)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref_out, ref_lse = reference_attention(*leaves, pattern)
    (ref_out * grad).sum().backward()
    heads_run = slice(start, start + count)
    local = [t[:, shard_positions(rank, world, seq_len, "zigzag"), heads_run] for t in (q, k, v)]
    if kv_heads is not None:  # every local query head reads the first local key/value head's copy
        local[1], local[2] = local[1][:, :, :kv_heads], local[2][:, :, :kv_heads]
    local = [t.clone().requires_grad_(True) for t in local]
    out, lse = call(*local, segment_lengths=pattern.segment_lengths, dilation_rates=pattern.dilation_rates,
                    causal=True, layout="zigzag", return_lse=True, global_heads=(start, heads), **options)
    positions = shard_positions(rank, world, seq_len, "zigzag")
    (out * grad[:, positions, heads_run]).sum().backward()
    if kv_heads is None:
        torch.testing.assert_close(out, ref_out[:, positions, heads_run], atol=ATOL, rtol=0)
        torch.testing.assert_close(lse, ref_lse[:, heads_run][:, :, positions], atol=ATOL, rtol=0)
        for mine, full in zip(local, leaves):
            torch.testing.assert_close(mine.grad, full.grad[:, positions, heads_run], atol=ATOL, rtol=0)
        return
    k_rep = k[:, :, heads_run][:, :, :kv_heads].expand(-1, -1, count, -1)
    v_rep = v[:, :, heads_run][:, :, :kv_heads].expand(-1, -1, count, -1)
    k_full, v_full = k.clone(), v.clone()
    k_full[:, :, heads_run], v_full[:, :, heads_run] = k_rep, v_rep
    expected, _ = reference_attention(q, k_full, v_full, pattern)
    torch.testing.assert_close(out, expected[:, positions, heads_run], atol=ATOL, rtol=0)


@check
def check_hybrid_matches_reference(rank, world):
    """Head-parallel pairs around rings on a 2 x 2 mesh (ring x ulysses): both modes, causal zigzag, spanning
    segments, grouped-query heads fewer than the ulysses degree, a packed row."""
    from torch.distributed.device_mesh import init_device_mesh

    from hilbert_lab.distributed.hybrid import hybrid_dilated_attention, hybrid_positions

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("ring", "ulysses"))
    r, u = mesh.get_local_rank("ring"), mesh.get_local_rank("ulysses")
    n = 4
    seq_len = n * world
    for layout, mode, causal, segments, rates, kv_heads, bounds in (
            ("zigzag", "longnet", True, [2, 3 * n, seq_len], [1, 2, 4], None, None),
            ("contiguous", "head_groups", False, [2, 2 * n, seq_len], [1, 2, 2], None, None),
            ("zigzag", "longnet", True, [4, seq_len], [1, 2], 1, None),
            ("contiguous", "longnet", True, [4, 2 * n], [1, 2], None, [0, 3, n + 1, seq_len])):
        positions = hybrid_positions(r, u, 2, world // 2, seq_len, layout)
        compare(rank, world, seq_len, segments, rates, mode, causal, layout=layout, heads=6 if mode == "head_groups"
                else 4, kv_heads=kv_heads, positions=positions, call=hybrid_dilated_attention, mesh=mesh,
                cu_seqlens=bounds)
    y = torch.randn(1, 4, 2, 2, dtype=torch.float64)
    try:  # the last rank disagrees: every rank of the mesh raises
        hybrid_dilated_attention(y, y, y, segment_lengths=[4], dilation_rates=[1], mesh=mesh, causal=rank == world - 1)
    except ValueError as error:
        assert "hybrid_dilated_attention" in str(error) or "rejected its inputs" in str(error), error
    else:
        raise AssertionError("ranks that disagree on causal were accepted")
    try:
        hybrid_dilated_attention(y, y, y, segment_lengths=[4], dilation_rates=[1], mesh=None)
    except ValueError as error:
        assert "mesh must be a 2-D DeviceMesh" in str(error), error
    else:
        raise AssertionError("mesh=None was accepted")


def _hybrid_module(q, k, v, *, segment_lengths, dilation_rates, causal, mode, layout, return_lse, cu_seqlens, mesh):
    """The call of `compare` through RingDilatedAttention(parallel="hybrid", mesh=mesh)."""
    from hilbert_lab.distributed.modules import RingDilatedAttention

    module = RingDilatedAttention(segment_lengths, dilation_rates, causal=causal, mode=mode, layout=layout,
                                  parallel="hybrid", mesh=mesh)
    return module(q, k, v, return_lse=return_lse, cu_seqlens=cu_seqlens)


@check
def check_hybrid_module(rank, world):
    """RingDilatedAttention(parallel="hybrid") on a 2 x P/2 mesh (ring x ulysses) equals the dense reference
    (out, LSE, dq, dk, dv; grouped-query heads, both modes, a packed row), and RingMultiheadDilatedAttention with
    a single-process module's weights gives its outputs and input gradients."""
    from torch.distributed.device_mesh import init_device_mesh

    from hilbert_lab.attention.modules import MultiheadDilatedAttention
    from hilbert_lab.distributed.hybrid import hybrid_positions
    from hilbert_lab.distributed.modules import RingMultiheadDilatedAttention

    ring, ulysses = 2, world // 2
    mesh = init_device_mesh("cpu", (ring, ulysses), mesh_dim_names=("ring", "ulysses"))
    r, u = mesh.get_local_rank("ring"), mesh.get_local_rank("ulysses")
    n = 4
    seq_len = n * world
    for layout, mode, causal, segments, rates, heads, kv_heads, bounds in (
            ("zigzag", "longnet", True, [2, 3 * n, seq_len], [1, 2, 4], 4, 1, None),
            ("contiguous", "head_groups", False, [2, 2 * n, seq_len], [1, 2, 2], 6, None, None),
            ("contiguous", "longnet", True, [4, 2 * n], [1, 2], 4, None, [0, 3, n + 1, seq_len])):
        compare(rank, world, seq_len, segments, rates, mode, causal, layout=layout, heads=heads, kv_heads=kv_heads,
                positions=hybrid_positions(r, u, ring, ulysses, seq_len, layout), call=_hybrid_module, mesh=mesh,
                cu_seqlens=bounds)
    embed, heads = 8, 2 * ulysses
    torch.manual_seed(7)
    kwargs = dict(causal=True, mode="longnet", dtype=torch.float64, num_kv_heads=1)
    single = MultiheadDilatedAttention(embed, heads, [2, seq_len], [1, 2], **kwargs)
    parallel = RingMultiheadDilatedAttention(embed, heads, [2, seq_len], [1, 2], layout="zigzag", parallel="hybrid",
                                             mesh=mesh, **kwargs)
    parallel.load_state_dict(single.state_dict())
    gen = torch.Generator().manual_seed(8)
    x, grad = (torch.randn(2, seq_len, embed, dtype=torch.float64, generator=gen) for _ in range(2))
    x_full = x.clone().requires_grad_(True)
    (single(x_full) * grad).sum().backward()
    positions = hybrid_positions(r, u, ring, ulysses, seq_len, "zigzag")
    x_local = x[:, positions].clone().requires_grad_(True)
    out = parallel(x_local)
    (out * grad[:, positions]).sum().backward()
    torch.testing.assert_close(out, single(x)[:, positions], atol=ATOL, rtol=0)
    torch.testing.assert_close(x_local.grad, x_full.grad[:, positions], atol=ATOL, rtol=0)


@check
def check_nccl_ulysses(rank, world):
    """On GPUs with NCCL: head-parallel (P ranks) and hybrid (2 x P/2 mesh) float64 exact against the engine;
    bf16 within twice the engine's own bf16 error (out, dq, dk, dv), the LSE loss included."""
    from torch.distributed.device_mesh import init_device_mesh

    from hilbert_lab.attention.engine import dilated_attention
    from hilbert_lab.distributed.hybrid import hybrid_dilated_attention, hybrid_positions

    device = torch.device("cuda", rank)
    mesh = init_device_mesh("cuda", (2, world // 2), mesh_dim_names=("ring", "ulysses"))
    r, u = mesh.get_local_rank("ring"), mesh.get_local_rank("ulysses")
    n, dim, heads = 256, 64, 8
    seq_len = n * world
    cases = [(dict(segment_lengths=[64, 2 * n, seq_len], dilation_rates=[1, 2, 4], causal=True), "zigzag", None),
             (dict(segment_lengths=[128, 3 * n], dilation_rates=[1, 4], mode="head_groups"), "contiguous", 2),
             (dict(segment_lengths=[seq_len], dilation_rates=[1], causal=True), "zigzag", 1)]
    for args, layout, kv_heads in cases:
        calls = (("ulysses", ulysses_dilated_attention, shard_positions(rank, world, seq_len, layout), {}),
                 ("hybrid", hybrid_dilated_attention, hybrid_positions(r, u, 2, world // 2, seq_len, layout),
                  {"mesh": mesh}))
        for name, call, positions, options in calls:
            positions = positions.to(device)
            results = {}
            for dtype in (torch.float64, torch.bfloat16):
                gen = torch.Generator().manual_seed(8)
                q, k, v, grad = (torch.randn(1, seq_len, heads, dim, generator=gen, dtype=torch.float64)
                                 .to(device, dtype) for _ in range(4))
                if kv_heads is not None:
                    k, v = k[:, :, :kv_heads].contiguous(), v[:, :, :kv_heads].contiguous()
                grad_lse = torch.randn(1, heads, seq_len, generator=gen, dtype=torch.float64).to(
                    device, torch.float64 if dtype == torch.float64 else torch.float32)
                full = [t.clone().requires_grad_(True) for t in (q, k, v)]
                ref, ref_lse = dilated_attention(*full, **args, return_lse=True)
                torch.autograd.backward((ref, _finite(ref_lse)), (grad, grad_lse))
                local = [t[:, positions].clone().requires_grad_(True) for t in (q, k, v)]
                out, lse = call(*local, **args, layout=layout, return_lse=True, **options)
                upstream = (grad[:, positions], grad_lse[:, :, positions].contiguous())
                torch.autograd.backward((out, _finite(lse)), upstream)
                results[dtype] = ([out.detach()] + [t.grad for t in local],
                                  [ref.detach()[:, positions]] + [t.grad[:, positions] for t in full])
            for mine, theirs in zip(*results[torch.float64]):
                torch.testing.assert_close(mine, theirs, atol=ATOL, rtol=0, msg=lambda m: f"{name} {args}: {m}")
            exact = results[torch.float64][1]
            for what, mine, theirs, truth in zip(("out", "dq", "dk", "dv"), *results[torch.bfloat16], exact):
                error = (mine.double() - truth).abs().max().item()
                engine_error = (theirs.double() - truth).abs().max().item()
                assert error <= 2 * engine_error + 1e-3, \
                    f"{name} {args} {layout} {what}: bf16 error {error} vs engine {engine_error}"


@check
def check_eight_rank_grids(rank, world):
    """Eight ranks on every (ring x ulysses) grid 8 x 1, 4 x 2, 2 x 4, 1 x 8, and head-parallel alone: spanning
    and local branches, causal zigzag, grouped-query heads fewer than the ulysses degree, a packed row; each rank's
    out, LSE and gradients equal its shard of the dense reference."""
    from torch.distributed.device_mesh import init_device_mesh

    from hilbert_lab.distributed.hybrid import hybrid_dilated_attention, hybrid_positions

    assert world == 8, world
    n = 4
    seq_len = n * world
    for ring, ulysses in ((8, 1), (4, 2), (2, 4), (1, 8)):
        mesh = init_device_mesh("cpu", (ring, ulysses), mesh_dim_names=("ring", "ulysses"))
        r, u = mesh.get_local_rank("ring"), mesh.get_local_rank("ulysses")
        for layout, mode, causal, segments, rates, kv_heads, bounds in (
                ("zigzag", "longnet", True, [2, 3 * n, seq_len], [1, 2, 4], None, None),
                ("contiguous", "head_groups", False, [2, 2 * n, seq_len], [1, 2, 2], None, None),
                ("zigzag", "longnet", True, [4, seq_len], [1, 2], 2, None),
                ("contiguous", "longnet", True, [4, 2 * n], [1, 2], None, [0, 3, n + 1, 5 * n + 2, seq_len])):
            positions = hybrid_positions(r, u, ring, ulysses, seq_len, layout)
            compare(rank, world, seq_len, segments, rates, mode, causal, layout=layout, heads=8, kv_heads=kv_heads,
                    positions=positions, call=hybrid_dilated_attention, mesh=mesh, cu_seqlens=bounds, batch=1,
                    dim=2)
    compare(rank, world, seq_len, [4, 2 * n, seq_len], [1, 2, 4], "longnet", True, layout="zigzag", heads=8,
            kv_heads=2, batch=1, dim=2)  # head-parallel alone over the 8 ranks


@check
def check_ulysses_random_patterns(rank, world):
    """The ring's random cases (ring_checks.random_cases) head-parallel, with world x 1 or 2 query heads."""
    from ring_checks import random_cases

    for seq_len, segments, rates, mode, causal, layout, heads, kv_heads, cu_seqlens in random_cases(world, 12, seed=1):
        heads = world * (1 + heads % 2)
        compare(rank, world, seq_len, segments, rates, mode, causal, layout=layout, heads=heads,
                kv_heads=kv_heads if kv_heads is not None and heads % kv_heads == 0 else None, cu_seqlens=cu_seqlens)


@check
def check_hybrid_random_patterns(rank, world):
    """The ring's random cases (ring_checks.random_cases) head-parallel x ring on a 2 x (world / 2) mesh, with
    (world / 2) x 1 or 2 query heads."""
    from torch.distributed.device_mesh import init_device_mesh

    from hilbert_lab.distributed.hybrid import hybrid_dilated_attention, hybrid_positions
    from ring_checks import random_cases

    ring, ulysses = 2, world // 2
    mesh = init_device_mesh("cpu", (ring, ulysses), mesh_dim_names=("ring", "ulysses"))
    r, u = mesh.get_local_rank("ring"), mesh.get_local_rank("ulysses")
    for seq_len, segments, rates, mode, causal, layout, heads, kv_heads, cu_seqlens in random_cases(world, 12, seed=2):
        heads = ulysses * (1 + heads % 2)
        compare(rank, world, seq_len, segments, rates, mode, causal, layout=layout, heads=heads,
                kv_heads=kv_heads if kv_heads is not None and heads % kv_heads == 0 else None, cu_seqlens=cu_seqlens,
                positions=hybrid_positions(r, u, ring, ulysses, seq_len, layout), call=hybrid_dilated_attention,
                mesh=mesh)
