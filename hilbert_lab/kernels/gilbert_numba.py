"""Numba CPU generators of the generalized Hilbert ('gilbert') curve for any rectangle or box:
sequential walks with an explicit stack (njit without parallel). Leaf module: plain integers and
numpy arrays only.
"""
from __future__ import annotations

import numba
import numpy as np


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
