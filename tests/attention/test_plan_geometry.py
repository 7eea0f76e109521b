"""The plan's query/key geometry through the executors, against the float64 oracle: grouped-query heads
(key/value heads shared by query heads), documents of a packed row (the pattern restarts at each), and
queries fewer than keys (the last rows of the full computation); outputs, LSE and gradients."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention.engine import execute_plan
from hilbert_lab.attention.executors import get_executor
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import build_plan
from hilbert_lab.attention.reference import reference_attention

from ._oracle import max_diff

EXECUTORS = ["reference", "manual", "sdpa"]
TOL = 1e-10


def _random(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)


def _check(got, expected, leaves, seed):
    (out, lse), (expected_out, expected_lse) = got, expected
    assert max_diff(out, expected_out) < TOL and max_diff(lse, expected_lse) < TOL
    gen = torch.Generator().manual_seed(seed)
    g_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    g_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64).masked_fill(torch.isinf(expected_lse), 0)
    want = torch.autograd.grad((expected_out, expected_lse.masked_fill(torch.isinf(expected_lse), 0)), leaves,
                               (g_out, g_lse))
    have = torch.autograd.grad((out, lse), leaves, (g_out, g_lse))
    assert max(max_diff(a, b) for a, b in zip(have, want)) < TOL


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
@pytest.mark.parametrize("kv_heads", [1, 2, 3])
def test_grouped_query_heads_read_their_key_value_head(executor, mode, kv_heads):
    """H = 6 query heads over H_kv key/value heads (head h reads h // (H / H_kv)); K/V are never repeated
    by the caller, their gradients sum over each group."""
    pattern = DilatedPattern.create([4, 8, 16], [1, 2, 4], mode=mode, causal=True)
    q = _random((2, 19, 6, 4), 0)
    k, v = _random((2, 19, kv_heads, 4), 1), _random((2, 19, kv_heads, 4), 2)
    plan = build_plan(pattern, 19, 6, num_kv_heads=kv_heads)
    got = execute_plan(plan, get_executor(executor), q, k, v, 0.5)
    groups = 6 // kv_heads
    expected = reference_attention(q, k.repeat_interleave(groups, 2), v.repeat_interleave(groups, 2), pattern,
                                   scale=0.5)
    _check(got, expected, (q, k, v), 3)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths", [(7, 1, 12, 3), (23,), (1, 1, 5, 16)])
def test_documents_of_a_packed_row_are_attended_as_their_own_sequences(executor, causal, lengths):
    """Documents of length 1, shorter than one segment and the whole row: each equals the oracle on that
    document alone (positions, segments, offsets and causality restart at its start)."""
    pattern = DilatedPattern.create([4, 8, 1 << 40], [1, 2, 4], causal=causal)
    total = sum(lengths)
    q, k, v = (_random((1, total, 4, 4), seed) for seed in range(3))
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    plan = build_plan(pattern, total, 4, documents=tuple(zip(starts, lengths)))
    got = execute_plan(plan, get_executor(executor), q, k, v, 0.5)
    parts = [reference_attention(q[:, s:s + n], k[:, s:s + n], v[:, s:s + n], pattern, scale=0.5)
             for s, n in zip(starts, lengths)]
    expected = (torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 2))
    _check(got, expected, (q, k, v), 4)


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("queries", [1, 3, 9, 21])
def test_queries_fewer_than_keys_are_the_last_rows_of_the_full_computation(executor, mode, causal, queries):
    pattern = DilatedPattern.create([4, 8, 16], [1, 2, 4], mode=mode, causal=causal)
    q_full = _random((2, 21, 6, 4), 5)
    k, v = _random((2, 21, 6, 4), 6), _random((2, 21, 6, 4), 7)
    q = q_full[:, 21 - queries:].detach().requires_grad_(True)
    plan = build_plan(pattern, 21, 6, query_len=queries)
    got = execute_plan(plan, get_executor(executor), q, k, v, 0.5)
    full_out, full_lse = reference_attention(torch.cat([q_full[:, :21 - queries].detach(), q], 1), k, v, pattern,
                                             scale=0.5)
    _check(got, (full_out[:, 21 - queries:], full_lse[:, :, 21 - queries:]), (q, k, v), 8)


def test_grouped_query_plans_know_when_key_heads_are_shared_across_branches():
    """head_groups with H = 6 and 2 key/value heads: kv head 0 serves query heads 0-2, of two head groups,
    so its gradient shares add up although no query row merges."""
    pattern = DilatedPattern.create([4, 8, 16], [1, 2, 4], mode="head_groups")
    plan = build_plan(pattern, 16, 6, num_kv_heads=2)
    assert not plan.merge and plan.kv_shared
    assert not build_plan(pattern, 16, 6, num_kv_heads=3).kv_shared
