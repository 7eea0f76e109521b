"""Checks over large tensors in bounded pieces: each piece's temporaries (a float64 copy, a mask) stay small.

`pieces(a, b)` yields views covering a tensor (and another of its shape) of at most `PIECE_ELEMENTS` elements
each; `close_piecewise(a, b, tolerance)` and `holds_everywhere(flat, holds)` are checks over them. A check of a
3 GiB bf16 tensor in one piece would allocate 12 GiB as float64, beside the tensors it checks.
"""
from __future__ import annotations

from typing import Callable, Iterator, Optional

import torch

__all__ = ["PIECE_ELEMENTS", "close_piecewise", "holds_everywhere", "pieces"]

PIECE_ELEMENTS = 1 << 24  # elements per piece: 128 MiB as float64


def pieces(a: torch.Tensor, b: Optional[torch.Tensor] = None,
           limit: Optional[int] = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(a piece of a, the same piece of b) views covering a (b: a tensor of a's shape, default a itself), each of at
    most `limit` (PIECE_ELEMENTS) elements, split along the leading dimensions."""
    limit = PIECE_ELEMENTS if limit is None else limit
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    b = a if b is None else b
    if a.shape != b.shape:
        raise ValueError(f"a and b must have one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.numel() <= limit or a.dim() == 0:
        yield a, b
        return
    inner = a[0].numel() if a.dim() > 1 else 1
    if inner <= limit:
        step = limit // inner
        for start in range(0, a.shape[0], step):
            yield a[start:start + step], b[start:start + step]
        return
    for index in range(a.shape[0]):
        yield from pieces(a[index], b[index], limit)


def close_piecewise(a: torch.Tensor, b: torch.Tensor, tolerance: float) -> bool:
    """Whether b equals a bitwise, or both are floating point with NaN in the same entries and every other entry
    within tolerance * (max |a| + 1e-6) of a's (infinities compared as the largest finite values)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0 or all(torch.equal(x, y) for x, y in pieces(a, b)):
        return True
    if not a.is_floating_point():
        return False
    worst, peak = [], []
    for x, y in pieces(a, b):
        if not torch.equal(torch.isnan(x), torch.isnan(y)):
            return False
        x, y = torch.nan_to_num(x.double()), torch.nan_to_num(y.double())
        worst.append((x - y).abs().max())
        peak.append(x.abs().max())
    return bool((torch.stack(worst).max() <= tolerance * (torch.stack(peak).max() + 1e-6)).item())


def holds_everywhere(flat: torch.Tensor, holds: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """Whether holds(piece) (a 0-d bool tensor, e.g. `torch.isnan(piece).all()`) is true for every piece of `flat`;
    one host read for all of them."""
    if flat.numel() == 0:
        return True
    return bool(torch.stack([holds(piece) for piece, _ in pieces(flat)]).all().item())
