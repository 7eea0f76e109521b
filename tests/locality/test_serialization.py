"""Serialization locality metrics: exact against brute force on small grids and point clouds."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from hilbert_lab.curves import serialize
from hilbert_lab.locality.neighbours import clustered_points, knn, knn_offsets, uniform_points
from hilbert_lab.locality.serialization import serialization_metrics, serialization_table


def grid_coordinates(shape):
    """(prod(shape), ndim) int64 cell coordinates (x, y[, z]) of a row-major grid, as knn_offsets orders them."""
    return np.indices(shape).reshape(len(shape), -1).T[:, ::-1].astype(np.int64)


def _brute_knn(points, k):
    d = ((points[:, None] - points[None]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    return np.argsort(d, axis=1, kind="stable")[:, :k]


def _brute_meet(inverse, segment_lengths, dilation_rates):
    n = len(inverse)
    slot = np.asarray(inverse)
    meet = np.zeros((n, n), dtype=bool)
    for w, r in zip(segment_lengths, dilation_rates):
        w = min(w, n)
        group = (slot // w) * r + (slot % w) % r
        meet |= group[:, None] == group[None, :]
    return meet


def _brute_metrics(coords, neighbour_lists, adjacent_pairs, perm, inverse, segment_lengths, dilation_rates):
    meet = _brute_meet(inverse, segment_lengths, dilation_rates)
    recall = {}
    for k, lists in neighbour_lists.items():
        shares = [np.mean([meet[i, j] for j in lst]) for i, lst in enumerate(lists) if len(lst)]
        recall[f"recall@{k}"] = float(np.mean(shares))
    n, w, r = len(perm), min(segment_lengths[0], len(perm)), dilation_rates[0]
    diameters = []
    for start in range(0, n, w):
        for offset in range(r):
            members = perm[start + offset: min(start + w, n): r]
            if len(members):
                pts = coords[members]
                diameters.append(np.sqrt(((pts[:, None] - pts[None]) ** 2).sum(-1).max()))
    unmet = np.mean([not meet[i, j] for i, j in adjacent_pairs])
    return {**recall, "diameter_mean": float(np.mean(diameters)), "diameter_max": float(np.max(diameters)),
            "unmet_adjacent": float(unmet)}


def _grid_neighbours(shape, k):
    coords = grid_coordinates(shape)
    index = {tuple(c): i for i, c in enumerate(coords)}
    offsets = knn_offsets(k, len(shape))
    return [[index[tuple(c + o)] for o in offsets if tuple(c + o) in index] for c in coords]


def _grid_adjacent(shape):
    coords = grid_coordinates(shape)
    index = {tuple(c): i for i, c in enumerate(coords)}
    pairs = []
    for i, c in enumerate(coords):
        for axis in range(len(shape)):
            step = np.zeros(len(shape), dtype=np.int64)
            step[axis] = 1
            if tuple(c + step) in index:
                pairs.append((i, index[tuple(c + step)]))
    return pairs


def test_knn_offsets_are_the_classic_neighbourhoods():
    assert {tuple(o) for o in knn_offsets(4, 2)} == {(1, 0), (-1, 0), (0, 1), (0, -1)}
    assert {tuple(o) for o in knn_offsets(8, 2)} == set(itertools.product((-1, 0, 1), repeat=2)) - {(0, 0)}
    assert {tuple(o) for o in knn_offsets(6, 3)} == {o for o in itertools.product((-1, 0, 1), repeat=3)
                                                     if sum(map(abs, o)) == 1}
    assert {tuple(o) for o in knn_offsets(26, 3)} == set(itertools.product((-1, 0, 1), repeat=3)) - {(0, 0, 0)}


@pytest.mark.parametrize("points", [uniform_points(700, 3, seed=1), uniform_points(500, 2, seed=2),
                                    clustered_points(600, 3, clusters=4, spread=0.01, seed=3),
                                    np.repeat(uniform_points(100, 2, seed=4), 3, axis=0)])
def test_knn_is_exact_with_ties_by_index(points):
    assert np.array_equal(knn(points, 26), _brute_knn(points, 26))


@pytest.mark.parametrize("shape", [(6, 10), (5, 7), (3, 4, 5)])
@pytest.mark.parametrize("ordering", ["rowmajor", "hilbert", "morton-trans"])
@pytest.mark.parametrize("pattern", [([8], [1]), ([16], [4]), ([4, 16], [1, 2])])
def test_grid_metrics_match_brute_force(shape, ordering, pattern):
    ks = (4, 8, 26)
    got = serialization_metrics(shape, ordering, *pattern, ks=ks)
    perm, inverse = serialize(shape, ordering)
    expected = _brute_metrics(grid_coordinates(shape).astype(float), {k: _grid_neighbours(shape, k) for k in ks},
                              _grid_adjacent(shape), perm, inverse, *pattern)
    assert got.keys() == expected.keys()
    for key in got:
        assert got[key] == pytest.approx(expected[key], abs=1e-12), key


def test_large_compact_groups_take_the_line_end_path_exactly():
    shape = (40, 40)  # groups of 256 > 64 tokens use the line-end candidates
    for ordering in ("hilbert", "rowmajor-trans", "morton"):
        got = serialization_metrics(shape, ordering, [256], [1], ks=(4,))
        perm, inverse = serialize(shape, ordering)
        expected = _brute_metrics(grid_coordinates(shape).astype(float), {4: _grid_neighbours(shape, 4)},
                                  _grid_adjacent(shape), perm, inverse, [256], [1])
        assert got["diameter_max"] == pytest.approx(expected["diameter_max"], abs=1e-12)
        assert got["diameter_mean"] == pytest.approx(expected["diameter_mean"], abs=1e-12)


@pytest.mark.parametrize("ordering", ["snake", "hilbert"])
def test_point_metrics_match_brute_force(ordering):
    points = clustered_points(400, 3, clusters=5, spread=0.05, seed=5)
    pattern = ([32, 128], [1, 4])
    got = serialization_metrics(points, ordering, *pattern, ks=(4, 8))
    perm, inverse = serialize(points, ordering)
    nearest = _brute_knn(points, 8)
    adjacent = [(i, int(j)) for i in range(len(points)) for j in nearest[i, :6]]
    expected = _brute_metrics(points, {4: nearest[:, :4].tolist(), 8: nearest.tolist()}, adjacent, perm, inverse,
                              *pattern)
    for key in got:
        assert got[key] == pytest.approx(expected[key], abs=1e-12), key


def test_hilbert_and_morton_agree_on_aligned_power_of_two_windows_and_beat_rowmajor():
    rows = {o: serialization_metrics((64, 64), o, [64], [1]) for o in ("rowmajor", "hilbert", "morton")}
    assert rows["hilbert"] == rows["morton"]  # 64-token windows are the same aligned 8x8 squares
    assert rows["rowmajor"]["recall@4"] == pytest.approx(0.5, abs=0.02)  # left and right only
    assert rows["hilbert"]["recall@4"] > rows["rowmajor"]["recall@4"] + 0.3
    assert rows["hilbert"]["diameter_max"] == pytest.approx(7 * np.sqrt(2))
    assert rows["rowmajor"]["diameter_max"] == pytest.approx(63)


def test_table_has_one_row_per_combination():
    table = serialization_table({"grid": (16, 16), "cloud": uniform_points(300, 2, seed=0)},
                                ["rowmajor", "hilbert"], [([16], [1]), ([64], [2])], ks=(4,))
    assert len(table) == 2 * 2 * 2
    assert {"recall@4", "diameter_mean", "diameter_max", "unmet_adjacent", "seconds"} <= set(table.columns)
    assert table["recall@4"].between(0, 1).all()


@pytest.mark.parametrize("call, match", [
    (lambda: knn(np.zeros((4, 5)), 2), r"points must have shape \(N, 2\|3\)"),
    (lambda: knn(np.zeros((4, 2)), 0), "k must be a positive integer"),
    (lambda: serialization_metrics((8, 8), "hilbert", [8], [1], ks=()), "ks must be a non-empty list"),
    (lambda: serialization_metrics((8, 8), "hilbert", [8], [16]), "dilation_rates must not exceed"),
    (lambda: knn_offsets(4, 4), "ndim must be 2 or 3"),
])
def test_bad_input_raises(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("n, segment_lengths, dilation_rates", [
    (48, (8, 16), (1, 4)), (50, (12, 64), (3, 4)), (37, (5, 10, 40), (1, 2, 5)),
])
def test_meeting_rule_is_the_engines_pattern(n, segment_lengths, dilation_rates):
    """Slots meet (the Numba kernel's arithmetic) iff some head of the engine's longnet pattern lets one
    attend the other: with H = lcm(rates) heads every offset of every branch is some head's."""
    import math

    from hilbert_lab.attention import DilatedPattern
    from hilbert_lab.locality.serialization import _meet

    heads = math.lcm(*dilation_rates)
    mask = DilatedPattern.create(list(segment_lengths), list(dilation_rates)).dense_mask(n, heads).any(0).numpy()
    segments, rates = np.array(segment_lengths, dtype=np.int64), np.array(dilation_rates, dtype=np.int64)
    ours = np.array([[_meet(a, b, segments, rates, n) for b in range(n)] for a in range(n)])
    np.testing.assert_array_equal(ours, mask)
