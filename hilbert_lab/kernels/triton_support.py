"""Triton where it is installed: `triton`, `tl` (triton.language) and HAVE_TRITON; None, None and False where it
is not (the kernel modules then import, and raise a clear error on use: `require_triton`). `interpreting()`:
whether Triton's interpreter runs the kernels (TRITON_INTERPRET=1, on the CPU); `runs_on(device)`: whether Triton
kernels run on a device's tensors; `define_op(schema, launch, fake)`: a kernel's launch as a `hilbert_lab::` op."""
from __future__ import annotations

import os
from collections.abc import Callable

import torch

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised only where triton is missing
    triton = None
    tl = None
    HAVE_TRITON = False

__all__ = ["HAVE_TRITON", "define_op", "interpreting", "require_triton", "runs_on", "tl", "triton"]


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


# Ops through torch.library.Library, not custom_op: the dispatcher calls the launch with no Python wrapper of its own.
_OPS = torch.library.Library("hilbert_lab", "FRAGMENT")


def define_op(schema: str, launch: Callable, fake: Callable):
    """The op `hilbert_lab::<name>` of `schema` ("name(args) -> outputs"), running `launch` on every device, with
    `fake` its shapes for torch.compile, which then holds the launch as one call -> the op's default overload."""
    name = schema.split("(", 1)[0]
    _OPS.define(schema)
    _OPS.impl(name, launch, "CompositeExplicitAutograd")
    torch.library.register_fake(f"hilbert_lab::{name}", fake, lib=_OPS)
    return getattr(torch.ops.hilbert_lab, name).default
