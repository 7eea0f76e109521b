"""Randomised patterns and calls (hypothesis): the engine equals the float64 oracle in outputs, LSE and gradients."""
from __future__ import annotations

import sys
from unittest import mock

import torch

from hilbert_lab.attention.engine import dilated_attention
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.reference import reference_attention

from property_testing import given, settings, st

from ._fa4_standin import CPU_FA4, standin_modules
from ._oracle import max_diff, random_qkv


@st.composite
def patterns(draw):
    branches = draw(st.integers(1, 3))
    segment_lengths = [draw(st.integers(1, 12)) for _ in range(branches)]
    dilation_rates = [draw(st.integers(1, w)) for w in segment_lengths]
    return dict(
        segment_lengths=segment_lengths, dilation_rates=dilation_rates,
        seq_len=draw(st.integers(1, 20)), num_heads=draw(st.integers(1, 5)),
        mode=draw(st.sampled_from(["longnet", "head_groups"])), causal=draw(st.booleans()),
        backend=draw(st.sampled_from(["manual", "sdpa"])),
    )


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(patterns())
def test_random_pattern_matches_oracle(case):
    q, k, v = random_qkv(2, case["seq_len"], case["num_heads"], 3)
    pattern = DilatedPattern.create(case["segment_lengths"], case["dilation_rates"], mode=case["mode"], causal=case["causal"])
    expected_out, expected_lse = reference_attention(q, k, v, pattern)
    out, lse = dilated_attention(q, k, v, segment_lengths=case["segment_lengths"], dilation_rates=case["dilation_rates"],
                                 mode=case["mode"], causal=case["causal"], backend=case["backend"], return_lse=True)
    assert max_diff(out, expected_out) < 1e-10 and max_diff(lse, expected_lse) < 1e-10
    g_out, g_lse = torch.randn_like(out), torch.randn_like(lse)
    expected = torch.autograd.grad((expected_out, expected_lse), (q, k, v), (g_out, g_lse))
    got = torch.autograd.grad((out, lse), (q, k, v), (g_out, g_lse))
    assert max(max_diff(a, b) for a, b in zip(got, expected)) < 1e-10


@st.composite
def calls(draw):
    """A random pattern with one of: grouped key/value heads, packed documents (cu_seqlens), fewer queries than
    keys, or a run of a layer's heads (global_heads); on manual, sdpa or the fa4 executor's glue (FlashAttention-4
    stood in for in float64)."""
    branches = draw(st.integers(1, 3))
    segment_lengths = [draw(st.sampled_from([1, 2, 3, 4, 5, 8, 12, 16, 48])) for _ in range(branches)]
    kind = draw(st.sampled_from(["grouped", "packed", "fewer", "heads"]))
    kv_heads = draw(st.integers(1, 3))
    seq_len = draw(st.integers(1, 40))
    case = dict(segment_lengths=segment_lengths, dilation_rates=[draw(st.integers(1, min(w, 6)))
                                                                for w in segment_lengths],
                seq_len=seq_len, kind=kind, kv_heads=kv_heads if kind == "grouped" else None,
                num_heads=kv_heads * draw(st.integers(1, 3)), mode=draw(st.sampled_from(["longnet", "head_groups"])),
                causal=draw(st.booleans()), backend=draw(st.sampled_from(["manual", "sdpa", "fa4"])))
    if kind == "packed":
        cuts = draw(st.lists(st.integers(0, seq_len), max_size=4))
        case["cu_seqlens"] = [0, *sorted(cuts), seq_len]  # empty documents too
    if kind == "fewer":
        case["queries"] = draw(st.integers(1, seq_len))
    if kind == "heads":
        case["total_heads"] = case["num_heads"] * draw(st.integers(2, 3))
        case["start"] = case["num_heads"] * draw(st.integers(0, case["total_heads"] // case["num_heads"] - 1))
    return case


def _oracle_of(case, q, k, v):
    """(out, lse) of the float64 dense oracle for `case` on q (B, N, H_all, D), k, v (B, N, H_kv, D) of the whole
    call: documents one by one, grouped heads repeated, the last `queries` rows, a run of heads sliced."""
    pattern = DilatedPattern.create(case["segment_lengths"], case["dilation_rates"], mode=case["mode"],
                                    causal=case["causal"])
    groups = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(groups, 2), v.repeat_interleave(groups, 2)
    bounds = case.get("cu_seqlens", [0, q.shape[1]])
    parts = [reference_attention(q[:, a:b], k[:, a:b], v[:, a:b], pattern) for a, b in zip(bounds, bounds[1:]) if b > a]
    out, lse = torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 2)
    queries = case.get("queries", q.shape[1])
    out, lse = out[:, q.shape[1] - queries:], lse[..., q.shape[1] - queries:]
    if case["kind"] == "heads":
        heads = slice(case["start"], case["start"] + case["num_heads"])
        out, lse = out[:, :, heads], lse[:, heads]
    return out, lse


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(calls())
def test_random_call_matches_oracle(case):
    """Outputs, LSE and gradients (random upstream gradients of both) against the float64 oracle."""
    batch = 1 if case["kind"] == "packed" else 2
    head_dim = 8  # the fa4 glue takes multiples of 8
    all_heads = case.get("total_heads", case["num_heads"])
    q, k, v = random_qkv(batch, case["seq_len"], all_heads, head_dim, seed=case["seq_len"])
    if case["kv_heads"] is not None:
        k, v = (t.detach()[:, :, :case["kv_heads"]].clone().requires_grad_(True) for t in (k, v))
    queries = case.get("queries", case["seq_len"])
    heads = slice(case.get("start", 0), case.get("start", 0) + case["num_heads"])
    inputs = [q.detach()[:, case["seq_len"] - queries:, heads], k.detach(), v.detach()]
    if case["kind"] == "heads":
        inputs[1:] = [t[:, :, heads] for t in inputs[1:]]
    inputs = [t.clone().requires_grad_(True) for t in inputs]
    options = {"cu_seqlens": case["cu_seqlens"]} if "cu_seqlens" in case else {}
    if case["kind"] == "heads":
        options["global_heads"] = (case["start"], case["total_heads"])
    with mock.patch.dict(sys.modules, standin_modules()):
        out, lse = dilated_attention(*inputs, segment_lengths=case["segment_lengths"],
                                     dilation_rates=case["dilation_rates"], mode=case["mode"], causal=case["causal"],
                                     backend=CPU_FA4 if case["backend"] == "fa4" else case["backend"],
                                     return_lse=True, **options)
        gen = torch.Generator().manual_seed(1)
        g_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
        g_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64)
        got = torch.autograd.grad((out, torch.where(torch.isinf(lse), 0.0, lse)), inputs, (g_out, g_lse))
    expected_out, expected_lse = _oracle_of(case, q, k, v)
    assert max_diff(out, expected_out) < 1e-10 and max_diff(lse, expected_lse) < 1e-10
    expected = torch.autograd.grad((expected_out, torch.where(torch.isinf(expected_lse), 0.0, expected_lse)),
                                   (q, k, v), (g_out, g_lse))
    expected = [expected[0][:, case["seq_len"] - queries:, heads], *expected[1:]]
    if case["kind"] == "heads":
        expected[1:] = [t[:, :, heads] for t in expected[1:]]
    # the fa4 glue hands the kernel its LSE in float32, as FlashAttention-4 takes it: probabilities to ~1e-7
    tolerance = 1e-6 if case["backend"] == "fa4" else 1e-10
    assert max(max_diff(a, b) for a, b in zip(got, expected)) < tolerance
