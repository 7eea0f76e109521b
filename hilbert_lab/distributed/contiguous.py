"""The contiguous ring: rank i holds tokens [i n, (i+1) n) of N = n P; segments spanning ranks form sub-rings.

What this layout decides (branches.py and schedule.py ask it):
- runs: a member's positions are one run (chunk id = the member, so chunk ids order positions);
- classify: a branch whose effective segment w divides n is local (every segment inside one shard);
  one whose w is a multiple of n spans the w / n consecutive ranks of its segment (a sub-ring; the last
  one may be shorter); any other crosses shard borders inside its segments and runs per segment (None);
- routes: non-causal, every packet visits every other member of the sub-ring (a rotation); causal, a
  packet only travels forward along the chain, since earlier members mask later keys;
- join: one kernel call per (query run, key run) cell that attends.
"""
from __future__ import annotations

NAME = "contiguous"

Cells = dict[tuple[int, int], str]  # (query part, key part) -> "diagonal" (causal, same chunk) or "full"
Call = tuple[tuple[int, ...], tuple[int, ...], bool]  # (query parts, key parts, causal)


def runs(member: int, ring_size: int, shard_len: int) -> tuple[tuple[int, slice], ...]:
    """(chunk id, storage slice) of the member's contiguous runs of positions."""
    return ((member, slice(0, shard_len)),)


def classify(segment: int, ring_size: int, index: int, seq_len: int) -> tuple[bool, tuple[int, ...]] | None:
    """(local, members of this rank's sub-ring) of a branch with effective segment length `segment`, on rank
    `index` of a ring of `ring_size` ranks holding `seq_len` tokens; None where segments cross shard borders
    at other places than sub-ring edges (the ring then runs each crossing segment on its own)."""
    n, me = seq_len // ring_size, index
    if n % segment == 0:
        return True, (me,)
    if segment % n:
        return None
    per_segment = segment // n
    first = (me // per_segment) * per_segment
    return False, tuple(range(first, min(first + per_segment, ring_size)))


def routes(members: int, causal: bool) -> list[list[int]]:
    """holders[j]: the members that hold member j's packet, in hop order (j first)."""
    if causal:
        return [list(range(j, members)) for j in range(members)]
    return [[(j + s) % members for s in range(members)] for j in range(members)]


def join(cells: Cells) -> list[Call]:
    """One call per attending cell (a diagonal cell is one causal call)."""
    return [((qi,), (ki,), kind == "diagonal") for (qi, ki), kind in cells.items()]
