"""Dilated attention at extreme score scales against the float64 oracle: the branch merge keeps its
weights summing to 1 (float32 scores ~1e4 / 1e5, float64 ~1e8 / 1e16), forward and exact backward."""
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
