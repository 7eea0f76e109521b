"""The zigzag ring (causal load balance): the sequence is cut into 2P chunks of c = n / 2 tokens and rank i
holds chunks i and 2P-1-i, an early and a late one, so that every rank does the same causal work.

What this layout decides (branches.py and schedule.py ask it):
- runs: a member's positions are two runs, its early chunk then its late one (chunk ids order positions);
- classify: a branch whose effective segment w divides c is local; one whose w is m whole chunks with m
  dividing 2P is a ring over the ranks holding this rank's segments (the mirror image of a segment is a
  segment with the same holders, so these groups split the ranks; w == N: all ranks; a group of one rank
  holds its segment in storage order and is local); any other runs per segment (None): each segment
  crossing a piece border is a sub-ring of the ranks holding it (documents.py);
- routes: every packet visits every other member (a rotation), causal or not: every rank's late chunk
  attends every earlier rank's keys (the schedule passes over members that attend none of a packet's keys);
- join: the own packet is one causal call (early and late rows against early and late keys, masked by
  position order); a remote packet is one full call (an earlier rank's early chunk for both query chunks,
  or both chunks of a later rank for the late query chunk); other shapes fall back to one call per cell.
"""
from __future__ import annotations

import hilbert_lab.distributed.contiguous as contiguous
from hilbert_lab.distributed.contiguous import Call, Cells

NAME = "zigzag"


def runs(member: int, ring_size: int, shard_len: int) -> tuple[tuple[int, slice], ...]:
    """(chunk id, storage slice) of the member's two chunks."""
    chunk = shard_len // 2
    return (member, slice(0, chunk)), (2 * ring_size - 1 - member, slice(chunk, shard_len))


def classify(segment: int, ring_size: int, index: int, seq_len: int) -> tuple[bool, tuple[int, ...]] | None:
    """(local, members of this rank's ring) of a branch with effective segment length `segment`, on rank `index`
    of a ring of `ring_size` ranks holding `seq_len` tokens; None where segments cross chunk borders other than as
    m whole chunks with m dividing 2P (the ring then runs each crossing segment on its own)."""
    chunk, chunks = seq_len // ring_size // 2, 2 * ring_size
    if chunk % segment == 0:
        return True, (index,)
    whole = segment // chunk  # chunks per segment
    if segment % chunk or chunks % whole:
        return None
    first = (index // whole) * whole  # the segment of this rank's early chunk; its late chunk's is the mirror image
    members = tuple(sorted({min(c, chunks - 1 - c) for c in range(first, first + whole)}))
    return (True, (index,)) if members == (index,) else (False, members)


def routes(members: int, causal: bool) -> list[list[int]]:
    """holders[j]: every member, starting at j (a rotation)."""
    return [[(j + s) % members for s in range(members)] for j in range(members)]


_JOINED: list[tuple[Cells, Call]] = [
    ({(0, 0): "diagonal", (1, 0): "full", (1, 1): "diagonal"}, ((0, 1), (0, 1), True)),  # the own packet
    ({(0, 0): "full", (1, 0): "full"}, ((0, 1), (0,), False)),  # an earlier rank's early chunk
    ({(1, 0): "full", (1, 1): "full"}, ((1,), (0, 1), False)),  # a later rank's chunks, for the late rows
]


def join(cells: Cells) -> list[Call]:
    """The cells of one packet as one call where they form a rectangle of parts, else one call per cell."""
    for shape, call in _JOINED:
        if cells == shape:
            return [call]
    return contiguous.join(cells)
