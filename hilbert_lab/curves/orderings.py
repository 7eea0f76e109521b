"""Token orderings: permutations that serialise 1D segments and 2D/3D token grids along a curve.

Permutation convention (docs/INTERFACES.md): ``perm[j]`` is the original (row-major) position of
the token stored at layout slot ``j``, so ``x_layout = x[perm]`` and ``x = x_layout[inverse]``.
A 1D segment of ``length`` tokens is laid row-major on the near-square grid
``near_square_grid(length) = (height, width)`` (height = largest divisor <= sqrt(length)); non-square
grids use the generalized (gilbert) Hilbert curve, so every ordering is a true permutation
(a prime length gives a 1 x length grid, on which every ordering is the identity).
Results are cached in a bounded LRU cache and returned read-only.
"""
from __future__ import annotations

import functools
import itertools
import math
from typing import Any

import numpy as np

from hilbert_lab.curves.codec import _check_fits_memory, _check_positive_int, encode
from hilbert_lab.curves.gilbert import gilbert, gilbert3d

ORDERINGS = ("identity", "hilbert", "morton", "snake")
GRID_ORDERINGS = ("rowmajor", "snake", "hilbert", "morton")
CACHE_SIZE = 128
# Peak bytes per token while a permutation is built (perm and inverse int64, curve coordinates,
# sort keys; measured <= 56 for 3D Morton).
PERMUTATION_BYTES_PER_TOKEN = 64
MAX_LENGTH = 2**63 - 1  # permutation entries are int64

_MILLER_RABIN_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)  # exact for n < 3.3e24


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in _MILLER_RABIN_BASES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in _MILLER_RABIN_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _some_factor(n: int) -> int:
    """A non-trivial factor of the odd composite n (Pollard's rho, Brent's cycle search)."""
    for c in itertools.count(1):
        x = y = saved = 2
        g, product, r = 1, 1, 1
        while g == 1:
            x = y
            for _ in range(r):
                y = (y * y + c) % n
            k = 0
            while k < r and g == 1:
                saved = y
                for _ in range(min(128, r - k)):
                    y = (y * y + c) % n
                    product = product * abs(x - y) % n
                g = math.gcd(product, n)
                k += 128
            r *= 2
        if g == n:  # the batch overshot: replay it one step at a time
            g = 1
            while g == 1:
                saved = (saved * saved + c) % n
                g = math.gcd(abs(x - saved), n)
        if g != n:
            return g
    raise AssertionError("unreachable")  # pragma: no cover


def _prime_factors(n: int) -> list[int]:
    factors = []
    for p in (2, 3, 5, 7, 11, 13):
        while n % p == 0:
            factors.append(p)
            n //= p
    stack = [n] if n > 1 else []
    while stack:
        m = stack.pop()
        if _is_prime(m):
            factors.append(m)
        else:
            f = _some_factor(m)
            stack += [f, m // f]
    return factors


def near_square_grid(length: int) -> tuple[int, int]:
    """(height, width) with height * width == length, height <= width, height as large as possible.

    Exact for every length up to 2**63 - 1 in milliseconds (factorisation, not a divisor scan).
    """
    length = _check_positive_int(length, "length")
    if length > MAX_LENGTH:
        raise ValueError(f"length must be <= 2**63 - 1 (int64 permutation entries), got {length}")
    root = math.isqrt(length)
    divisors = {1}
    for p in _prime_factors(length):
        divisors |= {d * p for d in divisors if d * p <= root}
    height = max(divisors)
    return height, length // height


def _morton_order(coordinates: np.ndarray) -> np.ndarray:
    """Row-major cell ids sorted by the Morton key of their coordinates (x, y[, z])."""
    order = max(1, int(coordinates.max()).bit_length())
    keys = encode(coordinates, order, curve="morton")
    return np.argsort(keys, kind="stable")


def _snake_2d(height: int, width: int) -> np.ndarray:
    grid = np.arange(height * width, dtype=np.int64).reshape(height, width)
    grid[1::2] = grid[1::2, ::-1]
    return grid.reshape(-1)


def _grid_order(shape: tuple[int, ...], ordering: str) -> np.ndarray:
    """perm for a grid of `shape` (row-major flat ids) under `ordering`."""
    count = math.prod(shape)
    if ordering == "rowmajor":
        return np.arange(count, dtype=np.int64)
    if len(shape) == 2:
        height, width = shape
        if ordering == "snake":
            return _snake_2d(height, width)
        if ordering == "hilbert":
            points = gilbert(width, height)
            return points[:, 1] * width + points[:, 0]
        columns = np.tile(np.arange(width, dtype=np.int64), height)
        rows = np.repeat(np.arange(height, dtype=np.int64), width)
        return _morton_order(np.stack([columns, rows], axis=-1))
    frames, height, width = shape
    plane = height * width
    if ordering == "snake":
        forward = _snake_2d(height, width)
        layers = [t * plane + (forward if t % 2 == 0 else forward[::-1]) for t in range(frames)]
        return np.concatenate(layers).astype(np.int64)
    if ordering == "hilbert":
        points = gilbert3d(width, height, frames)
        return points[:, 2] * plane + points[:, 1] * width + points[:, 0]
    cells = np.arange(count, dtype=np.int64)
    coordinates = np.stack([cells % width, (cells // width) % height, cells // plane], axis=-1)
    return _morton_order(coordinates)


def _read_only_pair(perm: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    perm = np.ascontiguousarray(perm, dtype=np.int64)
    inverse = np.empty_like(perm)
    inverse[perm] = np.arange(perm.shape[0], dtype=np.int64)
    perm.setflags(write=False)
    inverse.setflags(write=False)
    return perm, inverse


@functools.lru_cache(maxsize=CACHE_SIZE)
def _cached_grid_permutation(shape: tuple[int, ...], ordering: str) -> tuple[np.ndarray, np.ndarray]:
    return _read_only_pair(_grid_order(shape, ordering))


def grid_permutation(shape: Any, ordering: str) -> tuple[np.ndarray, np.ndarray]:
    """Serialise a 2D (H, W) or 3D (T, H, W) token grid given in row-major flat order.

    The grid case of ``hilbert_lab.curves.serialize`` for the four base orderings.

    ordering: "rowmajor" (alias "identity"), "snake" (boustrophedon; in 3D consecutive planes
    run in opposite directions so every step is a unit step), "hilbert" (gilbert curve, any size;
    x = column, y = row, z = frame), "morton" (cells sorted by Morton key of (x, y[, z]); the exact
    Z-order on power-of-two sides, its restriction to the grid otherwise).
    Returns (perm, inverse): read-only int64 arrays of length prod(shape), cached (bounded LRU).
    """
    if isinstance(ordering, str) and ordering == "identity":
        ordering = "rowmajor"
    if not isinstance(ordering, str) or ordering not in GRID_ORDERINGS:
        raise ValueError(f"ordering must be one of {GRID_ORDERINGS} (or 'identity'), got {ordering!r}")
    try:
        dims = tuple(shape)
    except TypeError:
        raise ValueError(f"shape must be a tuple (H, W) or (T, H, W) of positive ints, got {shape!r}") from None
    if len(dims) not in (2, 3):
        raise ValueError(f"shape must be a tuple (H, W) or (T, H, W) of positive ints, got {shape!r}")
    dims = tuple(_check_positive_int(size, "shape entries") for size in dims)
    _check_fits_memory(math.prod(dims), "prod(shape)", PERMUTATION_BYTES_PER_TOKEN, "building a permutation")
    return _cached_grid_permutation(dims, ordering)


def segment_permutation(length: int, ordering: str) -> tuple[np.ndarray, np.ndarray]:
    """(perm, inverse) read-only int64 arrays of `length` for a 1D segment under `ordering`.

    ordering in ORDERINGS: "identity" (arange), "hilbert", "morton", "snake"; the segment is laid
    row-major on ``near_square_grid(length)`` and serialised with ``grid_permutation``.
    """
    if not isinstance(ordering, str) or ordering not in ORDERINGS:
        raise ValueError(f"ordering must be one of {ORDERINGS}, got {ordering!r}")
    length = _check_positive_int(length, "length")
    _check_fits_memory(length, "length", PERMUTATION_BYTES_PER_TOKEN, "building a permutation")
    grid_ordering = "rowmajor" if ordering == "identity" else ordering
    return _cached_grid_permutation(near_square_grid(length), grid_ordering)
