"""hilbert_lab: LongNet-style dilated attention with space-filling-curve orderings.

Top-level names are imported lazily so that `import hilbert_lab` stays light.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_NAMES = {
    "dilated_attention": "hilbert_lab.attention.engine",
    "DilatedAttention": "hilbert_lab.attention.modules",
    "MultiheadDilatedAttention": "hilbert_lab.attention.modules",
    "DilatedPattern": "hilbert_lab.attention.pattern",
}
_SUBPACKAGES = ("curves", "attention", "locality", "distributed", "bench", "viz", "models")

__all__ = sorted(_NAMES) + list(_SUBPACKAGES)


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    if name in _SUBPACKAGES:
        return importlib.import_module(f"hilbert_lab.{name}")
    raise AttributeError(f"module 'hilbert_lab' has no attribute {name!r}")
