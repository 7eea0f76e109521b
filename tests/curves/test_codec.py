"""encode/decode: pinned vectors, agreement with galtay/hilbertcurve, round trips, locality, dtypes, torch."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from hilbert_lab.curves import decode, encode
from hilbert_lab.curves.codec import PARALLEL_MIN_POINTS

from property_testing import given, settings, st

ORDER2_PINNED = [(0, 0), (1, 0), (1, 1), (0, 1), (0, 2), (0, 3), (1, 3), (1, 2),
                 (2, 2), (2, 3), (3, 3), (3, 2), (3, 1), (2, 1), (2, 0), (3, 0)]
ORDER3_START = [(0, 0), (0, 1), (1, 1), (1, 0), (2, 0), (3, 0), (3, 1), (2, 1)]
ORDER10_PINNED = {(17, 23): 534, (1023, 0): 1048575, (0, 1023): 349525, (300, 700): 484256}
INTEGER_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def galtay_curve(order: int, ndim: int):
    """galtay/hilbertcurve's HilbertCurve, the reference Hilbert curve (a dev extra: the calling test skips without it)."""
    module = pytest.importorskip("hilbertcurve.hilbertcurve", reason="hilbertcurve (dev extra) is the reference "
                                                                      "Hilbert curve of this test")
    return module.HilbertCurve(order, ndim)


def galtay_encode(coords: np.ndarray, order: int) -> np.ndarray:
    curve = galtay_curve(order, coords.shape[-1])
    return np.array([curve.distance_from_point([int(v) for v in point]) for point in coords], dtype=np.int64)


def morton_reference(point: tuple[int, ...], order: int) -> int:
    """Documented layout: bit b of coordinate i -> index bit b*ndim + (ndim-1-i)."""
    ndim = len(point)
    return sum(((value >> level) & 1) << (level * ndim + ndim - 1 - dim)
               for dim, value in enumerate(point) for level in range(order))


def test_pinned_order2_full_sequence():
    assert decode(np.arange(16), 2, 2).tolist() == [list(p) for p in ORDER2_PINNED]
    assert encode(np.array(ORDER2_PINNED), 2).tolist() == list(range(16))


def test_pinned_order3_start():
    assert decode(np.arange(8), 3, 2).tolist() == [list(p) for p in ORDER3_START]


def test_pinned_order10_points():
    points = np.array(list(ORDER10_PINNED))
    assert encode(points, 10).tolist() == list(ORDER10_PINNED.values())
    assert decode(np.array(list(ORDER10_PINNED.values())), 10, 2).tolist() == points.tolist()


@pytest.mark.parametrize(("ndim", "order"), [
    (1, 1), (1, 7), (1, 63),
    (2, 1), (2, 2), (2, 5), (2, 12), (2, 16), (2, 17), (2, 24), (2, 31),
    (3, 1), (3, 4), (3, 7), (3, 12), (3, 21),
    (4, 3), (4, 8), (4, 15),
    (5, 6), (7, 9),
])
def test_agrees_with_hilbertcurve_on_random_points(ndim, order):
    rng = np.random.default_rng(ndim * 100 + order)
    coords = rng.integers(0, 1 << order, size=(400, ndim), dtype=np.int64)
    coords[0] = 0
    coords[1] = (1 << order) - 1  # the extreme corners
    expected = galtay_encode(coords, order)
    np.testing.assert_array_equal(encode(coords, order), expected)
    np.testing.assert_array_equal(decode(expected, order, ndim), coords)


@pytest.mark.parametrize(("ndim", "order"), [(2, 1), (2, 3), (2, 4), (2, 6), (3, 1), (3, 2), (3, 4), (4, 2), (5, 2)])
def test_exhaustive_bijection_and_unit_steps(ndim, order):
    """decode(0 .. 2**(ndim*order)-1) visits every grid point once, each step a unit step."""
    count = 1 << (ndim * order)
    points = decode(np.arange(count), order, ndim)
    assert points.min() == 0 and points.max() == (1 << order) - 1
    flat = np.ravel_multi_index(points.T, (1 << order,) * ndim)
    assert np.array_equal(np.sort(flat), np.arange(count))
    steps = np.abs(np.diff(points, axis=0)).sum(axis=1)
    assert np.all(steps == 1)
    np.testing.assert_array_equal(encode(points, order), np.arange(count))
    if ndim == 2 and order <= 4:
        np.testing.assert_array_equal(encode(points, order), galtay_encode(points, order))


@pytest.mark.parametrize(("ndim", "order"), [(2, 3), (3, 2), (2, 31), (3, 21), (9, 7), (1, 63)])
def test_morton_matches_documented_bit_layout(ndim, order):
    rng = np.random.default_rng(order)
    coords = rng.integers(0, 1 << order, size=(200, ndim), dtype=np.int64)
    expected = np.array([morton_reference(tuple(int(v) for v in p), order) for p in coords], dtype=np.int64)
    np.testing.assert_array_equal(encode(coords, order, curve="morton"), expected)
    np.testing.assert_array_equal(decode(expected, order, ndim, curve="morton"), coords)


def test_morton_small_grid_is_z_order_with_last_coordinate_low():
    # order 1, 2D: (x, y) -> 2x + y
    assert encode(np.array([[0, 0], [0, 1], [1, 0], [1, 1]]), 1, curve="morton").tolist() == [0, 1, 2, 3]
    # order 2: first quadrant (index 0..3) holds x, y < 2, quadrant x<2, y>=2 comes next
    assert decode(np.arange(8), 2, 2, curve="morton").tolist() == [
        [0, 0], [0, 1], [1, 0], [1, 1], [0, 2], [0, 3], [1, 2], [1, 3]]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_property_round_trip(data):
    ndim = data.draw(st.integers(1, 6), label="ndim")
    order = data.draw(st.integers(1, 63 // ndim), label="order")
    curve = data.draw(st.sampled_from(["hilbert", "morton"]), label="curve")
    point = data.draw(st.lists(st.integers(0, (1 << order) - 1), min_size=ndim, max_size=ndim), label="point")
    index = int(encode(np.array(point, dtype=np.int64), order, curve=curve))
    assert 0 <= index < (1 << (ndim * order))
    assert decode(np.array(index), order, ndim, curve=curve).tolist() == point
    other = data.draw(st.integers(0, (1 << (ndim * order)) - 1), label="index")
    assert int(encode(decode(np.array(other), order, ndim, curve=curve), order, curve=curve)) == other


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_property_hilbert_consecutive_indices_are_unit_steps(data):
    ndim = data.draw(st.integers(1, 5), label="ndim")
    order = data.draw(st.integers(1, 62 // ndim), label="order")
    index = data.draw(st.integers(0, (1 << (ndim * order)) - 2), label="index")
    pair = decode(np.array([index, index + 1], dtype=np.int64), order, ndim)
    assert int(np.abs(pair[1] - pair[0]).sum()) == 1


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_property_hilbert_agrees_with_hilbertcurve(data):
    ndim = data.draw(st.integers(1, 6), label="ndim")
    order = data.draw(st.integers(1, 63 // ndim), label="order")
    point = data.draw(st.lists(st.integers(0, (1 << order) - 1), min_size=ndim, max_size=ndim), label="point")
    expected = galtay_curve(order, ndim).distance_from_point(point)
    assert int(encode(np.array(point), order)) == expected


# each integer dtype compiles its own numba specialisation (seconds on a fresh checkout): two in the quick tier
QUICK_DTYPES = (np.uint8, np.int32)


@pytest.mark.parametrize("dtype", [dtype if dtype in QUICK_DTYPES else pytest.param(dtype, marks=pytest.mark.slow)
                                   for dtype in INTEGER_DTYPES])
def test_every_integer_dtype_gives_identical_results(dtype):
    rng = np.random.default_rng(3)
    coords = rng.integers(0, 128, size=(1000, 2))
    expected = encode(coords.astype(np.int64), 7)
    np.testing.assert_array_equal(encode(coords.astype(dtype), 7), expected)
    np.testing.assert_array_equal(decode(expected.astype(dtype) if np.iinfo(dtype).max >= (1 << 14) else expected,
                                         7, 2), coords)
    small = rng.integers(0, 4, size=(50, 3)).astype(dtype)
    np.testing.assert_array_equal(encode(small, 2), galtay_encode(small.astype(np.int64), 2))


def test_batch_shape_is_kept_and_values_match_flat_call():
    rng = np.random.default_rng(4)
    coords = rng.integers(0, 256, size=(3, 5, 7, 2))
    index = encode(coords, 8)
    assert index.shape == (3, 5, 7) and index.dtype == np.uint32  # 2 * 8 bits <= 32
    np.testing.assert_array_equal(index.reshape(-1), encode(coords.reshape(-1, 2), 8))
    back = decode(index, 8, 2)
    np.testing.assert_array_equal(back, coords)
    strided = coords[:, ::2]  # non-contiguous input
    np.testing.assert_array_equal(encode(strided, 8), index[:, ::2])
    assert encode(np.zeros((0, 2), dtype=np.int64), 8).shape == (0,)
    assert decode(np.zeros((0,), dtype=np.int64), 8, 3).shape == (0, 3)
    assert int(encode(np.array([3, 1]), 2)) == 12 and decode(np.int64(12), 2, 2).tolist() == [3, 1]


@pytest.mark.slow  # 7-15 s of CPU: make test-all
def test_large_batch_takes_the_parallel_path_and_agrees():
    rng = np.random.default_rng(5)
    coords = rng.integers(0, 1 << 20, size=(PARALLEL_MIN_POINTS + 1003, 2))
    index = encode(coords, 20)
    sample = rng.choice(coords.shape[0], 300, replace=False)
    np.testing.assert_array_equal(index[sample], galtay_encode(coords[sample], 20))
    np.testing.assert_array_equal(decode(index, 20, 2), coords)
    coords3 = rng.integers(0, 1 << 10, size=(PARALLEL_MIN_POINTS + 7, 3))
    np.testing.assert_array_equal(decode(encode(coords3, 10), 10, 3), coords3)


# ------------------------------------------------------------------ torch
def test_torch_in_torch_out():
    coords = torch.tensor(list(ORDER10_PINNED), dtype=torch.int32)
    index = encode(coords, 10)
    assert isinstance(index, torch.Tensor) and index.dtype == torch.int64 and index.device == coords.device
    assert index.tolist() == list(ORDER10_PINNED.values())
    back = decode(index, 10, 2)
    assert isinstance(back, torch.Tensor) and back.dtype == torch.int64
    assert torch.equal(back, coords.to(torch.int64))
    morton = encode(torch.tensor([[1, 0], [1, 1]], dtype=torch.uint8), 1, curve="morton")
    assert morton.tolist() == [2, 3]


def test_torch_non_integer_and_out_of_range_rejected():
    with pytest.raises(ValueError, match="coords must have an integer dtype"):
        encode(torch.zeros(4, 2), 3)
    with pytest.raises(ValueError, match="index must have an integer dtype"):
        decode(torch.zeros(4, dtype=torch.bool), 3, 2)
    with pytest.raises(ValueError, match=r"coords must lie in \[0, 7\]"):
        encode(torch.tensor([[8, 0]]), 3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensor_round_trip_matches_cpu():
    coords = torch.randint(0, 1 << 12, (4096, 2), device="cuda")
    index = encode(coords, 12)
    assert index.device == coords.device
    assert torch.equal(index.cpu(), encode(coords.cpu(), 12))
    assert torch.equal(decode(index, 12, 2), coords)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(("coords", "order", "match"), [
    (np.array([[0, -1]]), 3, r"coords must lie in \[0, 7\].*found -1"),
    (np.array([[8, 0]]), 3, r"coords must lie in \[0, 7\].*found 8"),
    (np.array([[1 << 31, 0]]), 31, r"coords must lie in \[0, 2147483647\]"),
    (np.array([[2**63 + 5, 0]], dtype=np.uint64), 31, r"coords must lie in"),
    (np.array([[0.0, 1.0]]), 3, "coords must have an integer dtype"),
    (np.array([[True, False]]), 3, "coords must have an integer dtype"),
    (np.array([[0, 1]]), 0, "order must be a positive integer"),
    (np.array([[0, 1]]), -2, "order must be a positive integer"),
    (np.array([[0, 1]]), 2.0, "order must be a positive integer"),
    (np.array([[0, 1]]), True, "order must be a positive integer"),
    (np.array([[0, 1]]), 32, r"ndim \* order must be <= 63.*largest allowed order for ndim=2 is 31"),
    (np.zeros((1, 4), dtype=np.int64), 16, r"ndim \* order must be <= 63"),
    (np.array(5), 3, r"coords must have shape \(\.\.\., ndim\)"),
    (np.zeros((3, 0), dtype=np.int64), 3, r"coords must have shape \(\.\.\., ndim\) with ndim >= 1"),
])
def test_encode_bad_input(coords, order, match):
    with pytest.raises(ValueError, match=match):
        encode(coords, order)


@pytest.mark.parametrize(("index", "order", "ndim", "match"), [
    (np.array([16]), 2, 2, r"index must lie in \[0, 15\].*found 16"),
    (np.array([3, -1]), 2, 2, r"index must lie in \[0, 15\].*found -1"),
    (np.array([1 << 63], dtype=np.uint64), 21, 3, r"index must lie in \[0, 9223372036854775807\]"),
    (np.array([0.5]), 2, 2, "index must have an integer dtype"),
    (np.array([1]), 2, 0, "ndim must be a positive integer"),
    (np.array([1]), 22, 3, r"ndim \* order must be <= 63"),
    (np.array([1]), 0, 2, "order must be a positive integer"),
])
def test_decode_bad_input(index, order, ndim, match):
    with pytest.raises(ValueError, match=match):
        decode(index, order, ndim)


def test_unknown_curve_rejected_by_both():
    with pytest.raises(ValueError, match=r"curve must be one of \('hilbert', 'morton'\)"):
        encode(np.array([[0, 0]]), 2, curve="peano")
    with pytest.raises(ValueError, match=r"curve must be one of"):
        decode(np.array([0]), 2, 2, curve="snake")


def test_out_of_range_in_any_position_is_caught():
    """The single-pass OR check must catch one bad entry anywhere in a large batch, per axis."""
    base = np.zeros((50_000, 3), dtype=np.int64)
    for position, axis in itertools.product((0, 17_000, 49_999), range(3)):
        bad = base.copy()
        bad[position, axis] = 1 << 5
        with pytest.raises(ValueError, match=r"coords must lie in \[0, 31\]"):
            encode(bad, 5)
        with pytest.raises(ValueError, match=r"coords must lie in \[0, 31\]"):
            encode(bad, 5, curve="morton")
    for ndim, curve in (("2", "hilbert"), ("3", "hilbert"), ("2", "morton"), ("3", "morton")):
        index = np.zeros(PARALLEL_MIN_POINTS + 5, dtype=np.int64)
        index[31_000] = 1 << (int(ndim) * 5)
        with pytest.raises(ValueError, match=r"index must lie in \[0, "):
            decode(index, 5, int(ndim), curve=curve)


# ------------------------------------------------------------------ out= and index dtypes
@pytest.mark.parametrize("ndim,order,expected", [(2, 16, np.uint32), (2, 17, np.int64), (3, 10, np.uint32),
                                                 (3, 11, np.int64), (1, 32, np.uint32), (4, 8, np.uint32)])
@pytest.mark.parametrize("curve", ["hilbert", "morton"])
def test_default_index_dtype_is_uint32_up_to_32_bits(ndim, order, expected, curve):
    rng = np.random.default_rng(ndim * 100 + order)
    coords = rng.integers(0, 1 << order, size=(500, ndim), dtype=np.int64)
    index = encode(coords, order, curve=curve)
    assert index.dtype == expected
    wide = encode(coords, order, curve=curve, dtype=np.int64)
    assert wide.dtype == np.int64 and np.array_equal(index.astype(np.int64), wide)
    np.testing.assert_array_equal(decode(index, order, ndim, curve=curve), coords)
    assert index.max() >= 1 << (ndim * order - 2)  # the top bits are really used
    assert encode(torch.from_numpy(coords), order, curve=curve).dtype == torch.int64


@pytest.mark.parametrize("curve", ["hilbert", "morton"])
@pytest.mark.parametrize("count", [1000, pytest.param(PARALLEL_MIN_POINTS + 777, marks=pytest.mark.slow)])  # 16 s each
def test_out_is_filled_and_returned_without_allocating(curve, count):
    rng = np.random.default_rng(count)
    coords = rng.integers(0, 1 << 12, size=(count, 2), dtype=np.int64)
    expected = encode(coords, 12, curve=curve, dtype=np.int64)
    for out_dtype, in_dtype in ((np.uint32, np.uint16), (np.int64, np.int64), (np.uint64, np.int32), (np.int32, np.uint16)):
        out = np.full(count, 7, dtype=out_dtype)
        assert encode(coords.astype(in_dtype), 12, curve=curve, out=out) is out
        np.testing.assert_array_equal(out.astype(np.int64), expected)
        back = np.zeros((count, 2), dtype=np.uint16)
        assert decode(out, 12, 2, curve=curve, out=back) is back
        np.testing.assert_array_equal(back, coords)
    coords3 = rng.integers(0, 1 << 10, size=(count, 3))
    out3 = np.empty(count, dtype=np.uint32)
    encode(coords3, 10, curve=curve, out=out3)
    np.testing.assert_array_equal(out3, encode(coords3, 10, curve=curve, dtype=np.int64))
    back3 = np.empty((count, 3), dtype=np.int16)
    np.testing.assert_array_equal(decode(out3, 10, 3, curve=curve, out=back3), coords3)


def test_torch_out_and_dtype():
    coords = torch.tensor(list(ORDER10_PINNED), dtype=torch.int32)
    out = torch.full((len(ORDER10_PINNED),), -1, dtype=torch.int32)
    assert encode(coords, 10, out=out) is out and out.tolist() == list(ORDER10_PINNED.values())
    assert encode(coords, 10, dtype=torch.int32).dtype == torch.int32
    back = torch.zeros(len(ORDER10_PINNED), 2, dtype=torch.int16)
    assert decode(out, 10, 2, out=back) is back and torch.equal(back.long(), coords.long())
    assert decode(out, 10, 2, dtype=torch.int32).dtype == torch.int32
    with pytest.raises(ValueError, match="out must be a torch tensor"):
        encode(coords, 10, out=np.empty(4, dtype=np.int64))


@pytest.mark.parametrize("kwargs,match", [
    ({"dtype": np.uint16}, r"dtype must be an integer dtype that holds 24-bit"),
    ({"dtype": np.float64}, r"dtype must be an integer dtype"),
    ({"dtype": "int8"}, r"dtype must be an integer dtype"),
    ({"dtype": "banana"}, r"dtype must be an integer dtype"),
    ({"out": np.empty(9, dtype=np.int64)}, r"out must be a writeable C-contiguous numpy array of shape \(10,\)"),
    ({"out": np.empty(20, dtype=np.int64)[::2]}, "out must be a writeable C-contiguous"),
    ({"out": np.empty(10, dtype=np.int16)}, r"out must have a native integer dtype that holds 24-bit"),
    ({"out": np.empty(10, dtype=np.float32)}, "out must have a native integer dtype"),
    ({"out": np.empty(10, dtype=">i8")}, "out must have a native integer dtype"),
    ({"out": [0] * 10}, "out must be a writeable C-contiguous numpy array"),
    ({"out": np.empty(10, dtype=np.int64), "dtype": np.uint32}, "disagree"),
])
def test_bad_out_and_dtype_are_rejected(kwargs, match):
    coords = np.zeros((10, 2), dtype=np.int64)
    with pytest.raises(ValueError, match=match):
        encode(coords, 12, **kwargs)


def test_bad_decode_out_and_32_bit_signed_limits():
    index = np.zeros(10, dtype=np.uint32)
    with pytest.raises(ValueError, match=r"out must have a native integer dtype that holds 12-bit coordinate"):
        decode(index, 12, 2, out=np.empty((10, 2), dtype=np.uint8))
    with pytest.raises(ValueError, match=r"shape \(10, 2\)"):
        decode(index, 12, 2, out=np.empty((10, 3), dtype=np.int64))
    readonly = np.empty((10, 2), dtype=np.int64)
    readonly.setflags(write=False)
    with pytest.raises(ValueError, match="writeable"):
        decode(index, 12, 2, out=readonly)
    with pytest.raises(ValueError, match="32-bit"):
        encode(np.zeros((3, 2), dtype=np.int64), 16, dtype=np.int32)  # int32 holds 31 bits
    assert encode(np.zeros((3, 2), dtype=np.int64), 16, dtype=np.uint32).dtype == np.uint32


@pytest.mark.parametrize("dtype", [np.uint8, pytest.param(np.uint16, marks=pytest.mark.slow),
                                   pytest.param(np.uint32, marks=pytest.mark.slow)])
def test_unsigned_narrow_coords_out_of_range_are_caught(dtype):
    coords = np.zeros((PARALLEL_MIN_POINTS + 9, 2), dtype=dtype)
    coords[-1, 1] = 1 << 7
    with pytest.raises(ValueError, match=r"coords must lie in \[0, 127\]"):
        encode(coords, 7)
    coords[-1] = [(1 << 7) - 1, 5]
    assert decode(encode(coords, 7), 7, 2)[-1].tolist() == [127, 5]
