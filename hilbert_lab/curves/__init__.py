"""Space-filling curves: Hilbert/Morton encode+decode, generalized (gilbert) curves, token orderings."""
from __future__ import annotations

from hilbert_lab.curves.codec import CURVES, decode, encode
from hilbert_lab.curves.coordinates import CURVE_FAMILIES, curve_coordinates
from hilbert_lab.curves.gilbert import gilbert, gilbert3d
from hilbert_lab.curves.orderings import (
    GRID_ORDERINGS,
    ORDERINGS,
    grid_permutation,
    near_square_grid,
    segment_permutation,
)
from hilbert_lab.curves.serialize import SERIALIZATIONS, serialize

__all__ = [
    "CURVES", "CURVE_FAMILIES", "GRID_ORDERINGS", "ORDERINGS", "SERIALIZATIONS", "curve_coordinates", "decode",
    "encode", "gilbert", "gilbert3d",
    "grid_permutation", "near_square_grid", "segment_permutation", "serialize",
]
