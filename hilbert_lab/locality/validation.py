"""Argument checks shared by the locality modules (each raises ValueError naming the argument)."""
from __future__ import annotations

import numpy as np


def positive_int(value, name: str, minimum: int = 1) -> int:
    """`value` as int when it is an integer >= minimum (bools refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def grid_shape(shape) -> tuple[int, ...]:
    """A 2D (H, W) or 3D (T, H, W) grid shape with sides >= 1."""
    try:
        sides = tuple(int(side) for side in shape)
    except (TypeError, ValueError):
        raise ValueError(f"shape must be a 2D (H, W) or 3D (T, H, W) tuple of sides >= 1, got {shape!r}") from None
    if len(sides) not in (2, 3) or min(sides) < 1:
        raise ValueError(f"shape must be a 2D (H, W) or 3D (T, H, W) tuple of sides >= 1, got {shape!r}")
    return sides


def box_sides(box, ndim: int) -> tuple[int, ...]:
    """An int k (k on every axis) or a tuple of `ndim` sides >= 1."""
    sides = (int(box),) * ndim if np.isscalar(box) else tuple(int(side) for side in box)
    if len(sides) != ndim or min(sides) < 1:
        raise ValueError(f"box must be an int >= 1 or a tuple of {ndim} ints >= 1, got {box!r}")
    return sides
