"""serialize: grids and point clouds, every ordering, transposes, batching, torch/numpy, errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from hilbert_lab.curves import GRID_ORDERINGS, SERIALIZATIONS, decode, grid_permutation, serialize

GRIDS = [(8, 8), (5, 7), (6, 4), (3, 5, 6), (4, 8, 8)]


def _grid_points(shape):
    """Cell centres (x, y[, z]) of a row-major grid, in row-major order."""
    cells = np.indices(shape).reshape(len(shape), -1).T[:, ::-1]  # (x, y[, z])
    return cells + 0.5


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("ordering", SERIALIZATIONS)
def test_grid_is_a_permutation_with_inverse(shape, ordering):
    perm, inverse = serialize(shape, ordering)
    count = int(np.prod(shape))
    assert sorted(perm.tolist()) == list(range(count))
    assert np.array_equal(perm[inverse], np.arange(count))
    x = np.random.default_rng(0).normal(size=count)
    assert np.array_equal(x[perm][inverse], x)


@pytest.mark.parametrize("shape", GRIDS)
@pytest.mark.parametrize("ordering", GRID_ORDERINGS)
def test_grid_permutation_is_the_base_case(shape, ordering):
    assert np.array_equal(grid_permutation(shape, ordering)[0], serialize(shape, ordering)[0])


@pytest.mark.parametrize("shape", [(8, 8), (5, 7), (3, 5, 6)])
@pytest.mark.parametrize("ordering", GRID_ORDERINGS)
def test_transposed_is_the_ordering_of_the_swapped_grid(shape, ordering):
    perm, _ = serialize(shape, ordering + "-trans")
    swapped = shape[:-2] + (shape[-1], shape[-2])
    perm_swapped, _ = serialize(swapped, ordering)
    # the cell at slot j of the transposed serialization is the swapped grid's cell, axes swapped back
    grid = np.arange(int(np.prod(shape))).reshape(shape)
    expected = np.swapaxes(grid, -1, -2).reshape(-1)[perm_swapped]
    assert np.array_equal(perm, expected)


def test_rowmajor_trans_is_column_major():
    perm, _ = serialize((3, 4), "rowmajor-trans")
    assert perm.tolist() == [0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]


def test_hilbert_trans_equals_hilbert_on_non_square_grids_only():
    # gilbert always runs along the longer side, so transposing a non-square grid changes nothing
    assert np.array_equal(serialize((5, 7), "hilbert")[0], serialize((5, 7), "hilbert-trans")[0])
    assert not np.array_equal(serialize((8, 8), "hilbert")[0], serialize((8, 8), "hilbert-trans")[0])


@pytest.mark.parametrize("ordering", SERIALIZATIONS)
def test_points_on_a_power_of_two_grid_match_the_grid(ordering):
    shape = (16, 16)
    perm_points, _ = serialize(_grid_points(shape), ordering, grid_size=1.0)
    assert np.array_equal(perm_points, serialize(shape, ordering)[0])


@pytest.mark.parametrize("ordering", ["rowmajor", "snake", "morton", "rowmajor-trans", "snake-trans", "morton-trans"])
def test_points_on_a_3d_grid_match_the_grid(ordering):
    shape = (4, 8, 8)
    perm_points, _ = serialize(_grid_points(shape), ordering, grid_size=1.0)
    assert np.array_equal(perm_points, serialize(shape, ordering)[0])


def test_points_hilbert_follows_the_decoded_curve():
    # 3D Hilbert on a 2^k cube is Skilling's curve (decode), a different variant than gilbert3d
    order = 3
    cells = decode(np.arange(8**order), order, 3)
    shuffled = np.random.default_rng(1).permutation(len(cells))
    perm, _ = serialize(cells[shuffled] + 0.5, "hilbert", grid_size=1.0)
    assert np.array_equal(shuffled[perm], np.arange(len(cells)))


def test_ties_in_a_cell_keep_the_original_order():
    rng = np.random.default_rng(2)
    points = np.repeat(rng.random((50, 2)), 3, axis=0) + rng.random((150, 2)) * 1e-6
    for ordering in ("hilbert", "morton", "snake"):
        perm, _ = serialize(points, ordering, grid_size=0.05)
        cells = np.floor((points - points.min(axis=0)) / 0.05)
        same_cell = np.all(cells[perm][1:] == cells[perm][:-1], axis=1)
        assert np.all(perm[1:][same_cell] > perm[:-1][same_cell])


@pytest.mark.parametrize("ordering", SERIALIZATIONS)
def test_batched_points_equal_per_cloud_and_torch_equals_numpy(ordering):
    points = np.random.default_rng(3).random((3, 200, 3))
    perm, inverse = serialize(points, ordering)
    assert perm.shape == (3, 200)
    for b in range(3):
        assert np.array_equal(perm[b], serialize(points[b], ordering)[0])
        assert np.array_equal(perm[b][inverse[b]], np.arange(200))
    perm_t, inverse_t = serialize(torch.from_numpy(points).float(), ordering)
    assert isinstance(perm_t, torch.Tensor) and perm_t.dtype == torch.int64
    assert np.array_equal(perm_t.numpy(), serialize(points.astype(np.float32), ordering)[0])
    assert torch.equal(torch.gather(perm_t, 1, inverse_t), torch.arange(200).expand(3, 200))


def test_hilbert_points_are_spatially_local():
    points = np.random.default_rng(4).random((4096, 2))
    steps = {}
    for ordering in ("rowmajor", "hilbert", "morton"):
        perm, _ = serialize(points, ordering, grid_size=1 / 64)
        steps[ordering] = np.linalg.norm(np.diff(points[perm], axis=0), axis=1).mean()
    assert steps["hilbert"] < steps["morton"] < steps["rowmajor"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA for the CUDA curve kernels")
@pytest.mark.gpu
@pytest.mark.parametrize("ordering", SERIALIZATIONS)
def test_cuda_points_match_cpu(ordering):
    points = torch.rand(2, 5000, 3, dtype=torch.float64)
    perm_cpu, _ = serialize(points, ordering)
    perm_gpu, inverse_gpu = serialize(points.cuda(), ordering)
    assert perm_gpu.is_cuda and torch.equal(perm_gpu.cpu(), perm_cpu)
    assert torch.equal(torch.gather(perm_gpu, 1, inverse_gpu).cpu(), torch.arange(5000).expand(2, 5000))


@pytest.mark.parametrize("args, kwargs, match", [
    (((4, 4), "peano"), {}, r"ordering must be one of \('rowmajor'.*'morton-trans'\)"),
    (((4,), "hilbert"), {}, "grid shape must be"),
    (((4, 0), "hilbert"), {}, "grid shape must be"),
    (((4, 4), "hilbert"), {"grid_size": 0.5}, "grid_size applies to point clouds only"),
    ((np.zeros((5, 4)), "hilbert"), {}, r"points must have shape \(N, 2\|3\)"),
    ((np.zeros((5, 2)), "hilbert"), {"grid_size": -1.0}, "grid_size must be None or a positive"),
    ((np.array([[0.0, 0.0], [1.0, np.nan]]), "hilbert"), {}, "points must be finite"),
    ((np.array([[0.0, 0.0], [1.0, 1.0]]), "morton"), {"grid_size": 1e-30}, "grid_size is too small"),
    (("abc", "hilbert"), {}, "grid_shape_or_points must be"),
])
def test_bad_input_raises_value_error(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        serialize(*args, **kwargs)


def test_a_cloud_spanning_more_than_the_largest_float_is_ordered_like_its_scaled_copy():
    import warnings

    points = np.array([[-1e308, -1e308], [1e308, 1e308], [0.0, 0.0], [1e307, -1e308], [-5e307, 3e307]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow on the way
        for ordering in ("hilbert", "morton", "snake-trans"):
            perm, _ = serialize(points, ordering)
            scaled, _ = serialize(points * 1e-300, ordering)  # the same cloud at a scale without overflow
            assert perm.tolist() == scaled.tolist(), ordering
            assert serialize(torch.tensor(points), ordering)[0].tolist() == perm.tolist()
    with pytest.raises(ValueError, match="grid_size is too small"):
        serialize(points, "hilbert", grid_size=1.0)


def test_complex_points_and_huge_grids_are_refused_naming_them():
    with pytest.raises(ValueError, match="points must be a real numeric tensor, got dtype torch.complex64"):
        serialize(torch.tensor([[1 + 1j, 2.0], [3.0, 4.0]]), "hilbert")
    with pytest.raises(ValueError, match="points must be a real numeric array"):
        serialize(np.array([[1 + 1j, 2.0], [3.0, 4.0]]), "hilbert")
    for ordering in ("rowmajor", "snake-trans", "morton"):
        with pytest.raises(ValueError, match=r"grid shape \(100000, 100000\)"):
            serialize((100000, 100000), ordering)
