"""Dilated attention at extreme score scales against the float64 oracle: the branch merge keeps its
weights summing to 1 (float32 scores ~1e4 / 1e5, float64 ~1e8 / 1e16), forward and exact backward; the eager
kernel at scales up to 1e308 and down to 1e-308 and at large logits; a scale float32 cannot hold is refused
for inputs that compute in float32."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention import dilated_attention, reference_attention
from hilbert_lab.attention.pattern import DilatedPattern

from ._oracle import max_diff

SEGMENTS, RATES = [8, 16, 32], [1, 2, 4]


def _inputs(level: float, seed: int = 0):
    """float64 (B, N, H, D) q, k, v, upstream gradients and the scale that makes scores ~level."""
    gen = torch.Generator().manual_seed(seed)
    shape = (2, 32, 4, 8)
    q, k, v, grad_out = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(4))
    grad_lse = torch.randn(2, 4, 32, generator=gen, dtype=torch.float64)
    return q, k, v, grad_out, grad_lse, level / shape[-1] ** 0.5


def _oracle(q, k, v, scale, causal=False):
    pattern = DilatedPattern.create(SEGMENTS, RATES, mode="longnet", causal=causal)
    return reference_attention(q, k, v, pattern, scale=scale)


@pytest.mark.parametrize("backend", ["manual", "sdpa"])
@pytest.mark.parametrize("dtype,level,tol", [(torch.float32, 1e4, 1e-5), (torch.float32, 1e5, 1e-5),
                                             (torch.float64, 1e8, 1e-12), (torch.float64, 1e16, 1e-12)])
@pytest.mark.parametrize("causal", [False, True])
def test_longnet_output_and_lse_match_the_oracle_at_large_scores(backend, dtype, level, tol, causal):
    q, k, v, _, _, scale = _inputs(level)
    expected_out, expected_lse = _oracle(q, k, v, scale, causal)
    out, lse = dilated_attention(*(t.to(dtype) for t in (q, k, v)), segment_lengths=SEGMENTS, dilation_rates=RATES,
                                 causal=causal, backend=backend, scale=scale, return_lse=True)
    assert max_diff(out, expected_out) < tol
    # The LSE carries the rounding of the scores themselves: a few ulp of the score scale.
    assert max_diff(lse, expected_lse) < 32 * torch.finfo(dtype).eps * level


@pytest.mark.parametrize("backend", ["manual", "sdpa"])
@pytest.mark.parametrize("dtype,level,tol", [(torch.float32, 1e4, 3e-3), (torch.float64, 1e8, 1e-7)])
def test_exact_backward_matches_the_oracle_at_large_scores(backend, dtype, level, tol):
    """Gradients come from the merged LSE, so they are exact up to its rounding (ulp(|lse|)/2)."""
    q, k, v, grad_out, grad_lse, scale = _inputs(level, seed=1)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    expected = torch.autograd.grad(_oracle(*leaves, scale), leaves, (grad_out, grad_lse))
    leaves = [t.to(dtype).requires_grad_(True) for t in (q, k, v)]
    outputs = dilated_attention(*leaves, segment_lengths=SEGMENTS, dilation_rates=RATES, backend=backend, scale=scale,
                                return_lse=True)
    got = torch.autograd.grad(outputs, leaves, (grad_out.to(dtype), grad_lse.to(dtype)))
    for name, a, b in zip("qkv", got, expected):
        assert torch.isfinite(a).all(), name
        assert ((a.double() - b).norm() / b.norm()).item() < tol, name


# ---------------------------------------------------------------- extreme scales on the eager kernel

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_scale_beyond_float32_is_refused_for_inputs_that_compute_in_float32(dtype):
    """Inputs other than float64 compute their scores in float32, where 1e308 is inf: refused by name."""
    q = torch.randn(1, 8, 2, 4).to(dtype)
    with pytest.raises(ValueError, match=r"scale must be None \(D\*\*-0.5\) or a finite float in \(0, 3.4028235e\+38\] "
                                         f"for {dtype}"):
        dilated_attention(q, q, q, segment_lengths=[4], dilation_rates=[1], backend="manual", scale=1e308)
    dilated_attention(q, q, q, segment_lengths=[4], dilation_rates=[1], backend="manual", scale=3e38)
    q64 = q.double()
    dilated_attention(q64, q64, q64, segment_lengths=[4], dilation_rates=[1], backend="manual", scale=1e308)


# (dtype, scale, logit magnitude of q and k): scores far beyond the dtype's range, or far below it
EXTREMES = [(torch.float64, 1e308, 1.0), (torch.float64, 1e308, 0.1), (torch.float64, 1e-308, 1.0),
            (torch.float64, 1e-308, 1e150), (torch.float64, 1.0, 1e150),
            (torch.float32, 1e38, 1.0), (torch.float32, 3e38, 0.1),
            (torch.float32, 1e-308, 1.0), (torch.float32, 1e-308, 1e18), (torch.float32, 1.0, 1e18)]


@pytest.mark.parametrize("segments, rates", [([8], [1]), ([4, 8], [1, 2])])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype, scale, logits", EXTREMES)
def test_manual_output_and_lse_are_the_oracles_wherever_its_lse_fits_the_dtype(dtype, scale, logits, segments,
                                                                               rates, causal):
    """The eager kernel subtracts each row's largest score before a scale > 1 multiplies the scores, so no
    weight overflows: every row whose float64 LSE fits the LSE dtype (float32 for float32 inputs) has the
    oracle's output and LSE; rows whose scores all underflow to -inf hold no weight in both (out 0, LSE -inf)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 13, 4, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    q, k, v = (t.to(dtype).double() for t in (q * logits, k * logits, v))  # values the dtype holds
    pattern = DilatedPattern.create(segments, rates, causal=causal)
    want_out, want_lse = reference_attention(q, k, v, pattern, scale=scale)
    out, lse = dilated_attention(*(t.to(dtype) for t in (q, k, v)), segment_lengths=segments, dilation_rates=rates,
                                 causal=causal, backend="manual", scale=scale, return_lse=True)
    fits = want_lse.to(lse.dtype).isfinite() & want_out.isfinite().all(-1).transpose(1, 2)  # (B, H, N)
    empty = want_lse == float("-inf")
    assert fits.sum() > fits.numel() // 4, "the case must hold rows the dtype can express"
    rows = fits.transpose(1, 2)
    assert out[rows].isfinite().all(), f"{int((~out[rows].isfinite()).sum())} non-finite outputs"
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    assert (out[rows].double() - want_out[rows]).abs().max() < tol
    # the LSE carries the rounding of the scores: a few ulp of the largest score
    assert (lse[fits].double() - want_lse[fits]).abs().max() < 32 * torch.finfo(dtype).eps * \
        want_lse[fits].abs().max().clamp_min(1)
    assert (out.transpose(1, 2)[empty] == 0).all() and (lse[empty] == float("-inf")).all()


@pytest.mark.parametrize("segments, rates, mode", [([8], [1], "longnet"), ([4, 8], [1, 2], "head_groups")])
@pytest.mark.parametrize("causal", [False, True])
def test_rows_whose_lse_overflows_float32_keep_the_oracles_output_where_nothing_merges(segments, rates, mode, causal):
    """float32 scores beyond float32's range (scale 1e38, logits ~1): the LSE rounds to +inf, but the weights are
    taken after the row's largest score is subtracted, so where no branch merge needs the LSE (one branch per
    head) each row still gets the oracle's output."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 32, 4, 4, generator=gen) for _ in range(3))
    pattern = DilatedPattern.create(segments, rates, mode=mode, causal=causal)
    want_out, want_lse = reference_attention(q, k, v, pattern, scale=1e38)
    out, lse = dilated_attention(q, k, v, segment_lengths=segments, dilation_rates=rates, mode=mode, causal=causal,
                                 backend="manual", scale=1e38, return_lse=True)
    over = (want_lse > torch.finfo(torch.float32).max) & want_out.isfinite().all(-1).transpose(1, 2)
    assert over.sum() >= 8  # rows the test is about
    rows = over.transpose(1, 2)
    assert (out[rows].double() - want_out[rows]).abs().max() < 1e-6
    assert (lse[over] == float("inf")).all()
