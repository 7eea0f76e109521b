"""Triton where it is installed: `triton`, `tl` (triton.language) and HAVE_TRITON; None, None and False where it
is not (the kernel modules then import, and raise a clear error on use: `require_triton`). `interpreting()`:
whether Triton's interpreter runs the kernels (TRITON_INTERPRET=1, on the CPU); `runs_on(device)`: whether Triton
kernels run on a device's tensors; `dependent_launch(device)`: whether a kernel launched there may start
before the one ahead of it in the stream ends (programmatic dependent launch; `gdc_wait` / `gdc_launch_dependents`
inside kernels that take it)."""
from __future__ import annotations

import functools
import os

import torch

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None
    HAVE_TRITON = False

__all__ = ["HAVE_TRITON", "dependent_launch", "interpreting", "require_triton", "runs_on", "tl", "triton"]

# grid dependency control in kernels (tl.extra.cuda.gdc_wait / gdc_launch_dependents): Triton 3.3 on
HAVE_GDC = HAVE_TRITON and hasattr(getattr(getattr(tl, "extra", None), "cuda", None), "gdc_wait")


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


@functools.lru_cache(maxsize=None)
def _hopper_or_newer(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def dependent_launch(device) -> bool:
    """Whether kernels launched on `device` (a torch.device) use programmatic dependent launch: a CUDA device of
    compute capability 9 or more (Hopper on), a Triton with grid dependency control, not the interpreter, and not
    turned off by HILBERT_LAB_PDL=0. Such a launch may start while the kernel ahead of it in the stream ends: its
    programs run what reads nothing that kernel writes (a weight, say), then wait for it (`gdc_wait`), hiding the
    launch and the ramp between kernels, which a decoding step of small kernels feels. A CUDA graph keeps the
    launches' dependencies as they were captured."""
    if not (HAVE_GDC and device.type == "cuda") or interpreting() or os.environ.get("HILBERT_LAB_PDL", "1") == "0":
        return False
    return _hopper_or_newer(device.index if device.index is not None else torch.cuda.current_device())
