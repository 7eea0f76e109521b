"""DilatedPattern: head offsets, groups and masks against a brute-force reading of the definition; validation."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from hilbert_lab.attention import dilated_attention
from hilbert_lab.attention.pattern import DilatedPattern

from ._oracle import brute_multiplicity, head_offset

CASES = [  # (segment_lengths, dilation_rates, seq_len, num_heads)
    ([4, 8], [1, 2], 16, 4),
    ([4, 8, 16], [1, 2, 4], 13, 5),  # ragged N, heads not divisible
    ([3, 6], [1, 3], 11, 7),
    ([32], [4], 10, 3),  # w > N, H < r
    ([8, 4], [4, 2], 9, 2),
]


@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
@pytest.mark.parametrize("segment_lengths,dilation_rates,seq_len,num_heads", CASES)
def test_head_offsets_match_definition(segment_lengths, dilation_rates, seq_len, num_heads, mode):
    pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode)
    offsets = pattern.head_offsets(num_heads)
    for branch, h in itertools.product(range(len(segment_lengths)), range(num_heads)):
        assert offsets[branch][h] == head_offset(mode, branch, h, num_heads, dilation_rates)


def test_head_offsets_explicit_values():
    longnet = DilatedPattern.create([8, 8], [1, 4]).head_offsets(6)  # ceil(6/4) = 2 heads per block
    assert longnet[0].tolist() == [0] * 6 and longnet[1].tolist() == [0, 0, 1, 1, 2, 2]
    groups = DilatedPattern.create([4, 8, 16], [1, 2, 4], mode="head_groups").head_offsets(8)  # sizes 3, 3, 2
    assert groups[0].tolist() == [0, 0, 0, -1, -1, -1, -1, -1]
    assert groups[1].tolist() == [-1, -1, -1, 0, 1, 0, -1, -1]
    assert groups[2].tolist() == [-1, -1, -1, -1, -1, -1, 0, 1]


@pytest.mark.parametrize("mode,causal", [("longnet", False), ("longnet", True), ("head_groups", True)])
@pytest.mark.parametrize("segment_lengths,dilation_rates,seq_len,num_heads", CASES)
def test_multiplicity_and_mask_match_brute_force(segment_lengths, dilation_rates, seq_len, num_heads, mode, causal):
    pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
    expected = brute_multiplicity(segment_lengths, dilation_rates, mode, causal, seq_len, num_heads)
    assert np.array_equal(pattern.multiplicity(seq_len, num_heads).numpy(), expected)
    assert np.array_equal(pattern.dense_mask(seq_len, num_heads).numpy(), expected > 0)


def test_multiplicity_counts_keys_shared_by_two_branches():
    # w=4,r=1 and w=8,r=2 both let query 2 see key 0 for head 0 (offset 0 in both branches).
    mult = DilatedPattern.create([4, 8], [1, 2]).multiplicity(8, 1)
    assert mult[0, 2, 0] == 2 and mult[0, 3, 1] == 1 and mult[0, 6, 0] == 1


@pytest.mark.parametrize("segment_lengths,dilation_rates,seq_len,num_heads", CASES)
def test_groups_index_lists_exactly_the_selected_positions(segment_lengths, dilation_rates, seq_len, num_heads):
    pattern = DilatedPattern.create(segment_lengths, dilation_rates)
    seen_heads = {b: set() for b in range(len(segment_lengths))}
    for g in pattern.groups(seq_len, num_heads):
        w = min(segment_lengths[g.branch], seq_len)
        assert g.segment_length == w and g.dilation_rate == dilation_rates[g.branch]
        assert g.index.shape[0] == -(-seq_len // w)
        for s, row in enumerate(g.index.tolist()):
            expected = [p for p in range(s * w, min((s + 1) * w, seq_len)) if (p % w) % g.dilation_rate == g.offset]
            assert [p for p in row if p >= 0] == expected
            assert all(p == -1 for p in row[len(expected):])
        assert list(range(num_heads))[g.head_slice] == list(g.heads)
        seen_heads[g.branch] |= set(g.heads)
    assert all(heads == set(range(num_heads)) for heads in seen_heads.values())  # longnet: all heads in all branches


def test_effective_segment_clips_to_sequence():
    pattern = DilatedPattern.create([4, 64], [1, 2])
    assert pattern.effective_segment(0, 10) == 4 and pattern.effective_segment(1, 10) == 10


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(segment_lengths=[4, 8], dilation_rates=[1]), "same length"),
        (dict(segment_lengths=[], dilation_rates=[]), "segment_lengths"),
        (dict(segment_lengths=[4, 0], dilation_rates=[1, 1]), "segment_lengths"),
        (dict(segment_lengths=[4, -8], dilation_rates=[1, 1]), "segment_lengths"),
        (dict(segment_lengths=[4.0], dilation_rates=[1]), "segment_lengths"),
        (dict(segment_lengths=[4], dilation_rates=[1.5]), "dilation_rates"),
        (dict(segment_lengths=[4], dilation_rates=[True]), "dilation_rates"),
        (dict(segment_lengths=[4], dilation_rates=[0]), "dilation_rates"),
        (dict(segment_lengths=[4], dilation_rates=[8]), "dilation_rates must not exceed segment_lengths"),
        (dict(segment_lengths="48", dilation_rates=[1]), "segment_lengths"),
        (dict(segment_lengths=[4], dilation_rates=[1], mode="dense"), "mode must be one of"),
        (dict(segment_lengths=[4], dilation_rates=[1], causal="yes"), "causal"),
    ],
)
def test_create_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DilatedPattern.create(**kwargs)


def test_seq_len_and_num_heads_are_validated():
    pattern = DilatedPattern.create([4], [1])
    with pytest.raises(ValueError, match="seq_len"):
        pattern.groups(0, 2)
    with pytest.raises(ValueError, match="num_heads"):
        pattern.head_offsets(-1)


def test_create_accepts_numpy_and_tensor_free_ints():
    pattern = DilatedPattern.create(np.array([4, 8]), (np.int64(1), 2))
    assert pattern.segment_lengths == (4, 8) and pattern.dilation_rates == (1, 2)
    assert isinstance(pattern.groups(8, 2)[0].index, torch.Tensor)


@pytest.mark.parametrize("segment_lengths,dilation_rates,name", [
    ([2**60], [2**60], "dilation_rates"), ([16, 2**61], [1, 2**60], "dilation_rates"),
    ([2**62 + 1], [1], "segment_lengths"), ([2**63 - 1], [2**62], "segment_lengths"),
    ([2**33], [2**32 + 1], "dilation_rates"),
])
def test_sizes_past_the_int64_bounds_are_rejected_at_once(segment_lengths, dilation_rates, name):
    with pytest.raises(ValueError, match=rf"{name} must contain integers <= 2\*\*"):
        DilatedPattern.create(segment_lengths, dilation_rates)
    q = torch.randn(1, 16, 2, 4)
    for backend in ("manual", "sdpa"):
        with pytest.raises(ValueError, match=name):
            dilated_attention(q, q, q, segment_lengths=segment_lengths, dilation_rates=dilation_rates, backend=backend)


def test_the_largest_sizes_still_work_and_mean_the_whole_sequence():
    q, k, v = (torch.randn(1, 16, 2, 4, dtype=torch.float64) for _ in range(3))
    # Rates >= N all select one token per head (head h: offset h), like w = r = N.
    expected = dilated_attention(q, k, v, segment_lengths=[16], dilation_rates=[16], backend="reference")
    for segment, rate in ((1 << 40, 16), (2**62, 16), (1 << 40, 2**32), (2**62, 2**32)):
        out = dilated_attention(q, k, v, segment_lengths=[segment], dilation_rates=[rate], backend="manual")
        assert torch.allclose(out, expected, atol=1e-12), (segment, rate)


def test_plain_arguments_give_one_checked_pattern_and_bad_ones_are_refused_every_time():
    """create() with plain values returns the pattern it built for them (checked once); lists and tuples of the same
    ints are one pattern; numpy values and np.bool_ build an equal one; a bad argument is named on every call."""
    first = DilatedPattern.create([64, 128], [1, 2], mode="head_groups", causal=True)
    assert DilatedPattern.create((64, 128), (1, 2), mode="head_groups", causal=True) is first
    assert DilatedPattern.create(np.array([64, 128]), [1, 2], "head_groups", np.bool_(True)) == first
    assert DilatedPattern.create(64, 1) == DilatedPattern.create([64], [1])
    for _ in range(2):
        with pytest.raises(ValueError, match=r"dilation_rates must not exceed segment_lengths, got dilation 4 > segment 2"):
            DilatedPattern.create([2], [4])
        with pytest.raises(ValueError, match=r"mode must be one of"):
            DilatedPattern.create([2], [1], mode="ring")
