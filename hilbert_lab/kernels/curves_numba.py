"""Numba CPU kernels for space-filling curves: Hilbert/Morton encode+decode and gilbert generators.

Leaf module: plain integers and numpy arrays only, no validation beyond what the kernels report.
Every batch kernel writes into a preallocated output and returns the bitwise OR of all its integer
inputs (as int64), so the caller detects out-of-range or negative inputs with one
``(acc >> bits) != 0`` test instead of a second pass over the data.

Conventions (shared with ``hilbert_lab.curves``):

* Hilbert: John Skilling's transpose algorithm, bit-identical to galtay/hilbertcurve
  ``HilbertCurve(order, ndim).distance_from_point(point)``. Within each level of the index,
  ``coords[..., 0]`` supplies the most significant bit and ``coords[..., ndim-1]`` the least.
* Morton: plain bit interleave with the same bit layout (no Gray code / rotations): bit ``b`` of
  ``coords[..., i]`` lands at index bit ``b * ndim + (ndim - 1 - i)``; the last coordinate is the
  low bit.

2D Hilbert is branch- and table-free, so LLVM vectorizes it across points. Walking the levels from
the top, the sub-square frame is a state (swap, complement) in GF(2)^2 that starts at (0, 0).
With coordinate bits (bx, by) of a level and e = bx ^ by:

* digit = (hi, e) with hi = bx ^ (swap & e) ^ complement,
* next state = M(e) @ state + t, M(e) = [[~e, 1], [e, ~e]], t = (~by, e & bx)   (affine over GF(2)).

Encode composes these affine maps for all levels with a log-step prefix scan on bit-plane words
(one bit per level; above ``order`` the translations are zero, so those maps fix the start state).
For order <= 16 two points share one 64-bit word (SWAR), one per 32-bit half. Decode is simpler: given the digit,
the state toggles (~fy, fx & ~fy) do not depend on the state, so the state is a prefix XOR.

Each ``*_serial`` kernel has the same signature as its parallel twin (use it for small inputs,
where thread start-up dominates). Parallel kernels split the points into blocks and call the
serial kernel on contiguous slices, keeping the 'C' layout that lets LLVM vectorize (inlined into
numba's parfor body the same loop runs about 2x slower). The gilbert walks are inherently
sequential (njit without parallel).
"""
from __future__ import annotations

import numba
import numpy as np

BLOCK = 1 << 14  # points per parallel work item


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


@numba.njit(inline="always")
def _spread_halves_16(word):
    """Spread the low 16 bits of each 32-bit half of `word` to the even bits of that half."""
    word = (word | (word << 8)) & 0x00FF00FF00FF00FF
    word = (word | (word << 4)) & 0x0F0F0F0F0F0F0F0F
    word = (word | (word << 2)) & 0x3333333333333333
    word = (word | (word << 1)) & 0x5555555555555555
    return word


@numba.njit(inline="always")
def _hilbert2d_affine_scan(x, y, rounds):
    """Translation words (t0, t1) of the composed level maps (see module docstring)."""
    e = x ^ y
    not_e = ~e
    m00 = not_e
    m01 = np.int64(-1)
    m10 = e
    m11 = not_e
    t0 = ~y
    t1 = e & x
    shift = 1
    for _ in range(rounds):
        # compose (lower block at bit l) o (higher block: words >> shift)
        b00 = m00 >> shift
        b01 = m01 >> shift
        b10 = m10 >> shift
        b11 = m11 >> shift
        c0 = t0 >> shift
        c1 = t1 >> shift
        t0 = (m00 & c0) ^ (m01 & c1) ^ t0
        t1 = (m10 & c0) ^ (m11 & c1) ^ t1
        n00 = (m00 & b00) ^ (m01 & b10)
        n01 = (m00 & b01) ^ (m01 & b11)
        n10 = (m10 & b00) ^ (m11 & b10)
        n11 = (m10 & b01) ^ (m11 & b11)
        m00 = n00
        m01 = n01
        m10 = n10
        m11 = n11
        shift <<= 1
    return t0, t1


@numba.njit(inline="always")
def _hilbert2d_encode_point(x, y, level_mask):
    """Hilbert index of one point (int64 x, y < 2**order, order <= 31); level_mask = 2**order - 1.

    Above the order's levels the translations must be zero (t0 is masked; t1 = e & x is zero
    there), so those levels fix the start state (0, 0) whatever their matrix part.
    """
    e = x ^ y
    t0, t1 = _hilbert2d_affine_scan(x, y & level_mask | ~level_mask, 5)
    high = x ^ ((t0 >> 1) & e) ^ (t1 >> 1)
    return (_spread_bits_2d(high) << 1) | _spread_bits_2d(e)


@numba.njit(inline="always")
def _hilbert2d_encode_pair(x_pair, y_pair, pair_mask):
    """Hilbert indices of two points (order <= 16) packed SWAR-style: point a in bits 0..31 and
    point b in bits 32..63 of x_pair / y_pair; pair_mask = level_mask | level_mask << 32.

    After 4 scan rounds a result bit l depends only on input bits l .. l+15, i.e. on a's own half
    for every bit l <= 16 that is used, so b's bits never leak into a's result.
    """
    e = x_pair ^ y_pair
    t0, t1 = _hilbert2d_affine_scan(x_pair, y_pair | ~pair_mask, 4)
    high = (x_pair ^ ((t0 >> 1) & e) ^ (t1 >> 1)) & pair_mask
    both = (_spread_halves_16(high) << 1) | _spread_halves_16(e)
    return both & 0xFFFFFFFF, (both >> 32) & 0xFFFFFFFF


@numba.njit(inline="always")
def _hilbert2d_decode_point(index, level_mask, narrow):
    """(x, y) of a Hilbert index (int64, < 4**order); level_mask = 2**order - 1.

    narrow: order <= 16, where the two bit planes and the two prefix scans are each packed side
    by side in one 64-bit word (bits leaking across the halves land above bit 16 and are unused).
    """
    if narrow:
        word = (index & 0x55555555) | (((index >> 1) & 0x55555555) << 32)
        word = (word | (word >> 1)) & 0x3333333333333333
        word = (word | (word >> 2)) & 0x0F0F0F0F0F0F0F0F
        word = (word | (word >> 4)) & 0x00FF00FF00FF00FF
        word = (word | (word >> 8)) & 0x0000FFFF0000FFFF
        low = word & 0xFFFF
        frame_x = word >> 32
        frame_y = frame_x ^ low
        toggles = (~frame_y & level_mask) | ((frame_x & ~frame_y) << 32)
        toggles ^= toggles >> 1
        toggles ^= toggles >> 2
        toggles ^= toggles >> 4
        toggles ^= toggles >> 8
        flip = ((toggles >> 1) & low) ^ (toggles >> 33)
        return frame_x ^ flip, frame_y ^ flip
    frame_x = _compact_bits_2d(index >> 1)
    low = _compact_bits_2d(index)
    frame_y = frame_x ^ low
    toggle_swap = ~frame_y & level_mask
    toggle_complement = frame_x & ~frame_y
    toggle_swap ^= toggle_swap >> 1
    toggle_complement ^= toggle_complement >> 1
    toggle_swap ^= toggle_swap >> 2
    toggle_complement ^= toggle_complement >> 2
    toggle_swap ^= toggle_swap >> 4
    toggle_complement ^= toggle_complement >> 4
    toggle_swap ^= toggle_swap >> 8
    toggle_complement ^= toggle_complement >> 8
    toggle_swap ^= toggle_swap >> 16
    toggle_complement ^= toggle_complement >> 16
    flip = ((toggle_swap >> 1) & low) ^ (toggle_complement >> 1)
    return frame_x ^ flip, frame_y ^ flip


@numba.njit(cache=True, nogil=True)
def hilbert_encode_2d_serial(flat, order, out):
    """Serial twin of hilbert_encode_2d (same arguments and result)."""
    level_mask = (np.int64(1) << order) - 1
    count = out.shape[0]
    acc = np.int64(0)
    if order <= 16:
        pair_mask = level_mask | (level_mask << 32)
        for pair in range(count // 2):
            x_a = np.int64(flat[4 * pair])
            y_a = np.int64(flat[4 * pair + 1])
            x_b = np.int64(flat[4 * pair + 2])
            y_b = np.int64(flat[4 * pair + 3])
            acc |= x_a | y_a | x_b | y_b
            index_a, index_b = _hilbert2d_encode_pair(x_a | (x_b << 32), y_a | (y_b << 32), pair_mask)
            out[2 * pair] = index_a
            out[2 * pair + 1] = index_b
        if count % 2:
            x_a = np.int64(flat[2 * count - 2])
            y_a = np.int64(flat[2 * count - 1])
            acc |= x_a | y_a
            out[count - 1] = _hilbert2d_encode_pair(x_a & level_mask, y_a & level_mask, pair_mask)[0]
    else:
        for i in range(count):
            x = np.int64(flat[2 * i])
            y = np.int64(flat[2 * i + 1])
            acc |= x | y
            out[i] = _hilbert2d_encode_point(x, y, level_mask)
    return acc


@numba.njit(cache=True, nogil=True)
def hilbert_decode_2d_serial(index, order, flat_out):
    """Serial twin of hilbert_decode_2d (same arguments and result)."""
    level_mask = (np.int64(1) << order) - 1
    acc = np.int64(0)
    if order <= 16:
        for i in range(index.shape[0]):
            value = np.int64(index[i])
            acc |= value
            x, y = _hilbert2d_decode_point(value, level_mask, True)
            flat_out[2 * i] = x
            flat_out[2 * i + 1] = y
    else:
        for i in range(index.shape[0]):
            value = np.int64(index[i])
            acc |= value
            x, y = _hilbert2d_decode_point(value, level_mask, False)
            flat_out[2 * i] = x
            flat_out[2 * i + 1] = y
    return acc


@numba.njit(parallel=True, cache=True)
def hilbert_encode_2d(flat, order, out):
    """flat (2N,) interleaved x0, y0, x1, ... any int dtype -> out (N,) int64; returns OR of coords."""
    count = out.shape[0]
    blocks = (count + BLOCK - 1) // BLOCK
    block_or = np.zeros(blocks, dtype=np.int64)
    for block in numba.prange(blocks):
        start = block * BLOCK
        stop = min(count, start + BLOCK)
        block_or[block] = hilbert_encode_2d_serial(flat[2 * start:2 * stop], order, out[start:stop])
    total = np.int64(0)
    for block in range(blocks):
        total |= block_or[block]
    return total


@numba.njit(parallel=True, cache=True)
def hilbert_decode_2d(index, order, flat_out):
    """index (N,) any int dtype -> flat_out (2N,) int64 interleaved x, y; returns OR of indices."""
    count = index.shape[0]
    blocks = (count + BLOCK - 1) // BLOCK
    block_or = np.zeros(blocks, dtype=np.int64)
    for block in numba.prange(blocks):
        start = block * BLOCK
        stop = min(count, start + BLOCK)
        block_or[block] = hilbert_decode_2d_serial(index[start:stop], order, flat_out[2 * start:2 * stop])
    total = np.int64(0)
    for block in range(blocks):
        total |= block_or[block]
    return total


# ----------------------------------------------------------------------------------------------
# Hilbert, any ndim (Skilling's transpose algorithm)
# ----------------------------------------------------------------------------------------------
@numba.njit(cache=True, nogil=True)
def hilbert_encode_nd_serial(coords, order, out):
    """Serial twin of hilbert_encode_nd (same arguments and result)."""
    ndim = coords.shape[1]
    top = np.int64(1) << (order - 1)
    axes = np.empty(ndim, dtype=np.int64)
    acc = np.int64(0)
    for i in range(out.shape[0]):
        for dim in range(ndim):
            value = np.int64(coords[i, dim])
            acc |= value
            axes[dim] = value
        # inverse undo excess work
        q = top
        while q > 1:
            p = q - 1
            for dim in range(ndim):
                if axes[dim] & q:
                    axes[0] ^= p
                else:
                    t = (axes[0] ^ axes[dim]) & p
                    axes[0] ^= t
                    axes[dim] ^= t
            q >>= 1
        # Gray encode
        for dim in range(1, ndim):
            axes[dim] ^= axes[dim - 1]
        t = np.int64(0)
        q = top
        while q > 1:
            if axes[ndim - 1] & q:
                t ^= q - 1
            q >>= 1
        for dim in range(ndim):
            axes[dim] ^= t
        # transpose -> integer: level by level from the top, coordinate 0 first
        result = np.int64(0)
        for level in range(order - 1, -1, -1):
            for dim in range(ndim):
                result = (result << 1) | ((axes[dim] >> level) & 1)
        out[i] = result
    return acc


@numba.njit(cache=True, nogil=True)
def hilbert_decode_nd_serial(index, order, out):
    """Serial twin of hilbert_decode_nd (same arguments and result)."""
    ndim = out.shape[1]
    limit = np.int64(2) << (order - 1)  # wraps to -2**63 for order 63, still the loop's end
    axes = np.empty(ndim, dtype=np.int64)
    acc = np.int64(0)
    for i in range(index.shape[0]):
        value = np.int64(index[i])
        acc |= value
        # integer -> transpose
        for dim in range(ndim):
            axes[dim] = 0
        position = ndim * order - 1
        for level in range(order - 1, -1, -1):
            for dim in range(ndim):
                axes[dim] |= ((value >> position) & 1) << level
                position -= 1
        # Gray decode
        t = axes[ndim - 1] >> 1
        for dim in range(ndim - 1, 0, -1):
            axes[dim] ^= axes[dim - 1]
        axes[0] ^= t
        # undo excess work
        q = np.int64(2)
        while q != limit:
            p = q - 1
            for dim in range(ndim - 1, -1, -1):
                if axes[dim] & q:
                    axes[0] ^= p
                else:
                    t = (axes[0] ^ axes[dim]) & p
                    axes[0] ^= t
                    axes[dim] ^= t
            q <<= 1
        for dim in range(ndim):
            out[i, dim] = axes[dim]
    return acc


@numba.njit(parallel=True, cache=True)
def hilbert_encode_nd(coords, order, out):
    """coords (N, ndim) any int dtype -> out (N,) int64 Hilbert index; returns OR of all coords."""
    count = out.shape[0]
    blocks = (count + BLOCK - 1) // BLOCK
    block_or = np.zeros(blocks, dtype=np.int64)
    for block in numba.prange(blocks):
        start = block * BLOCK
        stop = min(count, start + BLOCK)
        block_or[block] = hilbert_encode_nd_serial(coords[start:stop], order, out[start:stop])
    total = np.int64(0)
    for block in range(blocks):
        total |= block_or[block]
    return total


@numba.njit(parallel=True, cache=True)
def hilbert_decode_nd(index, order, out):
    """index (N,) any int dtype -> out (N, ndim) int64 coordinates; returns OR of all indices."""
    count = index.shape[0]
    blocks = (count + BLOCK - 1) // BLOCK
    block_or = np.zeros(blocks, dtype=np.int64)
    for block in numba.prange(blocks):
        start = block * BLOCK
        stop = min(count, start + BLOCK)
        block_or[block] = hilbert_decode_nd_serial(index[start:stop], order, out[start:stop])
    total = np.int64(0)
    for block in range(blocks):
        total |= block_or[block]
    return total


# ----------------------------------------------------------------------------------------------
# Morton (bit interleave), any ndim
# ----------------------------------------------------------------------------------------------
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


# ----------------------------------------------------------------------------------------------
# Generalized Hilbert ('gilbert') generators: sequential walks with an explicit stack
# ----------------------------------------------------------------------------------------------
@numba.njit(inline="always")
def _sign(value):
    return (value > 0) - (value < 0)


@numba.njit(cache=True)
def gilbert2d_walk(x0, y0, ax0, ay0, bx0, by0, out):
    """Fill out (|ax0+ay0| * |bx0+by0|, 2) with the gilbert walk of the rectangle spanned by
    major vector (ax0, ay0) and minor vector (bx0, by0) from corner (x0, y0).

    Returns the number of cells written (-1: out too small, -2: stack exhausted)."""
    stack = np.empty((4096, 6), dtype=np.int64)
    stack[0, 0] = x0
    stack[0, 1] = y0
    stack[0, 2] = ax0
    stack[0, 3] = ay0
    stack[0, 4] = bx0
    stack[0, 5] = by0
    top = 1
    position = 0
    while top > 0:
        if top + 4 > stack.shape[0]:
            return -2  # stack exhausted (cannot happen for sides < 2**62)
        top -= 1
        x = stack[top, 0]
        y = stack[top, 1]
        ax = stack[top, 2]
        ay = stack[top, 3]
        bx = stack[top, 4]
        by = stack[top, 5]
        width = abs(ax + ay)
        height = abs(bx + by)
        dax = _sign(ax)
        day = _sign(ay)
        dbx = _sign(bx)
        dby = _sign(by)
        if height == 1:
            if position + width > out.shape[0]:
                return -1
            for _ in range(width):
                out[position, 0] = x
                out[position, 1] = y
                position += 1
                x += dax
                y += day
            continue
        if width == 1:
            if position + height > out.shape[0]:
                return -1
            for _ in range(height):
                out[position, 0] = x
                out[position, 1] = y
                position += 1
                x += dbx
                y += dby
            continue
        ax2 = ax // 2
        ay2 = ay // 2
        bx2 = bx // 2
        by2 = by // 2
        width2 = abs(ax2 + ay2)
        height2 = abs(bx2 + by2)
        if 2 * width > 3 * height:
            if (width2 % 2) and (width > 2):
                ax2 += dax
                ay2 += day
            # two halves along the major axis; push in reverse order of traversal
            stack[top] = (x + ax2, y + ay2, ax - ax2, ay - ay2, bx, by)
            stack[top + 1] = (x, y, ax2, ay2, bx, by)
            top += 2
        else:
            if (height2 % 2) and (height > 2):
                bx2 += dbx
                by2 += dby
            stack[top] = (x + (ax - dax) + (bx2 - dbx), y + (ay - day) + (by2 - dby),
                          -bx2, -by2, -(ax - ax2), -(ay - ay2))
            stack[top + 1] = (x + bx2, y + by2, ax, ay, bx - bx2, by - by2)
            stack[top + 2] = (x, y, bx2, by2, ax2, ay2)
            top += 3
    return position


@numba.njit(cache=True)
def gilbert3d_walk(a, b, c, out):
    """Fill out (prod of |a|, |b|, |c|, 3) with the 3D gilbert walk from the origin, where a, b, c
    are int64 (3,) vectors: a = major axis, b and c = the two minor axes.

    Returns the number of cells written (-1: out too small, -2: stack exhausted)."""
    stack = np.empty((8192, 12), dtype=np.int64)
    stack[0, 0:3] = 0
    stack[0, 3:6] = a
    stack[0, 6:9] = b
    stack[0, 9:12] = c
    top = 1
    position = 0
    while top > 0:
        if top + 4 > stack.shape[0]:
            return -2  # stack exhausted (cannot happen for sides < 2**62)
        top -= 1
        x = stack[top, 0]
        y = stack[top, 1]
        z = stack[top, 2]
        ax = stack[top, 3]
        ay = stack[top, 4]
        az = stack[top, 5]
        bx = stack[top, 6]
        by = stack[top, 7]
        bz = stack[top, 8]
        cx = stack[top, 9]
        cy = stack[top, 10]
        cz = stack[top, 11]
        width = abs(ax + ay + az)
        height = abs(bx + by + bz)
        depth = abs(cx + cy + cz)
        dax = _sign(ax)
        day = _sign(ay)
        daz = _sign(az)
        dbx = _sign(bx)
        dby = _sign(by)
        dbz = _sign(bz)
        dcx = _sign(cx)
        dcy = _sign(cy)
        dcz = _sign(cz)
        if height == 1 and depth == 1:
            if position + width > out.shape[0]:
                return -1
            for _ in range(width):
                out[position, 0] = x
                out[position, 1] = y
                out[position, 2] = z
                position += 1
                x += dax
                y += day
                z += daz
            continue
        if width == 1 and depth == 1:
            if position + height > out.shape[0]:
                return -1
            for _ in range(height):
                out[position, 0] = x
                out[position, 1] = y
                out[position, 2] = z
                position += 1
                x += dbx
                y += dby
                z += dbz
            continue
        if width == 1 and height == 1:
            if position + depth > out.shape[0]:
                return -1
            for _ in range(depth):
                out[position, 0] = x
                out[position, 1] = y
                out[position, 2] = z
                position += 1
                x += dcx
                y += dcy
                z += dcz
            continue
        ax2 = ax // 2
        ay2 = ay // 2
        az2 = az // 2
        bx2 = bx // 2
        by2 = by // 2
        bz2 = bz // 2
        cx2 = cx // 2
        cy2 = cy // 2
        cz2 = cz // 2
        width2 = abs(ax2 + ay2 + az2)
        height2 = abs(bx2 + by2 + bz2)
        depth2 = abs(cx2 + cy2 + cz2)
        if (width2 % 2) and (width > 2):
            ax2 += dax
            ay2 += day
            az2 += daz
        if (height2 % 2) and (height > 2):
            bx2 += dbx
            by2 += dby
            bz2 += dbz
        if (depth2 % 2) and (depth > 2):
            cx2 += dcx
            cy2 += dcy
            cz2 += dcz
        if (2 * width > 3 * height) and (2 * width > 3 * depth):
            # wide: split the major axis only
            stack[top] = (x + ax2, y + ay2, z + az2, ax - ax2, ay - ay2, az - az2,
                          bx, by, bz, cx, cy, cz)
            stack[top + 1] = (x, y, z, ax2, ay2, az2, bx, by, bz, cx, cy, cz)
            top += 2
        elif 3 * height > 4 * depth:
            # do not split depth
            stack[top] = (x + (ax - dax) + (bx2 - dbx), y + (ay - day) + (by2 - dby),
                          z + (az - daz) + (bz2 - dbz), -bx2, -by2, -bz2, cx, cy, cz,
                          -(ax - ax2), -(ay - ay2), -(az - az2))
            stack[top + 1] = (x + bx2, y + by2, z + bz2, ax, ay, az,
                              bx - bx2, by - by2, bz - bz2, cx, cy, cz)
            stack[top + 2] = (x, y, z, bx2, by2, bz2, cx, cy, cz, ax2, ay2, az2)
            top += 3
        elif 3 * depth > 4 * height:
            # do not split height
            stack[top] = (x + (ax - dax) + (cx2 - dcx), y + (ay - day) + (cy2 - dcy),
                          z + (az - daz) + (cz2 - dcz), -cx2, -cy2, -cz2,
                          -(ax - ax2), -(ay - ay2), -(az - az2), bx, by, bz)
            stack[top + 1] = (x + cx2, y + cy2, z + cz2, ax, ay, az, bx, by, bz,
                              cx - cx2, cy - cy2, cz - cz2)
            stack[top + 2] = (x, y, z, cx2, cy2, cz2, ax2, ay2, az2, bx, by, bz)
            top += 3
        else:
            # regular: split all three axes (five sub-boxes)
            stack[top] = (x + (ax - dax) + (bx2 - dbx), y + (ay - day) + (by2 - dby),
                          z + (az - daz) + (bz2 - dbz), -bx2, -by2, -bz2, cx2, cy2, cz2,
                          -(ax - ax2), -(ay - ay2), -(az - az2))
            stack[top + 1] = (x + (ax - dax) + bx2 + (cx - dcx), y + (ay - day) + by2 + (cy - dcy),
                              z + (az - daz) + bz2 + (cz - dcz), -cx, -cy, -cz,
                              -(ax - ax2), -(ay - ay2), -(az - az2), bx - bx2, by - by2, bz - bz2)
            stack[top + 2] = (x + (bx2 - dbx) + (cx - dcx), y + (by2 - dby) + (cy - dcy),
                              z + (bz2 - dbz) + (cz - dcz), ax, ay, az, -bx2, -by2, -bz2,
                              -(cx - cx2), -(cy - cy2), -(cz - cz2))
            stack[top + 3] = (x + bx2, y + by2, z + bz2, cx, cy, cz, ax2, ay2, az2,
                              bx - bx2, by - by2, bz - bz2)
            stack[top + 4] = (x, y, z, bx2, by2, bz2, cx2, cy2, cz2, ax2, ay2, az2)
            top += 5
    return position
