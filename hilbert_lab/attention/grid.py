"""2D/3D helpers: serialise a token grid (B, *grid, H, D) into a sequence by a curve, and back."""
from __future__ import annotations

from typing import Sequence

import torch

from hilbert_lab.curves.layouts import grid_layout, permute_sequence


def serialize_grid(x: torch.Tensor, ordering: str = "hilbert", grid_dims: int = 2) -> torch.Tensor:
    """x (B, Hgt, Wdt, H, D) (or (B, T, Hgt, Wdt, H, D) with grid_dims=3) -> (B, N, H, D) in curve order.

    Token j of the sequence is grid cell perm[j] (row-major), with perm from
    hilbert_lab.curves.grid_layout(grid shape, ordering) (any name in SERIALIZATIONS, transposed
    variants included); contiguous segments of the sequence are then spatially compact for
    "hilbert"/"morton".
    """
    if grid_dims not in (2, 3):
        raise ValueError(f"grid_dims must be 2 or 3, got {grid_dims!r}")
    if x.dim() != grid_dims + 3:
        raise ValueError(f"x must be (B, {'T, ' if grid_dims == 3 else ''}Hgt, Wdt, H, D), got shape {tuple(x.shape)}")
    grid_shape = tuple(x.shape[1 : 1 + grid_dims])
    perm, _ = grid_layout(grid_shape, ordering, device=x.device)
    return permute_sequence(x.flatten(1, grid_dims), perm)


def deserialize_grid(seq: torch.Tensor, grid_shape: Sequence[int], ordering: str = "hilbert") -> torch.Tensor:
    """Inverse of `serialize_grid`: seq (B, N, H, D) -> (B, *grid_shape, H, D)."""
    grid_shape = tuple(int(s) for s in grid_shape)
    if len(grid_shape) not in (2, 3):
        raise ValueError(f"grid_shape must be (Hgt, Wdt) or (T, Hgt, Wdt), got {grid_shape!r}")
    if seq.dim() != 4 or seq.shape[1] != torch.Size(grid_shape).numel():
        raise ValueError(f"seq must be (B, {torch.Size(grid_shape).numel()}, H, D) for grid {grid_shape}, got {tuple(seq.shape)}")
    _, inverse = grid_layout(grid_shape, ordering, device=seq.device)
    return permute_sequence(seq, inverse).unflatten(1, grid_shape)
