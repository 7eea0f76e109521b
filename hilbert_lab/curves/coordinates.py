"""curve_coordinates: the cells of a 2D/3D grid in a curve's traversal order, as (x, y[, z]) coordinates."""
from __future__ import annotations

import numpy as np

from hilbert_lab.curves.codec import decode
from hilbert_lab.curves.gilbert import gilbert, gilbert3d
from hilbert_lab.curves.orderings import grid_permutation

CURVE_FAMILIES = ("hilbert", "gilbert", "morton", "snake", "rowmajor")
ORDER_FAMILIES = ("hilbert", "morton")  # may be sized by order (side 2^order) instead of width/height/depth


def _flat_to_coords(flat: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Row-major flat indices of a (H, W) / (T, H, W) grid -> (N, ndim) coords (x, y[, z])."""
    unravelled = np.unravel_index(np.asarray(flat, dtype=np.int64), shape)
    return np.stack(unravelled[::-1], axis=-1).astype(np.int64)


def curve_coordinates(family: str, *, order: int | None = None, width: int | None = None,
                      height: int | None = None, depth: int | None = None, ndim: int = 2) -> np.ndarray:
    """Cells of a 2D/3D grid in traversal order: (N, ndim) int64 coordinates (x, y[, z]).

    `hilbert` / `morton` take `order` (a cube of side 2**order, from the curve codec) or, without it,
    width/height (and depth for ndim=3) as grid_permutation serialises that grid; `gilbert`, `snake`,
    `rowmajor` take width/height (and depth for ndim=3).
    """
    if family not in CURVE_FAMILIES:
        raise ValueError(f"family must be one of {CURVE_FAMILIES}, got {family!r}")
    if ndim not in (2, 3):
        raise ValueError(f"ndim must be 2 or 3, got {ndim!r}")
    if family in ORDER_FAMILIES and (order is not None or width is None):
        if order is None or not 1 <= int(order) <= (10 if ndim == 2 else 6):
            raise ValueError(f"order must be in [1, {10 if ndim == 2 else 6}] for {family} "
                             f"(or give width/height), got {order!r}")
        side = 2 ** int(order)
        index = np.arange(side ** ndim, dtype=np.int64)
        coords = np.asarray(decode(index, int(order), ndim, curve=family), dtype=np.int64)
        return coords.reshape(-1, ndim)
    sizes = {"width": width, "height": height} | ({"depth": depth} if ndim == 3 else {})
    for name, value in sizes.items():
        if value is None or int(value) < 1:
            raise ValueError(f"{name} must be an integer >= 1 for {family}, got {value!r}")
    if family == "gilbert":
        if ndim == 2:
            return np.asarray(gilbert(int(width), int(height)), dtype=np.int64)
        return np.asarray(gilbert3d(int(width), int(height), int(depth)), dtype=np.int64)
    shape = (int(height), int(width)) if ndim == 2 else (int(depth), int(height), int(width))
    perm, _inverse = grid_permutation(shape, family)
    return _flat_to_coords(perm, shape)
