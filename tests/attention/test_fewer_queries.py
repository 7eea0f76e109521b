"""dilated_attention with fewer queries than keys (decoding): q (B, Nq, H, D) holds the last Nq positions and
the result is the last Nq rows of the full computation (float64 oracle, LSE and gradients), on every executor
that runs on the CPU; the fused kernel and hilbert_pattern refuse with a ValueError."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention import dilated_attention, execute_plan, get_executor
from hilbert_lab.attention.modules import MultiheadDilatedAttention
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import build_plan
from hilbert_lab.attention.reference import reference_attention

from ._oracle import max_diff

TOL = 1e-10
SEGMENTS, RATES = [4, 8, 16], [1, 2, 4]


def _qkv(seq_len, seed, heads=6):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(2, seq_len, heads, 4, generator=gen, dtype=torch.float64) for _ in range(3)]


def _expected(q_full, k, v, queries, mode, causal):
    pattern = DilatedPattern.create(SEGMENTS, RATES, mode=mode, causal=causal)
    out, lse = reference_attention(q_full, k, v, pattern, scale=0.5)
    start = q_full.shape[1] - queries
    return out[:, start:], lse[:, :, start:]


# The plan-level geometry of every executor is covered by test_plan_geometry; here the engine's entry.
CASES = [("sdpa", mode, causal, 5) for mode in ("longnet", "head_groups") for causal in (True, False)]
CASES += [("sdpa", "longnet", True, 1), ("manual", "head_groups", False, 1)]
CASES += [(backend, "longnet", True, 5) for backend in ("reference", "manual", "sdpa_math", "sdpa_flash", "auto")]


@pytest.mark.parametrize("backend,mode,causal,queries", CASES)
def test_fewer_queries_are_the_last_rows_with_gradients(backend, mode, causal, queries):
    """19 keys (ragged in every branch), 1 or 5 queries: outputs, LSE and dq, dk, dv of the last rows."""
    q_full, k, v = _qkv(19, 0)
    q = q_full[:, 19 - queries:].clone().requires_grad_(True)
    k.requires_grad_(True)
    v.requires_grad_(True)
    out, lse = dilated_attention(q, k, v, segment_lengths=SEGMENTS, dilation_rates=RATES, mode=mode, causal=causal,
                                 backend=backend, scale=0.5, return_lse=True)
    q_ref = torch.cat([q_full[:, :19 - queries], q], 1)
    want_out, want_lse = _expected(q_ref, k, v, queries, mode, causal)
    assert out.shape == q.shape and lse.shape == (2, 6, queries)
    assert max_diff(out, want_out) < TOL and max_diff(lse, want_lse) < TOL
    gen = torch.Generator().manual_seed(1)
    g_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    g_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64).masked_fill(torch.isinf(want_lse), 0)
    have = torch.autograd.grad((out, lse), (q, k, v), (g_out, g_lse))
    want = torch.autograd.grad((want_out, want_lse.masked_fill(torch.isinf(want_lse), 0)), (q, k, v), (g_out, g_lse))
    assert max(max_diff(a, b) for a, b in zip(have, want)) < TOL


def test_flex_forward_and_transposed_inputs():
    """FlexAttention (forward only on the CPU) and q, k, v given as transposed (B, H, N, D) storage."""
    causal = True
    q_full, k, v = _qkv(21, 2)
    q = q_full[:, 18:]
    want_out, want_lse = _expected(q_full, k, v, 3, "longnet", causal)
    out, lse = dilated_attention(q, k, v, segment_lengths=SEGMENTS, dilation_rates=RATES, causal=causal, backend="flex",
                                 scale=0.5, return_lse=True)
    assert max_diff(out, want_out) < TOL and max_diff(lse, want_lse) < TOL
    bhnd = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
    out = dilated_attention(*bhnd, segment_lengths=SEGMENTS, dilation_rates=RATES, causal=causal, backend="sdpa",
                            scale=0.5)
    assert max_diff(out, want_out) < TOL


def test_module_takes_a_shorter_query():
    torch.manual_seed(0)
    layer = MultiheadDilatedAttention(24, 6, SEGMENTS, RATES, causal=True).double()
    x = torch.randn(2, 19, 24, dtype=torch.float64)
    full = layer(x)
    assert max_diff(layer(x[:, 15:], x, x), full[:, 15:]) < TOL
    with pytest.raises(ValueError, match="query may be shorter"):
        layer(x, x[:, :5], x[:, :5])


def test_what_takes_one_length_only_says_so():
    q_full, k, v = _qkv(16, 3)
    with pytest.raises(ValueError, match="same shape.*Nq <= N"):
        dilated_attention(torch.cat([q_full, q_full], 1), k, v, segment_lengths=SEGMENTS, dilation_rates=RATES)
    with pytest.raises(ValueError, match="same shape.*Nq <= N"):
        dilated_attention(q_full[:, :4], k, v[:, :8], segment_lengths=SEGMENTS, dilation_rates=RATES)
    with pytest.raises(ValueError, match="hilbert_pattern"):
        dilated_attention(q_full[:, :4], k, v, segment_lengths=SEGMENTS, dilation_rates=RATES, hilbert_pattern=True)
    plan = build_plan(DilatedPattern.create(SEGMENTS, RATES, causal=True), 16, 6, query_len=4)
    with pytest.raises(ValueError, match="triton.*one length"):
        execute_plan(plan, get_executor("triton"), q_full[:, 12:], k, v, 0.5)
