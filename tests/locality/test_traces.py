"""Attention K/V traces against a brute-force trace built from the attention mask itself."""
from __future__ import annotations

import numpy as np
import pytest

from hilbert_lab.curves import grid_permutation, layout_permutation
from hilbert_lab.locality import (
    attention_trace,
    dilated_attention_trace,
    dilated_groups,
    window_attention_trace,
    window_groups,
)


def reference_trace(num_tokens, attends, perm, tile_size, key_block, row_bytes, line_bytes):
    """Per query tile: sorted layout rows of every key any query attends; K lines then V lines per key tile."""
    inverse = np.argsort(perm)
    value_base = -(-num_tokens * row_bytes // line_bytes)
    lines, needed, loaded = [], 0, 0
    for tile in range(-(-num_tokens // tile_size)):
        queries = perm[tile * tile_size:(tile + 1) * tile_size]
        rows = sorted({int(inverse[key]) for query in queries for key in range(num_tokens) if attends(query, key)})
        needed += len(rows)
        if key_block:
            blocks = sorted({row // key_block for row in rows})
            chunks = [list(range(b * key_block, min((b + 1) * key_block, num_tokens))) for b in blocks]
        else:
            chunks = [rows[i:i + tile_size] for i in range(0, len(rows), tile_size)]
        for chunk in chunks:
            loaded += len(chunk)
            for base in (0, value_base):
                last = None
                for row in chunk:
                    for line in range(row * row_bytes // line_bytes, ((row + 1) * row_bytes - 1) // line_bytes + 1):
                        if line + base != last:
                            lines.append(line + base)
                            last = line + base
    return np.array(lines, dtype=np.int64), needed, loaded


def dilated_attends(segment_length, dilation_rate, offset):
    def attends(query, key):
        same_segment = query // segment_length == key // segment_length
        return same_segment and (query % segment_length) % dilation_rate == offset == (key % segment_length) % dilation_rate
    return attends


@pytest.mark.parametrize("tile_size, key_block", [(8, None), (8, 8), (5, None), (5, 7)])  # 5, 7: ragged last tiles
@pytest.mark.parametrize("head_dim, element_bytes", [(8, 4), (32, 4), (48, 4), (64, 4)])  # 32, 128, 192, 256 B
@pytest.mark.parametrize("offset", [0, 3])
def test_dilated_trace_matches_mask_bruteforce(rng, tile_size, key_block, head_dim, element_bytes, offset):
    seq_len, segment_length, dilation_rate = 48, 16, 4
    perm = rng.permutation(seq_len)  # any layout: the trace must follow it exactly
    groups = dilated_groups(seq_len, segment_length, dilation_rate, offset)
    trace = attention_trace(groups, perm, tile_size=tile_size, key_block=key_block, head_dim=head_dim,
                            element_bytes=element_bytes, line_bytes=128)
    expected, needed, loaded = reference_trace(seq_len, dilated_attends(segment_length, dilation_rate, offset), perm,
                                               tile_size, key_block, head_dim * element_bytes, 128)
    np.testing.assert_array_equal(trace.lines, expected)
    assert (trace.rows_needed, trace.rows_loaded) == (needed, loaded)


@pytest.mark.parametrize("shape, window", [((6, 7), 3), ((5, 5), 4), ((3, 4, 4), 3)])
def test_window_trace_matches_bruteforce(rng, shape, window):
    num_tokens = int(np.prod(shape))
    coords = np.stack(np.unravel_index(np.arange(num_tokens), shape), axis=1)
    low, high = -(window // 2), (window - 1) // 2

    def attends(query, key):
        delta = coords[key] - coords[query]
        return bool(np.all((delta >= low) & (delta <= high)))

    perm = rng.permutation(num_tokens)
    for key_block in (None, 4):
        trace = attention_trace(window_groups(shape, window), perm, tile_size=4, key_block=key_block, head_dim=16,
                                element_bytes=2, line_bytes=64)
        expected, needed, loaded = reference_trace(num_tokens, attends, perm, 4, key_block, 32, 64)
        np.testing.assert_array_equal(trace.lines, expected)
        assert (trace.rows_needed, trace.rows_loaded) == (needed, loaded)


def test_dilated_groups_match_dilated_pattern_dense_mask():
    from hilbert_lab.attention.pattern import DilatedPattern

    seq_len, segment_length, dilation_rate = 48, 16, 4
    pattern = DilatedPattern.create([segment_length], [dilation_rate])
    mask = pattern.dense_mask(seq_len, dilation_rate).numpy()
    offsets = pattern.head_offsets(dilation_rate)[0]
    for head, offset in enumerate(offsets.tolist()):
        groups = dilated_groups(seq_len, segment_length, dilation_rate, offset)
        ours = np.zeros((seq_len, seq_len), dtype=bool)
        for group in range(groups.group_indptr.size - 1):
            members = groups.group_members[groups.group_indptr[group]:groups.group_indptr[group + 1]]
            ours[np.ix_(members, members)] = True
        np.testing.assert_array_equal(ours, mask[head])


@pytest.mark.parametrize("seq_len, segment_length, dilation_rate", [
    (48, 16, 4), (50, 16, 4), (64, 16, 3), (37, 12, 5), (20, 64, 4), (7, 8, 8), (100, 30, 7),
])
def test_dilated_groups_are_the_plans_blocks(seq_len, segment_length, dilation_rate):
    """Every group is one segment row of a build_plan block of the head's offset, ragged N included,
    and the groups give pattern.dense_mask exactly."""
    from hilbert_lab.attention import DilatedPattern, build_plan

    pattern = DilatedPattern.create([segment_length], [dilation_rate])
    plan = build_plan(pattern, seq_len, dilation_rate)  # head j has offset j
    mask = pattern.dense_mask(seq_len, dilation_rate).numpy()
    for offset in range(dilation_rate):
        groups = dilated_groups(seq_len, segment_length, dilation_rate, offset)
        expected = [row.tolist() for blk in plan.blocks if blk.offset == offset for row in blk.positions()]
        got = [groups.group_members[a:b].tolist() for a, b in zip(groups.group_indptr[:-1], groups.group_indptr[1:])]
        assert got == expected
        for group, members in enumerate(got):
            assert (groups.query_group[members] == group).all()
        assert (groups.query_group >= 0).sum() == sum(len(m) for m in got)
        ours = np.zeros((seq_len, seq_len), dtype=bool)
        for members in got:
            ours[np.ix_(members, members)] = True
        np.testing.assert_array_equal(ours, mask[offset])


def test_dilated_trace_accepts_ragged_sequences():
    """N = 100, w = 30, r = 7: the ragged last segment (10 tokens) is traced as its own group."""
    trace = dilated_attention_trace(100, 30, 7, "hilbert", tile_size=8, head_dim=64, element_bytes=2)
    groups = dilated_groups(100, 30, 7)
    assert np.unique(trace.lines).size == 2 * groups.group_members.size  # one K and one V line per selected row
    assert groups.group_members.tolist() == [0, 7, 14, 21, 28, 30, 37, 44, 51, 58, 60, 67, 74, 81, 88, 90, 97]


def test_dilation_major_layout_makes_groups_contiguous():
    seq_len, segment_length, dilation_rate = 64, 16, 4
    perm, inverse = (t.numpy() for t in layout_permutation(seq_len, segment_length, "dilation_major",
                                                             dilation_rate=dilation_rate))
    np.testing.assert_array_equal(perm[inverse], np.arange(seq_len))
    for offset in range(dilation_rate):
        groups = dilated_groups(seq_len, segment_length, dilation_rate, offset)
        for group in range(groups.group_indptr.size - 1):
            slots = np.sort(inverse[groups.group_members[groups.group_indptr[group]:groups.group_indptr[group + 1]]])
            assert slots[-1] - slots[0] == slots.size - 1  # one contiguous run


def test_ordering_changes_layout_not_attention():
    # Same rows needed in total for any layout of a gather kernel, only their order/grouping differs.
    common = dict(tile_size=64, head_dim=64, element_bytes=2)
    natural = dilated_attention_trace(4096, 1024, 4, "identity", **common)
    major = dilated_attention_trace(4096, 1024, 4, "dilation_major", **common)
    # distinct rows touched are the group members (K and V, one line each) in both layouts
    assert np.unique(natural.lines).size == np.unique(major.lines).size == 2 * 4096 // 4
    # dilation-major packs each group's queries into 256/64 = 4 tiles instead of all 16 tiles of a segment
    assert natural.rows_needed == 4 * major.rows_needed


def test_window_trace_rowmajor_grid_layout_is_identity():
    perm, inverse = grid_permutation((4, 5), "rowmajor")
    np.testing.assert_array_equal(perm, np.arange(20))
    trace = window_attention_trace((4, 5), 3, "rowmajor", tile_size=5, head_dim=64, element_bytes=2)
    # first tile = grid row 0 (5 tokens): needs grid rows 0 and 1 (10 K/V rows) in key tiles of 5 rows,
    # each key tile K lines then V lines (V starts after the 20 K lines)
    expected = np.r_[np.arange(5), 20 + np.arange(5), 5 + np.arange(5), 25 + np.arange(5)]
    np.testing.assert_array_equal(trace.lines[:20], expected)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: dilated_groups(100, 30, 31), "dilation_rate"),
        (lambda: dilated_groups(64, 16, 3, offset=-1), "offset"),
        (lambda: dilated_groups(64, 16, 4, offset=4), "offset"),
        (lambda: dilated_groups(64, 16, 4, offset=1.0), "offset"),
        (lambda: dilated_groups(0, 16, 4), "seq_len"),
        (lambda: window_groups((4,), 3), "shape"),
        (lambda: window_groups((4, 4), (3, 3, 3)), "box"),
        (lambda: attention_trace(dilated_groups(16, 8, 2), np.arange(16), tile_size=0), "tile_size"),
        (lambda: attention_trace(dilated_groups(16, 8, 2), np.zeros(16, dtype=int)), "perm"),
        (lambda: attention_trace(dilated_groups(16, 8, 2), np.arange(16), key_block=0), "key_block"),
    ],
)
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_attention_trace_through_gpu_hierarchy_is_consistent():
    from hilbert_lab.locality import cache_levels, miss_curve, simulate_hierarchy

    levels = cache_levels("GTX-1080")  # 128 B lines at both levels, fully associative
    trace = window_attention_trace((32, 32), 8, "hilbert", head_dim=64, element_bytes=4, line_bytes=128)
    result = simulate_hierarchy(trace.lines * 128, levels)
    l1_misses = miss_curve(trace.lines, [levels[0].num_lines])[0]
    assert result[0]["accesses"] == trace.lines.size and result[0]["misses"] == l1_misses
    assert result[1]["accesses"] == l1_misses
    # the whole K/V (2 x 1024 rows x 2 lines) fits in the 2 MiB L2: only compulsory misses
    assert result[1]["misses"] == np.unique(trace.lines).size == 4096
