"""Numba kernels directly: parallel and serial twins agree, block boundaries, the OR-accumulator."""
from __future__ import annotations

import numpy as np
import pytest

from hilbert_lab.kernels import gilbert_numba, hilbert_numba, morton_numba

COUNT = 3 * hilbert_numba.BLOCK + 123  # several parallel blocks plus a ragged tail


def kernel(name: str):
    """The Numba kernel `name` of its curve family's module."""
    return getattr(morton_numba if name.startswith("morton") else hilbert_numba, name)


@pytest.mark.parametrize("order", [5, 16, 17, 31])
def test_2d_parallel_equals_serial_and_round_trips(order):
    rng = np.random.default_rng(order)
    coords = rng.integers(0, 1 << order, size=(COUNT, 2), dtype=np.int64)
    flat = coords.reshape(-1)
    for encode_name, decode_name in (("hilbert_encode_2d", "hilbert_decode_2d"), ("morton_encode_2d", "morton_decode_2d")):
        extra = (order,) if encode_name.startswith("hilbert") else ()
        parallel_index = np.full(COUNT, -1, dtype=np.int64)
        serial_index = np.full(COUNT, -2, dtype=np.int64)
        acc_parallel = kernel(encode_name)(flat, *extra, parallel_index)
        acc_serial = kernel(f"{encode_name}_serial")(flat, *extra, serial_index)
        np.testing.assert_array_equal(parallel_index, serial_index)
        assert acc_parallel == acc_serial == np.bitwise_or.reduce(flat)
        back = np.full(2 * COUNT, -1, dtype=np.int64)
        acc_index = kernel(decode_name)(parallel_index, *extra, back)
        np.testing.assert_array_equal(back, flat)
        assert acc_index == np.bitwise_or.reduce(parallel_index)


@pytest.mark.parametrize(("ndim", "order"), [(1, 40), (3, 10), (4, 15)])
def test_nd_parallel_equals_serial_and_round_trips(ndim, order):
    rng = np.random.default_rng(ndim)
    coords = rng.integers(0, 1 << order, size=(COUNT, ndim), dtype=np.int64)
    for encode_name, decode_name in (("hilbert_encode_nd", "hilbert_decode_nd"), ("morton_encode_nd", "morton_decode_nd")):
        parallel_index = np.full(COUNT, -1, dtype=np.int64)
        serial_index = np.full(COUNT, -2, dtype=np.int64)
        acc = kernel(encode_name)(coords, order, parallel_index)
        kernel(f"{encode_name}_serial")(coords, order, serial_index)
        np.testing.assert_array_equal(parallel_index, serial_index)
        assert acc == np.bitwise_or.reduce(coords.reshape(-1))
        back = np.full((COUNT, ndim), -1, dtype=np.int64)
        kernel(decode_name)(parallel_index, order, back)
        np.testing.assert_array_equal(back, coords)


def test_accumulator_flags_negative_and_wide_inputs_in_the_last_block():
    coords = np.zeros(COUNT * 2, dtype=np.int64)
    out = np.empty(COUNT, dtype=np.int64)
    coords[-1] = -3
    assert (hilbert_numba.hilbert_encode_2d(coords, 8, out) >> 8) != 0
    coords[-1] = 1 << 8
    assert (hilbert_numba.hilbert_encode_2d(coords, 8, out) >> 8) != 0
    coords[-1] = (1 << 8) - 1
    assert (hilbert_numba.hilbert_encode_2d(coords, 8, out) >> 8) == 0


def test_gilbert_walk_reports_a_too_small_output_instead_of_writing_past_it():
    out = np.zeros((5, 2), dtype=np.int64)
    assert gilbert_numba.gilbert2d_walk(0, 0, 3, 0, 0, 2, out) == -1
    out3 = np.zeros((7, 3), dtype=np.int64)
    assert gilbert_numba.gilbert3d_walk(np.array([2, 0, 0]), np.array([0, 2, 0]), np.array([0, 0, 2]), out3) == -1


def test_2d_hilbert_tables_match_galtay_at_every_order():
    """Every chunk count (1..5 lookups of 7 levels) and every top-chunk padding, corners included."""
    HilbertCurve = pytest.importorskip("hilbertcurve.hilbertcurve", reason="hilbertcurve (dev extra) is the "
                                       "reference Hilbert curve of this test").HilbertCurve

    rng = np.random.default_rng(11)
    for order in range(1, 32):
        top = (1 << order) - 1
        coords = np.concatenate([rng.integers(0, top + 1, size=(40, 2)),
                                 [[0, 0], [top, 0], [0, top], [top, top], [top, top >> 1]]]).astype(np.int64)
        curve = HilbertCurve(order, 2)
        expected = np.array([curve.distance_from_point([int(a), int(b)]) for a, b in coords], dtype=np.int64)
        index = np.empty(len(coords), dtype=np.int64)
        hilbert_numba.hilbert_encode_2d_serial(coords.reshape(-1), order, index)
        np.testing.assert_array_equal(index, expected, err_msg=f"order {order}")
        back = np.empty(2 * len(coords), dtype=np.int64)
        hilbert_numba.hilbert_decode_2d_serial(expected, order, back)
        np.testing.assert_array_equal(back, coords.reshape(-1), err_msg=f"order {order}")


@pytest.mark.parametrize("order,dtype", [(5, np.uint8), (8, np.int16), (16, np.uint16), (15, np.int16), (17, np.uint32),
                                         (31, np.int32), (31, np.uint32), (22, np.int32)])
def test_packed_2d_decode_equals_interleaved(order, dtype):
    rng = np.random.default_rng(order)
    coords = rng.integers(0, 1 << order, size=(COUNT, 2), dtype=np.int64)
    coords[:2] = [[(1 << order) - 1, 0], [(1 << order) - 1, (1 << order) - 1]]
    index = np.empty(COUNT, dtype=np.int64)
    hilbert_numba.hilbert_encode_2d(coords.reshape(-1), order, index)
    width = 8 * np.dtype(dtype).itemsize
    for name in ("hilbert_decode_2d_packed", "hilbert_decode_2d_packed_serial"):
        out = np.full((COUNT, 2), 3, dtype=dtype)
        acc = kernel(name)(index, order, out.view(np.dtype(f"u{2 * out.itemsize}")).reshape(-1), width)
        np.testing.assert_array_equal(out, coords, err_msg=name)
        assert acc == np.bitwise_or.reduce(index)


@pytest.mark.parametrize("order,dtype", [(5, np.uint8), (8, np.uint8), (12, np.uint16), (16, np.uint16), (17, np.uint32),
                                         (31, np.uint32)])
def test_packed_2d_encode_equals_interleaved(order, dtype):
    rng = np.random.default_rng(order)
    coords = rng.integers(0, 1 << order, size=(COUNT, 2)).astype(dtype)
    coords[:2] = [[(1 << order) - 1, 0], [(1 << order) - 1, (1 << order) - 1]]
    expected = np.empty(COUNT, dtype=np.int64)
    hilbert_numba.hilbert_encode_2d(coords.astype(np.int64).reshape(-1), order, expected)
    packed = coords.view(np.dtype(f"u{2 * coords.itemsize}")).reshape(-1)
    for name in ("hilbert_encode_2d_packed", "hilbert_encode_2d_packed_serial"):
        index = np.full(COUNT, -1, dtype=np.int64)
        acc = kernel(name)(packed, order, index, 8 * coords.itemsize)
        np.testing.assert_array_equal(index, expected, err_msg=name)
        assert acc == np.bitwise_or.reduce(coords.reshape(-1).astype(np.int64))
