"""The one plan of a dilated pattern: which tokens of which heads form each attention block.

A plan turns (pattern, sequence length N, heads H[, layout]) into blocks. A block is one
(branch, offset, head slice) group over a run of equal segments: token j of segment s is the
original position `start + s * seg + offset + j * step`, read from a (B, N, H, D) tensor as the
strided view (B, count, L, h, D) (no copy) or, with a layout permutation, through an index map.
The ragged last segment is its own block; a segment longer than N is clipped to N. The engine,
the ring, the memory estimate and the locality traces all read this plan.

The selection rule of the whole library, `is_selected` (position p is selected in a branch (w, r)
for offset o iff `(p % w) % r == o`), lives in attention.pattern and is exported here too.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch

from hilbert_lab.attention.pattern import DilatedPattern, is_selected
from hilbert_lab.curves.layouts import layout_permutation

IDENTITY_ORDERINGS = (None, "identity")
__all__ = ["IDENTITY_ORDERINGS", "Block", "Plan", "build_plan", "cached_plan", "is_selected"]


@dataclass(frozen=True)
class Block:
    """Segments [start, start + count * seg) of one (branch, offset) group, read as (B * count, L, h, ...).

    Token j of segment s is original position start + s * seg + offset + j * step. With a layout
    permutation, `index` (count * L,) holds the layout slots of those tokens instead.
    """

    branch: int
    heads: slice
    start: int
    count: int
    seg: int
    offset: int
    step: int
    length: int
    index: Optional[torch.Tensor] = None

    def __hash__(self) -> int:  # slices are unhashable before Python 3.12; index maps hash by identity
        return hash((self.branch, self.heads.start, self.heads.stop, self.heads.step, self.start, self.count, self.seg,
                     self.offset, self.step, self.length, None if self.index is None else id(self.index)))

    @property
    def num_heads(self) -> int:
        return len(range(self.heads.start, self.heads.stop, self.heads.step or 1))

    def positions(self) -> torch.Tensor:
        """int64 (count, L): the original positions of the block's tokens."""
        local = torch.arange(self.offset, self.offset + self.length * self.step, self.step)
        return self.start + torch.arange(self.count)[:, None] * self.seg + local[None, :]

    def pairs(self, causal: bool) -> int:
        """Query-key pairs the block computes per batch element and head."""
        per_segment = self.length * (self.length + 1) // 2 if causal else self.length * self.length
        return self.count * per_segment

    def read(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, N, H, *rest) -> (B * count, L, h, *rest): a strided view when the batch and segment
        strides fold into one (always for count = 1 or whole-sequence runs), else a copy."""
        if self.index is not None:
            picked = x.index_select(1, self.index)[:, :, self.heads]
            return picked.unflatten(1, (self.count, self.length)).flatten(0, 1)
        size, stride, offset = self._geometry(x)
        if x.shape[0] == 1 or self.count == 1 or stride[0] == self.count * stride[1]:
            return x.as_strided((size[0] * size[1],) + size[2:], stride[1:] if self.count > 1 else (stride[0],) + stride[2:],
                                offset)
        return x.as_strided(size, stride, offset).flatten(0, 1)

    def write(self, dst: torch.Tensor, value: torch.Tensor, accumulate: bool = False) -> None:
        """Store (or add) `value` (B * count, L, h, *rest) into dst (B, N, H, *rest) in place."""
        value = value.unflatten(0, (dst.shape[0], self.count))
        if self.index is not None:
            value = value.flatten(1, 2).to(dst.dtype)
            if accumulate:
                dst[:, self.index, self.heads] += value
            else:
                dst[:, self.index, self.heads] = value
            return
        view = self.view(dst)
        if accumulate:
            view.add_(value.to(dst.dtype))
        else:
            view.copy_(value)

    def view(self, x: torch.Tensor) -> torch.Tensor:
        """The block of x (B, N, H, *rest) as a strided view (B, count, L, h, *rest); no copy."""
        return x.as_strided(*self._geometry(x))

    def _geometry(self, x: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        s_b, s_n, s_h, *rest = x.stride()
        head_step = self.heads.step or 1
        size = (x.shape[0], self.count, self.length, self.num_heads, *x.shape[3:])
        stride = (s_b, self.seg * s_n, self.step * s_n, head_step * s_h, *rest)
        offset = x.storage_offset() + (self.start + self.offset) * s_n + self.heads.start * s_h
        return size, stride, offset


@dataclass(frozen=True)
class Plan:
    """Blocks of a (pattern, seq_len, num_heads, layout).

    merge: some (position, head) is computed by more than one branch, so branch results are merged
    by their LSEs; otherwise every (position, head) belongs to at most one block (head_groups mode,
    or a single branch) and blocks write their results in place.
    """

    blocks: tuple[Block, ...]
    num_branches: int
    merge: bool
    seq_len: int
    num_heads: int

    def pairs(self, causal: bool) -> int:
        """Query-key pairs the plan computes per batch element (all heads and branches)."""
        return sum(b.pairs(causal) * b.num_heads for b in self.blocks)


def build_plan(pattern: DilatedPattern, seq_len: int, num_heads: int, inverse: Optional[torch.Tensor] = None,
               branches: Optional[tuple[int, ...]] = None) -> Plan:
    """The blocks of `pattern` for N = seq_len tokens and H = num_heads heads.

    inverse: optional LongTensor (N,) layout permutation (`x = x_layout[inverse]`); blocks then read
    the layout through index maps instead of strided views. branches: plan only these branches (the
    others contribute no block; `merge` then says whether the planned ones overlap), e.g. the branches
    whose segments lie inside one rank's shard of a ring.
    """
    blocks = []
    branches_per_head = [0] * num_heads
    for group in pattern.groups(seq_len, num_heads):
        if branches is not None and group.branch not in branches:
            continue
        for h in group.heads:
            branches_per_head[h] += 1
        seg, step, offset = group.segment_length, group.dilation_rate, group.offset  # seg = min(w, N)
        full = seq_len // seg
        parts = [(0, full, seg)] if full else []
        if seq_len - full * seg:
            parts.append((full * seg, 1, seq_len - full * seg))
        for start, count, length in parts:
            selected = len(range(offset, length, step))
            if selected == 0:
                continue
            index = None
            if inverse is not None:
                local = torch.arange(offset, length, step, device=inverse.device)
                segments = torch.arange(count, device=inverse.device)
                positions = (start + segments[:, None] * length + local[None, :]).reshape(-1)
                index = inverse[positions]
            blocks.append(Block(group.branch, group.head_slice, start, count, length, offset, step, selected, index))
    return Plan(tuple(blocks), pattern.num_branches, max(branches_per_head) > 1, seq_len, num_heads)


@torch.compiler.disable  # planning is Python/numpy work: keep it out of compiled graphs
@functools.lru_cache(maxsize=128)
def cached_plan(pattern: DilatedPattern, seq_len: int, num_heads: int, ordering: Optional[str] = None,
                device: str = "cpu", branches: Optional[tuple[int, ...]] = None) -> Plan:
    """`build_plan` for a layout `ordering` (None / "identity": original order), cached.

    The layout permutes tokens inside blocks of max(segment_lengths) (clipped to N) tokens
    (hilbert_lab.curves.layout_permutation)."""
    inverse = None
    if ordering not in IDENTITY_ORDERINGS:
        inverse = layout_permutation(seq_len, max(pattern.segment_lengths), ordering, device=device)[1]
    return build_plan(pattern, seq_len, num_heads, inverse, None if branches is None else tuple(branches))
