"""GPU checks (run on the device machine): CUDA curve maps against the CPU curve core, the
segment permutation against torch indexing, and the fused Triton kernel against the engine's
float64 reference on many random shapes (bf16, fp16, fp32 with TF32 off)."""
from __future__ import annotations

import random
import zlib
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the device machine)"),
]

# ---------------------------------------------------------------- curve maps


@pytest.mark.parametrize("curve", ["hilbert", "morton"])
@pytest.mark.parametrize("ndim,order", [(2, 1), (2, 5), (2, 12), (2, 15), (2, 16), (2, 31), (3, 3), (3, 10), (3, 21)])
@pytest.mark.parametrize("count", [4096, 1001, 1002, 130])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("method", ["table", "bitscan"])
def test_cuda_encode_decode_match_cpu(curve, ndim, order, count, dtype, method):
    from hilbert_lab import curves
    from hilbert_lab.kernels import cuda_curves

    if dtype == torch.int32 and order >= 31:
        pytest.skip("int32 coordinates hold at most 31 bits")
    gen = torch.Generator().manual_seed(order * 7 + ndim)
    coords = torch.randint(0, 2**order, (count, ndim), generator=gen, dtype=torch.int64)
    expected = torch.as_tensor(curves.encode(coords.numpy(), order, curve=curve, dtype="int64"))
    out_dtype = torch.int32 if ndim * order <= 31 and dtype == torch.int32 else torch.int64
    out = torch.full((count,), -1, dtype=out_dtype, device="cuda")  # poisoned: every element must be written
    got = cuda_curves.encode(coords.to("cuda", dtype), order, curve, out=out, method=method)
    assert torch.equal(got.cpu().long(), expected)
    back = torch.full((count, ndim), -1, dtype=dtype, device="cuda")
    decoded = cuda_curves.decode(expected.to("cuda", out_dtype), order, ndim, curve, out=back, method=method)
    assert torch.equal(decoded.cpu().long(), coords)
    # the public curve API dispatches CUDA tensors here and returns int64 on the same device
    public = curves.encode(coords.to("cuda"), order, curve=curve)
    assert public.is_cuda and torch.equal(public.cpu(), expected)


@pytest.mark.parametrize("items,threads,points", [(1, 32, 2), (2, 128, 4), (4, 256, 2), (4, 256, 4), (8, 512, 4),
                                                  (8, 96, 2)])
def test_cuda_launch_configs_give_the_same_indices(items, threads, points):
    """Every launch configuration of the vectorised 2D kernels covers every point exactly once,
    with ragged tails (counts that no block size divides), for all four 2D methods/curves."""
    from hilbert_lab import curves
    from hilbert_lab.kernels import cuda_curves

    gen = torch.Generator().manual_seed(items * 1000 + threads + points)
    count = 4 * (items * threads * 3 + 17)  # whole quads, not a multiple of a block's work
    coords = torch.randint(0, 2**12, (count, 2), generator=gen, dtype=torch.int64)
    try:
        cuda_curves.set_launch_config(items, threads, points, points)
        for curve, method in (("hilbert", "table"), ("hilbert", "bitscan"), ("morton", "table")):
            expected = torch.as_tensor(curves.encode(coords.numpy(), 12, curve=curve, dtype="int64"))
            out = torch.full((count,), -1, dtype=torch.int32, device="cuda")
            cuda_curves.encode(coords.to("cuda", torch.int32), 12, curve, out=out, method=method)
            assert torch.equal(out.cpu().long(), expected), (curve, method)
            back = torch.full((count, 2), -1, dtype=torch.int32, device="cuda")
            cuda_curves.decode(out, 12, 2, curve, out=back, method=method)
            assert torch.equal(back.cpu().long(), coords), (curve, method)
    finally:
        cuda_curves.set_launch_config()
    with pytest.raises(ValueError, match="items must be one of"):
        cuda_curves.set_launch_config(items=3)
    with pytest.raises(ValueError, match="threads must be a multiple of 32"):
        cuda_curves.set_launch_config(threads=100)
    with pytest.raises(ValueError, match="encode_points must be 2 or 4"):
        cuda_curves.set_launch_config(encode_points=8)


def test_cuda_curve_bad_input():
    from hilbert_lab.kernels import cuda_curves

    coords = torch.tensor([[0, 4]], device="cuda")
    with pytest.raises(ValueError, match="coords"):
        cuda_curves.encode(coords, 2)
    with pytest.raises(ValueError, match="index"):
        cuda_curves.decode(torch.tensor([16], device="cuda"), 2, 2)
    with pytest.raises(NotImplementedError):
        cuda_curves.encode(torch.zeros(3, 4, dtype=torch.int64, device="cuda"), 3)
    with pytest.raises(NotImplementedError):
        cuda_curves.encode(torch.zeros(3, 2, dtype=torch.int64), 3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("shape,segment", [((2, 256, 12, 64), 64), ((1, 250, 3, 5), 32), ((2, 100, 4, 8), 100), ((1, 77, 1, 3), 10)])
def test_segment_permutation_matches_indexing(dtype, shape, segment):
    from hilbert_lab.kernels import cuda_curves

    gen = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(shape, generator=gen).to("cuda", dtype)
    perm = torch.randperm(segment, generator=gen)
    tail = shape[1] % segment
    tail_perm = torch.randperm(tail, generator=gen) if tail else None
    source = torch.cat([s * segment + perm for s in range(shape[1] // segment)] +
                       ([shape[1] - tail + tail_perm] if tail else []))
    out = torch.full_like(x, float("nan"))
    got = cuda_curves.apply_segment_permutation(x, perm.numpy(), segment, tail_perm=tail_perm, out=out)
    assert torch.equal(got, x[:, source.cuda()])
    inverse = torch.argsort(perm)
    tail_inverse = torch.argsort(tail_perm) if tail else None
    assert torch.equal(cuda_curves.apply_segment_permutation(got, inverse, segment, tail_perm=tail_inverse), x)
    with pytest.raises(ValueError, match="permutation"):
        cuda_curves.apply_segment_permutation(x, torch.zeros(segment, dtype=torch.int64), segment, tail_perm=tail_perm)


# ---------------------------------------------------------------- fused attention


def _random_cases(count: int, seed: int):
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        branches = rng.randint(1, 3)
        segs = sorted(rng.choice([16, 32, 48, 64, 100, 128, 256, 512]) for _ in range(branches))
        dils = [rng.choice([1, 2, 3, 4]) for _ in range(branches)]
        dils = [min(r, w) for r, w in zip(dils, segs)]
        seq_len = rng.choice([1, 17, 64, 129, 300, 511, 700])
        cases.append((rng.randint(1, 2), seq_len, rng.choice([1, 2, 3, 4, 6]), rng.choice([32, 64, 128]),
                      segs, dils, rng.choice(["longnet", "head_groups"]), rng.random() < 0.5))
    return cases


BENCH_LIKE = [
    (1, 1024, 12, 64, [256, 512, 1024], [1, 2, 4], "head_groups", False),
    (1, 1024, 12, 64, [256, 512, 1024], [1, 2, 4], "longnet", False),
    (1, 1000, 8, 64, [256, 512, 1024], [1, 2, 4], "longnet", True),
    (2, 777, 5, 128, [128, 300], [2, 3], "head_groups", True),
    (1, 300, 4, 48, [64, 128], [1, 2], "longnet", True),  # head dim not a power of two
]
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 1e-2, torch.float32: 1e-3}
GRAD_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 1e-2, torch.float32: 1e-3}


RANDOM_CASES = _random_cases(24, seed=5)
FUSED_CASES = ([(c, torch.bfloat16) for c in BENCH_LIKE + RANDOM_CASES]
               + [(c, dt) for c in BENCH_LIKE + RANDOM_CASES[:6] for dt in (torch.float16, torch.float32)])


def _case_id(item) -> str:
    c, dt = item
    return f"{str(dt)[6:]}-{c[6]}-N{c[1]}-H{c[2]}-D{c[3]}-{c[4]}-{c[5]}-{'causal' if c[7] else 'full'}"


@pytest.mark.parametrize("case,dtype", FUSED_CASES, ids=[_case_id(item) for item in FUSED_CASES])
def test_fused_kernel_matches_float64_reference(case, dtype):
    from _attention_cases import run_case

    prev = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        result = run_case(case, "cuda", dtype, seed=zlib.crc32(str(case).encode()) % 1000)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    assert result["finite"] and result["neg_inf_rows_match"] and result["no_keys_rows_zero"], result
    assert result["out"] <= TOLERANCE[dtype], result
    assert result["lse"] <= (2e-2 if dtype != torch.float32 else 1e-3), result
    for name in ("dq", "dk", "dv"):
        assert result[name] <= GRAD_TOLERANCE[dtype], (name, result)


TMA_CASES = [c for c in BENCH_LIKE + RANDOM_CASES if c[3] in (16, 32, 64, 128)][:10]


@pytest.mark.parametrize("case", TMA_CASES, ids=[_case_id((c, torch.bfloat16)) for c in TMA_CASES])
def test_fused_forward_with_bulk_tensor_copies_matches_float64(case):
    """The forward's optional TMA path (device-side tensor descriptors for full key blocks, used when
    CONFIG_OVERRIDES["fwd_tma"] is set) computes the same attention, on shapes with ragged segments."""
    from _attention_cases import run_case

    from hilbert_lab.kernels import triton_dilated

    assert triton_dilated._tma_eligible(*(torch.zeros(1, 8, 2, case[3], device="cuda", dtype=torch.bfloat16)
                                           for _ in range(2)))
    triton_dilated.CONFIG_OVERRIDES["fwd_tma"] = True
    try:
        result = run_case(case, "cuda", torch.bfloat16, seed=zlib.crc32(str(case).encode()) % 1000)
    finally:
        triton_dilated.CONFIG_OVERRIDES.pop("fwd_tma", None)
    assert result["finite"] and result["neg_inf_rows_match"] and result["no_keys_rows_zero"], result
    assert result["out"] <= TOLERANCE[torch.bfloat16] and result["lse"] <= 2e-2, result


@pytest.mark.parametrize("causal", [False, True])
def test_dense_block_on_the_fused_executor_matches_float64(causal):
    from hilbert_lab.attention.engine import dilated_attention

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 200, 3, 64, generator=gen).cuda().to(torch.bfloat16).requires_grad_(True) for _ in range(3))
    out, lse = dilated_attention(q, k, v, segment_lengths=[200], dilation_rates=[1], causal=causal, backend="triton",
                                 scale=0.2, return_lse=True)
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    scores = torch.einsum("bnhd,bmhd->bhnm", q64, k64) * 0.2
    if causal:
        scores = scores.masked_fill(torch.ones(200, 200, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    ref_lse = torch.logsumexp(scores, -1)
    ref = torch.einsum("bhnm,bmhd->bnhd", torch.softmax(scores, -1), v64)
    assert (out.double() - ref).norm() / ref.norm() < 1e-2
    assert (lse.double() - ref_lse).abs().max() < 2e-2
    grad = torch.randn_like(ref)
    got = torch.autograd.grad((out.double() * grad).sum(), (q, k, v))
    want = torch.autograd.grad((ref * grad).sum(), (q64, k64, v64))
    for a, b in zip(got, want):
        assert (a.double() - b).norm() / b.norm() < 2e-2


@pytest.mark.parametrize("ordering", [None, "hilbert"])
@pytest.mark.parametrize("mode,causal", [("longnet", True), ("head_groups", False)])
def test_engine_dispatches_to_fused_kernel(ordering, mode, causal):
    """hilbert_lab.dilated_attention(backend="triton") runs the fused kernel and matches the float64
    reference (outputs, lse, gradients), with a layout ordering too (it must not change the result)."""
    from hilbert_lab.attention.engine import dilated_attention
    from hilbert_lab.attention.pattern import DilatedPattern
    from hilbert_lab.attention.reference import reference_attention

    segs, dils = [64, 128, 256], [1, 2, 4]
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, 300, 6, 64, generator=gen).cuda().to(torch.bfloat16).requires_grad_(True) for _ in range(3))
    out, lse = dilated_attention(q, k, v, segment_lengths=segs, dilation_rates=dils, causal=causal, mode=mode,
                                 backend="triton", ordering=ordering, return_lse=True)
    pattern = DilatedPattern.create(segs, dils, mode=mode, causal=causal)
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    ref, ref_lse = reference_attention(*leaves, pattern)
    assert (out.double() - ref).norm() / ref.norm() < 1e-2
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert (lse.double()[finite] - ref_lse[finite]).abs().max() < 2e-2
    grad = torch.randn(ref.shape, generator=gen, dtype=torch.float64).cuda()
    got = torch.autograd.grad((out.double() * grad).sum(), (q, k, v))
    want = torch.autograd.grad((ref * grad).sum(), leaves)
    for a, b in zip(got, want):
        assert (a.double() - b).norm() / b.norm() < 2e-2


# ---------------------------------------------------------------- one-row linear layer


@pytest.mark.parametrize("n,k", [(6144, 2048), (2048, 8192), (32000, 2048), (1000, 777), (3, 256)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_gemv_matches_the_float64_product_on_the_gpu(n, k, dtype, bias, activation):
    from hilbert_lab.kernels.triton_gemv import gemv

    gen = torch.Generator(device="cuda").manual_seed(n + k)
    x = torch.randn(1, 1, k, device="cuda", generator=gen).to(dtype)
    weight = (torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5).to(dtype)
    b = torch.randn(n, device="cuda", generator=gen).to(dtype) if bias else None
    act = torch.nn.functional.gelu if activation else (lambda y: y)
    want = act(x.double() @ weight.double().T + (b.double() if bias else 0))
    got = gemv(x, weight, b, activation)
    assert got.dtype == dtype and got.shape == (1, 1, n)
    # the float32 sums rounded once to the output dtype: within one rounding of the largest value, as cuBLAS is
    rounding = {torch.bfloat16: 2 ** -8, torch.float16: 2 ** -11, torch.float32: 2 ** -20}[dtype]
    scale = want.abs().max().item()
    assert (got.double() - want).abs().max().item() <= 2 * rounding * scale
    cublas = act(torch.nn.functional.linear(x, weight, b))
    assert (got.double() - want).abs().max() <= 2 * (cublas.double() - want).abs().max() + rounding * scale
