"""Point sets and their exact nearest neighbours, for the serialization metrics (locality.serialization).

`knn(points, k)`: the exact k nearest other points (Euclidean, ties by index) by a uniform cell grid and
an expanding shell search in a serial Numba kernel (see locality.serialization on why serial);
`knn_offsets(k, ndim)`: the k integer offsets nearest the origin (a grid's k-neighbourhood);
`uniform_points` / `clustered_points`: the point clouds the serialization report measures.
"""
from __future__ import annotations

import itertools

import numba
import numpy as np


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
