"""GPU backends (SDPA flash/efficient/cuDNN, flex, flash-attn, xFormers, triton) against the float64 oracle."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention import dilated_attention
from hilbert_lab.attention.executors import unavailable_reason
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.reference import reference_attention

from ._oracle import assert_low_precision_matches, relative_error

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (GPU backends)"),
]
GPU_BACKENDS = ["sdpa", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "flex", "flash", "xformers", "triton", "fa4"]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_gpu_backend_matches_reference_in_bf16(backend, mode, causal):
    dtype = torch.bfloat16
    reason = unavailable_reason(backend, "cuda", dtype)
    if reason is not None:
        pytest.skip("backend unavailable on this machine: " + f"{backend}: {reason}")
    segment_lengths, dilation_rates = [16, 32, 64], [1, 2, 4]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 80, 6, 64, device="cuda", dtype=dtype, generator=gen).requires_grad_(True) for _ in range(3))
    pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
    expected_out, expected_lse = reference_attention(q, k, v, pattern)
    out, lse = dilated_attention(q, k, v, segment_lengths=segment_lengths, dilation_rates=dilation_rates, mode=mode,
                                 causal=causal, backend=backend, return_lse=True)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert_low_precision_matches(out, lse, expected_out, expected_lse, (q, k, v), gen)


@pytest.mark.parametrize("backend", ["sdpa_efficient", "sdpa", "manual"])
def test_gpu_float32_is_close_to_reference(backend):
    reason = unavailable_reason(backend, "cuda", torch.float32)
    if reason is not None:
        pytest.skip("backend unavailable on this machine: " + f"{backend}: {reason}")
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(1, 50, 4, 32, device="cuda", generator=gen).requires_grad_(True) for _ in range(3))
    pattern = DilatedPattern.create([16, 32], [1, 2], causal=True)
    expected_out, expected_lse = reference_attention(q, k, v, pattern)
    out, lse = dilated_attention(q, k, v, segment_lengths=[16, 32], dilation_rates=[1, 2], causal=True,
                                 backend=backend, return_lse=True)
    assert relative_error(out, expected_out) < 1e-3 and relative_error(lse, expected_lse) < 1e-4
    g_out = torch.randn(out.shape, device="cuda", generator=gen)
    expected = torch.autograd.grad(expected_out, (q, k, v), g_out.double())
    got = torch.autograd.grad(out, (q, k, v), g_out)
    assert max(relative_error(a, b) for a, b in zip(got, expected)) < 2e-3


def test_gpu_orderings_do_not_change_the_result():
    gen = torch.Generator(device="cuda").manual_seed(2)
    q, k, v = (torch.randn(1, 64, 4, 64, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    kwargs = dict(segment_lengths=[16, 32], dilation_rates=[1, 2], causal=True, backend="sdpa")
    plain = dilated_attention(q, k, v, **kwargs)
    ordered = dilated_attention(q, k, v, ordering="hilbert", **kwargs)
    assert (ordered.float() - plain.float()).abs().max() < 1e-2  # same blocks, same kernel: equal up to rounding


@pytest.mark.parametrize("seq_len,num_heads", [(80, 7), (96, 6), (1000, 5)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
@pytest.mark.parametrize("backend", ["sdpa", "sdpa_cudnn", "sdpa_flash", "fa4"])
def test_gpu_executor_on_views_matches_reference(backend, mode, causal, seq_len, num_heads):
    """The in-place executor (kernels on strided block views, backward with the merged out/LSE), on
    ragged N (blocks whose batch and segments do not fold), H not divisible by the branches, and an
    upstream gradient on the output only (the fast backward path)."""
    dtype = torch.bfloat16
    reason = unavailable_reason(backend, "cuda", dtype)
    if reason is not None:
        pytest.skip("backend unavailable on this machine: " + f"{backend}: {reason}")
    gen = torch.Generator(device="cuda").manual_seed(seq_len + num_heads)
    q, k, v = (torch.randn(2, seq_len, num_heads, 64, device="cuda", dtype=dtype, generator=gen).requires_grad_(True)
               for _ in range(3))
    segment_lengths, dilation_rates = [16, 48, 1 << 40], [1, 3, 8]
    pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
    expected_out, expected_lse = reference_attention(q, k, v, pattern)
    out, lse = dilated_attention(q, k, v, segment_lengths=segment_lengths, dilation_rates=dilation_rates, mode=mode,
                                 causal=causal, backend=backend, return_lse=True)
    assert relative_error(out, expected_out) < 3e-2 and relative_error(lse, expected_lse) < 1e-2
    g_out = torch.randn(out.shape, device="cuda", dtype=torch.float64, generator=gen)
    expected = torch.autograd.grad(expected_out, (q, k, v), g_out)
    got = torch.autograd.grad(out, (q, k, v), g_out.to(dtype))
    for name, a, b in zip("qkv", got, expected):
        assert relative_error(a, b) < 5e-2, f"d{name}"


def _poison_the_allocator() -> None:
    """Hand 256 MiB of NaN back to the caching allocator: the next allocations reuse that memory, so an entry no
    kernel writes reads NaN, not a lucky zero."""
    torch.full((64 << 20,), float("nan"), device="cuda")
    torch.cuda.synchronize()


@pytest.mark.parametrize("backend", ["fa4", "sdpa"])
@pytest.mark.parametrize("causal", [False, True])
def test_rows_a_head_does_not_select_are_zero_in_memory_that_held_nan(backend, causal):
    """head_groups with dilated branches (w not a power of r, a branch longer than N, ragged N): the entries no
    block writes (zeroed by one launch, kernels.triton_fill) read 0 in out, dq, dk and dv, forward alone and with the
    backward, though the memory they land in held NaN; all equal to the float64 oracle."""
    reason = unavailable_reason(backend, "cuda", torch.bfloat16)
    if reason is not None:
        pytest.skip("backend unavailable on this machine: " + f"{backend}: {reason}")
    gen = torch.Generator(device="cuda").manual_seed(11)
    q, k, v = (torch.randn(2, 1000, 6, 64, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_(True)
               for _ in range(3))
    args = dict(segment_lengths=[16, 48, 1 << 40], dilation_rates=[1, 3, 8], mode="head_groups", causal=causal)
    expected_out, _ = reference_attention(q, k, v, DilatedPattern.create(**args))
    with torch.no_grad():
        _poison_the_allocator()
        out = dilated_attention(q, k, v, backend=backend, **args)
    assert relative_error(out, expected_out) < 3e-2
    _poison_the_allocator()
    out = dilated_attention(q, k, v, backend=backend, **args)
    g_out = torch.randn(out.shape, device="cuda", dtype=torch.float64, generator=gen)
    expected = torch.autograd.grad(expected_out, (q, k, v), g_out)
    _poison_the_allocator()
    got = torch.autograd.grad(out, (q, k, v), g_out.to(torch.bfloat16))
    assert relative_error(out, expected_out) < 3e-2
    for name, a, b in zip("qkv", got, expected):
        assert relative_error(a, b) < 5e-2, f"d{name}"


@pytest.mark.parametrize("backend", ["sdpa", "sdpa_cudnn", "sdpa_flash", "triton", "fa4"])
@pytest.mark.parametrize("causal", [False, True])
def test_every_length_runs_on_every_gpu_executor(backend, causal):
    """Ragged lengths leave blocks of one token for some offsets (cuDNN takes no call with one query and one
    key): every N from 1 to 3 x the largest segment and multiples + 1 ... + r runs, equal to the oracle."""
    dtype = torch.bfloat16
    reason = unavailable_reason(backend, "cuda", dtype)
    if reason is not None:
        pytest.skip("backend unavailable on this machine: " + f"{backend}: {reason}")
    segment_lengths, dilation_rates = [8, 16, 32], [1, 4, 8]
    lengths = sorted(set(range(1, 3 * 32 + 1)) | {64 * m + j for m in (1, 2) for j in range(1, 9)})
    gen = torch.Generator(device="cuda").manual_seed(7)
    for seq_len in lengths:
        q, k, v = (torch.randn(2, seq_len, 8, 32, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
        pattern = DilatedPattern.create(segment_lengths, dilation_rates, causal=causal)
        expected, expected_lse = reference_attention(q, k, v, pattern)
        out, lse = dilated_attention(q, k, v, segment_lengths=segment_lengths, dilation_rates=dilation_rates,
                                     causal=causal, backend=backend, return_lse=True)
        assert relative_error(out, expected) < 3e-2 and relative_error(lse, expected_lse) < 1e-2, seq_len


def test_auto_runs_ragged_lengths_of_the_longnet_pattern():
    """The lengths that crashed cuDNN through auto (a one-token block): forward and backward, bf16, causal, against
    the float64 engine on the oracle executor "reference" (dense float64 per block; the dense oracle would need
    H N^2 entries at these N)."""
    pattern = dict(segment_lengths=[2048, 8192, 32768, 131072], dilation_rates=[1, 4, 8, 32], causal=True)
    for seq_len in (32768, 32773):
        gen = torch.Generator(device="cuda").manual_seed(seq_len)
        q, k, v = (torch.randn(1, seq_len, 8, 32, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_(True)
                   for _ in range(3))
        out, lse = dilated_attention(q, k, v, **pattern, return_lse=True)
        exact = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
        expected_out, expected_lse = dilated_attention(*exact, **pattern, backend="reference", return_lse=True)
        assert relative_error(out, expected_out) < 3e-2 and relative_error(lse, expected_lse) < 1e-2, seq_len
        g_out = torch.randn(out.shape, device="cuda", dtype=torch.float64, generator=gen)
        got = torch.autograd.grad(out, (q, k, v), g_out.to(torch.bfloat16))
        expected = torch.autograd.grad(expected_out, exact, g_out)
        for name, a, b in zip("qkv", got, expected):
            assert relative_error(a, b) < 5e-2, f"d{name} at N={seq_len}"


@pytest.mark.parametrize("head_dim", [4, 12, 64, 100, 128, 256])
def test_auto_runs_every_head_dim_in_bf16_like_the_oracle(head_dim):
    """auto at head dims that no one GPU kernel takes (4, 12, 100: not multiples of 8; 256: beyond cuDNN's 128), in
    bf16, against the float64 oracle: inference and training (auto's rule differs), the last queries alone (dense
    blocks) and decoding steps (auto's dense kernel): outputs, LSE and gradients."""
    from hilbert_lab.attention import DilatedKVCache

    dtype = torch.bfloat16
    segment_lengths, dilation_rates = [16, 32, 64], [1, 2, 4]
    kwargs = dict(segment_lengths=segment_lengths, dilation_rates=dilation_rates, causal=True, backend="auto")
    pattern = DilatedPattern.create(segment_lengths, dilation_rates, causal=True)
    gen = torch.Generator(device="cuda").manual_seed(head_dim)
    q, k, v = (torch.randn(2, 80, 4, head_dim, device="cuda", dtype=dtype, generator=gen).requires_grad_(True)
               for _ in range(3))
    expected_out, expected_lse = reference_attention(q, k, v, pattern)
    with torch.no_grad():
        out, lse = dilated_attention(q, k, v, **kwargs, return_lse=True)
    assert out.dtype == dtype and relative_error(out, expected_out) < 3e-2 and relative_error(lse, expected_lse) < 1e-2
    out, lse = dilated_attention(q, k, v, **kwargs, return_lse=True)
    assert_low_precision_matches(out, lse, expected_out, expected_lse, (q, k, v), gen)
    q, k, v = (t.detach() for t in (q, k, v))
    last = dilated_attention(q[:, -5:], k, v, **kwargs)
    assert relative_error(last, expected_out[:, -5:]) < 3e-2
    cache = DilatedKVCache(segment_lengths, dilation_rates, backend="auto")
    steps = [cache.attend(q[:, :40], k[:, :40], v[:, :40])]
    steps += [cache.attend(q[:, n:n + 1], k[:, n:n + 1], v[:, n:n + 1]) for n in range(40, 80)]
    assert relative_error(torch.cat(steps, 1), expected_out) < 3e-2


def test_a_calls_job_is_built_once_per_call_key_on_cuda_and_again_for_a_new_executor():
    """The op builds a call's job (plan, part, slot layout) once per (config, executor, shapes, dtypes, packing) on
    CUDA: the same call reuses it, a new shape, packing or resolved executor gets its own."""
    from hilbert_lab.attention import op, selection

    config = op.call_config([64, 128], [1, 2], "longnet", True, "auto", 0.125, True, True)
    q = torch.zeros(1, 256, 4, 64, device="cuda", dtype=torch.bfloat16)
    first = op._job(q, q, None, config)
    assert op._job(q, q, None, config) is first
    longer = torch.zeros(1, 384, 4, 64, device="cuda", dtype=torch.bfloat16)
    assert op._job(longer, longer, None, config)[0].parts[0].plan.seq_len == 384
    packed = op._job(q, q, torch.tensor([0, 100, 256]), config)
    assert packed is not first and packed[0].parts[0].plan.blocks != first[0].parts[0].plan.blocks
    assert op._job(q, q, torch.tensor([0, 100, 256]), config) is packed
    assert op._job(q, q, torch.tensor([0, 101, 256]), config) is not packed
    sdpa = op.call_config([64, 128], [1, 2], "longnet", True, "sdpa", 0.125, True, True)
    assert op._job(q, q, None, sdpa)[0].parts[0].executor.name == "sdpa"
    selection.clear_fit_decisions()
    assert op._job(q, q, None, config)[0].parts[0].executor is first[0].parts[0].executor  # same choice, same job
    assert op._job(q, q, None, config) is first


def test_auto_resolves_once_per_call_key_on_cuda_until_the_fit_decisions_are_cleared():
    from hilbert_lab.attention import selection

    q = torch.zeros(1, 4096, 4, 64, device="cuda", dtype=torch.bfloat16)
    pattern = DilatedPattern.create([1024, 2048], [1, 2], causal=True)
    selection.clear_fit_decisions()
    first = selection.resolve_executor("auto", q, pattern, training=True)
    key = ("auto", q.device, q.dtype, tuple(q.shape), pattern, True, True, False)
    assert selection._RESOLVED[key] is first
    assert selection.resolve_executor("auto", q, pattern, training=True) is first
    assert first.name == selection.select_backend(q.device, q.dtype, shape=tuple(q.shape), causal=True, training=True,
                                                  segment_lengths=[1024, 2048], dilation_rates=[1, 2])
    selection.clear_fit_decisions()
    assert key not in selection._RESOLVED
