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
