"""Generalized Hilbert (gilbert) curves: bijection, unit-step share, endpoints, equality on 2^k squares."""
from __future__ import annotations

import numpy as np
import pytest

from hilbert_lab.curves import decode, gilbert, gilbert3d

from property_testing import given, settings, st


def assert_bijection(points: np.ndarray, sizes: tuple[int, ...]) -> None:
    assert points.shape == (int(np.prod(sizes)), len(sizes)) and points.dtype == np.int64
    assert points.min() >= 0
    assert np.all(points.max(axis=0) < np.array(sizes))
    flat = np.ravel_multi_index(points.T, sizes)
    assert np.array_equal(np.sort(flat), np.arange(int(np.prod(sizes))))


def step_lengths(points: np.ndarray) -> np.ndarray:
    return np.abs(np.diff(points, axis=0)).sum(axis=1)


def expected_2d_non_unit_steps(width: int, height: int) -> int:
    """A unit-step walk from (0,0) to the far end of the longer side exists unless that side is
    odd and the other even (colour argument); the construction then needs exactly one diagonal,
    except for a shorter side of 2, where it ends one cell early instead (all unit steps)."""
    longer, shorter = max(width, height), min(width, height)
    return 1 if (longer % 2 == 1 and shorter % 2 == 0 and shorter > 2) else 0


def expected_2d_end(width: int, height: int) -> tuple[int, int]:
    longer, shorter = max(width, height), min(width, height)
    far = longer - 2 if (shorter == 2 and longer % 2 == 1) else longer - 1
    return (far, 0) if width >= height else (0, far)


def test_every_2d_size_up_to_32_is_a_bijection_with_predicted_unit_steps():
    for width in range(1, 33):
        for height in range(1, 33):
            points = gilbert(width, height)
            assert_bijection(points, (width, height))
            steps = np.abs(np.diff(points, axis=0))
            non_unit = int((steps.sum(axis=1) != 1).sum())
            assert non_unit == expected_2d_non_unit_steps(width, height), (width, height)
            if len(points) > 1:
                assert steps.max() == 1  # the one allowed non-unit step is a diagonal
            assert tuple(points[0]) == (0, 0) and tuple(points[-1]) == expected_2d_end(width, height)


@pytest.mark.parametrize(("width", "height"), [(1000, 999), (999, 1000), (37, 1000), (1024, 768), (4097, 3), (1, 5000)])
def test_large_and_skinny_rectangles(width, height):
    points = gilbert(width, height)
    assert_bijection(points, (width, height))
    assert int((step_lengths(points) != 1).sum()) == expected_2d_non_unit_steps(width, height)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(1, 300))
def test_property_2d_bijection_and_unit_step_share(width, height):
    points = gilbert(width, height)
    assert_bijection(points, (width, height))
    assert int((step_lengths(points) != 1).sum()) == expected_2d_non_unit_steps(width, height)


@pytest.mark.parametrize("order", range(1, 9))
def test_equals_standard_hilbert_on_power_of_two_squares(order):
    side = 1 << order
    np.testing.assert_array_equal(gilbert(side, side), decode(np.arange(side * side), order, 2))


def test_every_3d_size_up_to_8_is_a_bijection():
    for width in range(1, 9):
        for height in range(1, 9):
            for depth in range(1, 9):
                points = gilbert3d(width, height, depth)
                assert_bijection(points, (width, height, depth))
                assert tuple(points[0]) == (0, 0, 0)


@pytest.mark.parametrize("sizes", [(2, 2, 2), (4, 6, 8), (8, 6, 4), (10, 2, 6), (2, 12, 20), (16, 16, 16), (32, 8, 2), (20, 12, 2)])
def test_3d_even_sizes_take_only_unit_steps(sizes):
    points = gilbert3d(*sizes)
    assert_bijection(points, sizes)
    assert np.all(step_lengths(points) == 1)


def test_3d_odd_sizes_keep_a_high_unit_step_share():
    """Odd sides force some non-unit steps in the 3D construction; the worst measured share is 0.8 (1x2x3)."""
    worst = 1.0
    for width in range(1, 11):
        for height in range(1, 11):
            for depth in range(1, 11):
                points = gilbert3d(width, height, depth)
                if len(points) > 1:
                    worst = min(worst, float((step_lengths(points) == 1).mean()))
    assert worst >= 0.8
    big = gilbert3d(15, 13, 11)
    assert_bijection(big, (15, 13, 11))
    assert float((step_lengths(big) == 1).mean()) >= 0.9


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_3d_power_of_two_cube_is_octant_recursive(order):
    """On 2^k cubes every aligned 2^j sub-cube is visited in one contiguous run (Hilbert property)."""
    side = 1 << order
    points = gilbert3d(side, side, side)
    assert np.all(step_lengths(points) == 1)
    for level in range(1, order + 1):
        block = points >> level
        block_id = (block[:, 0] * side + block[:, 1]) * side + block[:, 2]
        runs = 1 + int((np.diff(block_id) != 0).sum())
        assert runs == (side >> level) ** 3


@pytest.mark.parametrize(("function", "args", "match"), [
    (gilbert, (0, 4), "width must be a positive integer"),
    (gilbert, (4, -1), "height must be a positive integer"),
    (gilbert, (2.5, 4), "width must be a positive integer"),
    (gilbert3d, (2, 2, 0), "depth must be a positive integer"),
    (gilbert3d, (True, 2, 2), "width must be a positive integer"),
])
def test_bad_sizes(function, args, match):
    with pytest.raises(ValueError, match=match):
        function(*args)
