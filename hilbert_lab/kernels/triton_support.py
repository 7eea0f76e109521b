"""Triton where it is installed: `triton`, `tl` (triton.language) and HAVE_TRITON; None, None and False where it
is not (the kernel modules then import, and raise a clear error on use)."""
from __future__ import annotations

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None
    HAVE_TRITON = False

__all__ = ["HAVE_TRITON", "tl", "triton"]
