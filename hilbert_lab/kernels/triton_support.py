"""Triton where it is installed: `triton`, `tl` (triton.language) and HAVE_TRITON; None, None and False where it
is not (the kernel modules then import, and raise a clear error on use: `require_triton`). `interpreting()`:
whether Triton's interpreter runs the kernels (TRITON_INTERPRET=1, on the CPU); `runs_on(device)`: whether Triton
kernels run on a device's tensors; `chained_launch(device)`: whether kernels launch as programmatic dependent
launches there."""
from __future__ import annotations

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

__all__ = ["HAVE_TRITON", "chained_launch", "interpreting", "require_triton", "runs_on", "tl", "triton"]


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


_CHAINED: dict = {}  # chained_launch's answers by device


def chained_launch(device: torch.device) -> bool:
    """Whether the decoding kernels launch on `device` as programmatic dependent launches (CUDA, compute capability
    9 or more, not the interpreter; HILBERT_LAB_CHAINED_LAUNCH=0 turns it off): a launch then starts while the one
    before it finishes, reads only constant data (weights) until that one is done (`griddepcontrol.wait`), and
    lets the next one start in turn. In a CUDA graph the launches stay chained."""
    if device.type != "cuda" or not HAVE_TRITON or interpreting() \
            or os.environ.get("HILBERT_LAB_CHAINED_LAUNCH", "1") == "0":
        return False
    index = torch.cuda.current_device() if device.index is None else device.index
    if index not in _CHAINED:
        _CHAINED[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return _CHAINED[index]
