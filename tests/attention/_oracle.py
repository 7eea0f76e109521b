"""Test-only helpers: a brute-force statement of the pattern semantics, independent of pattern.py."""
from __future__ import annotations

import math

import numpy as np


def head_offset(mode: str, branch: int, head: int, num_heads: int, dilation_rates) -> int:
    """The issue's rule, written out: offset of `head` in `branch`, or -1 when it is not in it."""
    r = dilation_rates[branch]
    if mode == "longnet":
        return head // math.ceil(num_heads / r)
    k = len(dilation_rates)
    sizes = [num_heads // k + (1 if i < num_heads % k else 0) for i in range(k)]
    first = sum(sizes[:branch])
    if not first <= head < first + sizes[branch]:
        return -1
    return (head - first) % r


def brute_multiplicity(segment_lengths, dilation_rates, mode, causal, seq_len, num_heads) -> np.ndarray:
    """(H, N, N) count of branches letting query n attend key m, by direct loops over the definition."""
    mult = np.zeros((num_heads, seq_len, seq_len), dtype=np.int64)
    for branch, (w, r) in enumerate(zip(segment_lengths, dilation_rates)):
        for h in range(num_heads):
            o = head_offset(mode, branch, h, num_heads, dilation_rates)
            if o < 0:
                continue
            for n in range(seq_len):
                for m in range(seq_len):
                    same_segment = n // w == m // w
                    selected = (n % w) % r == o and (m % w) % r == o
                    if same_segment and selected and (not causal or m <= n):
                        mult[h, n, m] += 1
    return mult


def random_qkv(batch, seq_len, num_heads, head_dim, *, dtype=None, requires_grad=True, seed=0):
    """Three float64 (B, N, H, D) tensors from a seeded generator."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(batch, seq_len, num_heads, head_dim, generator=gen, dtype=dtype or torch.float64)
        .requires_grad_(requires_grad)
        for _ in range(3)
    )


def grads(outputs, inputs, upstream):
    """Gradients of outputs w.r.t. inputs for the given upstream gradients (no .mean() loss)."""
    import torch

    return torch.autograd.grad(outputs, inputs, upstream)


def max_diff(a, b) -> float:
    """max |a - b| over finite entries of b, and inf when the -inf/finite pattern differs."""
    import torch

    a, b = a.detach().double(), b.detach().double()
    if not torch.equal(torch.isfinite(a), torch.isfinite(b)) or not torch.equal(a.isneginf(), b.isneginf()):
        return float("inf")
    finite = torch.isfinite(b)
    return (a[finite] - b[finite]).abs().max().item() if finite.any() else 0.0


def relative_error(a, b) -> float:
    """max |a - b| / max |b| over the finite entries of b (the -inf/finite pattern must agree)."""
    import torch

    a, b = a.detach().double(), b.detach().double()
    finite = torch.isfinite(b)
    assert torch.equal(finite, torch.isfinite(a)), "-inf pattern differs"
    return ((a - b)[finite].abs().max() / b[finite].abs().max().clamp_min(1e-6)).item()


def assert_low_precision_matches(out, lse, expected_out, expected_lse, inputs, generator, *, out_tol=3e-2,
                                 lse_tol=1e-2, grad_tol=5e-2) -> None:
    """A half-precision (out, lse) and the gradients of `inputs` (q, k, v) for random upstream gradients of both,
    each within a relative tolerance of the float64 oracle's (expected_out, expected_lse)."""
    import torch

    assert relative_error(out, expected_out) < out_tol and relative_error(lse, expected_lse) < lse_tol
    g_out = torch.randn(out.shape, device=out.device, dtype=torch.float64, generator=generator)
    g_lse = torch.randn(lse.shape, device=out.device, dtype=torch.float64, generator=generator)
    expected = torch.autograd.grad((expected_out, expected_lse), inputs, (g_out, g_lse))
    got = torch.autograd.grad((out, lse), inputs, (g_out.to(out.dtype), g_lse.to(lse.dtype)))
    for name, a, b in zip("qkv", got, expected):
        assert relative_error(a, b) < grad_tol, f"d{name}"
