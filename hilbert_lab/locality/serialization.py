"""Exact locality of a serialization under segment (window) and dilated attention, no training.

Tokens of a grid or point cloud are serialized (``hilbert_lab.curves.serialize``) and a dilated
pattern (segment lengths w_b, dilation rates r_b) is applied to the *serialized* positions. Two
tokens at slots s, t meet in branch b iff they share a segment and a dilation offset:
``s // w == t // w`` and ``(s % w) % r == (t % w) % r`` (w = min(w_b, N); in longnet mode with
H >= r heads every offset is some head's, so this is "attend each other in some head"). They meet
in the pattern iff they meet in some branch. This is the selection rule of the engine
(``hilbert_lab.attention.pattern.is_selected``: slot p is in branch (w, r) at offset (p % w) % r);
the Numba kernels below spell it out in their own arithmetic.

Metrics (all exact):

* ``recall@k``: mean over tokens of the share of its k spatial nearest neighbours it meets.
  Points: the exact k nearest other points (Euclidean, ties by index). Grids: the in-grid cells
  at the k integer offsets nearest the origin (ties by the offsets' lexicographic order), so k=4 /
  k=8 are the 4- / 8-neighbourhood in 2D and k=6 / k=26 the 6- / 26-neighbourhood in 3D.
* ``diameter_mean`` / ``diameter_max``: the largest Euclidean distance between two tokens of one
  attention group (a segment's tokens at one dilation offset), over the groups of the first
  branch (grid cells, or point-cloud units).
* ``unmet_adjacent``: the share of spatially adjacent pairs that meet in no branch (grids:
  face-adjacent cell pairs; points: (point, one of its 2*d nearest neighbours) pairs).

All kernels are serial Numba: with numba's default "omp" threading layer, a parallel kernel leaves
OpenMP threads that make later torch CPU ops in the same process ~30x slower (measured here), and
these metrics run next to training. ``serialization_table`` adds the wall time of each row.
"""
from __future__ import annotations

import itertools
import math
import time
from typing import Any, Sequence

import numba
import numpy as np

from hilbert_lab.curves.serialize import SERIALIZATIONS, serialize

DEFAULT_KS = (4, 8, 26)


# ----------------------------------------------------------------------------------------- kernels
@numba.njit(inline="always", cache=True)
def _meet(a, b, segments, rates, n):
    """Slots a and b meet in some branch: same segment and the same offset under
    attention.pattern.is_selected's rule (p % w) % r (kept as arithmetic inside Numba)."""
    for i in range(segments.shape[0]):
        w = min(segments[i], n)
        r = rates[i]
        if a // w == b // w and (a % w) % r == (b % w) % r:
            return True
    return False


@numba.njit(cache=True)
def _grid_recall(shape, offsets, inverse, segments, rates):
    """Sum over tokens of met/valid neighbour shares, and the number of tokens with a neighbour."""
    depth, height, width = shape[0], shape[1], shape[2]
    n = depth * height * width
    shares = np.zeros(n, dtype=np.float64)
    counted = np.zeros(n, dtype=np.int64)
    for cell in range(n):
        z = cell // (height * width)
        y = (cell // width) % height
        x = cell % width
        met = 0
        valid = 0
        for o in range(offsets.shape[0]):
            zz = z + offsets[o, 0]
            yy = y + offsets[o, 1]
            xx = x + offsets[o, 2]
            if zz < 0 or zz >= depth or yy < 0 or yy >= height or xx < 0 or xx >= width:
                continue
            other = (zz * height + yy) * width + xx
            valid += 1
            if _meet(inverse[cell], inverse[other], segments, rates, n):
                met += 1
        if valid:
            shares[cell] = met / valid
            counted[cell] = 1
    return shares.sum(), counted.sum()


@numba.njit(cache=True)
def _neighbour_recall(neighbours, inverse, segments, rates):
    """Per-token share of the listed neighbours (-1 = none) it meets: (sum of shares, tokens counted)."""
    n = neighbours.shape[0]
    shares = np.zeros(n, dtype=np.float64)
    counted = np.zeros(n, dtype=np.int64)
    for i in range(n):
        met = 0
        valid = 0
        for j in range(neighbours.shape[1]):
            other = neighbours[i, j]
            if other < 0:
                continue
            valid += 1
            if _meet(inverse[i], inverse[other], segments, rates, n):
                met += 1
        if valid:
            shares[i] = met / valid
            counted[i] = 1
    return shares.sum(), counted.sum()


@numba.njit(inline="always")
def _pair_max(cand, count):
    best = 0.0
    for a in range(count):
        for b in range(a + 1, count):
            d = 0.0
            for c in range(cand.shape[1]):
                t = cand[a, c] - cand[b, c]
                d += t * t
            if d > best:
                best = d
    return best


@numba.njit(cache=True)
def _group_diameters(coords, w, r, integral):
    """Diameter of every attention group of one branch; coords (N, 3) float64 in serialized order.

    integral: coordinates are integers (grid cells); then only the two end cells of every line
    along the group's longest axis are candidates (the farthest pair lies on the convex hull, whose
    vertices are line ends), which makes compact groups cheap. Group g = (segment g // r, offset
    g % r) holds the slots start + j * r of its segment: exactly the slots attention.pattern.is_selected
    selects for that offset.
    """
    n = coords.shape[0]
    segments = (n + w - 1) // w
    out = np.full(segments * r, -1.0)
    for g in range(segments * r):
        seg = g // r
        offset = g % r
        start = seg * w + offset
        stop = min(seg * w + w, n)
        if start >= stop:
            continue
        count = (stop - start + r - 1) // r
        if not integral or count <= 64:
            cand = np.empty((count, 3))
            for j in range(count):
                for c in range(3):
                    cand[j, c] = coords[start + j * r, c]
            out[g] = math.sqrt(_pair_max(cand, count))
            continue
        low = np.full(3, np.inf)
        high = np.full(3, -np.inf)
        for j in range(count):
            for c in range(3):
                v = coords[start + j * r, c]
                low[c] = min(low[c], v)
                high[c] = max(high[c], v)
        axis = 0
        for c in range(1, 3):
            if high[c] - low[c] > high[axis] - low[axis]:
                axis = c
        b_axis = (axis + 1) % 3
        c_axis = (axis + 2) % 3
        nb = int(high[b_axis] - low[b_axis]) + 1
        nc = int(high[c_axis] - low[c_axis]) + 1
        lo = np.full(nb * nc, np.inf)
        hi = np.full(nb * nc, -np.inf)
        for j in range(count):
            p = start + j * r
            line = int(coords[p, b_axis] - low[b_axis]) * nc + int(coords[p, c_axis] - low[c_axis])
            lo[line] = min(lo[line], coords[p, axis])
            hi[line] = max(hi[line], coords[p, axis])
        cand = np.empty((2 * nb * nc, 3))
        used = 0
        for line in range(nb * nc):
            if lo[line] == np.inf:
                continue
            for end in range(2):
                if end == 1 and hi[line] == lo[line]:
                    break
                cand[used, axis] = lo[line] if end == 0 else hi[line]
                cand[used, b_axis] = low[b_axis] + line // nc
                cand[used, c_axis] = low[c_axis] + line % nc
                used += 1
        out[g] = math.sqrt(_pair_max(cand, used))
    return out


@numba.njit(inline="always")
def _insert(best_d, best_i, d, j):
    k = best_d.shape[0]
    if d > best_d[k - 1] or (d == best_d[k - 1] and j >= best_i[k - 1]):
        return
    pos = k - 1
    while pos > 0 and (best_d[pos - 1] > d or (best_d[pos - 1] == d and best_i[pos - 1] > j)):
        best_d[pos] = best_d[pos - 1]
        best_i[pos] = best_i[pos - 1]
        pos -= 1
    best_d[pos] = d
    best_i[pos] = j


@numba.njit(inline="always", cache=True)
def _knn_point(q, points, cell, dims, cell_of, cell_start, members, best_d, best_i):
    """Fill best_d / best_i (k,) with the k nearest other points of sorted point q (squared distances,
    original indices). Points are sorted by cell, so every cell's points are contiguous in memory."""
    n = points.shape[0]
    k = best_d.shape[0]
    best_d[:] = np.inf
    best_i[:] = n
    nx, ny, nz = dims[0], dims[1], dims[2]
    cx, cy, cz = cell_of[q, 0], cell_of[q, 1], cell_of[q, 2]
    for radius in range(max(nx, max(ny, nz)) + 1):
        for dz in range(-radius, radius + 1):
            z = cz + dz
            if z < 0 or z >= nz:
                continue
            for dy in range(-radius, radius + 1):
                y = cy + dy
                if y < 0 or y >= ny:
                    continue
                for dx in range(-radius, radius + 1):
                    x = cx + dx
                    if max(abs(dx), max(abs(dy), abs(dz))) != radius or x < 0 or x >= nx:
                        continue
                    c = (z * ny + y) * nx + x
                    for m in range(cell_start[c], cell_start[c + 1]):
                        if m != q:
                            d = 0.0
                            for a in range(3):
                                t = points[q, a] - points[m, a]
                                d += t * t
                            _insert(best_d, best_i, d, members[m])
        # every point outside the cells searched so far is at least radius * cell away
        if best_d[k - 1] < (radius * cell) ** 2:
            return


@numba.njit(cache=True)
def _knn_kernel(points, k, cell, dims, cell_of, cell_start, members):
    """points / cell_of sorted by cell; members[m] = original index of sorted point m."""
    n = points.shape[0]
    out = np.full((n, k), -1, dtype=np.int64)
    best_d = np.empty(k)
    best_i = np.empty(k, dtype=np.int64)
    for q in range(n):
        _knn_point(q, points, cell, dims, cell_of, cell_start, members, best_d, best_i)
        for j in range(k):
            if best_i[j] < n:
                out[members[q], j] = best_i[j]
    return out


# -------------------------------------------------------------------------------------- public API
def knn_offsets(k: int, ndim: int) -> np.ndarray:
    """(k, ndim) int64 offsets nearest the origin (origin excluded; ties by lexicographic order)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    if ndim not in (2, 3):
        raise ValueError(f"ndim must be 2 or 3, got {ndim!r}")
    reach = 1
    while (2 * reach + 1) ** ndim - 1 < k:
        reach += 1
    reach += 1  # the ball of the k-th distance fits in the next cube
    candidates = [o for o in itertools.product(range(-reach, reach + 1), repeat=ndim) if any(o)]
    candidates.sort(key=lambda o: (sum(v * v for v in o), o))
    return np.array(candidates[:k], dtype=np.int64)


def knn(points: np.ndarray, k: int) -> np.ndarray:
    """Exact k nearest other points of each point: (N, k) int64 indices, nearest first (ties by index).

    points: (N, 2|3) float. A uniform cell grid (about 2 points per cell) and an expanding shell
    search; -1 fills rows when N <= k.
    """
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[1] not in (2, 3) or points.shape[0] < 1:
        raise ValueError(f"points must have shape (N, 2|3), got {points.shape}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    n, ndim = points.shape
    padded = np.zeros((n, 3))
    padded[:, :ndim] = points - points.min(axis=0)
    extent = padded.max(axis=0)
    volume = float(np.prod(np.maximum(extent[:ndim], 1e-12)))
    cell = max((2.0 * volume / n) ** (1.0 / ndim), float(extent.max()) / 1024.0, 1e-12)
    dims = np.maximum(np.floor(extent / cell).astype(np.int64) + 1, 1)
    dims[ndim:] = 1
    cell_of = np.minimum(np.floor(padded / cell).astype(np.int64), dims - 1)
    flat = (cell_of[:, 2] * dims[1] + cell_of[:, 1]) * dims[0] + cell_of[:, 0]
    members = np.argsort(flat, kind="stable").astype(np.int64)
    cell_start = np.zeros(int(np.prod(dims)) + 1, dtype=np.int64)
    np.cumsum(np.bincount(flat, minlength=int(np.prod(dims))), out=cell_start[1:])
    return _knn_kernel(np.ascontiguousarray(padded[members]), int(k), cell, dims,
                       np.ascontiguousarray(cell_of[members]), cell_start, members)


def grid_coordinates(shape: Sequence[int]) -> np.ndarray:
    """(prod(shape), ndim) int64 cell coordinates (x, y[, z]) of a row-major (H, W) / (T, H, W) grid."""
    shape = tuple(int(s) for s in shape)
    return np.indices(shape).reshape(len(shape), -1).T[:, ::-1].astype(np.int64)


def uniform_points(count: int, ndim: int = 3, *, seed: int = 0) -> np.ndarray:
    """(count, ndim) float64 points uniform in the unit cube."""
    return np.random.default_rng(seed).random((count, ndim))


def clustered_points(count: int, ndim: int = 3, *, clusters: int = 32, spread: float = 0.03,
                     seed: int = 0) -> np.ndarray:
    """(count, ndim) float64 points: Gaussian blobs (std `spread`) around uniform centres, clipped to [0, 1]."""
    rng = np.random.default_rng(seed)
    centres = rng.random((clusters, ndim))
    labels = rng.integers(0, clusters, count)
    return np.clip(centres[labels] + rng.normal(0.0, spread, (count, ndim)), 0.0, 1.0)


def _branches(segment_lengths, dilation_rates) -> tuple[np.ndarray, np.ndarray]:
    from hilbert_lab.attention.pattern import DilatedPattern  # noqa: PLC0415 (validation only)

    pattern = DilatedPattern.create(segment_lengths, dilation_rates)
    return (np.array(pattern.segment_lengths, dtype=np.int64), np.array(pattern.dilation_rates, dtype=np.int64))


def _check_ks(ks) -> tuple[int, ...]:
    ks = tuple(ks)
    if not ks or any(isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1 for k in ks):
        raise ValueError(f"ks must be a non-empty list of positive integers, got {ks!r}")
    return tuple(int(k) for k in ks)


def serialization_metrics(
    data: Any,
    ordering: str,
    segment_lengths: Sequence[int],
    dilation_rates: Sequence[int],
    *,
    ks: Sequence[int] = DEFAULT_KS,
    grid_size: float | None = None,
    neighbours: np.ndarray | None = None,
) -> dict[str, float]:
    """Locality metrics (module docstring) of `ordering` on a grid shape or a point cloud (N, 2|3).

    neighbours: precomputed ``knn(points, max(ks))`` to share between orderings (points only).
    Returns {"recall@k": ..., "diameter_mean", "diameter_max", "unmet_adjacent"}.
    """
    ks = _check_ks(ks)
    segments, rates = _branches(segment_lengths, dilation_rates)
    perm, inverse = serialize(data, ordering, grid_size=grid_size)
    perm, inverse = np.asarray(perm), np.asarray(inverse)
    is_grid = not isinstance(data, np.ndarray)
    result: dict[str, float] = {}
    if is_grid:
        shape = tuple(int(s) for s in data)
        shape3 = np.array((1,) * (3 - len(shape)) + shape, dtype=np.int64)
        coords = grid_coordinates(shape).astype(np.float64)
        for k in ks:
            offsets = knn_offsets(k, len(shape))[:, ::-1]  # (dx, dy[, dz]) -> (dz, dy, dx) columns
            offsets3 = np.zeros((k, 3), dtype=np.int64)
            offsets3[:, 3 - len(shape):] = offsets
            total, counted = _grid_recall(shape3, offsets3, inverse, segments, rates)
            result[f"recall@{k}"] = total / max(counted, 1)
        face = np.zeros((len(shape), 3), dtype=np.int64)
        for axis in range(len(shape)):
            face[axis, 2 - axis] = 1  # +x, +y[, +z] as (dz, dy, dx)
        unmet, pairs = _unmet_grid(shape3, face, inverse, segments, rates)
    else:
        points = np.asarray(data, dtype=np.float64)
        if points.ndim != 2:
            raise ValueError(f"data must be a grid shape or points (N, 2|3), got an array of shape {points.shape}")
        coords = points
        if neighbours is None:
            neighbours = knn(points, max(max(ks), 2 * points.shape[1]))
        for k in ks:
            total, counted = _neighbour_recall(np.ascontiguousarray(neighbours[:, :k]), inverse, segments, rates)
            result[f"recall@{k}"] = total / max(counted, 1)
        adjacent = np.ascontiguousarray(neighbours[:, : 2 * points.shape[1]])
        valid = int((adjacent >= 0).sum())
        met = _count_met(adjacent, inverse, segments, rates)
        unmet, pairs = valid - met, valid
    padded = np.zeros((len(perm), 3))
    padded[:, : coords.shape[1]] = coords[perm]
    w = int(min(segments[0], len(perm)))
    diameters = _group_diameters(padded, w, int(rates[0]), is_grid)
    diameters = diameters[diameters >= 0]
    result["diameter_mean"] = float(diameters.mean())
    result["diameter_max"] = float(diameters.max())
    result["unmet_adjacent"] = unmet / max(pairs, 1)
    return result


@numba.njit(cache=True)
def _unmet_grid(shape, offsets, inverse, segments, rates):
    depth, height, width = shape[0], shape[1], shape[2]
    n = depth * height * width
    unmet = np.zeros(n, dtype=np.int64)
    pairs = np.zeros(n, dtype=np.int64)
    for cell in range(n):
        z = cell // (height * width)
        y = (cell // width) % height
        x = cell % width
        for o in range(offsets.shape[0]):
            zz = z + offsets[o, 0]
            yy = y + offsets[o, 1]
            xx = x + offsets[o, 2]
            if zz >= depth or yy >= height or xx >= width:
                continue
            pairs[cell] += 1
            if not _meet(inverse[cell], inverse[(zz * height + yy) * width + xx], segments, rates, n):
                unmet[cell] += 1
    return unmet.sum(), pairs.sum()


@numba.njit(cache=True)
def _count_met(neighbours, inverse, segments, rates):
    n = neighbours.shape[0]
    met = np.zeros(n, dtype=np.int64)
    for i in range(n):
        for j in range(neighbours.shape[1]):
            other = neighbours[i, j]
            if other >= 0 and _meet(inverse[i], inverse[other], segments, rates, n):
                met[i] += 1
    return met.sum()


def serialization_table(
    datasets: dict[str, Any],
    orderings: Sequence[str] = SERIALIZATIONS,
    settings: Sequence[tuple[Sequence[int], Sequence[int]]] = (([64], [1]), ([256], [1]), ([256], [4])),
    *,
    ks: Sequence[int] = DEFAULT_KS,
) -> Any:
    """pandas DataFrame: one row per (data set, setting, ordering) with the metrics and its seconds.

    datasets: name -> grid shape or points (N, 2|3); settings: (segment_lengths, dilation_rates).
    Columns: data, tokens, segment_lengths, dilation_rates, ordering, recall@k..., diameter_mean,
    diameter_max, unmet_adjacent, seconds.
    """
    import pandas as pd  # noqa: PLC0415

    ks = _check_ks(ks)
    rows = []
    for name, data in datasets.items():
        neighbours = None
        tokens = int(np.prod(data)) if not isinstance(data, np.ndarray) else int(data.shape[0])
        if isinstance(data, np.ndarray):
            neighbours = knn(data, max(max(ks), 2 * data.shape[1]))
        for segment_lengths, dilation_rates in settings:
            for ordering in orderings:
                start = time.perf_counter()
                metrics = serialization_metrics(data, ordering, segment_lengths, dilation_rates, ks=ks,
                                                neighbours=neighbours)
                rows.append({"data": name, "tokens": tokens, "segment_lengths": list(segment_lengths),
                             "dilation_rates": list(dilation_rates), "ordering": ordering, **metrics,
                             "seconds": time.perf_counter() - start})
    return pd.DataFrame(rows)
