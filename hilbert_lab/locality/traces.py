"""Cache-line traces of the K/V reads of attention kernels under a token ordering (1D dilated, 2D/3D windows).

Model: tokens are stored in layout order (`x_layout = x[perm]`); K and V are two row-major arrays of
rows of head_dim * element_bytes bytes. A flash-style kernel walks query tiles of `tile_size`
consecutive layout slots; for each tile it loads the keys the tile's queries attend to, in ascending
layout order, in key tiles: K lines of the tile's rows, then V lines. With key_block=None the kernel
gathers exactly the needed rows (chunks of tile_size rows); with key_block=b it is block-sparse and
loads every b-row block holding at least one needed key. Which token attends to which never depends
on the ordering: the ordering only moves rows in memory. One head is traced: a tile slot whose query
this head does not compute (a dilated branch's other offsets) reads nothing, and a tile with no such
query is skipped. Q reads and O writes are left out (each row once, the same for every ordering).
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from hilbert_lab.attention import DilatedPattern, build_plan
from hilbert_lab.curves import grid_permutation
from hilbert_lab.curves.layouts import inverse_permutation, layout_permutation
from hilbert_lab.locality.validation import box_sides, grid_shape, positive_int

__all__ = [
    "AttentionGroups",
    "AttentionTrace",
    "attention_trace",
    "dilated_attention_trace",
    "dilated_groups",
    "grid_coordinates",
    "window_attention_trace",
    "window_groups",
]

@dataclass(frozen=True)
class AttentionGroups:
    """Which keys each query reads, in original token positions, as groups shared by queries.

    query_group: int64 (N,), the group of each query or -1 when it attends nothing.
    group_indptr: int64 (G+1,), group_members: int64 (nnz,): keys of group g are
    group_members[group_indptr[g]:group_indptr[g+1]].
    """

    num_tokens: int
    query_group: np.ndarray
    group_indptr: np.ndarray
    group_members: np.ndarray


@dataclass(frozen=True)
class AttentionTrace:
    """A line trace plus the counts behind it (rows needed vs rows loaded)."""

    lines: np.ndarray  # int64 cache-line ids in access order
    rows_needed: int  # sum over query tiles of distinct key rows the tile's queries need
    rows_loaded: int  # sum over query tiles of key rows loaded (> rows_needed for block-sparse)
    lines_per_row: float  # bytes per row / line bytes


def dilated_groups(seq_len: int, segment_length: int, dilation_rate: int, offset: int = 0) -> AttentionGroups:
    """One LongNet branch (w, r) for the head with `offset`, as the engine plans it: the tokens of a
    segment selected for `offset` (attention.pattern.is_selected) attend each other; a ragged last
    segment is its own group and a segment longer than seq_len is the whole sequence
    (hilbert_lab.attention.build_plan). Groups are numbered by segment, skipping segments that
    select nothing.

    ValueError for dilation_rate > segment_length (the engine's pattern refuses it) and for an offset
    outside [0, dilation_rate): the trace follows one head, and every head's offset is in that range.
    """
    seq_len = positive_int(seq_len, "seq_len")
    segment_length = positive_int(segment_length, "segment_length")
    dilation_rate = positive_int(dilation_rate, "dilation_rate")
    if dilation_rate > segment_length:
        raise ValueError(f"dilation_rate must not exceed segment_length={segment_length}, got {dilation_rate}")
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, (int, np.integer)) \
            or not 0 <= int(offset) < dilation_rate:
        raise ValueError(f"offset must be an integer in [0, dilation_rate={dilation_rate}), got {offset!r}")
    offset = int(offset)
    query_group = np.full(seq_len, -1, dtype=np.int64)
    rows = []
    if offset < seq_len:  # otherwise no segment selects anything (every position is < seq_len <= offset)
        # longnet with offset + 1 <= r heads: head j has offset j, so the last head is ours
        pattern = DilatedPattern.create([segment_length], [dilation_rate])
        plan = build_plan(pattern, seq_len, offset + 1)
        rows = [blk.positions().numpy() for blk in plan.blocks if blk.offset == offset]
    members = np.concatenate([r.reshape(-1) for r in rows]) if rows else np.zeros(0, dtype=np.int64)
    sizes = np.concatenate([np.full(r.shape[0], r.shape[1]) for r in rows]) if rows else np.zeros(0, dtype=np.int64)
    group_indptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    query_group[members] = np.repeat(np.arange(sizes.size, dtype=np.int64), sizes)
    return AttentionGroups(seq_len, query_group, group_indptr, members.astype(np.int64))


def window_groups(shape, window) -> AttentionGroups:
    """Every grid token attends the window x window (x window) box centred on it, clipped at borders.

    The box of a token at c covers c - window // 2 .. c + (window - 1) // 2 on every axis.
    """
    shape = grid_shape(shape)
    sides = box_sides(window, len(shape))
    grids = np.meshgrid(*[np.arange(side) for side in shape], indexing="ij")
    centres = np.stack([grid.reshape(-1) for grid in grids], axis=1)  # (N, ndim) row-major
    offsets = np.stack(
        np.meshgrid(*[np.arange(-(side // 2), (side - 1) // 2 + 1) for side in sides], indexing="ij"), axis=-1
    ).reshape(-1, len(shape))
    neighbours = centres[:, None, :] + offsets[None, :, :]  # (N, K, ndim)
    valid = np.all((neighbours >= 0) & (neighbours < np.array(shape)), axis=-1)
    flat = np.ravel_multi_index(tuple(np.clip(neighbours, 0, np.array(shape) - 1).transpose(2, 0, 1)), shape)
    group_members = flat[valid].astype(np.int64)  # row order keeps each query's keys together
    group_indptr = np.concatenate([[0], np.cumsum(valid.sum(axis=1))]).astype(np.int64)
    num_tokens = int(np.prod(shape))
    return AttentionGroups(num_tokens, np.arange(num_tokens, dtype=np.int64), group_indptr, group_members)


def grid_coordinates(shape, perm: np.ndarray) -> np.ndarray:
    """Coordinates (N, ndim) int64 of the token at each sequence slot (row-major flat ids in perm)."""
    shape = grid_shape(shape)
    return np.stack(np.unravel_index(np.asarray(perm, dtype=np.int64), shape), axis=1).astype(np.int64)


@numba.njit(cache=True, nogil=True)
def _tile_units(perm, inverse, query_group, indptr, members, tile_size, key_block, fill, unit_ptr, units):  # pragma: no cover
    """Per query tile, the sorted distinct key units (layout rows, or key blocks when key_block > 0).

    fill=False: write counts into unit_ptr[1:] and return the total; fill=True: write units.
    Also returns the number of distinct needed rows over all tiles.
    """
    num_tokens = perm.shape[0]
    num_tiles = (num_tokens + tile_size - 1) // tile_size
    group_stamp = np.full(indptr.shape[0] - 1, -1, dtype=np.int64)
    row_stamp = np.full(num_tokens, -1, dtype=np.int64)
    num_blocks = (num_tokens + key_block - 1) // key_block if key_block > 0 else 1
    block_stamp = np.full(num_blocks, -1, dtype=np.int64)
    total = 0
    rows_needed = 0
    for tile in range(num_tiles):
        start = unit_ptr[tile] if fill else 0
        count = 0
        for slot in range(tile * tile_size, min((tile + 1) * tile_size, num_tokens)):
            group = query_group[perm[slot]]
            if group < 0 or group_stamp[group] == tile:
                continue
            group_stamp[group] = tile
            for member_index in range(indptr[group], indptr[group + 1]):
                row = inverse[members[member_index]]
                if row_stamp[row] == tile:
                    continue
                row_stamp[row] = tile
                rows_needed += 1
                if key_block > 0:
                    block = row // key_block
                    if block_stamp[block] == tile:
                        continue
                    block_stamp[block] = tile
                    if fill:
                        units[start + count] = block
                else:
                    if fill:
                        units[start + count] = row
                count += 1
        if fill:
            units[start:start + count].sort()
        else:
            unit_ptr[tile + 1] = count
        total += count
    return total, rows_needed


@numba.njit(cache=True, nogil=True)
def _emit_lines(unit_ptr, units, num_tokens, tile_size, key_block, row_bytes, line_bytes, value_base, count_only, out):  # pragma: no cover
    """Expand units into K then V line ids per key tile; skip a line equal to the previous one."""
    written = 0
    rows_loaded = 0
    chunk_rows = np.empty(max(tile_size, key_block), dtype=np.int64)
    for tile in range(unit_ptr.shape[0] - 1):
        begin = unit_ptr[tile]
        end = unit_ptr[tile + 1]
        unit = begin
        while unit < end:
            # gather one key tile of rows
            num_rows = 0
            if key_block > 0:
                first = units[unit] * key_block
                for row in range(first, min(first + key_block, num_tokens)):
                    chunk_rows[num_rows] = row
                    num_rows += 1
                unit += 1
            else:
                while unit < end and num_rows < tile_size:
                    chunk_rows[num_rows] = units[unit]
                    num_rows += 1
                    unit += 1
            rows_loaded += num_rows
            for base in (0, value_base):
                last = -1
                for index in range(num_rows):
                    row = chunk_rows[index]
                    first_line = (row * row_bytes) // line_bytes
                    last_line = ((row + 1) * row_bytes - 1) // line_bytes
                    for line in range(first_line, last_line + 1):
                        if line + base == last:
                            continue
                        last = line + base
                        if not count_only:
                            out[written] = last
                        written += 1
    return written, rows_loaded


def attention_trace(
    groups: AttentionGroups,
    perm: np.ndarray,
    *,
    tile_size: int = 64,
    key_block: int | None = None,
    head_dim: int = 64,
    element_bytes: int = 2,
    line_bytes: int = 128,
) -> AttentionTrace:
    """Line trace of K/V reads of a flash-style kernel over `groups` stored in layout `perm`.

    perm (N,) int64: perm[slot] = original position stored at layout slot. K occupies lines from 0,
    V starts at the first line after K. Returns AttentionTrace (lines int64 in access order).
    """
    tile_size = positive_int(tile_size, "tile_size")
    head_dim = positive_int(head_dim, "head_dim")
    element_bytes = positive_int(element_bytes, "element_bytes")
    line_bytes = positive_int(line_bytes, "line_bytes")
    if key_block is not None:
        key_block = positive_int(key_block, "key_block")
    perm = np.ascontiguousarray(perm, dtype=np.int64)
    num_tokens = groups.num_tokens
    if perm.shape != (num_tokens,) or not np.array_equal(np.sort(perm), np.arange(num_tokens)):
        raise ValueError(f"perm must be a permutation of 0..{num_tokens - 1}")
    inverse = inverse_permutation(perm)
    num_tiles = -(-num_tokens // tile_size)
    unit_ptr = np.zeros(num_tiles + 1, dtype=np.int64)
    block = key_block or 0
    args = (perm, inverse, groups.query_group, groups.group_indptr, groups.group_members, tile_size, block)
    total, rows_needed = _tile_units(*args, False, unit_ptr, np.zeros(0, dtype=np.int64))
    np.cumsum(unit_ptr, out=unit_ptr)
    units = np.empty(total, dtype=np.int64)
    _tile_units(*args, True, unit_ptr, units)
    row_bytes = head_dim * element_bytes
    value_base = -(-num_tokens * row_bytes // line_bytes)
    emit = (unit_ptr, units, num_tokens, tile_size, block, row_bytes, line_bytes, value_base)
    count, _ = _emit_lines(*emit, True, np.zeros(0, dtype=np.int64))
    lines = np.empty(count, dtype=np.int64)
    _, rows_loaded = _emit_lines(*emit, False, lines)
    return AttentionTrace(lines, int(rows_needed), int(rows_loaded), row_bytes / line_bytes)


def dilated_attention_trace(
    seq_len: int,
    segment_length: int,
    dilation_rate: int,
    ordering: str,
    *,
    offset: int = 0,
    tile_size: int = 64,
    key_block: int | None = None,
    head_dim: int = 64,
    element_bytes: int = 2,
    line_bytes: int = 128,
) -> AttentionTrace:
    """K/V line trace of one head of one dilated branch stored in the 1D layout
    hilbert_lab.curves.layout_permutation(seq_len, segment_length, ordering, dilation_rate=dilation_rate)
    (ordering in hilbert_lab.curves.LAYOUTS)."""
    groups = dilated_groups(seq_len, segment_length, dilation_rate, offset)
    perm = layout_permutation(seq_len, segment_length, ordering, dilation_rate=dilation_rate)[0].numpy()
    return attention_trace(groups, perm, tile_size=tile_size, key_block=key_block, head_dim=head_dim,
                           element_bytes=element_bytes, line_bytes=line_bytes)


def window_attention_trace(
    shape,
    window: int,
    ordering: str,
    *,
    tile_size: int = 64,
    key_block: int | None = None,
    head_dim: int = 64,
    element_bytes: int = 2,
    line_bytes: int = 128,
) -> AttentionTrace:
    """K/V line trace of window (neighbourhood) attention on a 2D/3D grid serialised by `ordering`
    (hilbert_lab.curves.grid_permutation)."""
    groups = window_groups(shape, window)
    perm, _ = grid_permutation(grid_shape(shape), ordering)
    return attention_trace(groups, perm, tile_size=tile_size, key_block=key_block, head_dim=head_dim,
                           element_bytes=element_bytes, line_bytes=line_bytes)
