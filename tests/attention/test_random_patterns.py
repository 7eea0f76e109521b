"""Randomised patterns and calls (hypothesis): the engine equals the float64 oracle in outputs, LSE and gradients."""
from __future__ import annotations

import sys

import pytest
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
    """A random pattern with any mix of: grouped key/value heads, packed documents (cu_seqlens) or fewer queries
    than keys, a run of a layer's heads (global_heads), a memory layout (ordering) and a score scale; on every executor
    with a CPU backward (manual, sdpa, sdpa_math, sdpa_flash) or the fa4 executor's glue (FlashAttention-4 stood in
    for in float64)."""
    branches = draw(st.integers(1, 3))
    segment_lengths = [draw(st.sampled_from([1, 2, 3, 4, 5, 8, 12, 16, 48])) for _ in range(branches)]
    kv_heads = draw(st.integers(1, 3))
    seq_len = draw(st.integers(1, 40))
    rows = draw(st.sampled_from(["all", "packed", "fewer"]))
    case = dict(segment_lengths=segment_lengths, dilation_rates=[draw(st.integers(1, min(w, 6)))
                                                                for w in segment_lengths],
                seq_len=seq_len, grouped=draw(st.booleans()), kv_heads=kv_heads,
                num_heads=kv_heads * draw(st.integers(1, 3)), mode=draw(st.sampled_from(["longnet", "head_groups"])),
                causal=draw(st.booleans()),
                backend=draw(st.sampled_from(["manual", "sdpa", "fa4", "sdpa_math", "sdpa_flash"])),
                queries=seq_len, total_heads=None, start=0,
                ordering=draw(st.sampled_from([None, None, None, "hilbert", "morton", "snake"])),
                scale=draw(st.sampled_from([None, None, None, 0.01, 10.0])))  # 10: scores ~30, LSEs far apart
    if rows == "packed":
        cuts = draw(st.lists(st.integers(0, seq_len), max_size=4))
        case["cu_seqlens"] = [0, *sorted(cuts), seq_len]  # empty documents too
    if rows == "fewer":
        case["queries"] = draw(st.integers(1, seq_len))
    if draw(st.booleans()):  # q's heads are a run of a layer's heads
        case["total_heads"] = case["num_heads"] * draw(st.integers(2, 3))
        case["start"] = case["num_heads"] * draw(st.integers(0, case["total_heads"] // case["num_heads"] - 1))
    return case


def _oracle_of(case, q, k, v):
    """(out, lse) of the float64 dense oracle for `case` on q (B, N, H_all, D), k, v (B, N, H_kv_all, D) of the
    whole layer: documents one by one, grouped heads repeated, the last `queries` rows, all heads."""
    pattern = DilatedPattern.create(case["segment_lengths"], case["dilation_rates"], mode=case["mode"],
                                    causal=case["causal"])
    groups = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(groups, 2), v.repeat_interleave(groups, 2)
    bounds = case.get("cu_seqlens", [0, q.shape[1]])
    parts = [reference_attention(q[:, a:b], k[:, a:b], v[:, a:b], pattern, scale=case.get("scale"))
             for a, b in zip(bounds, bounds[1:]) if b > a]
    out, lse = torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 2)
    first = q.shape[1] - case["queries"]
    return out[:, first:], lse[..., first:]


def _call_matches_oracle(case):
    """Outputs, LSE and gradients (random upstream gradients of both) of one `calls` case against the float64
    oracle of the whole layer, sliced to the call's queries and heads."""
    batch = 1 if "cu_seqlens" in case else 2
    head_dim = 8  # the fa4 glue takes multiples of 8
    all_heads = case["total_heads"] or case["num_heads"]
    group = case["num_heads"] // case["kv_heads"] if case["grouped"] else 1
    q, k, v = random_qkv(batch, case["seq_len"], all_heads, head_dim, seed=case["seq_len"])
    k, v = (t.detach()[:, :, :all_heads // group].clone().requires_grad_(True) for t in (k, v))
    first = case["seq_len"] - case["queries"]
    heads = slice(case["start"], case["start"] + case["num_heads"])
    kv_heads = slice(heads.start // group, heads.stop // group)
    inputs = [t.detach().clone().requires_grad_(True)
              for t in (q[:, first:, heads], k[:, :, kv_heads], v[:, :, kv_heads])]
    options = {"cu_seqlens": case["cu_seqlens"]} if "cu_seqlens" in case else {}
    if case["total_heads"]:
        options["global_heads"] = (case["start"], case["total_heads"])
    # only the stand-in's own modules are put in and taken out (restoring all of sys.modules would also drop what a
    # first Numba compilation inside imports, which a later import would then register twice)
    with pytest.MonkeyPatch.context() as patch:
        for name, module in standin_modules().items():
            patch.setitem(sys.modules, name, module)
        out, lse = dilated_attention(*inputs, segment_lengths=case["segment_lengths"],
                                     dilation_rates=case["dilation_rates"], mode=case["mode"], causal=case["causal"],
                                     backend=CPU_FA4 if case["backend"] == "fa4" else case["backend"],
                                     ordering=case.get("ordering"), scale=case.get("scale"), return_lse=True,
                                     **options)
        gen = torch.Generator().manual_seed(1)
        g_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
        g_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64)
        got = torch.autograd.grad((out, torch.where(torch.isinf(lse), 0.0, lse)), inputs, (g_out, g_lse))
    expected_out, expected_lse = _oracle_of(case, q, k, v)
    expected_out, expected_lse = expected_out[:, :, heads], expected_lse[:, heads]
    assert max_diff(out, expected_out) < 1e-10 and max_diff(lse, expected_lse) < 1e-10
    expected = torch.autograd.grad((expected_out, torch.where(torch.isinf(expected_lse), 0.0, expected_lse)),
                                   (q, k, v), (g_out, g_lse), allow_unused=True)
    expected = [torch.zeros_like(t) if e is None else e for e, t in zip(expected, (q, k, v))]
    expected = [expected[0][:, first:, heads], expected[1][:, :, kv_heads], expected[2][:, :, kv_heads]]
    # the fa4 glue hands the kernel its LSE in float32, as FlashAttention-4 takes it: probabilities exp(s - lse) to
    # ~|lse| 2^-24, so gradients to about that part of their own size (a gradient summed over many heads and branches
    # is larger, and so is its error: 1.09e-6 where the largest entry is 6.3, a GQA case of three equal branches)
    finite_lse = expected_lse[torch.isfinite(expected_lse)]
    lse_size = finite_lse.abs().max().item() if finite_lse.numel() else 0.0
    relative = 1e-6 * max(1.0, lse_size / 4) if case["backend"] == "fa4" else 1e-10
    for a, b in zip(got, expected):
        assert max_diff(a, b) < relative * max(1.0, b.detach().abs().max().item())


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(calls())
def test_random_call_matches_oracle(case):
    _call_matches_oracle(case)


def test_a_grouped_call_of_three_equal_branches_matches_oracle_on_the_fa4_glue():
    """Gradients summed over three query heads and three equal branches: their float32-LSE error is relative."""
    _call_matches_oracle(dict(segment_lengths=[5, 5, 5], dilation_rates=[1, 1, 1], seq_len=24, grouped=True, kv_heads=3,
                              num_heads=9, mode="longnet", causal=False, backend="fa4", queries=24, total_heads=None,
                              start=0, ordering=None))


@pytest.mark.parametrize("backend", ["manual", "sdpa", "fa4"])
def test_gradients_of_packed_heads_whose_first_document_has_no_row_of_the_first_branch(backend):
    """Global head 7 of 8 reads offset 7 in branch 0 (rate 8): the first document (6 tokens) has no row there, so
    branch 1 (which covers every row) is the branch whose shares are written; every executor stores them before
    branch 0 adds its own (the second document's), whatever the order of the branches."""
    case = dict(segment_lengths=[16, 3], dilation_rates=[8, 1], seq_len=54, grouped=False, kv_heads=1, num_heads=1,
                mode="longnet", causal=False, backend=backend, queries=54, total_heads=8, start=7,
                cu_seqlens=[0, 6, 54])
    _call_matches_oracle(case)
