"""The one plan of a dilated pattern: which tokens of which heads form each attention block.

A plan turns (pattern, key length N, heads H[, key/value heads, queries]) into blocks. A block is one
(branch, offset, head slice) group over a run of equal segments: key j of segment s is the original
position `start + s * seg + offset + j * step`, read from a (B, N, H_kv, D) tensor as the strided view
(B, count, L, h_kv, D) (no copy). Queries and keys have their own geometry:
- queries may be fewer than keys (decoding): the queries are the last `query_len` positions, query
  row i is position N - query_len + i, and a block's queries are the last `queries` of its selected
  tokens per segment (causal attention is then bottom-right aligned inside the block);
- several query heads may read one key/value head (grouped-query attention): `kv_heads` is the block's
  slice of key/value heads;
- documents of a packed row restart the pattern: blocks of each document start at its offset;
- the heads may be a run of a larger layer's heads (head-parallel ranks): `global_heads` (start, total)
  says that local head j is global head start + j, whose offsets (pattern.head_offsets(total)) it keeps.
The ragged last segment is its own block; a segment longer than N is clipped to N. The engine, the
ring, the memory estimate and the locality traces all read this plan.

The selection rule of the whole library, `is_selected` (position p is selected in a branch (w, r)
for offset o iff `(p % w) % r == o`), lives in attention.pattern and is exported here too.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Optional

import torch

from hilbert_lab.attention.pattern import DilatedPattern, is_selected
from hilbert_lab.kernels.beside import Beside
from hilbert_lab.kernels.triton_fill import FILL_DTYPES, fill_unselected, head_table
from hilbert_lab.kernels.triton_support import runs_on

IDENTITY_ORDERINGS = (None, "identity")
__all__ = ["IDENTITY_ORDERINGS", "Block", "Plan", "build_plan", "cached_plan", "is_selected", "kv_split",
           "local_offsets"]


def _count(heads: slice) -> int:
    return len(range(heads.start, heads.stop, heads.step or 1))


@dataclass(frozen=True)
class Block:
    """Segments [start, start + count * seg) of one (branch, offset) group.

    Key j of segment s is original position start + s * seg + offset + j * step (j < length); its
    queries are the last `queries` of those positions (all of them unless queries sit only at the end
    of the sequence). heads: the query heads; kv_heads: the key/value heads they read (equal to heads
    without grouped-query attention; otherwise each kv head serves `heads / kv_heads` consecutive query
    heads of the slice).
    """

    branch: int
    heads: slice
    start: int
    count: int
    seg: int
    offset: int
    step: int
    length: int
    kv_heads: Optional[slice] = None
    queries: Optional[int] = None

    def __hash__(self) -> int:  # slices are unhashable before Python 3.12
        kv = self.key_heads
        return hash((self.branch, self.heads.start, self.heads.stop, self.heads.step, self.start, self.count, self.seg,
                     self.offset, self.step, self.length, kv.start, kv.stop, kv.step, self.num_queries))

    @property
    def num_heads(self) -> int:
        return _count(self.heads)

    @property
    def key_heads(self) -> slice:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def num_kv_heads(self) -> int:
        return _count(self.key_heads)

    @property
    def num_queries(self) -> int:
        return self.length if self.queries is None else self.queries

    @property
    def bottom_right(self) -> bool:
        """Whether the queries are fewer than the keys (causal masks then align at the bottom right)."""
        return self.num_queries < self.length

    def positions(self) -> torch.Tensor:
        """int64 (count, L): the original positions of the block's keys."""
        local = torch.arange(self.offset, self.offset + self.length * self.step, self.step)
        return self.start + torch.arange(self.count)[:, None] * self.seg + local[None, :]

    def query_positions(self) -> torch.Tensor:
        """int64 (count, Lq): the original positions of the block's queries."""
        return self.positions()[:, self.length - self.num_queries:]

    def pairs(self, causal: bool) -> int:
        """Query-key pairs the block computes per batch element and query head."""
        lq, lk = self.num_queries, self.length
        if not causal:
            return self.count * lq * lk
        return self.count * (lq * (lk - lq) + lq * (lq + 1) // 2)

    def view(self, x: torch.Tensor, role: str = "key", query_start: int = 0) -> torch.Tensor:
        """The block of x as a strided view (B, count, L, h, *rest); no copy.

        role "key": x is (B, N, H_kv, *rest) (keys, values); "query": x is (B, Nq, H, *rest) whose row
        0 is position query_start (queries, outputs, their gradients)."""
        return x.as_strided(*self.geometry(x.shape, x.stride(), x.storage_offset(), role, query_start))

    def read(self, x: torch.Tensor, role: str = "key", query_start: int = 0) -> torch.Tensor:
        """The block of x as (B * count, L, h, *rest): a view where batch and segments fold, else a copy."""
        view = self.view(x, role, query_start)
        return view.flatten(0, 1) if view.shape[0] == 1 or view.shape[1] == 1 else view.reshape(-1, *view.shape[2:])

    def geometry(self, shape, stride, storage_offset: int, role: str = "key",
                 query_start: int = 0) -> tuple[tuple[int, ...], tuple[int, ...], int]:
        """(size, stride, storage offset) of the block's view (B, count, L, h, *rest) of a tensor."""
        s_b, s_n, s_h, *rest = stride
        if role == "query":
            heads, length = self.heads, self.num_queries
            first = self.start + self.offset + (self.length - length) * self.step - query_start
        else:
            heads, length, first = self.key_heads, self.length, self.start + self.offset
        size = (shape[0], self.count, length, _count(heads), *shape[3:])
        strides = (s_b, self.seg * s_n, self.step * s_n, (heads.step or 1) * s_h, *rest)
        return size, strides, storage_offset + first * s_n + heads.start * s_h


@dataclass(frozen=True)
class Plan:
    """Blocks of a (pattern, sequence, heads) plus the geometry they were planned for.

    merge: some (query position, head) is computed by more than one branch, so branch results are merged
    by their LSEs; otherwise every (query position, head) belongs to at most one block (head_groups mode,
    or a single branch) and blocks write their results in place. covered: every (query row, head) lies in
    some block (else the output's uncovered rows must read 0 and their LSE -inf). first_branch: a branch
    whose blocks cover every (position, head), or None: its gradient shares are written where other branches'
    add, so an executor stores all of its shares (every document's) before any other branch's. Its blocks
    need not come first in `blocks` (a packed row's first document may have no block of a lower branch whose
    offsets start past it). kv_shared: some key/value head is read by blocks of several branches
    (grouped-query heads across head groups), so its gradient shares add up even without a merge.
    unselected: where each head is in at most one branch (one document, every query), per head (w, r, o): the
    positions p with (p % w) % r != o are the ones no block writes (clear_unselected).
    """

    blocks: tuple[Block, ...]
    num_branches: int
    merge: bool
    seq_len: int
    num_heads: int
    pattern: Optional[DilatedPattern] = None
    branches: Optional[tuple[int, ...]] = None
    num_kv_heads: Optional[int] = None
    query_len: Optional[int] = None
    covered: bool = False
    first_branch: Optional[int] = None
    kv_shared: bool = False
    unselected: Optional[tuple[tuple[int, int, int], ...]] = None
    global_heads: Optional[tuple[int, int]] = None

    def head_offsets(self) -> list:
        """Per branch an int64 array (H,) of the plan's heads: the head's offset, -1 when not in the branch
        (the global heads' offsets for a plan of a run of heads)."""
        return local_offsets(self.pattern, self.num_heads, self.global_heads)

    def clear_unselected(self, x: torch.Tensor, value: float = 0.0, *,
                         beside: Optional[Beside] = None) -> torch.Tensor:
        """Fill at least the entries of x (B, N, H, *rest) that no block writes with `value` and return x.
        Where the plan knows them (`unselected`: per head (w, r, o), the positions p with (p % w) % r != o), one
        Triton launch writes exactly those where it runs (kernels.triton_fill), `beside` the blocks' calls where
        given (kernels.beside: its caller joins it before reading x); elsewhere the heads with any such position are
        filled whole (the blocks write theirs afterwards). Else all of x."""
        if self.unselected is None:
            return x.fill_(value)
        if runs_on(x.device) and x.dim() == 4 and x.shape[2] == len(self.unselected) and x.stride(-1) == 1 \
                and x.dtype in FILL_DTYPES:
            table = head_table(self.unselected, x.device)
            if beside is not None:
                return beside.run(fill_unselected, x, table, value)
            return fill_unselected(x, table, value)
        for heads in _cleared_head_runs(self.unselected):
            x[:, :, heads].fill_(value)
        return x

    @property
    def causal(self) -> bool:
        return bool(self.pattern is not None and self.pattern.causal)

    @property
    def kv_heads(self) -> int:
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def queries(self) -> int:
        return self.seq_len if self.query_len is None else self.query_len

    @property
    def query_start(self) -> int:
        """Position of query row 0 (queries sit at the end of the sequence)."""
        return self.seq_len - self.queries

    def pairs(self, causal: bool) -> int:
        """Query-key pairs the plan computes per batch element (all heads and branches)."""
        return sum(b.pairs(causal) * b.num_heads for b in self.blocks)


def build_plan(pattern: DilatedPattern, seq_len: int, num_heads: int,
               branches: Optional[tuple[int, ...]] = None, *, num_kv_heads: Optional[int] = None,
               documents: Optional[tuple[tuple[int, int], ...]] = None, query_len: Optional[int] = None,
               global_heads: Optional[tuple[int, int]] = None) -> Plan:
    """The blocks of `pattern` for N = seq_len key positions and H = num_heads query heads.

    branches: plan only these branches (the others contribute no block; `merge` then says whether the
    planned ones overlap), e.g. the branches whose segments lie inside one rank's shard of a ring.
    num_kv_heads: key/value heads H_kv (H % H_kv == 0); query head h reads key/value head h // (H / H_kv).
    documents: ((start, length), ...) covering the row in order: each is planned as its own sequence
    (positions, segments, dilation offsets and causality restart at its start; its last segment is
    ragged; a segment longer than the document is the document); default one document of N tokens.
    query_len: the queries are the last query_len positions (default N); segments before them carry no
    block, and the segment where they begin is its own block with fewer queries than keys.
    global_heads: (start, total): the H heads are the heads [start, start + H) of a layer of `total` heads and
    keep their offsets (a head-parallel rank's share); num_kv_heads then counts the local key/value heads.
    """
    first_head, total = (0, num_heads) if global_heads is None else global_heads
    kv = num_heads if num_kv_heads is None else num_kv_heads
    documents = ((0, seq_len),) if documents is None else tuple(documents)
    query_start = 0 if query_len is None else seq_len - query_len
    blocks = []
    branches_per_head = [0] * num_heads
    kv_readers: dict[int, set[int]] = {}
    counted = set()
    for doc_start, doc_len in documents:
        for group in pattern.groups(doc_len, total):
            if branches is not None and group.branch not in branches:
                continue
            local = tuple(h - first_head for h in group.heads if first_head <= h < first_head + num_heads)
            if not local:
                continue
            if (group.branch, group.offset) not in counted:
                counted.add((group.branch, group.offset))
                for h in local:
                    branches_per_head[h] += 1
            seg, step, offset = group.segment_length, group.dilation_rate, group.offset  # seg = min(w, doc)
            full = doc_len // seg
            parts = [(0, full, seg)] if full else []
            if doc_len - full * seg:
                parts.append((full * seg, 1, doc_len - full * seg))
            for start, count, length in parts:
                selected = len(range(offset, length, step))
                if selected == 0:
                    continue
                for heads, kv_heads in kv_split(local, num_heads, kv):
                    for kv_head in range(kv_heads.start, kv_heads.stop, kv_heads.step):
                        kv_readers.setdefault(kv_head, set()).add(group.branch)
                    kv_slice = None if kv == num_heads else kv_heads
                    blocks.extend(_with_queries(Block(group.branch, heads, doc_start + start, count, length, offset,
                                                      step, selected, kv_slice), query_start))
    # Coverage (every query row and every key written) holds only when the queries are all positions.
    offsets = local_offsets(pattern, num_heads, global_heads)
    covered = query_start == 0 and _covers(pattern, offsets, branches)
    first = blocks[0].branch if blocks and query_start == 0 else None
    if first is not None and not _covers(pattern, offsets, (first,)):
        first = None
    kv_shared = any(len(readers) > 1 for readers in kv_readers.values())
    unselected = None
    if len(documents) == 1 and query_start == 0 and kv == num_heads and max(branches_per_head) <= 1:
        unselected = _unselected(pattern, offsets, branches)
    return Plan(tuple(blocks), pattern.num_branches, max(branches_per_head) > 1, seq_len, num_heads, pattern,
                None if branches is None else tuple(branches), None if num_kv_heads is None else kv, query_len,
                covered=covered, first_branch=first, kv_shared=kv_shared, unselected=unselected,
                global_heads=global_heads)


def local_offsets(pattern: DilatedPattern, num_heads: int, global_heads: Optional[tuple[int, int]] = None) -> list:
    """Per branch an int64 array (num_heads,): the offsets of the heads [start, start + num_heads) of a layer of
    `total` heads (global_heads (start, total); None: the num_heads heads themselves)."""
    if global_heads is None:
        return pattern.head_offsets(num_heads)
    start, total = global_heads
    return [offsets[start: start + num_heads] for offsets in pattern.head_offsets(total)]


def _covers(pattern: DilatedPattern, offsets: list, branches: Optional[tuple[int, ...]]) -> bool:
    """Whether every (position, head) is selected by some planned branch: a branch with dilation 1 selects
    every position of the heads in it (offsets: per branch, each planned head's offset or -1)."""
    num_heads = len(offsets[0])
    covered = [False] * num_heads
    for branch, r in enumerate(pattern.dilation_rates):
        if branches is not None and branch not in branches:
            continue
        for h in range(num_heads):
            if offsets[branch][h] >= 0 and r == 1:
                covered[h] = True
    return all(covered)


_EVERY_POSITION = (1, 1, 0)  # a head's (w, r, o) row when its blocks write every position
_INT32_MAX = 2 ** 31 - 1


def _unselected(pattern: DilatedPattern, offsets: list,
                branches: Optional[tuple[int, ...]]) -> tuple[tuple[int, int, int], ...]:
    """Where each head is in at most one planned branch: per head the (w, r, o) whose positions p with
    (p % w) % r != o no block writes: its branch's segment length, dilation rate and offset; (1, 1, 0) for a head of
    a branch with dilation 1 and (1, 1, -1) for a head in no planned branch. A segment longer than 2^31 - 1 is given
    as that (the same for every p < N; rows that hold no N keep one device table per pattern)."""
    num_heads = len(offsets[0])
    rows = [(1, 1, -1)] * num_heads
    for branch, heads_offsets in enumerate(offsets):
        if branches is not None and branch not in branches:
            continue
        rate = pattern.dilation_rates[branch]
        for h in (heads_offsets >= 0).nonzero()[0]:
            rows[int(h)] = _EVERY_POSITION if rate == 1 else \
                (min(pattern.segment_lengths[branch], _INT32_MAX), rate, int(heads_offsets[h]))
    return tuple(rows)


@functools.lru_cache(maxsize=256)
def _cleared_head_runs(rows: tuple[tuple[int, int, int], ...]) -> tuple[slice, ...]:
    """The heads of `unselected` rows with any position no block writes, as slices of consecutive heads."""
    runs: list[list[int]] = []
    for h, row in enumerate(rows):
        if row == _EVERY_POSITION:
            continue
        if runs and runs[-1][1] == h:
            runs[-1][1] = h + 1
        else:
            runs.append([h, h + 1])
    return tuple(slice(a, b) for a, b in runs)


def kv_split(heads: tuple[int, ...], num_heads: int, kv_heads: int) -> list[tuple[slice, slice]]:
    """The group's query heads (an arithmetic progression) with the key/value heads they read, as
    (query heads, kv heads) slices a grouped-query kernel call takes (call head j reads kv head
    j // (h / h_kv)); split per kv head where the group's heads do not line up with the kv groups."""
    per_kv = num_heads // kv_heads
    kvs = [h // per_kv for h in heads]
    runs = [(kv, sum(1 for x in kvs if x == kv)) for kv in dict.fromkeys(kvs)]
    size = runs[0][1]
    steps = {b[0] - a[0] for a, b in zip(runs, runs[1:])}
    consecutive = all(kvs[i] == runs[i // size][0] for i in range(len(kvs))) if all(n == size for _, n in runs) else False
    if consecutive and len(steps) <= 1 and (not steps or steps.pop() > 0):
        step = runs[1][0] - runs[0][0] if len(runs) > 1 else 1
        return [(_slice(heads), slice(runs[0][0], runs[-1][0] + 1, step))]
    out = []
    for kv, _ in runs:
        members = tuple(h for h, x in zip(heads, kvs) if x == kv)
        out.append((_slice(members), slice(kv, kv + 1, 1)))
    return out


def _slice(heads: tuple[int, ...]) -> slice:
    step = heads[1] - heads[0] if len(heads) > 1 else 1
    return slice(heads[0], heads[-1] + 1, step)


def _with_queries(block: Block, query_start: int) -> list[Block]:
    """The block restricted to queries at positions >= query_start: segments before them dropped, the
    segment where they begin its own block whose queries are its last selected tokens."""
    if query_start <= block.start:
        return [block]
    first = block.start + block.offset  # position of token 0 of segment 0
    before = min(block.count, max(0, (query_start - first) // block.seg))  # segments wholly before the queries
    out = []
    for s in range(before, block.count):
        seg_first = first + s * block.seg
        if seg_first >= query_start:
            out.append(replace(block, start=block.start + s * block.seg, count=block.count - s))
            break
        skipped = -(-(query_start - seg_first) // block.step)  # selected tokens before the first query
        if skipped < block.length:
            out.append(replace(block, start=block.start + s * block.seg, count=1, queries=block.length - skipped))
    return out


@torch.compiler.disable  # planning is Python/numpy work: keep it out of compiled graphs
@functools.lru_cache(maxsize=128)
def cached_plan(pattern: DilatedPattern, seq_len: int, num_heads: int,
                branches: Optional[tuple[int, ...]] = None, *, num_kv_heads: Optional[int] = None,
                documents: Optional[tuple[tuple[int, int], ...]] = None, query_len: Optional[int] = None,
                global_heads: Optional[tuple[int, int]] = None) -> Plan:
    """`build_plan`, cached per arguments."""
    return build_plan(pattern, seq_len, num_heads, None if branches is None else tuple(branches),
                      num_kv_heads=num_kv_heads, documents=documents, query_len=query_len, global_heads=global_heads)
