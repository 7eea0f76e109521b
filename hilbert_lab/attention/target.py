"""The device a computation runs for, and kernels' hidden workspace, for dry runs on meta tensors.

attention.memory estimates an executor's peak memory by running its own code on meta tensors (which
allocate nothing) while counting every storage it creates. Code that chooses by device (the SDPA
kernel, the fused merge) asks `device_facts`, which answers for the device being estimated when the
tensors are meta; a kernel call that allocates buffers internally (invisible to the count) runs inside
`holding_workspace`, which counts them as live for the call's duration.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator, Optional

import torch

# (device type, compute capability or None, cuDNN available) of the device a dry run estimates.
_TARGET: ContextVar[Optional[tuple[str, Optional[tuple[int, int]], bool]]] = ContextVar("target", default=None)
_WORKSPACE: ContextVar[Optional[Callable[[int], None]]] = ContextVar("workspace", default=None)


def device_facts(x: torch.Tensor) -> tuple[str, Optional[tuple[int, int]], bool]:
    """(device type, compute capability (CUDA) or None, cuDNN available) of the device x lives on, or, for
    meta tensors inside `estimating`, of the device being estimated."""
    if x.device.type == "meta" and _TARGET.get() is not None:
        return _TARGET.get()
    if x.device.type == "cuda":
        return _cuda_facts(x.device.index if x.device.index is not None else torch.cuda.current_device())
    return x.device.type, None, False


@functools.lru_cache(maxsize=16)
def _cuda_facts(index: int) -> tuple[str, tuple[int, int], bool]:
    return "cuda", torch.cuda.get_device_capability(index), torch.backends.cudnn.is_available()


@contextmanager
def estimating(device_type: str, capability: Optional[tuple[int, int]], cudnn: bool,
               workspace: Callable[[int], None]) -> Iterator[None]:
    """Within: meta tensors stand for `device_type`, and `workspace(delta)` hears of kernel workspace taken
    (delta > 0) and given back (delta < 0)."""
    tokens = _TARGET.set((device_type, capability, cudnn)), _WORKSPACE.set(workspace)
    try:
        yield
    finally:
        _TARGET.reset(tokens[0])
        _WORKSPACE.reset(tokens[1])


def counting_workspace() -> bool:
    """Whether a dry run is counting kernel workspace here (kernels skip working it out otherwise)."""
    return _WORKSPACE.get() is not None


@contextmanager
def holding_workspace(nbytes: int) -> Iterator[None]:
    """The code inside holds `nbytes` of kernel workspace that no tensor shows; a dry run counts them as live
    from entry to exit, beside whatever the code allocates (its outputs, copies it makes)."""
    listener = _WORKSPACE.get()
    if listener is None or not nbytes:
        yield
        return
    listener(int(nbytes))
    try:
        yield
    finally:
        listener(-int(nbytes))
