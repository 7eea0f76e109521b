"""Triton where it is installed: `triton`, `tl` (triton.language) and HAVE_TRITON; None, None and False where it
is not (the kernel modules then import, and raise a clear error on use: `require_triton`). `interpreting()`:
whether Triton's interpreter runs the kernels (TRITON_INTERPRET=1, on the CPU); `runs_on(device)`: whether Triton
kernels run on a device's tensors."""
from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None
    HAVE_TRITON = False

__all__ = ["HAVE_TRITON", "interpreting", "require_triton", "runs_on", "tl", "triton"]


def interpreting() -> bool:
    """Whether Triton's interpreter runs the kernels (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def runs_on(device) -> bool:
    """Whether Triton kernels run on tensors of `device` (a torch.device): installed, and a CUDA device or the
    interpreter."""
    return HAVE_TRITON and (device.type == "cuda" or interpreting())


def require_triton(what: str) -> None:
    """RuntimeError naming `what` where Triton is not installed."""
    if not HAVE_TRITON:
        raise RuntimeError(f"{what} needs the 'triton' package (pip install triton)")
