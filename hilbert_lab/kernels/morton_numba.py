"""Numba CPU kernels of the Morton (Z-order) curve: 2D (bit spreading) and any ndim.

Plain bit interleave with the Hilbert kernels' bit layout (no Gray code / rotations): bit ``b`` of
``coords[..., i]`` lands at index bit ``b * ndim + (ndim - 1 - i)``; the last coordinate is the low
bit. Conventions as in kernels.hilbert_numba: preallocated outputs, the OR of the integer inputs
returned, each ``*_serial`` kernel the serial twin of a parallel one over blocks of BLOCK points.
"""
from __future__ import annotations

import numba
import numpy as np

from hilbert_lab.kernels.hilbert_numba import BLOCK


@numba.njit(inline="always")
def _spread_bits_2d(value):
    """Move bit b of the low 32 bits to bit 2b."""
    value &= 0xFFFFFFFF
    value = (value | (value << 16)) & 0x0000FFFF0000FFFF
    value = (value | (value << 8)) & 0x00FF00FF00FF00FF
    value = (value | (value << 4)) & 0x0F0F0F0F0F0F0F0F
    value = (value | (value << 2)) & 0x3333333333333333
    value = (value | (value << 1)) & 0x5555555555555555
    return value


@numba.njit(inline="always")
def _compact_bits_2d(value):
    """Inverse of _spread_bits_2d: bit 2b -> bit b (odd bits are dropped)."""
    value &= 0x5555555555555555
    value = (value | (value >> 1)) & 0x3333333333333333
    value = (value | (value >> 2)) & 0x0F0F0F0F0F0F0F0F
    value = (value | (value >> 4)) & 0x00FF00FF00FF00FF
    value = (value | (value >> 8)) & 0x0000FFFF0000FFFF
    value = (value | (value >> 16)) & 0x00000000FFFFFFFF
    return value


@numba.njit(cache=True, nogil=True)
def morton_encode_nd_serial(coords, order, out):
    """Serial twin of morton_encode_nd (same arguments and result)."""
    ndim = coords.shape[1]
    acc = np.int64(0)
    for i in range(out.shape[0]):
        result = np.int64(0)
        for dim in range(ndim):
            value = np.int64(coords[i, dim])
            acc |= value
            for level in range(order):
                result |= ((value >> level) & 1) << (level * ndim + ndim - 1 - dim)
        out[i] = result
    return acc


@numba.njit(cache=True, nogil=True)
def morton_encode_2d_serial(flat, out):
    """Serial twin of morton_encode_2d (same arguments and result)."""
    acc = np.int64(0)
    for i in range(out.shape[0]):
        x = np.int64(flat[2 * i])
        y = np.int64(flat[2 * i + 1])
        acc |= x | y
        out[i] = (_spread_bits_2d(x) << 1) | _spread_bits_2d(y)
    return acc


@numba.njit(cache=True, nogil=True)
def morton_decode_nd_serial(index, order, out):
    """Serial twin of morton_decode_nd (same arguments and result)."""
    ndim = out.shape[1]
    acc = np.int64(0)
    for i in range(index.shape[0]):
        value = np.int64(index[i])
        acc |= value
        for dim in range(ndim):
            coordinate = np.int64(0)
            for level in range(order):
                coordinate |= ((value >> (level * ndim + ndim - 1 - dim)) & 1) << level
            out[i, dim] = coordinate
    return acc


@numba.njit(cache=True, nogil=True)
def morton_decode_2d_serial(index, flat_out):
    """Serial twin of morton_decode_2d (same arguments and result)."""
    acc = np.int64(0)
    for i in range(index.shape[0]):
        value = np.int64(index[i])
        acc |= value
        flat_out[2 * i] = _compact_bits_2d(value >> 1)
        flat_out[2 * i + 1] = _compact_bits_2d(value)
    return acc


@numba.njit(parallel=True, cache=True)
def morton_encode_2d(flat, out):
    """flat (2N,) interleaved x0, y0, x1, ... any int dtype -> out (N,) int64; returns OR of coords."""
    count = out.shape[0]
    blocks = (count + BLOCK - 1) // BLOCK
    block_or = np.zeros(blocks, dtype=np.int64)
    for block in numba.prange(blocks):
        start = block * BLOCK
        stop = min(count, start + BLOCK)
        block_or[block] = morton_encode_2d_serial(flat[2 * start:2 * stop], out[start:stop])
    total = np.int64(0)
    for block in range(blocks):
        total |= block_or[block]
    return total


@numba.njit(parallel=True, cache=True)
def morton_decode_2d(index, flat_out):
    """index (N,) any int dtype -> flat_out (2N,) int64 interleaved x, y; returns OR of indices."""
    count = index.shape[0]
    blocks = (count + BLOCK - 1) // BLOCK
    block_or = np.zeros(blocks, dtype=np.int64)
    for block in numba.prange(blocks):
        start = block * BLOCK
        stop = min(count, start + BLOCK)
        block_or[block] = morton_decode_2d_serial(index[start:stop], flat_out[2 * start:2 * stop])
    total = np.int64(0)
    for block in range(blocks):
        total |= block_or[block]
    return total


@numba.njit(parallel=True, cache=True)
def morton_encode_nd(coords, order, out):
    """coords (N, ndim) any int dtype -> out (N,) int64 Morton index; returns OR of all coords."""
    count = out.shape[0]
    blocks = (count + BLOCK - 1) // BLOCK
    block_or = np.zeros(blocks, dtype=np.int64)
    for block in numba.prange(blocks):
        start = block * BLOCK
        stop = min(count, start + BLOCK)
        block_or[block] = morton_encode_nd_serial(coords[start:stop], order, out[start:stop])
    total = np.int64(0)
    for block in range(blocks):
        total |= block_or[block]
    return total


@numba.njit(parallel=True, cache=True)
def morton_decode_nd(index, order, out):
    """index (N,) any int dtype -> out (N, ndim) int64 coordinates; returns OR of all indices."""
    count = index.shape[0]
    blocks = (count + BLOCK - 1) // BLOCK
    block_or = np.zeros(blocks, dtype=np.int64)
    for block in numba.prange(blocks):
        start = block * BLOCK
        stop = min(count, start + BLOCK)
        block_or[block] = morton_decode_nd_serial(index[start:stop], order, out[start:stop])
    total = np.int64(0)
    for block in range(blocks):
        total |= block_or[block]
    return total
