"""Locality metrics of a token ordering: steps, box clustering, lines per box, compactness, stretch, tile density.

Grid metrics take `coords` (N, ndim) int64: the grid coordinates of the token at each sequence slot
(see traces.grid_coordinates), and the grid `shape`. 2D grids are handled as 3D grids of depth 1.
"""
from __future__ import annotations

import numba
import numpy as np

from hilbert_lab.curves.layouts import inverse_permutation
from hilbert_lab.locality.traces import AttentionGroups
from hilbert_lab.locality.validation import box_sides, grid_shape, positive_int

__all__ = [
    "box_clustering_numbers",
    "blocks_touched_per_box",
    "segment_compactness",
    "step_distances",
    "worst_case_stretch",
    "mask_tile_density",
    "tile_density",
    "STRETCH_MAX_TOKENS",
]

STRETCH_MAX_TOKENS = 1 << 14  # exact all-pairs stretch is O(N^2)


def _coords_for(shape, coords) -> tuple[tuple[int, int, int], np.ndarray, np.ndarray]:
    """Validate coords against shape; return 3D shape, 3D coords (N, 3) and index grid (T, H, W)."""
    shape = grid_shape(shape)
    coords = np.asarray(coords, dtype=np.int64)
    num_tokens = int(np.prod(shape))
    if coords.shape != (num_tokens, len(shape)):
        raise ValueError(f"coords must have shape ({num_tokens}, {len(shape)}) for grid {shape}, got {coords.shape}")
    if len(shape) == 2:
        shape3 = (1, shape[0], shape[1])
        coords3 = np.concatenate([np.zeros((num_tokens, 1), dtype=np.int64), coords], axis=1)
    else:
        shape3 = shape
        coords3 = coords
    if coords3.min() < 0 or np.any(coords3.max(axis=0) >= np.array(shape3)):
        raise ValueError(f"coords must lie inside the grid {shape}")
    index_grid = np.full(shape3, -1, dtype=np.int64)
    index_grid[coords3[:, 0], coords3[:, 1], coords3[:, 2]] = np.arange(num_tokens)
    if np.any(index_grid < 0):
        raise ValueError("coords must visit every grid cell exactly once")
    return shape3, np.ascontiguousarray(coords3), index_grid


def step_distances(coords) -> np.ndarray:
    """Euclidean distance between consecutive tokens of the sequence, float64 (N-1,)."""
    coords = np.asarray(coords, dtype=np.float64)
    if coords.ndim != 2 or coords.shape[0] < 1:
        raise ValueError(f"coords must be a (N, ndim) array with N >= 1, got shape {coords.shape}")
    return np.sqrt(np.sum(np.diff(coords, axis=0) ** 2, axis=1))


def _box3(shape, box) -> tuple[int, int, int]:
    sides = box_sides(box, len(grid_shape(shape)))
    if any(side > limit for side, limit in zip(sides, grid_shape(shape))):
        raise ValueError(f"box must fit in the grid {tuple(shape)}, got {box!r}")
    return (1, sides[0], sides[1]) if len(sides) == 2 else sides


@numba.njit(cache=True, nogil=True)
def _clustering(coords3, index_grid, box_t, box_h, box_w):  # pragma: no cover - numba
    size_t, size_h, size_w = index_grid.shape
    out = np.zeros((size_t - box_t + 1, size_h - box_h + 1, size_w - box_w + 1), dtype=np.int64)
    for t0 in range(out.shape[0]):
        for h0 in range(out.shape[1]):
            for w0 in range(out.shape[2]):
                clusters = 0
                for t in range(t0, t0 + box_t):
                    for h in range(h0, h0 + box_h):
                        for w in range(w0, w0 + box_w):
                            index = index_grid[t, h, w]
                            if index == 0:
                                clusters += 1
                                continue
                            pt = coords3[index - 1, 0]
                            ph = coords3[index - 1, 1]
                            pw = coords3[index - 1, 2]
                            inside = (t0 <= pt < t0 + box_t) and (h0 <= ph < h0 + box_h) and (w0 <= pw < w0 + box_w)
                            if not inside:
                                clusters += 1
                out[t0, h0, w0] = clusters
    return out


def box_clustering_numbers(shape, coords, box) -> np.ndarray:
    """Clustering number (count of maximal runs of consecutive indices) of every box position.

    box: int k (k x k or k x k x k) or a tuple of sides. Returns int64 array with one entry per box
    position (stride 1), flattened.
    """
    shape3, coords3, index_grid = _coords_for(shape, coords)
    box_t, box_h, box_w = _box3(shape, box)
    return _clustering(coords3, index_grid, box_t, box_h, box_w).reshape(-1)


@numba.njit(cache=True, nogil=True)
def _blocks_touched(index_grid, box_t, box_h, box_w, block_size):  # pragma: no cover - numba
    size_t, size_h, size_w = index_grid.shape
    out = np.zeros((size_t - box_t + 1, size_h - box_h + 1, size_w - box_w + 1), dtype=np.int64)
    stamp = np.full((size_t * size_h * size_w + block_size - 1) // block_size, -1, dtype=np.int64)
    box_id = 0
    for t0 in range(out.shape[0]):
        for h0 in range(out.shape[1]):
            for w0 in range(out.shape[2]):
                count = 0
                for t in range(t0, t0 + box_t):
                    for h in range(h0, h0 + box_h):
                        for w in range(w0, w0 + box_w):
                            block = index_grid[t, h, w] // block_size
                            if stamp[block] != box_id:
                                stamp[block] = box_id
                                count += 1
                out[t0, h0, w0] = count
                box_id += 1
    return out


def blocks_touched_per_box(shape, coords, box, block_size: int) -> np.ndarray:
    """Distinct aligned blocks of `block_size` consecutive sequence slots touched by every box.

    block_size = rows per cache line gives cache lines per box (line_bytes // row_bytes rows per
    line); block_size = kernel tile size gives tiles per box. int64, one entry per box position.
    """
    block_size = positive_int(block_size, "block_size")
    shape3, _, index_grid = _coords_for(shape, coords)
    box_t, box_h, box_w = _box3(shape, box)
    return _blocks_touched(index_grid, box_t, box_h, box_w, block_size).reshape(-1)


def segment_compactness(shape, coords, segment_length: int, *, shift: int = 0) -> float:
    """Share of grid-neighbour pairs (axis-adjacent cells) whose sequence slots share a segment.

    Segments are [s*w - shift, (s+1)*w - shift): shift=0 aligned, shift=w//2 shifted by half.
    """
    segment_length = positive_int(segment_length, "segment_length")
    if not 0 <= int(shift) < segment_length:
        raise ValueError(f"shift must be in [0, segment_length={segment_length}), got {shift}")
    _, _, index_grid = _coords_for(shape, coords)
    segment = (index_grid + int(shift)) // segment_length
    same = 0
    pairs = 0
    for axis in range(3):
        if index_grid.shape[axis] < 2:
            continue
        first = np.take(segment, np.arange(index_grid.shape[axis] - 1), axis=axis)
        second = np.take(segment, np.arange(1, index_grid.shape[axis]), axis=axis)
        same += int(np.count_nonzero(first == second))
        pairs += first.size
    if pairs == 0:
        raise ValueError(f"shape must have at least one neighbour pair, got {tuple(shape)}")
    return same / pairs


@numba.njit(cache=True, nogil=True)
def _max_stretch(coords):  # pragma: no cover - numba
    num_tokens, ndim = coords.shape
    best = 0.0
    for first in range(num_tokens):
        for second in range(first + 1, num_tokens):
            squared = 0.0
            for axis in range(ndim):
                delta = coords[second, axis] - coords[first, axis]
                squared += delta * delta
            ratio = squared / (second - first)
            if ratio > best:
                best = ratio
    return best


def worst_case_stretch(coords) -> float:
    """max over slot pairs i < j of squared Euclidean distance / (j - i); exact, all pairs.

    Raises ValueError above STRETCH_MAX_TOKENS tokens (the cost is O(N^2)).
    """
    coords = np.ascontiguousarray(coords, dtype=np.float64)
    if coords.ndim != 2 or coords.shape[0] < 2:
        raise ValueError(f"coords must be a (N, ndim) array with N >= 2, got shape {coords.shape}")
    if coords.shape[0] > STRETCH_MAX_TOKENS:
        raise ValueError(f"coords must hold at most {STRETCH_MAX_TOKENS} tokens (O(N^2)), got {coords.shape[0]}")
    return float(_max_stretch(coords))


@numba.njit(cache=True, nogil=True)
def _group_block_counts(inverse, indptr, members, block_size, num_blocks):  # pragma: no cover - numba
    counts = np.zeros((num_blocks, num_blocks), dtype=np.int64)
    for group in range(indptr.shape[0] - 1):
        for first in range(indptr[group], indptr[group + 1]):
            row_block = inverse[members[first]] // block_size
            for second in range(indptr[group], indptr[group + 1]):
                counts[row_block, inverse[members[second]] // block_size] += 1
    return counts


def _density_summary(counts: np.ndarray, num_tokens: int, block_size: int) -> dict:
    sides = np.minimum(block_size, num_tokens - np.arange(counts.shape[0]) * block_size)
    areas = sides[:, None] * sides[None, :]
    nonempty = counts > 0
    return {
        "nonempty_share": float(nonempty.mean()),
        "mean_density": float((counts[nonempty] / areas[nonempty]).mean()) if nonempty.any() else 0.0,
        "nonempty_blocks": int(nonempty.sum()),
        "total_blocks": int(counts.size),
    }


def tile_density(groups: AttentionGroups, perm, block_size: int) -> dict:
    """Block structure of the mask of `groups` (queries and keys of a group attend each other) in layout perm.

    Valid for symmetric groups where a group's queries are its members (dilated_groups). Returns
    nonempty_share (share of b x b blocks with any allowed pair), mean_density (mean share of
    allowed pairs in the nonempty blocks), nonempty_blocks, total_blocks.
    """
    block_size = positive_int(block_size, "block_size")
    perm = np.asarray(perm, dtype=np.int64)
    if perm.shape != (groups.num_tokens,):
        raise ValueError(f"perm must have shape ({groups.num_tokens},), got {perm.shape}")
    inverse = inverse_permutation(perm)
    num_blocks = -(-groups.num_tokens // block_size)
    counts = _group_block_counts(inverse, groups.group_indptr, groups.group_members, block_size, num_blocks)
    return _density_summary(counts, groups.num_tokens, block_size)


def mask_tile_density(mask, block_size: int) -> dict:
    """Same summary as tile_density for a dense bool mask (N, N) already in layout order."""
    block_size = positive_int(block_size, "block_size")
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim != 2 or mask.shape[0] != mask.shape[1]:
        raise ValueError(f"mask must be a square (N, N) bool array, got shape {mask.shape}")
    num_tokens = mask.shape[0]
    num_blocks = -(-num_tokens // block_size)
    padded = np.zeros((num_blocks * block_size,) * 2, dtype=np.int64)
    padded[:num_tokens, :num_tokens] = mask
    counts = padded.reshape(num_blocks, block_size, num_blocks, block_size).sum(axis=(1, 3))
    return _density_summary(counts, num_tokens, block_size)
