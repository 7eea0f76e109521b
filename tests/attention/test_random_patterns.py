"""Randomised patterns (hypothesis): the engine equals the float64 oracle in outputs, LSE and gradients."""
from __future__ import annotations

import torch

from hilbert_lab.attention.engine import dilated_attention
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.reference import reference_attention

from property_testing import given, settings, st

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
