"""segment_permutation / grid_permutation: permutations, inverses, curve equalities, locality, cache."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hilbert_lab.curves import (
    GRID_ORDERINGS,
    ORDERINGS,
    decode,
    encode,
    gilbert,
    grid_permutation,
    near_square_grid,
    segment_permutation,
)
from hilbert_lab.curves.orderings import CACHE_SIZE, _cached_grid_permutation

from property_testing import given, settings, st


def assert_permutation_pair(perm: np.ndarray, inverse: np.ndarray, length: int) -> None:
    assert perm.dtype == np.int64 and inverse.dtype == np.int64
    assert perm.shape == (length,) and inverse.shape == (length,)
    assert np.array_equal(np.sort(perm), np.arange(length))
    assert np.array_equal(perm[inverse], np.arange(length))
    assert np.array_equal(inverse[perm], np.arange(length))


def grid_steps(perm: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """L1 distance in the grid between consecutive layout slots."""
    coordinates = np.stack(np.unravel_index(perm, shape), axis=-1)
    return np.abs(np.diff(coordinates, axis=0)).sum(axis=1)


def test_near_square_grid_is_the_most_square_factorisation():
    assert near_square_grid(1) == (1, 1)
    assert near_square_grid(12) == (3, 4)
    assert near_square_grid(4096) == (64, 64)
    assert near_square_grid(2048) == (32, 64)
    assert near_square_grid(97) == (1, 97)
    for length in range(1, 500):
        height, width = near_square_grid(length)
        assert height * width == length and height <= width
        assert not any(length % candidate == 0 for candidate in range(height + 1, math.isqrt(length) + 1))


@pytest.mark.parametrize("ordering", ORDERINGS)
def test_every_length_gives_a_permutation_with_its_inverse(ordering):
    for length in [*range(1, 150), 256, 1000, 1024, 4096, 4099, 65536]:
        perm, inverse = segment_permutation(length, ordering)
        assert_permutation_pair(perm, inverse, length)
        tokens = np.random.default_rng(length).standard_normal((length, 3))
        np.testing.assert_array_equal(tokens[perm][inverse], tokens)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 20_000), st.sampled_from(ORDERINGS))
def test_property_segment_permutation(length, ordering):
    perm, inverse = segment_permutation(length, ordering)
    assert_permutation_pair(perm, inverse, length)
    if ordering in ("snake", "hilbert") and length > 1:
        steps = grid_steps(perm, near_square_grid(length))
        height, width = near_square_grid(length)
        allowed = 1 if (ordering == "hilbert" and width % 2 == 1 and height % 2 == 0 and height > 2) else 0
        assert int((steps != 1).sum()) == allowed


def test_identity_is_arange():
    perm, inverse = segment_permutation(100, "identity")
    np.testing.assert_array_equal(perm, np.arange(100))
    np.testing.assert_array_equal(inverse, np.arange(100))


@pytest.mark.parametrize("order", [1, 2, 3, 5, 6])
def test_hilbert_on_square_lengths_follows_decode(order):
    side = 1 << order
    perm, _ = segment_permutation(side * side, "hilbert")
    points = decode(np.arange(side * side), order, 2)  # (x, y) = (column, row)
    np.testing.assert_array_equal(perm, points[:, 1] * side + points[:, 0])


@pytest.mark.parametrize("order", [1, 2, 4, 5])
def test_morton_on_square_lengths_follows_decode(order):
    side = 1 << order
    perm, _ = segment_permutation(side * side, "morton")
    points = decode(np.arange(side * side), order, 2, curve="morton")
    np.testing.assert_array_equal(perm, points[:, 1] * side + points[:, 0])


@pytest.mark.parametrize("length", [8, 32, 128, 2048, 4096 * 2])
def test_hilbert_on_two_to_one_lengths_uses_generalized_curve_with_unit_steps(length):
    height, width = near_square_grid(length)
    assert width == 2 * height
    perm, _ = segment_permutation(length, "hilbert")
    points = gilbert(width, height)
    np.testing.assert_array_equal(perm, points[:, 1] * width + points[:, 0])
    assert np.all(grid_steps(perm, (height, width)) == 1)


def test_snake_rows_alternate_direction():
    perm, _ = segment_permutation(12, "snake")
    assert perm.tolist() == [0, 1, 2, 3, 7, 6, 5, 4, 8, 9, 10, 11]


def test_morton_on_non_power_of_two_grid_sorts_by_z_key():
    perm, _ = segment_permutation(12, "morton")  # 3 x 4 grid
    rows, columns = np.divmod(perm, 4)
    keys = encode(np.stack([columns, rows], axis=-1), 2, curve="morton")
    assert np.all(np.diff(keys) > 0)


def test_results_are_cached_read_only_and_the_cache_is_bounded():
    first = segment_permutation(4096, "hilbert")
    second = segment_permutation(np.int64(4096), "hilbert")
    assert first[0] is second[0] and first[1] is second[1]
    with pytest.raises(ValueError, match="read-only"):
        first[0][0] = 5
    assert _cached_grid_permutation.cache_info().maxsize == CACHE_SIZE
    for length in range(1, CACHE_SIZE + 20):
        segment_permutation(length, "snake")
    assert _cached_grid_permutation.cache_info().currsize <= CACHE_SIZE


@pytest.mark.parametrize("ordering", GRID_ORDERINGS)
@pytest.mark.parametrize("shape", [(1, 1), (7, 5), (16, 16), (6, 10), (1, 9), (2, 3, 4), (4, 4, 4), (3, 5, 7), (8, 6, 4)])
def test_grid_permutation_is_a_permutation(ordering, shape):
    perm, inverse = grid_permutation(shape, ordering)
    assert_permutation_pair(perm, inverse, math.prod(shape))


@pytest.mark.parametrize("shape", [(5, 7), (6, 10), (3, 5, 7), (4, 6, 8), (1, 1, 9)])
def test_grid_snake_takes_unit_steps_in_2d_and_3d(shape):
    perm, _ = grid_permutation(shape, "snake")
    assert np.all(grid_steps(perm, shape) == 1)


@pytest.mark.parametrize("shape", [(4, 6, 8), (2, 8, 8), (16, 16, 16), (8, 12, 2)])
def test_grid_hilbert_3d_even_sides_take_unit_steps(shape):
    perm, _ = grid_permutation(shape, "hilbert")
    assert np.all(grid_steps(perm, shape) == 1)


def test_grid_hilbert_2d_matches_gilbert_and_rowmajor_is_identity():
    perm, _ = grid_permutation((6, 10), "hilbert")
    points = gilbert(10, 6)
    np.testing.assert_array_equal(perm, points[:, 1] * 10 + points[:, 0])
    np.testing.assert_array_equal(grid_permutation((6, 10), "rowmajor")[0], np.arange(60))
    np.testing.assert_array_equal(grid_permutation((6, 10), "identity")[0], np.arange(60))


def test_grid_morton_3d_power_of_two_follows_decode():
    perm, _ = grid_permutation((4, 4, 4), "morton")
    points = decode(np.arange(64), 2, 3, curve="morton")  # (x, y, z) = (column, row, frame)
    np.testing.assert_array_equal(perm, (points[:, 2] * 4 + points[:, 1]) * 4 + points[:, 0])


def test_permutation_applies_to_torch_tokens():
    perm, inverse = segment_permutation(64, "hilbert")
    tokens = torch.randn(2, 64, 3, 8)
    layout = tokens[:, torch.as_tensor(np.array(perm))]
    assert torch.equal(layout[:, torch.as_tensor(np.array(inverse))], tokens)
    assert torch.equal(layout[:, 1], tokens[:, int(perm[1])])


@pytest.mark.parametrize(("length", "ordering", "match"), [
    (0, "hilbert", "length must be a positive integer"),
    (-4, "snake", "length must be a positive integer"),
    (2.0, "snake", "length must be a positive integer"),
    (True, "snake", "length must be a positive integer"),
    (16, "zigzag", r"ordering must be one of \('identity', 'hilbert', 'morton', 'snake'\)"),
    (16, "rowmajor", "ordering must be one of"),
])
def test_segment_bad_input(length, ordering, match):
    with pytest.raises(ValueError, match=match):
        segment_permutation(length, ordering)


@pytest.mark.parametrize(("shape", "ordering", "match"), [
    ((4,), "hilbert", r"shape must be a tuple \(H, W\) or \(T, H, W\)"),
    ((2, 2, 2, 2), "snake", "shape must be a tuple"),
    (5, "snake", "shape must be a tuple"),
    ((0, 4), "hilbert", "shape entries must be a positive integer"),
    ((4, -1), "morton", "shape entries must be a positive integer"),
    ((4, 4), "peano", r"ordering must be one of \('rowmajor', 'snake', 'hilbert', 'morton'\)"),
])
def test_grid_bad_input(shape, ordering, match):
    with pytest.raises(ValueError, match=match):
        grid_permutation(shape, ordering)


@pytest.mark.parametrize("length,height", [
    (2**61 - 1, 1),  # a Mersenne prime: the old divisor scan ran for minutes
    (2**62, 2**31), (2**63 - 1, 2323823089), ((2**31 - 1) * (2**31 + 11), 2**31 - 1),
    (999999937 * 1000000007, 999999937), (3**39, 3**19),
])
def test_near_square_grid_is_exact_and_fast_for_any_int64_length(length, height):
    import time

    start = time.perf_counter()
    assert near_square_grid(length) == (height, length // height)
    assert time.perf_counter() - start < 2.0


def test_near_square_grid_matches_a_divisor_scan():
    for length in list(range(1, 3000)) + [2**20 * 3, 7919 * 7927, 65536 * 65537]:
        height = math.isqrt(length)
        while length % height:
            height -= 1
        assert near_square_grid(length) == (height, length // height), length
    with pytest.raises(ValueError, match="length must be <= 2\\*\\*63 - 1"):
        near_square_grid(2**63)


@pytest.mark.parametrize("call", [
    lambda: segment_permutation(2**61 - 1, "hilbert"), lambda: segment_permutation(2**40, "identity"),
    lambda: grid_permutation((2**15, 2**15, 2**15), "snake"), lambda: gilbert(2**20, 2**20),
])
def test_sizes_beyond_physical_memory_are_rejected_at_once(call):
    import time

    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"must be <= \d+ on this machine .* physical memory is"):
        call()
    assert time.perf_counter() - start < 1.0


def test_the_memory_bound_is_the_largest_size_that_fits(monkeypatch):
    from hilbert_lab.curves import codec
    from hilbert_lab.curves.gilbert import gilbert3d
    from hilbert_lab.curves.orderings import PERMUTATION_BYTES_PER_TOKEN

    monkeypatch.setattr(codec, "physical_memory_bytes", lambda: 1000 * PERMUTATION_BYTES_PER_TOKEN)
    assert_permutation_pair(*segment_permutation(997, "hilbert"), 997)  # 997 is not cached by other tests
    with pytest.raises(ValueError, match="length must be <= 1000 on this machine"):
        segment_permutation(1001, "hilbert")
    with pytest.raises(ValueError, match=r"prod\(shape\) must be <= 1000"):
        grid_permutation((11, 7, 13), "morton")
    with pytest.raises(ValueError, match=r"width \* height \* depth must be <= "):
        gilbert3d(100, 100, 100)
