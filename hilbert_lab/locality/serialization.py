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
these metrics run next to training. ``serialization_table`` adds the wall time of each row. The exact
nearest neighbours and the point clouds are in locality.neighbours.
"""
from __future__ import annotations

import math
import time
from typing import Any, Sequence

import numba
import numpy as np

from hilbert_lab.curves.serialize import SERIALIZATIONS, serialize
from hilbert_lab.locality.neighbours import knn, knn_offsets
from hilbert_lab.locality.traces import grid_coordinates

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
def _grid_meets(shape, offsets, inverse, segments, rates):
    """Per cell of a (depth, height, width) grid: how many in-grid cells at `offsets` (dz, dy, dx) it
    meets, and how many there are."""
    depth, height, width = shape[0], shape[1], shape[2]
    n = depth * height * width
    met = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=np.int64)
    for cell in range(n):
        z = cell // (height * width)
        y = (cell // width) % height
        x = cell % width
        for o in range(offsets.shape[0]):
            zz = z + offsets[o, 0]
            yy = y + offsets[o, 1]
            xx = x + offsets[o, 2]
            if zz < 0 or zz >= depth or yy < 0 or yy >= height or xx < 0 or xx >= width:
                continue
            valid[cell] += 1
            if _meet(inverse[cell], inverse[(zz * height + yy) * width + xx], segments, rates, n):
                met[cell] += 1
    return met, valid


@numba.njit(cache=True)
def _neighbour_meets(neighbours, inverse, segments, rates):
    """Per token: how many of its listed neighbours (-1 = none) it meets, and how many are listed."""
    n = neighbours.shape[0]
    met = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=np.int64)
    for i in range(n):
        for j in range(neighbours.shape[1]):
            other = neighbours[i, j]
            if other < 0:
                continue
            valid[i] += 1
            if _meet(inverse[i], inverse[other], segments, rates, n):
                met[i] += 1
    return met, valid


def _recall(met: np.ndarray, valid: np.ndarray) -> float:
    """Mean share of met neighbours over the tokens that have a neighbour."""
    shares = np.zeros(len(met))
    has = valid > 0
    shares[has] = met[has] / valid[has]
    return float(shares.sum() / max(int(has.sum()), 1))


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


# -------------------------------------------------------------------------------------- public API
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
        coords = grid_coordinates(shape, np.arange(int(np.prod(shape)))).astype(np.float64)  # distances only
        for k in ks:
            offsets = knn_offsets(k, len(shape))[:, ::-1]  # (dx, dy[, dz]) -> (dz, dy, dx) columns
            offsets3 = np.zeros((k, 3), dtype=np.int64)
            offsets3[:, 3 - len(shape):] = offsets
            result[f"recall@{k}"] = _recall(*_grid_meets(shape3, offsets3, inverse, segments, rates))
        face = np.zeros((len(shape), 3), dtype=np.int64)
        for axis in range(len(shape)):
            face[axis, 2 - axis] = 1  # +x, +y[, +z] as (dz, dy, dx)
        met, valid = _grid_meets(shape3, face, inverse, segments, rates)
        unmet, pairs = int(valid.sum() - met.sum()), int(valid.sum())
    else:
        points = np.asarray(data, dtype=np.float64)
        if points.ndim != 2:
            raise ValueError(f"data must be a grid shape or points (N, 2|3), got an array of shape {points.shape}")
        coords = points
        if neighbours is None:
            neighbours = knn(points, max(max(ks), 2 * points.shape[1]))
        for k in ks:
            met, valid = _neighbour_meets(np.ascontiguousarray(neighbours[:, :k]), inverse, segments, rates)
            result[f"recall@{k}"] = _recall(met, valid)
        adjacent = np.ascontiguousarray(neighbours[:, : 2 * points.shape[1]])
        met, valid = _neighbour_meets(adjacent, inverse, segments, rates)
        unmet, pairs = int(valid.sum() - met.sum()), int(valid.sum())
    padded = np.zeros((len(perm), 3))
    padded[:, : coords.shape[1]] = coords[perm]
    w = int(min(segments[0], len(perm)))
    diameters = _group_diameters(padded, w, int(rates[0]), is_grid)
    diameters = diameters[diameters >= 0]
    result["diameter_mean"] = float(diameters.mean())
    result["diameter_max"] = float(diameters.max())
    result["unmet_adjacent"] = unmet / max(pairs, 1)
    return result


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
