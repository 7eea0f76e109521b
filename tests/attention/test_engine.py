"""dilated_attention against the float64 dense oracle: outputs, LSE, gradients; orderings; bad input."""
from __future__ import annotations


import pytest
import torch

from hilbert_lab.attention.engine import dilated_attention
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.reference import reference_attention
from hilbert_lab.curves import ORDERINGS, layout_permutation

from ._oracle import max_diff, random_qkv

ATOL = 1e-10
CASES = {  # name: (segment_lengths, dilation_rates, seq_len, num_heads)
    "divisible": ([4, 8], [1, 2], 16, 4),
    "ragged_heads5": ([4, 8, 16], [1, 2, 4], 13, 5),
    "w_gt_n_empty_rows": ([32], [3], 10, 2),
    "ragged_heads7": ([3, 6], [1, 3], 11, 7),
    "n_below_dilation": ([2, 32], [1, 8], 4, 8),  # offsets >= N select nothing in the second branch
}
ORDERING_CASE = {"ordering_24": ([8, 16], [1, 2], 24, 4)}  # layout blocks of 16 + a ragged 8
GRAD_BACKENDS = ["reference", "manual", "sdpa", "sdpa_math"]


def _check_against_reference(case, mode, causal, backend, *, ordering=None, seed=0):
    segment_lengths, dilation_rates, seq_len, num_heads = {**CASES, **ORDERING_CASE}[case]
    q, k, v = random_qkv(2, seq_len, num_heads, 4, seed=seed)
    pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
    expected_out, expected_lse = reference_attention(q, k, v, pattern)
    out, lse = dilated_attention(q, k, v, segment_lengths=segment_lengths, dilation_rates=dilation_rates, mode=mode,
                                 causal=causal, backend=backend, ordering=ordering, return_lse=True)
    assert out.shape == q.shape and lse.shape == (2, num_heads, seq_len) and lse.dtype == torch.float64
    assert max_diff(out, expected_out) < ATOL and max_diff(lse, expected_lse) < ATOL
    gen = torch.Generator().manual_seed(seed + 1)
    g_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    g_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64)
    expected = torch.autograd.grad((expected_out, expected_lse), (q, k, v), (g_out, g_lse))
    got = torch.autograd.grad((out, lse), (q, k, v), (g_out, g_lse))
    for name, a, b in zip("qkv", got, expected):
        assert max_diff(a, b) < ATOL, f"d{name}"
    return out


@pytest.mark.parametrize("backend", GRAD_BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
@pytest.mark.parametrize("case", list(CASES))
def test_engine_matches_reference_with_gradients(case, mode, causal, backend):
    _check_against_reference(case, mode, causal, backend)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
@pytest.mark.parametrize("case", ["ragged_heads5", "w_gt_n_empty_rows"])
def test_flex_forward_matches_reference(case, mode, causal):
    segment_lengths, dilation_rates, seq_len, num_heads = CASES[case]
    q, k, v = random_qkv(2, seq_len, num_heads, 4, requires_grad=False)
    pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
    expected_out, expected_lse = reference_attention(q, k, v, pattern)
    out, lse = dilated_attention(q, k, v, segment_lengths=segment_lengths, dilation_rates=dilation_rates, mode=mode,
                                 causal=causal, backend="flex", return_lse=True)
    assert max_diff(out, expected_out) < ATOL and max_diff(lse, expected_lse) < ATOL


def test_longnet_weights_keys_shared_by_branches_twice():
    """A key reachable through two branches counts twice: compare with an explicit weighted softmax."""
    q, k, v = random_qkv(1, 8, 1, 4, requires_grad=False)
    out = dilated_attention(q, k, v, segment_lengths=[4, 8], dilation_rates=[1, 2], backend="manual")
    n = 2  # query 2 (offset 0 in both branches): keys 0..3 from branch 0, keys 0, 2, 4, 6 from branch 1
    weights = {0: 2, 1: 1, 2: 2, 3: 1, 4: 1, 6: 1}
    scores = torch.stack([(q[0, n, 0] @ k[0, m, 0]) * 0.5 + torch.log(torch.tensor(float(c), dtype=torch.float64))
                          for m, c in weights.items()])
    expected = torch.softmax(scores, 0) @ torch.stack([v[0, m, 0] for m in weights])
    assert (out[0, n, 0] - expected).abs().max() < 1e-13


def test_rows_with_no_keys_give_zero_and_minus_inf_and_zero_gradient():
    segment_lengths, dilation_rates, seq_len, num_heads = CASES["w_gt_n_empty_rows"]
    q, k, v = random_qkv(1, seq_len, num_heads, 4)
    mask = DilatedPattern.create(segment_lengths, dilation_rates).dense_mask(seq_len, num_heads)
    empty = ~mask.any(-1)  # (H, N)
    assert empty.any() and (~empty).any()
    gen = torch.Generator().manual_seed(1)
    g_out = torch.randn(q.shape, generator=gen, dtype=torch.float64)
    g_lse = torch.randn((1, num_heads, seq_len), generator=gen, dtype=torch.float64)
    expected_out, expected_lse = reference_attention(q, k, v, DilatedPattern.create(segment_lengths, dilation_rates))
    expected = torch.autograd.grad((expected_out, expected_lse), (q, k, v), (g_out, g_lse))
    for backend in ("manual", "sdpa"):
        out, lse = dilated_attention(q, k, v, segment_lengths=segment_lengths, dilation_rates=dilation_rates,
                                     backend=backend, return_lse=True)
        assert torch.all(out[0].transpose(0, 1)[empty] == 0)
        assert torch.all(torch.isneginf(lse[0][empty])) and max_diff(lse, expected_lse) < ATOL
        assert max_diff(out, expected_out) < ATOL
        dq, dk, dv = torch.autograd.grad((out, lse), (q, k, v), (g_out, g_lse))
        assert all(max_diff(a, b) < ATOL for a, b in zip((dq, dk, dv), expected))
        assert torch.all(dq[0].transpose(0, 1)[empty] == 0)


@pytest.mark.parametrize("ordering", [o for o in ORDERINGS if o != "identity"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
def test_orderings_do_not_change_the_result(ordering, causal, mode):
    perm, _ = layout_permutation(24, 16, ordering)
    assert not torch.equal(perm, torch.arange(24)), "the ordering must really move tokens"
    for backend in ("manual", "sdpa"):
        ordered = _check_against_reference("ordering_24", mode, causal, backend, ordering=ordering)
        plain = dilated_attention(*random_qkv(2, 24, 4, 4, seed=0), segment_lengths=[8, 16], dilation_rates=[1, 2],
                                  mode=mode, causal=causal, backend=backend)
        assert max_diff(ordered, plain) < 1e-13


def _hilbert_pattern_reference(q, k, v, segment_lengths, dilation_rates, mode, causal, ordering):
    """Dense masked softmax with the predecessor's pattern: the multiplicity read at layout positions."""
    seq_len, num_heads = q.shape[1], q.shape[2]
    _, inverse = layout_permutation(seq_len, min(max(segment_lengths), seq_len), ordering)
    mult = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal).multiplicity(seq_len, num_heads)
    mult = mult[:, inverse][:, :, inverse].double()  # query n, key m live at layout slots inverse[n], inverse[m]
    scores = torch.einsum("bnhd,bmhd->bhnm", q, k) * q.shape[-1] ** -0.5
    weighted = torch.where(mult > 0, scores + mult.clamp_min(1).log(), torch.tensor(float("-inf"), dtype=torch.float64))
    lse = torch.logsumexp(weighted, -1)
    probs = torch.nan_to_num(torch.exp(weighted - lse[..., None]), nan=0.0)
    return torch.einsum("bhnm,bmhd->bnhd", probs, v), lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
def test_hilbert_pattern_is_its_own_documented_pattern(mode, causal):
    q, k, v = random_qkv(1, 32, 4, 4, requires_grad=False)
    kwargs = dict(segment_lengths=[8, 16], dilation_rates=[1, 2], mode=mode, causal=causal)
    out, lse = dilated_attention(q, k, v, backend="manual", hilbert_pattern=True, return_lse=True, **kwargs)
    expected_out, expected_lse = _hilbert_pattern_reference(q, k, v, [8, 16], [1, 2], mode, causal, "hilbert")
    assert max_diff(out, expected_out) < ATOL and max_diff(lse, expected_lse) < ATOL
    standard = dilated_attention(q, k, v, backend="manual", **kwargs)
    assert (out - standard).abs().max() > 1e-3, "hilbert_pattern must be a different pattern"


def test_dropout_is_unbiased_and_changes_samples():
    q, k, v = random_qkv(1, 13, 5, 4, requires_grad=False)
    kwargs = dict(segment_lengths=[4, 8, 16], dilation_rates=[1, 2, 4], backend="manual")
    exact = dilated_attention(q, k, v, **kwargs)[0]
    samples = 3000
    out = dilated_attention(*(t.expand(samples, -1, -1, -1).contiguous() for t in (q, k, v)), dropout_p=0.3, **kwargs)
    assert (out[0] - out[1]).abs().max() > 1e-3  # dropout masks differ between batch rows
    mean, stderr = out.mean(0), out.std(0) / samples**0.5
    z = (mean - exact).abs() / stderr.clamp_min(1e-12)
    assert z.max() < 5.5 and (mean - exact).abs().max() < 0.05


def test_float32_inputs_are_close_to_the_oracle_and_lse_is_float32():
    q, k, v = random_qkv(2, 13, 5, 8, requires_grad=False)
    pattern = DilatedPattern.create([4, 8, 16], [1, 2, 4], causal=True)
    expected_out, expected_lse = reference_attention(q, k, v, pattern)
    for backend in ("manual", "sdpa", "auto"):
        out, lse = dilated_attention(q.float(), k.float(), v.float(), segment_lengths=[4, 8, 16], dilation_rates=[1, 2, 4],
                                     causal=True, backend=backend, return_lse=True)
        assert out.dtype == torch.float32 and lse.dtype == torch.float32
        assert max_diff(out, expected_out) < 1e-5 and max_diff(lse, expected_lse) < 1e-5


def test_custom_scale_is_used():
    q, k, v = random_qkv(1, 8, 2, 4, requires_grad=False)
    pattern = DilatedPattern.create([4], [1])
    expected, _ = reference_attention(q, k, v, pattern, scale=0.9)
    out = dilated_attention(q, k, v, segment_lengths=[4], dilation_rates=[1], scale=0.9, backend="manual")
    assert max_diff(out, expected) < ATOL


def test_checks_bad_input():
    q, k, v = random_qkv(1, 8, 2, 4, requires_grad=False)
    ok = dict(segment_lengths=[4], dilation_rates=[1])
    bad_calls = [
        (lambda: dilated_attention(q, k[:, :4], v, **ok), "same shape"),
        (lambda: dilated_attention(q, k.float(), v, **ok), "dtype"),
        (lambda: dilated_attention(q, k.to("meta"), v, **ok), "device"),
        (lambda: dilated_attention(q[0], k[0], v[0], **ok), "4D"),
        (lambda: dilated_attention(q.long(), k.long(), v.long(), **ok), "floating"),
        (lambda: dilated_attention(q, k, v, segment_lengths=[4, 8], dilation_rates=[1]), "same length"),
        (lambda: dilated_attention(q, k, v, segment_lengths=[4], dilation_rates=[5]), "dilation_rates"),
        (lambda: dilated_attention(q, k, v, segment_lengths=[0], dilation_rates=[1]), "segment_lengths"),
        (lambda: dilated_attention(q, k, v, segment_lengths=[2.5], dilation_rates=[1]), "segment_lengths"),
        (lambda: dilated_attention(q, k, v, mode="longnet2", **ok), "mode"),
        (lambda: dilated_attention(q, k, v, backend="fastest", **ok), "backend"),
        (lambda: dilated_attention(q, k, v, ordering="zigzag", **ok), "ordering"),
        (lambda: dilated_attention(q, k, v, dropout_p=1.0, **ok), "dropout_p"),
        (lambda: dilated_attention(q, k, v, scale=-1.0, **ok), "scale"),
        (lambda: dilated_attention(q, k, v, hilbert_pattern="yes", **ok), "hilbert_pattern"),
    ]
    for call, match in bad_calls:
        with pytest.raises(ValueError, match=match):
            call()


def _dense_bhld(q, k, v, causal, scale):
    """float64 (out, lse, scores) of (B, H, L, D) inputs: top-left causal mask."""
    scores = q.double() @ k.double().transpose(-1, -2) * scale
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    lse = scores.logsumexp(-1)
    return (scores - lse[..., None]).exp() @ v.double(), lse, scores


def _dense_grads_bhld(grad_out, q, k, v, out, lse, causal, scale):
    """(dq, dk, dv) from the given out and lse, as the fused backward kernels compute them."""
    _, _, scores = _dense_bhld(q, k, v, causal, scale)
    probs = (scores - lse.double()[..., None]).exp()
    grad_out, out = grad_out.double(), out.double()
    dscores = probs * (grad_out @ v.double().transpose(-1, -2) - (grad_out * out).sum(-1, keepdim=True))
    return dscores @ k.double() * scale, dscores.transpose(-1, -2) @ q.double() * scale, probs.transpose(-1, -2) @ grad_out


class _CudaOpsOnTheCpu:
    """Stands in for torch.ops.aten in executors.sdpa: each CUDA SDPA op is first called for real on meta
    copies of its arguments (the op's schema: argument order, dtypes, output layouts), then its outputs are
    filled with the dense formula on the CPU in the layouts the meta kernel returned (padded LSE rows: NaN)."""

    def __getattr__(self, name):
        return getattr(torch.ops.aten, name)

    @staticmethod
    def _meta(op, args, kwargs):
        meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
        return getattr(torch.ops.aten, op)(*meta, **kwargs)

    def _forward(self, op, q, k, v, causal, args, kwargs):
        shapes = self._meta(op, args, kwargs)
        out, lse, _ = _dense_bhld(q, k, v, causal, kwargs["scale"])
        padded = torch.full(shapes[1].shape, float("nan"), dtype=shapes[1].dtype)
        index = (..., 0) if padded.dim() == 4 else (..., slice(0, lse.shape[-1]))  # (B, H, L, 1) or (B, H, >= L)
        padded[index] = lse
        rest = [torch.zeros(s.shape, dtype=s.dtype) if isinstance(s, torch.Tensor) else s for s in shapes[2:]]
        return (out.to(q.dtype), padded, *rest)

    def _backward(self, op, grad_out, q, k, v, out, lse, causal, args, kwargs):
        shapes = self._meta(op, args, kwargs)
        grads = _dense_grads_bhld(grad_out, q, k, v, out, lse, causal, kwargs["scale"])
        assert [g.shape for g in grads] == [s.shape for s in shapes[:3]]
        return tuple(g.to(q.dtype) for g in grads)

    def _scaled_dot_product_flash_attention(self, *args, **kwargs):
        q, k, v, _, causal, _ = args
        return self._forward("_scaled_dot_product_flash_attention", q, k, v, causal, args, kwargs)

    def _scaled_dot_product_cudnn_attention(self, *args, **kwargs):
        q, k, v, _, _, _, causal, _ = args
        return self._forward("_scaled_dot_product_cudnn_attention", q, k, v, causal, args, kwargs)

    def _scaled_dot_product_efficient_attention(self, *args, **kwargs):
        q, k, v, _, _, _, causal = args
        return self._forward("_scaled_dot_product_efficient_attention", q, k, v, causal, args, kwargs)

    def _scaled_dot_product_flash_attention_backward(self, *args, **kwargs):
        grad_out, q, k, v, out, lse = args[:6]
        return self._backward("_scaled_dot_product_flash_attention_backward", grad_out, q, k, v, out, lse, args[11],
                              args, kwargs)

    def _scaled_dot_product_cudnn_attention_backward(self, *args, **kwargs):
        grad_out, q, k, v, out, lse = args[:6]
        assert lse.shape[-1] == 1, "the cuDNN backward takes the LSE as (B, H, L, 1)"
        return self._backward("_scaled_dot_product_cudnn_attention_backward", grad_out, q, k, v, out, lse[..., 0],
                              args[14], args, kwargs)


@pytest.mark.parametrize("kernel", ["flash", "efficient", "cudnn"])
@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
def test_cuda_sdpa_call_conventions(kernel, mode, monkeypatch):
    """The CUDA-only aten SDPA ops (flash / efficient / cuDNN, forward and fused backward) as the executor
    calls them: on meta tensors the ops' meta kernels accept the calls (schema, argument order, dtypes);
    with the ops answered on the CPU in their documented layouts (LSE (B, H, L) for flash, (B, H, L, 1) for
    cuDNN, rows padded to 32 for efficient), out, LSE and gradients equal the float64 oracle. Values of the
    real kernels are checked in test_gpu.py."""
    from hilbert_lab.attention.engine import execute_plan
    from hilbert_lab.attention.executors import Capabilities, sdpa
    from hilbert_lab.attention.executors.blockwise import blockwise_executor
    from hilbert_lab.attention.plan import cached_plan

    executor = blockwise_executor(kernel, lambda q: sdpa.KERNELS[kernel], Capabilities(), None)
    pattern = DilatedPattern.create([4, 8, 16], [1, 2, 4], mode=mode, causal=True)

    plan = cached_plan(pattern, 40, 6)  # the autograd function off CUDA, as dry runs call it
    q, k, v = (torch.empty(2, 40, 6, 64, device="meta", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out, lse = execute_plan(plan, executor, q, k, v, 0.125)
    assert lse.dtype == torch.float32 and lse.shape == (2, 6, 40)
    grads = torch.autograd.grad((out, lse), (q, k, v), (torch.empty_like(out), torch.empty_like(lse)))
    assert all(g.dtype == torch.bfloat16 and g.shape == q.shape for g in grads)

    monkeypatch.setattr(sdpa, "aten", _CudaOpsOnTheCpu())
    q, k, v = random_qkv(2, 20, 6, 8)
    expected_out, expected_lse = reference_attention(q, k, v, pattern)
    gen = torch.Generator().manual_seed(1)
    g_out = torch.randn(expected_out.shape, generator=gen, dtype=torch.float64)
    g_lse = torch.randn(expected_lse.shape, generator=gen, dtype=torch.float64)
    expected = torch.autograd.grad((expected_out, expected_lse), (q, k, v), (g_out, g_lse))
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    out, lse = execute_plan(cached_plan(pattern, 20, 6), executor, q32, k32, v32, 8 ** -0.5)
    assert lse.dtype == torch.float32
    assert max_diff(out, expected_out) < 1e-5 and max_diff(lse, expected_lse) < 1e-5
    got = torch.autograd.grad((out, lse), (q32, k32, v32), (g_out.float(), g_lse.float()))
    for name, a, b in zip("qkv", got, expected):
        assert max_diff(a, b) < 1e-5, f"d{name}"


def test_dropout_path_gradients_pass_gradcheck():
    """With the dropout mask fixed by a seed, the eager dropout path is a deterministic function of
    q, k, v; gradcheck compares its autograd gradients with finite differences."""
    q, k, v = random_qkv(1, 6, 2, 3)

    def fn(q, k, v):
        torch.manual_seed(7)
        return dilated_attention(q, k, v, segment_lengths=[2, 6], dilation_rates=[1, 2], causal=True,
                                 backend="manual", dropout_p=0.25, return_lse=True)

    out_a, out_b = fn(q, k, v)[0], fn(q, k, v)[0]
    assert torch.equal(out_a, out_b)
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_whole_pattern_executors_receive_the_plan_and_match_the_block_path():
    """An executor declaring whole_pattern (like "triton") gets the plan of every branch and writes the
    merged result into one slot; orderings and hilbert_pattern give the same results as the block path."""
    from hilbert_lab.attention.executors import Capabilities, Executor

    calls = []

    def forward(plan, q, k, v, slots, *, scale):
        calls.append(plan.pattern)
        out, lse = reference_attention(q, k, v, plan.pattern, scale=scale)
        slots.out(0).copy_(out)
        slots.lse(0).copy_(lse.transpose(1, 2))

    fused = Executor("fused", Capabilities(whole_pattern=True), forward, None)
    q, k, v = random_qkv(1, 32, 4, 4, requires_grad=False)
    kwargs = dict(segment_lengths=[8, 16], dilation_rates=[1, 2], causal=True)
    for extra in (dict(ordering=None), dict(ordering="hilbert"), dict(hilbert_pattern=True)):
        expected = dilated_attention(q, k, v, backend="manual", **kwargs, **extra)
        assert max_diff(dilated_attention(q, k, v, backend=fused, **kwargs, **extra), expected) < ATOL
    assert len(calls) == 3 and calls[0] == DilatedPattern.create([8, 16], [1, 2], causal=True)
