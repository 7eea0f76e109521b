"""Locality metrics: known values of the classic orderings and brute-force checks on random orderings."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from hilbert_lab.curves import grid_permutation, layout_permutation
from hilbert_lab.locality import (
    blocks_touched_per_box,
    box_clustering_numbers,
    dilated_groups,
    grid_coordinates,
    mask_tile_density,
    segment_compactness,
    step_distances,
    tile_density,
    worst_case_stretch,
)


def coords_of(shape, ordering):
    perm, _ = grid_permutation(shape, ordering)
    return grid_coordinates(shape, perm)


def random_coords(rng, shape):
    return grid_coordinates(shape, rng.permutation(int(np.prod(shape))))


def brute_boxes(shape, coords, box):
    """(clustering numbers, sets of slots) of every box position, by direct enumeration."""
    index = {tuple(c): i for i, c in enumerate(coords.tolist())}
    out = []
    ranges = [range(side - box + 1) for side in shape]
    for corner in itertools.product(*ranges):
        cells = itertools.product(*[range(c, c + box) for c in corner])
        slots = sorted(index[cell] for cell in cells)
        runs = 1 + sum(1 for a, b in zip(slots, slots[1:]) if b != a + 1)
        out.append((runs, slots))
    return out


@pytest.mark.parametrize("side", [2, 4, 8, 16, 32, 64])
def test_hilbert_steps_are_exactly_one_on_power_of_two_grids(side):
    np.testing.assert_array_equal(step_distances(coords_of((side, side), "hilbert")), 1.0)


@pytest.mark.parametrize("side", [2, 4, 8])
def test_hilbert_steps_are_exactly_one_on_power_of_two_cubes(side):
    np.testing.assert_array_equal(step_distances(coords_of((side, side, side), "hilbert")), 1.0)


@pytest.mark.parametrize("shape", [(8, 8), (16, 16), (8, 8, 8)])
def test_morton_steps_are_those_of_the_bit_interleaved_order(shape):
    """Slot i of the Z-order is the cell whose coordinates are the de-interleaved bits of i (the step lengths do
    not depend on which axis takes the lowest bit); its mean step exceeds Hilbert's exact 1 by more than 0.1."""
    dims, bits = len(shape), int(np.log2(shape[0]))
    slots = np.arange(int(np.prod(shape)))
    cells = np.stack([sum(((slots >> (dims * b + axis)) & 1) << b for b in range(bits)) for axis in range(dims)], 1)
    expected = np.linalg.norm(np.diff(cells, axis=0), axis=1)
    np.testing.assert_allclose(step_distances(coords_of(shape, "morton")), expected, rtol=0, atol=1e-12)
    assert expected.mean() > 1.1


def test_snake_steps_are_one_and_rowmajor_jumps_at_row_ends():
    np.testing.assert_array_equal(step_distances(coords_of((5, 7), "snake")), 1.0)
    steps = step_distances(coords_of((5, 7), "rowmajor"))
    assert np.count_nonzero(steps != 1.0) == 4 and np.isclose(steps.max(), np.hypot(6, 1))


@pytest.mark.parametrize("box", [2, 3, 5])
def test_rowmajor_clustering_number_of_a_box_equals_its_side(box):
    numbers = box_clustering_numbers((9, 11), coords_of((9, 11), "rowmajor"), box)
    assert numbers.size == (9 - box + 1) * (11 - box + 1)
    np.testing.assert_array_equal(numbers, box)


def test_rowmajor_clustering_in_3d_equals_box_face():
    numbers = box_clustering_numbers((5, 6, 7), coords_of((5, 6, 7), "rowmajor"), 3)
    np.testing.assert_array_equal(numbers, 9)


def test_full_width_rowmajor_box_is_one_cluster():
    assert set(box_clustering_numbers((6, 4), coords_of((6, 4), "rowmajor"), (2, 4)).tolist()) == {1}


@pytest.mark.parametrize("shape, box", [((7, 6), 3), ((4, 5, 3), 2)])
def test_clustering_and_blocks_touched_match_bruteforce_on_random_orderings(rng, shape, box):
    coords = random_coords(rng, shape)
    brute = brute_boxes(shape, coords, box)
    np.testing.assert_array_equal(box_clustering_numbers(shape, coords, box), [runs for runs, _ in brute])
    for block_size in (1, 3, 8):
        expected = [len({slot // block_size for slot in slots}) for _, slots in brute]
        np.testing.assert_array_equal(blocks_touched_per_box(shape, coords, box, block_size), expected)


def test_hilbert_boxes_touch_fewer_tiles_than_rowmajor():
    """64 x 64 grid, tiles of 64 slots, 8 x 8 boxes. Row-major: a tile is one row, a box touches 8. Hilbert: a
    tile is an aligned 8 x 8 block; a box spans 1 block along an axis where it is aligned (8 of its 57
    positions) and 2 elsewhere, so (106 / 57)^2 = 3.46 tiles on average."""
    shape = (64, 64)
    hilbert = blocks_touched_per_box(shape, coords_of(shape, "hilbert"), 8, 64)
    rowmajor = blocks_touched_per_box(shape, coords_of(shape, "rowmajor"), 8, 64)
    np.testing.assert_array_equal(rowmajor, 8)
    assert hilbert.mean() == pytest.approx((106 / 57) ** 2, abs=1e-12)


def test_segment_compactness_known_values():
    height, width = 6, 8
    coords = coords_of((height, width), "rowmajor")
    horizontal, vertical = height * (width - 1), width * (height - 1)
    assert segment_compactness((height, width), coords, width) == pytest.approx(horizontal / (horizontal + vertical))
    assert segment_compactness((height, width), coords, height * width) == 1.0
    assert segment_compactness((height, width), coords, 1) == 0.0
    # shifted by half a row: each row splits into two segments, the vertical pairs of a half-row share one
    shifted = segment_compactness((height, width), coords, width, shift=width // 2)
    manual_index = np.arange(height * width).reshape(height, width)
    segment = (manual_index + width // 2) // width
    same = np.count_nonzero(segment[:, 1:] == segment[:, :-1]) + np.count_nonzero(segment[1:] == segment[:-1])
    assert shifted == pytest.approx(same / (horizontal + vertical))


def test_hilbert_compactness_beats_rowmajor_for_tile_sized_segments():
    """32 x 32 grid, segments of 64 slots; 2 x 32 x 31 = 1984 adjacent pairs. Row-major segments are two rows:
    all 992 horizontal pairs and 16 x 32 vertical ones share a segment. Hilbert segments are aligned 8 x 8
    blocks: 28 of the 31 pairs of each row and of each column do."""
    shape = (32, 32)
    hilbert = segment_compactness(shape, coords_of(shape, "hilbert"), 64)
    rowmajor = segment_compactness(shape, coords_of(shape, "rowmajor"), 64)
    assert rowmajor == pytest.approx((992 + 16 * 32) / 1984) and hilbert == pytest.approx(2 * 28 * 32 / 1984)


def test_worst_case_stretch_known_and_bruteforce(rng):
    width = 9
    assert worst_case_stretch(coords_of((4, width), "rowmajor")) == (width - 1) ** 2 + 1
    coords = random_coords(rng, (5, 6)).astype(float)
    expected = max(np.sum((coords[j] - coords[i]) ** 2) / (j - i) for i in range(30) for j in range(i + 1, 30))
    assert worst_case_stretch(coords) == pytest.approx(expected)
    # Hilbert's Euclidean-squared stretch is bounded (6 in 2D); row-major grows with the width
    assert worst_case_stretch(coords_of((32, 32), "hilbert")) <= 6.0 < worst_case_stretch(coords_of((32, 32), "rowmajor"))


def dense_mask_from_groups(groups):
    mask = np.zeros((groups.num_tokens, groups.num_tokens), dtype=bool)
    for group in range(groups.group_indptr.size - 1):
        members = groups.group_members[groups.group_indptr[group]:groups.group_indptr[group + 1]]
        mask[np.ix_(members, members)] = True
    return mask


@pytest.mark.parametrize("dilation_rate", [1, 2, 4, 8])
def test_tile_density_natural_layout_is_one_over_r_squared_inside_segments(dilation_rate):
    seq_len, segment_length, block_size = 2048, 512, 64
    groups = dilated_groups(seq_len, segment_length, dilation_rate)
    perm = layout_permutation(seq_len, segment_length, "identity")[0].numpy()
    density = tile_density(groups, perm, block_size)
    assert density["mean_density"] == pytest.approx(1 / dilation_rate**2)
    # every block inside a diagonal segment block is nonempty, none outside
    assert density["nonempty_blocks"] == (seq_len // segment_length) * (segment_length // block_size) ** 2
    # and each nonempty block has exactly that density (not only on average)
    mask = dense_mask_from_groups(groups)
    counts = mask.reshape(32, 64, 32, 64).sum(axis=(1, 3))
    np.testing.assert_array_equal(np.unique(counts[counts > 0]), [block_size**2 // dilation_rate**2])


@pytest.mark.parametrize("dilation_rate", [1, 2, 4])
def test_tile_density_dilation_major_layout_is_one(dilation_rate):
    seq_len, segment_length, block_size = 2048, 512, 64
    groups = dilated_groups(seq_len, segment_length, dilation_rate)
    perm = layout_permutation(seq_len, segment_length, "dilation_major", dilation_rate=dilation_rate)[0].numpy()
    density = tile_density(groups, perm, block_size)
    assert density["mean_density"] == 1.0
    assert density["nonempty_blocks"] == (seq_len // segment_length) * (segment_length // dilation_rate // block_size) ** 2


def test_tile_density_matches_dense_mask_on_random_layouts(rng):
    groups = dilated_groups(200, 40, 4, offset=1)
    mask = dense_mask_from_groups(groups)
    for block_size in (7, 16, 64):
        perm = rng.permutation(200)
        expected = mask_tile_density(mask[np.ix_(perm, perm)], block_size)
        got = tile_density(groups, perm, block_size)
        assert got["nonempty_blocks"] == expected["nonempty_blocks"]
        assert got["total_blocks"] == expected["total_blocks"] == (-(-200 // block_size)) ** 2
        assert got["mean_density"] == pytest.approx(expected["mean_density"])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: step_distances(np.zeros(3)), "coords"),
        (lambda: box_clustering_numbers((4, 4), np.zeros((15, 2), dtype=int), 2), "coords"),
        (lambda: box_clustering_numbers((4, 4), np.zeros((16, 2), dtype=int), 2), "every grid cell"),
        (lambda: box_clustering_numbers((4, 4), coords_of((4, 4), "rowmajor"), 5), "box"),
        (lambda: box_clustering_numbers((4, 4), coords_of((4, 4), "rowmajor"), 0), "box"),
        (lambda: blocks_touched_per_box((4, 4), coords_of((4, 4), "rowmajor"), 2, 0), "block_size"),
        (lambda: segment_compactness((4, 4), coords_of((4, 4), "rowmajor"), 0), "segment_length"),
        (lambda: segment_compactness((4, 4), coords_of((4, 4), "rowmajor"), 4, shift=4), "shift"),
        (lambda: worst_case_stretch(np.zeros((20000, 2))), "coords"),
        (lambda: tile_density(dilated_groups(16, 8, 2), np.arange(8), 4), "perm"),
        (lambda: mask_tile_density(np.zeros((3, 4), dtype=bool), 2), "mask"),
    ],
)
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
