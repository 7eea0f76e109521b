"""Serialize a 2D/3D token grid or a point cloud into a 1D sequence along a curve.

``serialize(grid_shape_or_points, ordering, *, grid_size=None) -> (perm, inverse)`` with the
permutation convention of ``hilbert_lab.curves.orderings``: ``x_serialized = x[perm]`` and
``x = x_serialized[inverse]`` (``perm[j]`` is the original index of the token at sequence slot j).

Orderings (``SERIALIZATIONS``): "rowmajor", "snake", "hilbert", "morton" and their transposed
variants "rowmajor-trans", ... which swap the x and y axes first (Point Transformer V3 mixes an
ordering and its transpose across layers). Axes: a grid (H, W) or (T, H, W) has x = column,
y = row, z = frame; a point cloud (N, 2|3) has columns (x, y[, z]).

* Grid: any side lengths; "hilbert" is the generalized (gilbert) curve, "morton" the Z-order
  restricted to the grid (``grid_permutation`` is the same function for the four base orderings).
  Returns read-only int64 numpy arrays, cached.
* Points: float (N, d) or batched (B, N, d), numpy or torch (CPU, or CUDA through the CUDA curve
  kernels). Each cloud is shifted to its own minimum corner and quantized to cells of side
  ``grid_size`` (default: the side that gives about one cell per point,
  ``max extent / N**(1/d)``); points are sorted by the curve code of their cell ("hilbert":
  Skilling's Hilbert on the 2**order cube, "morton": bit interleave, "rowmajor"/"snake": the grid
  orders on the cells' bounding box), ties (points in one cell) by their original index.
  Returns int64 (perm, inverse) of shape (N,) or (B, N), numpy or torch like the input.
"""
from __future__ import annotations

import math
import numbers
import sys
from typing import Any

import numpy as np

from hilbert_lab.curves.codec import MAX_INDEX_BITS, _check_fits_memory, encode
from hilbert_lab.curves.orderings import (
    GRID_ORDERINGS, PERMUTATION_BYTES_PER_TOKEN, _cached_grid_permutation, _read_only_pair,
)

TRANSPOSED_SUFFIX = "-trans"
SERIALIZATIONS = GRID_ORDERINGS + tuple(name + TRANSPOSED_SUFFIX for name in GRID_ORDERINGS)


def _check_ordering(ordering: Any) -> tuple[str, bool]:
    """(base ordering, transposed) of a name in SERIALIZATIONS ("identity" = "rowmajor")."""
    if isinstance(ordering, str) and ordering == "identity":
        ordering = "rowmajor"
    if not isinstance(ordering, str) or ordering not in SERIALIZATIONS:
        raise ValueError(f"ordering must be one of {SERIALIZATIONS}, got {ordering!r}")
    if ordering.endswith(TRANSPOSED_SUFFIX):
        return ordering[: -len(TRANSPOSED_SUFFIX)], True
    return ordering, False


def _is_torch(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _is_grid_shape(value: Any) -> bool:
    if _is_torch(value) or isinstance(value, np.ndarray):
        return False
    if not isinstance(value, (tuple, list)):
        return False
    return all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value)


def _grid(shape: Any, ordering: str) -> tuple[np.ndarray, np.ndarray]:
    dims = tuple(shape)
    if len(dims) not in (2, 3) or any(int(v) < 1 for v in dims):
        raise ValueError(f"grid shape must be (H, W) or (T, H, W) of positive ints, got {shape!r}")
    dims = tuple(int(v) for v in dims)
    base, transposed = _check_ordering(ordering)
    _check_fits_memory(math.prod(dims), f"grid shape {dims}: H*W*T", PERMUTATION_BYTES_PER_TOKEN,
                       "building a permutation")
    if not transposed:
        return _cached_grid_permutation(dims, base)
    return _cached_transposed(dims, base)


_TRANSPOSED_CACHE: dict[tuple[tuple[int, ...], str], tuple[np.ndarray, np.ndarray]] = {}


def _cached_transposed(dims: tuple[int, ...], base: str) -> tuple[np.ndarray, np.ndarray]:
    key = (dims, base)
    if key not in _TRANSPOSED_CACHE:
        # Serialize the grid with x and y swapped, then name each cell by its row-major id in `dims`.
        swapped = dims[:-2] + (dims[-1], dims[-2])
        perm_t, _ = _cached_grid_permutation(swapped, base)
        height, width = dims[-2], dims[-1]
        plane = height * width
        frame, rest = np.divmod(perm_t, plane)
        row_t, col_t = np.divmod(rest, height)  # swapped grid: rows run over x, columns over y
        if len(_TRANSPOSED_CACHE) >= 64:
            _TRANSPOSED_CACHE.clear()
        _TRANSPOSED_CACHE[key] = _read_only_pair(frame * plane + col_t * width + row_t)
    return _TRANSPOSED_CACHE[key]


def _check_grid_size(grid_size: Any) -> float | None:
    if grid_size is None:
        return None
    if isinstance(grid_size, bool) or not isinstance(grid_size, numbers.Real) or not grid_size > 0 \
            or not math.isfinite(grid_size):
        raise ValueError(f"grid_size must be None or a positive finite float, got {grid_size!r}")
    return float(grid_size)


def _cell_keys_numpy(cells: np.ndarray, base: str, order: int) -> np.ndarray:
    """Sort keys (..., N) of integer cells (..., N, d) (columns x, y[, z]) under `base`."""
    ndim = cells.shape[-1]
    if base in ("hilbert", "morton"):
        return encode(cells, order, curve=base)
    extent = cells.reshape(-1, ndim).max(axis=0) + 1 if cells.size else np.ones(ndim, dtype=np.int64)
    width, height = int(extent[0]), int(extent[1])
    x, y = cells[..., 0], cells[..., 1]
    if base == "snake":
        x = np.where(y % 2 == 1, width - 1 - x, x)
    key = y * width + x
    if ndim == 3:
        plane = width * height
        z = cells[..., 2]
        if base == "snake":
            key = np.where(z % 2 == 1, plane - 1 - key, key)
        key = z * plane + key
    return key


def _quantize(points: np.ndarray, grid_size: float | None) -> np.ndarray:
    """int64 cells (..., N, d) of points (..., N, d): floor((p - min of its cloud) / grid_size).

    Computed in float64 at half scale when a cloud spans more than the largest float (p - min would
    overflow): halving is exact, so the cells are the same."""
    low = points.min(axis=-2, keepdims=True)
    scale = 1.0
    with np.errstate(over="ignore", invalid="ignore"):
        shifted = points - low
    if not np.isfinite(shifted).all():
        scale = 0.5
        shifted = points * scale - low * scale
    if grid_size is None:
        count, ndim = points.shape[-2], points.shape[-1]
        extent = shifted.max(axis=(-2, -1), keepdims=True)
        size = np.where(extent > 0, extent / max(1.0, count ** (1.0 / ndim)), 1.0)
    else:
        size = grid_size * scale
    with np.errstate(over="ignore"):
        cells = np.floor(shifted / size)
    _check_cell_range(float(cells.max()), points.shape[-1])
    return cells.astype(np.int64)


def _check_cell_range(cells_max: float, ndim: int) -> None:
    if not cells_max < 2.0 ** (MAX_INDEX_BITS // ndim):  # inf included
        raise ValueError(
            f"grid_size is too small: the quantized cloud spans {cells_max:.3g} cells per axis, at most "
            f"2**{MAX_INDEX_BITS // ndim} allowed for {ndim}D points (use a larger grid_size)"
        )


def _check_points(points: Any) -> None:
    shape = tuple(points.shape)
    if len(shape) not in (2, 3) or shape[-1] not in (2, 3) or shape[-2] < 1:
        raise ValueError(f"points must have shape (N, 2|3) or (B, N, 2|3) with N >= 1, got {shape}")


def _order_for(cells_max: int, ndim: int) -> int:
    order = max(1, int(cells_max).bit_length())
    if order * ndim > MAX_INDEX_BITS:
        raise ValueError(
            f"grid_size is too small: the quantized cloud needs {order} bits per axis, at most "
            f"{MAX_INDEX_BITS // ndim} allowed for {ndim}D points (use a larger grid_size)"
        )
    return order


def _points_numpy(points: np.ndarray, base: str, transposed: bool, grid_size: float | None):
    if not np.issubdtype(points.dtype, np.number) or np.issubdtype(points.dtype, np.complexfloating) \
            or points.dtype == np.bool_:
        raise ValueError(f"points must be a real numeric array, got dtype {points.dtype}")
    points = points.astype(np.float64, copy=False)
    if not np.isfinite(points).all():
        raise ValueError("points must be finite (no NaN or inf)")
    cells = _quantize(points, grid_size)
    if transposed:
        cells = cells[..., [1, 0] + list(range(2, cells.shape[-1]))]
    order = _order_for(int(cells.max()), cells.shape[-1])
    keys = _cell_keys_numpy(cells, base, order)
    perm = np.argsort(keys, axis=-1, kind="stable").astype(np.int64)
    inverse = np.empty_like(perm)
    np.put_along_axis(inverse, perm, np.broadcast_to(np.arange(perm.shape[-1], dtype=np.int64), perm.shape), axis=-1)
    return perm, inverse


def _points_torch(points: Any, base: str, transposed: bool, grid_size: float | None):
    import torch

    if points.is_complex() or points.dtype == torch.bool:
        raise ValueError(f"points must be a real numeric tensor, got dtype {points.dtype}")
    points = points.to(torch.float64)
    if not bool(torch.isfinite(points).all()):
        raise ValueError("points must be finite (no NaN or inf)")
    low = points.amin(dim=-2, keepdim=True)
    scale = 1.0
    shifted = points - low
    if not bool(torch.isfinite(shifted).all()):  # the cloud spans more than the largest float: half scale
        scale = 0.5
        shifted = points * scale - low * scale
    if grid_size is None:
        count, ndim = points.shape[-2], points.shape[-1]
        extent = shifted.amax(dim=(-2, -1), keepdim=True)
        size = torch.where(extent > 0, extent / max(1.0, count ** (1.0 / ndim)), torch.ones_like(extent))
    else:
        size = grid_size * scale
    cells = torch.floor(shifted / size)
    _check_cell_range(float(cells.max()), points.shape[-1])
    cells = cells.to(torch.int64)
    if transposed:
        cells = cells[..., [1, 0] + list(range(2, cells.shape[-1]))]
    order = _order_for(int(cells.max()), cells.shape[-1])
    if base in ("hilbert", "morton"):
        keys = encode(cells, order, curve=base)
    else:
        keys = torch.from_numpy(_cell_keys_numpy(cells.cpu().numpy(), base, order)).to(points.device)
    perm = torch.sort(keys, dim=-1, stable=True).indices
    positions = torch.arange(perm.shape[-1], device=perm.device).expand_as(perm)
    inverse = torch.empty_like(perm).scatter_(-1, perm, positions)
    return perm, inverse


def serialize(grid_shape_or_points: Any, ordering: str, *, grid_size: float | None = None):
    """(perm, inverse) serializing a grid (H, W) / (T, H, W) or a point cloud (N, d) / (B, N, d).

    ordering: one of SERIALIZATIONS ("identity" is accepted for "rowmajor"). grid_size: cell side
    for point clouds (None: about one cell per point); not allowed for grids. See the module
    docstring for the axes, the quantization and the tie-break.
    """
    base, transposed = _check_ordering(ordering)
    grid_size = _check_grid_size(grid_size)
    if _is_grid_shape(grid_shape_or_points):
        if grid_size is not None:
            raise ValueError("grid_size applies to point clouds only; pass None with a grid shape")
        return _grid(grid_shape_or_points, ordering)
    if _is_torch(grid_shape_or_points):
        _check_points(grid_shape_or_points)
        return _points_torch(grid_shape_or_points, base, transposed, grid_size)
    if isinstance(grid_shape_or_points, np.ndarray):
        _check_points(grid_shape_or_points)
        return _points_numpy(grid_shape_or_points, base, transposed, grid_size)
    raise ValueError(
        "grid_shape_or_points must be a grid shape (H, W) / (T, H, W) of ints or a float point array "
        f"(N, 2|3) / (B, N, 2|3) (numpy or torch), got {type(grid_shape_or_points).__name__}"
    )
