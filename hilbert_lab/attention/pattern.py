"""Dilated attention pattern: the single validator, head offsets, gather groups and dense masks.

Semantics (on original token positions): branch i has segment length w_i and dilation r_i.
Position p is selected in branch i for offset o iff (p mod w_i) mod r_i == o (`is_selected`, the
one statement of this rule in the library). Query p attends key p' in branch i iff both share a
segment (p // w_i == p' // w_i), both are selected with the head's offset and, when causal,
p' <= p. A segment longer than the sequence is the whole sequence.

Heads per branch:
- mode="longnet": every head takes part in every branch; within branch i the H heads are split
  into r_i contiguous blocks of ceil(H / r_i) heads and block j uses offset j.
- mode="head_groups": heads are split into k contiguous groups (the first H mod k groups get one
  extra head); head h of group i uses only branch i, with offset (h - first head of group i) mod r_i.
"""
from __future__ import annotations

import functools
import numbers
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from hilbert_lab.attention.validation import concrete

MODES = ("longnet", "head_groups")
# Upper bounds that keep the plan's int64 arithmetic exact. Segment lengths: positions, segment
# starts and counts (start + count * w, p // w * w + offset) stay far inside int64; a segment
# longer than the sequence (e.g. 1 << 40, "the whole sequence") is fine. Dilation rates: a rate is
# the step of a strided view, and step * row stride (H * D elements per token) must fit int64,
# which 2**32 keeps true for rows of up to 2**31 elements.
MAX_SEGMENT_LENGTH = 2**62
MAX_DILATION_RATE = 2**32


def is_selected(positions, segment_length: int, dilation_rate: int, offset: int):
    """The selection rule: bool mask (same type and shape as `positions`, numpy or torch) of the
    positions p selected by branch (w, r) for offset o, i.e. (p % w) % r == o."""
    return (positions % segment_length) % dilation_rate == offset


@dataclass(frozen=True)
class Group:
    """Heads that share one (branch, offset): their tokens are gathered together.

    heads: tuple of head indices, always an arithmetic progression (see `head_slice`). index:
    LongTensor (S, L) of original positions (S segments, L selected tokens per full segment,
    padded with -1 in a shorter last segment), built on first use (O(N / r) memory), so planning
    a long sequence needs no O(N) tensors.
    """

    branch: int
    offset: int
    heads: tuple[int, ...]
    segment_length: int  # effective segment length min(w_i, N)
    dilation_rate: int
    seq_len: int

    @property
    def head_slice(self) -> slice:
        """The heads as a slice (heads are always an arithmetic progression)."""
        step = self.heads[1] - self.heads[0] if len(self.heads) > 1 else 1
        return slice(self.heads[0], self.heads[-1] + 1, step)

    @functools.cached_property
    def index(self) -> torch.Tensor:
        """LongTensor (S, L): the group's original positions per segment, -1 past the sequence end."""
        w, r, offset = self.segment_length, self.dilation_rate, self.offset
        local = torch.arange(offset, max(w, offset), r, dtype=torch.int64)  # empty when offset >= w
        index = torch.arange(-(-self.seq_len // w), dtype=torch.int64)[:, None] * w + local[None, :]
        return torch.where(index < self.seq_len, index, torch.full_like(index, -1))


def _check_int_list(values, name: str, limit: int) -> tuple[int, ...]:
    if isinstance(values, (int, np.integer)) and not isinstance(values, bool):
        values = [values]
    if isinstance(values, np.ndarray) and values.ndim != 1:
        raise ValueError(f"{name} must be a non-empty list (or 1-D array) of positive integers, got a "
                         f"{values.ndim}-d array {values!r}")
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise ValueError(f"{name} must be a non-empty list of positive integers, got {values!r}")
    values = list(values)
    if not values:
        raise ValueError(f"{name} must be a non-empty list of positive integers, got []")
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"{name} must contain positive integers, got {value!r} in {values!r}")
        if int(value) <= 0:
            raise ValueError(f"{name} must contain positive integers (>= 1), got {int(value)} in {values!r}")
        if int(value) > limit:
            raise ValueError(f"{name} must contain integers <= 2**{limit.bit_length() - 1} = {limit} (int64 index "
                             f"arithmetic), got {int(value)} in {values!r}")
        out.append(concrete(int(value)))
    return tuple(out)


_CREATED: dict[tuple, "DilatedPattern"] = {}  # (class, plain arguments) -> the pattern DilatedPattern.create built


def _plain_values(values) -> tuple[int, ...] | None:
    if type(values) is int:
        return (values,)
    if type(values) in (list, tuple) and all(type(value) is int for value in values):
        return tuple(values)
    return None


def _plain_key(segment_lengths, dilation_rates, mode, causal) -> tuple | None:
    """The arguments of `DilatedPattern.create` as a key when all are plain Python values, else None."""
    lengths, rates = _plain_values(segment_lengths), _plain_values(dilation_rates)
    if lengths is None or rates is None or type(mode) is not str or type(causal) is not bool:
        return None
    return lengths, rates, mode, causal


@dataclass(frozen=True)
class DilatedPattern:
    """A validated dilated-attention pattern; build it with `DilatedPattern.create`."""

    segment_lengths: tuple[int, ...]
    dilation_rates: tuple[int, ...]
    mode: str = "longnet"
    causal: bool = False

    @classmethod
    def create(
        cls,
        segment_lengths: Sequence[int] | int,
        dilation_rates: Sequence[int] | int,
        mode: str = "longnet",
        causal: bool = False,
    ) -> "DilatedPattern":
        """Validate the arguments (ValueError naming the argument) and build the pattern. Plain arguments (ints or
        lists / tuples of ints, a str, a bool) are checked once: the same ones give the same pattern object."""
        key = _plain_key(segment_lengths, dilation_rates, mode, causal)
        if key is None or torch.compiler.is_compiling():  # symbolic values are guarded by _check_int_list
            return cls._validated(segment_lengths, dilation_rates, mode, causal)
        pattern = _CREATED.get((cls, *key))
        if pattern is None:
            if len(_CREATED) >= 1024:
                _CREATED.clear()
            pattern = _CREATED[(cls, *key)] = cls._validated(segment_lengths, dilation_rates, mode, causal)
        return pattern

    @classmethod
    def _validated(cls, segment_lengths, dilation_rates, mode: str, causal: bool) -> "DilatedPattern":
        segment_lengths = _check_int_list(segment_lengths, "segment_lengths", MAX_SEGMENT_LENGTH)
        dilation_rates = _check_int_list(dilation_rates, "dilation_rates", MAX_DILATION_RATE)
        if len(segment_lengths) != len(dilation_rates):
            raise ValueError(
                f"segment_lengths and dilation_rates must have the same length, got "
                f"{len(segment_lengths)} and {len(dilation_rates)}"
            )
        for w, r in zip(segment_lengths, dilation_rates):
            if r > w:
                raise ValueError(
                    f"dilation_rates must not exceed segment_lengths, got dilation {r} > segment {w}"
                )
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if not isinstance(causal, (bool, np.bool_)):
            raise ValueError(f"causal must be True or False, got {causal!r}")
        return cls(segment_lengths, dilation_rates, mode, bool(causal))

    @property
    def num_branches(self) -> int:
        return len(self.segment_lengths)

    def effective_segment(self, branch: int, seq_len: int) -> int:
        """Segment length of `branch` for a sequence of `seq_len` tokens: min(w_i, seq_len)."""
        _check_positive(seq_len, "seq_len")
        return min(self.segment_lengths[branch], seq_len)

    def head_offsets(self, num_heads: int) -> list[np.ndarray]:
        """Per branch an int64 array (H,): the head's offset, or -1 when the head is not in it."""
        return [a.copy() for a in _head_offsets(self, _check_positive(num_heads, "num_heads"))]

    def groups(self, seq_len: int, num_heads: int) -> list[Group]:
        """The (branch, offset) groups with their heads and (S, L) original-position index.

        Groups are listed by branch, then offset. Cached; do not modify the returned tensors.
        """
        return _groups(self, _check_positive(seq_len, "seq_len"), _check_positive(num_heads, "num_heads"))

    def multiplicity(self, seq_len: int, num_heads: int) -> torch.Tensor:
        """int64 (H, N, N): how many branches let query n attend key m (the softmax weight factor)."""
        n = _check_positive(seq_len, "seq_len")
        mult = torch.zeros(_check_positive(num_heads, "num_heads"), n, n, dtype=torch.int64)
        pos = torch.arange(n)
        for g in self.groups(n, num_heads):
            w = g.segment_length
            selected = is_selected(pos, w, g.dilation_rate, g.offset)
            allowed = selected[:, None] & selected[None, :] & ((pos // w)[:, None] == (pos // w)[None, :])
            if self.causal:
                allowed &= pos[None, :] <= pos[:, None]
            mult[list(g.heads)] += allowed.to(torch.int64)
        return mult

    def dense_mask(self, seq_len: int, num_heads: int) -> torch.Tensor:
        """bool (H, N, N): True where query n may attend key m in at least one branch."""
        return self.multiplicity(seq_len, num_heads) > 0


def _check_positive(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@functools.lru_cache(maxsize=256)
def _head_offsets(pattern: DilatedPattern, num_heads: int) -> tuple[np.ndarray, ...]:
    heads = np.arange(num_heads, dtype=np.int64)
    k = pattern.num_branches
    out = []
    if pattern.mode == "longnet":
        for r in pattern.dilation_rates:
            block = -(-num_heads // r)
            out.append(heads // block)
    else:
        base, extra = divmod(num_heads, k)
        sizes = [base + (1 if i < extra else 0) for i in range(k)]
        first = np.cumsum([0] + sizes[:-1])
        for i, r in enumerate(pattern.dilation_rates):
            offsets = np.full(num_heads, -1, dtype=np.int64)
            members = heads[first[i] : first[i] + sizes[i]]
            offsets[members] = (members - first[i]) % r
            out.append(offsets)
    for a in out:
        a.setflags(write=False)
    return tuple(out)


@functools.lru_cache(maxsize=256)
def _groups(pattern: DilatedPattern, seq_len: int, num_heads: int) -> list[Group]:
    groups = []
    for branch, offsets in enumerate(_head_offsets(pattern, num_heads)):
        w = pattern.effective_segment(branch, seq_len)
        r = pattern.dilation_rates[branch]
        for offset in sorted(set(offsets[offsets >= 0].tolist())):
            heads = tuple(int(h) for h in np.nonzero(offsets == offset)[0])
            groups.append(Group(branch, int(offset), heads, w, r, seq_len))
    return groups
