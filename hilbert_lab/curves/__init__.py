"""Space-filling curves: Hilbert/Morton encode+decode, generalized (gilbert) curves, token orderings,
sequence layouts (torch; imported on first use so that this package stays light)."""
from __future__ import annotations

import importlib

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
    "LAYOUTS", "grid_layout", "inverse_permutation", "layout_permutation", "permute_sequence",
]

_LAYOUT_NAMES = ("LAYOUTS", "grid_layout", "inverse_permutation", "layout_permutation", "permute_sequence")


def __getattr__(name: str):
    if name in _LAYOUT_NAMES:
        return getattr(importlib.import_module("hilbert_lab.curves.layouts"), name)
    raise AttributeError(f"module 'hilbert_lab.curves' has no attribute {name!r}")
