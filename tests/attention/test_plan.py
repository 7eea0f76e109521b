"""The public plan: blocks as strided views (exactly the pattern's groups), units of folded offsets."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention import DilatedPattern, build_plan, cached_plan, is_selected
from hilbert_lab.attention.views import KEY, plan_units, unit_views

CONFIGS = [([16, 32, 64], [1, 2, 4]), ([16, 48, 1 << 40], [1, 3, 8]), ([8], [1]), ([6, 10, 64], [1, 3, 2])]


@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
@pytest.mark.parametrize("segments,rates", CONFIGS)
@pytest.mark.parametrize("seq_len,num_heads", [(64, 12), (80, 7), (29, 5)])
def test_blocks_hold_exactly_the_selected_tokens(mode, segments, rates, seq_len, num_heads):
    """Each (branch, head, position) a block reads is selected by the rule, in the right segment, and every
    selected one is read exactly once; the view and the index of original positions agree."""
    pattern = DilatedPattern.create(segments, rates, mode=mode)
    plan = build_plan(pattern, seq_len, num_heads)
    offsets = pattern.head_offsets(num_heads)
    seen = torch.zeros(pattern.num_branches, num_heads, seq_len, dtype=torch.int64)
    x = torch.arange(seq_len).view(1, seq_len, 1, 1).expand(2, seq_len, num_heads, 1).contiguous()
    for blk in plan.blocks:
        positions = blk.positions()
        assert torch.equal(blk.view(x)[0, :, :, 0, 0], positions)
        assert torch.equal(blk.read(x)[: blk.count, :, 0, 0], positions)
        assert torch.equal(blk.query_positions(), positions)
        w = pattern.effective_segment(blk.branch, seq_len)
        for h in range(blk.heads.start, blk.heads.stop, blk.heads.step or 1):
            assert is_selected(positions, w, rates[blk.branch], int(offsets[blk.branch][h])).all()
            seen[blk.branch, h, positions.reshape(-1)] += 1
    pos = torch.arange(seq_len)
    for branch, w in enumerate(pattern.effective_segment(i, seq_len) for i in range(pattern.num_branches)):
        for h in range(num_heads):
            o = int(offsets[branch][h])
            expected = is_selected(pos, w, rates[branch], o) if o >= 0 else torch.zeros(seq_len, dtype=torch.bool)
            assert torch.equal(seen[branch, h], expected.long()), (branch, h)
    assert plan.merge == (mode == "longnet" and pattern.num_branches > 1)


@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
@pytest.mark.parametrize("segments,rates", CONFIGS)
@pytest.mark.parametrize("seq_len,num_heads", [(64, 12), (80, 7), (96, 6)])
def test_units_read_the_same_elements_as_their_blocks(mode, segments, rates, seq_len, num_heads):
    """Folded units (several offsets on one view's head axis) read each block element once, in the same
    (position, head) order as the blocks' own views."""
    pattern = DilatedPattern.create(segments, rates, mode=mode)
    plan = cached_plan(pattern, seq_len, num_heads)
    x = torch.randn(2, seq_len, num_heads, 3)
    from_units = torch.zeros_like(x)
    from_blocks = torch.zeros_like(x)
    calls = 0
    for unit in plan_units(plan):
        for (view,) in unit_views(unit, [(from_units, KEY)])[1]:
            view.add_(1)
            calls += 1
        # element identity: a unit view of x holds exactly the values of its blocks' views
        unit_values = torch.cat([v.reshape(-1) for (v,) in unit_views(unit, [(x, KEY)])[1]]).sort().values
        block_values = torch.cat([b.view(x).reshape(-1) for b in unit.blocks]).sort().values
        assert torch.equal(unit_values, block_values)
    for blk in plan.blocks:
        blk.view(from_blocks).add_(1)
    assert torch.equal(from_units, from_blocks)
    assert calls <= len(plan.blocks) * 2  # per-batch pieces at most double the calls


def test_segments_longer_than_the_sequence_are_clipped():
    plan = build_plan(DilatedPattern.create([1 << 40], [1]), 100, 2)
    assert [(b.start, b.count, b.seg, b.length) for b in plan.blocks] == [(0, 1, 100, 100)]
    assert plan.pairs(causal=False) == 2 * 100 * 100 and plan.pairs(causal=True) == 2 * 5050


@pytest.mark.parametrize("segments,rates", CONFIGS)
@pytest.mark.parametrize("seq_len,num_heads", [(64, 12), (80, 7), (29, 5)])
@pytest.mark.parametrize("head_dim,dtype", [(1, torch.float32), (8, torch.bfloat16), (3, torch.float64)])
def test_cleared_entries_and_the_blocks_cover_every_entry(segments, rates, seq_len, num_heads, head_dim, dtype):
    """head_groups (each head in one branch): the entries the plan clears and the blocks' views together
    touch every (position, head); only heads of dilated branches are cleared (on the CPU whole, without Triton's
    interpreter), each cleared entry exactly zero while the others keep their values; the plan's per-head rows name
    exactly the entries no block writes (what the one-launch fill of kernels.triton_fill writes)."""
    pattern = DilatedPattern.create(segments, rates, mode="head_groups")
    plan = build_plan(pattern, seq_len, num_heads)
    x = torch.zeros(2, seq_len, num_heads, head_dim, dtype=dtype)
    for blk in plan.blocks:
        blk.view(x).add_(1)
    cleared = plan.clear_unselected(torch.full_like(x, 7.0))
    assert bool(((x > 0) | (cleared == 0)).all())
    assert bool(((cleared == 0) | (cleared == 7)).all())
    positions = torch.arange(seq_len)
    selected = torch.stack([is_selected(positions, w, r, o) for w, r, o in plan.unselected], dim=1)
    assert torch.equal(x[0, :, :, 0] > 0, selected)
    dense_heads = [h for h in range(num_heads) if all(
        pattern.dilation_rates[b] == 1 for b, offsets in enumerate(pattern.head_offsets(num_heads)) if offsets[h] >= 0)]
    assert all(bool((cleared[:, :, h] == 7).all()) for h in dense_heads)
