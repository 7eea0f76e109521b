"""Numba CPU kernels of the Hilbert curve: 2D (table-driven state machine) and any ndim (Skilling).

Leaf module: plain integers and numpy arrays only, no validation beyond what the kernels report.
Every batch kernel writes into a preallocated output and returns the bitwise OR of all its integer
inputs (as int64), so the caller detects out-of-range or negative inputs with one
``(acc >> bits) != 0`` test instead of a second pass over the data. The Morton kernels
(kernels.morton_numba) share these conventions; the gilbert walks are in kernels.gilbert_numba.

Hilbert: John Skilling's transpose algorithm, bit-identical to galtay/hilbertcurve
``HilbertCurve(order, ndim).distance_from_point(point)``. Within each level of the index,
``coords[..., 0]`` supplies the most significant bit and ``coords[..., ndim-1]`` the least.

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
where thread start-up dominates). Parallel kernels split the points into blocks of BLOCK and call
the serial kernel on contiguous slices, keeping the 'C' layout that lets LLVM vectorize (inlined into
numba's parfor body the same loop runs about 2x slower).
"""
from __future__ import annotations

import numba
import numpy as np

BLOCK = 1 << 14  # points per parallel work item


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
