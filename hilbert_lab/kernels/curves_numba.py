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

2D Hilbert runs a 4-state machine, LUT_BITS = 7 levels per table lookup. Walking the levels from
the top, the sub-square frame is a state (swap s, complement c) in GF(2)^2 that starts at (0, 0).
With coordinate bits (bx, by) of a level and e = bx ^ by:

* digit = (hi, e) with hi = bx ^ (s & e) ^ c,
* next state: s' = (~e & s) ^ c ^ ~by, c' = (e & s) ^ (~e & c) ^ (e & bx).

Decode inverts the digit: bx = hi ^ (s & e) ^ c, by = bx ^ e. A zero level (bx = by = 0, digit 0)
only toggles s, so a top chunk padded with p zero levels above the order starts from (p mod 2, 0)
and emits zeros there. The tables map (7 bits of x, 7 of y) to (14 index bits, next state) and
back, one 16-bit lane per state in an int64 entry (128 KiB each): the lookup address does not
depend on the state, only the lane shift does. A kernel specialised to the chunk count (1..5)
lets LLVM unroll the chunk loop and vectorise over points (lookups become 64-bit gathers).

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


LUT_BITS = 7  # levels per 2D Hilbert table lookup
_LUT_CHUNK_MASK = (1 << LUT_BITS) - 1


def _hilbert2d_tables(bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(encode, decode) int64 tables of the 2D Hilbert state machine, `bits` (<= 7) levels per lookup.

    Lane `state` (bits 16 * state ..) of encode[xb << bits | yb] is digits << 2 | next state (digits:
    2 * bits index bits); of decode[digits] it is xb << bits + 2 | yb << 2 | next state; state = s << 1 | c.
    """
    size = 1 << (2 * bits)
    state = np.repeat(np.arange(4, dtype=np.int64), size)
    word = np.tile(np.arange(size, dtype=np.int64), 4)
    swap, complement = state >> 1, state & 1
    digits = np.zeros_like(word)
    for level in range(bits - 1, -1, -1):  # encode: word = xb << bits | yb
        bx, by = (word >> (bits + level)) & 1, (word >> level) & 1
        e = bx ^ by
        digits = (digits << 2) | ((bx ^ (swap & e) ^ complement) << 1) | e
        swap, complement = ((1 - e) & swap) ^ complement ^ (1 - by), (e & swap) ^ ((1 - e) & complement) ^ (e & bx)
    encode = (digits << 2) | (swap << 1) | complement
    swap, complement = state >> 1, state & 1
    xs, ys = np.zeros_like(word), np.zeros_like(word)
    for level in range(bits - 1, -1, -1):  # decode: word = digits
        hi, e = (word >> (2 * level + 1)) & 1, (word >> (2 * level)) & 1
        bx = hi ^ (swap & e) ^ complement
        by = bx ^ e
        xs, ys = (xs << 1) | bx, (ys << 1) | by
        swap, complement = ((1 - e) & swap) ^ complement ^ (1 - by), (e & swap) ^ ((1 - e) & complement) ^ (e & bx)
    decode = (xs << (bits + 2)) | (ys << 2) | (swap << 1) | complement

    def lanes(table: np.ndarray) -> np.ndarray:
        per_state = table.reshape(4, size).astype(np.uint64)
        packed = per_state[0] | (per_state[1] << 16) | (per_state[2] << 32) | (per_state[3] << 48)
        return packed.view(np.int64)

    return lanes(encode), lanes(decode)


_ENCODE_TABLE, _DECODE_TABLE = _hilbert2d_tables(LUT_BITS)


@numba.njit(inline="always")
def _hilbert2d_chunks(order):
    """(table lookups per point, start state) for `order` levels."""
    chunks = (order + LUT_BITS - 1) // LUT_BITS
    return chunks, ((chunks * LUT_BITS - order) & 1) << 1


@numba.njit(inline="always")
def _hilbert2d_encode_loop(flat, out, start, chunks, packed, width):
    """Encode all points with a fixed chunk count (a literal at each call site, so it unrolls).

    packed False (a literal): flat (2N,) interleaved x, y; True: flat (N,) unsigned words
    x | y << width (one load per point: (N, 2) unsigned coordinates viewed as one word each)."""
    acc = np.int64(0)
    low = (np.int64(1) << width) - 1
    for i in range(out.shape[0]):
        if packed:
            word = np.int64(flat[i])
            x = word & low
            y = (word >> width) & low
        else:
            x = np.int64(flat[2 * i])
            y = np.int64(flat[2 * i + 1])
        acc |= x | y
        state = np.int64(start)
        index = np.int64(0)
        for chunk in range(chunks - 1, -1, -1):
            shift = chunk * LUT_BITS
            word = _ENCODE_TABLE[(((x >> shift) & _LUT_CHUNK_MASK) << LUT_BITS) | ((y >> shift) & _LUT_CHUNK_MASK)]
            entry = (word >> (state << 4)) & 0xFFFF
            index = (index << (2 * LUT_BITS)) | (entry >> 2)
            state = entry & 3
        out[i] = index
    return acc


@numba.njit(inline="always")
def _hilbert2d_decode_loop(index, flat_out, start, chunks, packed, width):
    """Decode all indices with a fixed chunk count (a literal at each call site, so it unrolls).

    packed False (a literal): flat_out (2N,) interleaved x, y; True: flat_out (N,) holds
    x | y << width (one store per point, for (N, 2) outputs of narrow dtypes viewed as one word
    per point)."""
    acc = np.int64(0)
    digit_mask = (1 << (2 * LUT_BITS)) - 1
    for i in range(index.shape[0]):
        value = np.int64(index[i])
        acc |= value
        state = np.int64(start)
        x = np.int64(0)
        y = np.int64(0)
        for chunk in range(chunks - 1, -1, -1):
            entry = (_DECODE_TABLE[(value >> (2 * LUT_BITS * chunk)) & digit_mask] >> (state << 4)) & 0xFFFF
            x = (x << LUT_BITS) | (entry >> (LUT_BITS + 2))
            y = (y << LUT_BITS) | ((entry >> 2) & _LUT_CHUNK_MASK)
            state = entry & 3
        if packed:
            flat_out[i] = x | (y << width)
        else:
            flat_out[2 * i] = x
            flat_out[2 * i + 1] = y
    return acc


@numba.njit(cache=True, nogil=True)
def hilbert_encode_2d_serial(flat, order, out):
    """Serial twin of hilbert_encode_2d (same arguments and result)."""
    chunks, start = _hilbert2d_chunks(order)
    if chunks == 1:
        return _hilbert2d_encode_loop(flat, out, start, 1, False, 0)
    if chunks == 2:
        return _hilbert2d_encode_loop(flat, out, start, 2, False, 0)
    if chunks == 3:
        return _hilbert2d_encode_loop(flat, out, start, 3, False, 0)
    if chunks == 4:
        return _hilbert2d_encode_loop(flat, out, start, 4, False, 0)
    return _hilbert2d_encode_loop(flat, out, start, 5, False, 0)


@numba.njit(cache=True, nogil=True)
def hilbert_encode_2d_packed_serial(packed, order, out, width):
    """Serial twin of hilbert_encode_2d_packed (same arguments and result)."""
    chunks, start = _hilbert2d_chunks(order)
    if chunks == 1:
        return _hilbert2d_encode_loop(packed, out, start, 1, True, width)
    if chunks == 2:
        return _hilbert2d_encode_loop(packed, out, start, 2, True, width)
    if chunks == 3:
        return _hilbert2d_encode_loop(packed, out, start, 3, True, width)
    if chunks == 4:
        return _hilbert2d_encode_loop(packed, out, start, 4, True, width)
    return _hilbert2d_encode_loop(packed, out, start, 5, True, width)


@numba.njit(cache=True, nogil=True)
def hilbert_decode_2d_serial(index, order, flat_out):
    """Serial twin of hilbert_decode_2d (same arguments and result)."""
    chunks, start = _hilbert2d_chunks(order)
    if chunks == 1:
        return _hilbert2d_decode_loop(index, flat_out, start, 1, False, 0)
    if chunks == 2:
        return _hilbert2d_decode_loop(index, flat_out, start, 2, False, 0)
    if chunks == 3:
        return _hilbert2d_decode_loop(index, flat_out, start, 3, False, 0)
    if chunks == 4:
        return _hilbert2d_decode_loop(index, flat_out, start, 4, False, 0)
    return _hilbert2d_decode_loop(index, flat_out, start, 5, False, 0)


@numba.njit(cache=True, nogil=True)
def hilbert_decode_2d_packed_serial(index, order, packed_out, width):
    """Serial twin of hilbert_decode_2d_packed (same arguments and result)."""
    chunks, start = _hilbert2d_chunks(order)
    if chunks == 1:
        return _hilbert2d_decode_loop(index, packed_out, start, 1, True, width)
    if chunks == 2:
        return _hilbert2d_decode_loop(index, packed_out, start, 2, True, width)
    if chunks == 3:
        return _hilbert2d_decode_loop(index, packed_out, start, 3, True, width)
    if chunks == 4:
        return _hilbert2d_decode_loop(index, packed_out, start, 4, True, width)
    return _hilbert2d_decode_loop(index, packed_out, start, 5, True, width)


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


@numba.njit(parallel=True, cache=True)
def hilbert_encode_2d_packed(packed, order, out, width):
    """packed (N,) unsigned words x | y << width ((N, 2) unsigned width-bit coordinates viewed as
    one word per point, width <= 32) -> out (N,); returns OR of the coordinates."""
    count = out.shape[0]
    blocks = (count + BLOCK - 1) // BLOCK
    block_or = np.zeros(blocks, dtype=np.int64)
    for block in numba.prange(blocks):
        start = block * BLOCK
        stop = min(count, start + BLOCK)
        block_or[block] = hilbert_encode_2d_packed_serial(packed[start:stop], order, out[start:stop], width)
    total = np.int64(0)
    for block in range(blocks):
        total |= block_or[block]
    return total


@numba.njit(parallel=True, cache=True)
def hilbert_decode_2d_packed(index, order, packed_out, width):
    """index (N,) any int dtype -> packed_out (N,) unsigned, x | y << width (order <= width <= 32,
    width * 2 bits wide: an (N, 2) array of a width-bit dtype viewed as one word per point);
    returns OR of indices."""
    count = index.shape[0]
    blocks = (count + BLOCK - 1) // BLOCK
    block_or = np.zeros(blocks, dtype=np.int64)
    for block in numba.prange(blocks):
        start = block * BLOCK
        stop = min(count, start + BLOCK)
        block_or[block] = hilbert_decode_2d_packed_serial(index[start:stop], order, packed_out[start:stop], width)
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
