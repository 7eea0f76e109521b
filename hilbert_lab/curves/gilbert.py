"""Generalized Hilbert ('gilbert', J. Cervený's construction) curves for any 2D rectangle / 3D box.

``gilbert(width, height)`` walks every cell of the rectangle exactly once from (0, 0) along the
longer side (ending at (width-1, 0) when width >= height, else at (0, height-1)). On 2^k x 2^k
squares it is exactly ``decode(arange(4**k), k, 2)`` (the galtay/hilbertcurve convention). All
steps are unit steps except a single diagonal step when the longer side is odd and the shorter
even and > 2 (no unit-step walk between those corners exists then); with a shorter side of 2 and
an odd longer side the walk stays unit-step and ends one cell before the far corner.
``gilbert3d(width, height, depth)`` is the 3D construction: on 2^k cubes it is an octant-recursive
Hilbert curve, but a different (equally valid) 3D Hilbert variant than Skilling's ``decode``;
with all sides even every step is a unit step, odd sides cost some diagonal steps.
"""
from __future__ import annotations

import numpy as np

from hilbert_lab.curves.codec import _check_fits_memory, _check_positive_int
from hilbert_lab.kernels import gilbert_numba


def gilbert(width: int, height: int) -> np.ndarray:
    """(width*height, 2) int64 coordinates (x, y), 0 <= x < width, 0 <= y < height, in curve order."""
    width = _check_positive_int(width, "width")
    height = _check_positive_int(height, "height")
    _check_fits_memory(width * height, "width * height", 16, "the int64 (x, y) cells")
    out = np.empty((width * height, 2), dtype=np.int64)
    if width >= height:
        written = gilbert_numba.gilbert2d_walk(0, 0, width, 0, 0, height, out)
    else:
        written = gilbert_numba.gilbert2d_walk(0, 0, 0, height, width, 0, out)
    if written != width * height:  # a construction bug, never an input problem
        raise RuntimeError(f"gilbert({width}, {height}) wrote {written} of {width * height} cells")
    return out


def gilbert3d(width: int, height: int, depth: int) -> np.ndarray:
    """(width*height*depth, 3) int64 coordinates (x, y, z) in curve order, starting at (0, 0, 0)."""
    width = _check_positive_int(width, "width")
    height = _check_positive_int(height, "height")
    depth = _check_positive_int(depth, "depth")
    _check_fits_memory(width * height * depth, "width * height * depth", 24, "the int64 (x, y, z) cells")
    along_x = np.array([width, 0, 0], dtype=np.int64)
    along_y = np.array([0, height, 0], dtype=np.int64)
    along_z = np.array([0, 0, depth], dtype=np.int64)
    if width >= height and width >= depth:
        major, minor_b, minor_c = along_x, along_y, along_z
    elif height >= width and height >= depth:
        major, minor_b, minor_c = along_y, along_x, along_z
    else:
        major, minor_b, minor_c = along_z, along_x, along_y
    count = width * height * depth
    out = np.empty((count, 3), dtype=np.int64)
    written = gilbert_numba.gilbert3d_walk(major, minor_b, minor_c, out)
    if written != count:
        raise RuntimeError(f"gilbert3d({width}, {height}, {depth}) wrote {written} of {count} cells")
    return out
