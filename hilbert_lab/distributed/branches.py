"""Which branches of a dilated pattern a ring computes inside each shard and which around a sub-ring.

`RingLayout` is the geometry: P ranks hold equal shards of n = N / P tokens, laid out by a ring algorithm
(`ALGORITHMS`: contiguous.py, zigzag.py), which also says how a member's positions form runs. Per branch
(effective segment w = min(w_i, N)) the algorithm classifies:
- local: every segment lies inside one shard; the branch runs as the engine runs it on the shard (the job's
  local part) and sends nothing;
- ring: the members of this rank's sub-ring, the ranks sharing its segment; the branch is one job part
  whose steps move keys and values between them (steps.py);
- per segment: segments cross shard borders at places that no sub-ring of the layout follows (e.g. w = 1.5 n,
  or zigzag's w = 3c on 4 ranks); the ring splits the branch per segment as it splits a packed row (documents.py):
  segments inside a piece join the local part, each crossing one is a sub-ring of the ranks holding it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

import hilbert_lab.distributed.contiguous as contiguous
import hilbert_lab.distributed.zigzag as zigzag
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import kv_split, local_offsets
from hilbert_lab.distributed.sharding import shard_positions

ALGORITHMS = {contiguous.NAME: contiguous, zigzag.NAME: zigzag}


@dataclass(frozen=True)
class RingLayout:
    """Geometry of the sharded sequence: ring size P, this rank's index in the ring, N and the layout."""

    ring_size: int
    index: int
    seq_len: int
    layout: str

    @property
    def shard_len(self) -> int:
        return self.seq_len // self.ring_size

    @property
    def algorithm(self):
        return ALGORITHMS[self.layout]

    def positions(self, member: int) -> torch.Tensor:
        """int64 (n,): the global positions member `member` holds, in storage order."""
        return shard_positions(member, self.ring_size, self.seq_len, self.layout)

    def runs(self, member: int) -> tuple[tuple[int, slice], ...]:
        """(chunk id, storage slice) of the member's contiguous runs; chunk ids order positions."""
        return self.algorithm.runs(member, self.ring_size, self.shard_len)


@dataclass(frozen=True)
class HeadGroup:
    """Heads of one branch that share a dilation offset (an arithmetic progression of head indices)."""

    offset: int
    head_indices: tuple[int, ...]
    kv_indices: Optional[tuple[int, ...]] = None  # the key/value heads they read (None: the same heads)

    @property
    def heads(self) -> slice:
        return _as_slice(self.head_indices)

    @property
    def num_heads(self) -> int:
        return len(self.head_indices)

    @property
    def kv_heads(self) -> slice:
        """The key/value heads of the group's calls: query head j of the group reads kv head j // (h / h_kv)."""
        return self.heads if self.kv_indices is None else _as_slice(self.kv_indices)

    @property
    def num_kv_heads(self) -> int:
        return self.num_heads if self.kv_indices is None else len(self.kv_indices)


def _as_slice(indices: tuple[int, ...]) -> slice:
    step = indices[1] - indices[0] if len(indices) > 1 else 1
    return slice(indices[0], indices[-1] + 1, step)


@dataclass(frozen=True)
class RingBranch:
    """How one branch runs on this rank: inside the shard (local), or around the sub-ring `members`.

    span: None (the branch's segments are aligned at position 0), or the positions [a, b) of one segment
    of a packed row's document crossing a shard border (documents.py): its members select the positions
    p of [a, b) with (p - a) % r == offset."""

    branch: int
    segment_length: int  # effective: min(w, N); a span's: b - a
    dilation_rate: int
    groups: tuple[HeadGroup, ...]
    members: tuple[int, ...]  # ring indices sharing this rank's segments; (me,) when local; () per segment
    local: bool
    span: Optional[tuple[int, int]] = None
    per_segment: bool = False  # its segments cross shard borders off the layout's sub-rings (split per segment)


def head_groups(pattern: DilatedPattern, branch: int, num_heads: int, num_kv_heads: Optional[int] = None,
                global_heads: Optional[tuple[int, int]] = None) -> tuple[HeadGroup, ...]:
    """The branch's heads grouped by offset, offsets ascending. With fewer key/value heads (num_kv_heads),
    a group whose heads do not line up with the kv heads is split as the plan splits it (attention.plan.
    kv_split), so that every group's query heads read its kv heads evenly. global_heads (start, total): the
    heads are a run of a layer's heads and keep the global heads' offsets (attention.plan.local_offsets)."""
    offsets = local_offsets(pattern, num_heads, global_heads)[branch]
    groups = []
    for offset in sorted({int(o) for o in offsets[offsets >= 0]}):
        heads = tuple(int(h) for h in (offsets == offset).nonzero()[0])
        if num_kv_heads is None or num_kv_heads == num_heads:
            groups.append(HeadGroup(offset, heads))
            continue
        for query, kv in kv_split(heads, num_heads, num_kv_heads):
            groups.append(HeadGroup(offset, tuple(range(query.start, query.stop, query.step or 1)),
                                    tuple(range(kv.start, kv.stop, kv.step or 1))))
    return tuple(groups)


def plan_branches(pattern: DilatedPattern, geometry: RingLayout, num_heads: int, num_kv_heads: Optional[int] = None,
                  global_heads: Optional[tuple[int, int]] = None) -> list[RingBranch]:
    """Per branch: local, ring (and its sub-ring), or per segment (see the module docstring)."""
    plans = []
    for branch, (requested, rate) in enumerate(zip(pattern.segment_lengths, pattern.dilation_rates)):
        segment = min(requested, geometry.seq_len)
        found = geometry.algorithm.classify(segment, geometry.ring_size, geometry.index, geometry.seq_len)
        local, members = found if found is not None else (False, ())
        groups = head_groups(pattern, branch, num_heads, num_kv_heads, global_heads)
        plans.append(RingBranch(branch, segment, rate, groups, members, local, per_segment=found is None))
    return plans
