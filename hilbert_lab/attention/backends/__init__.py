"""Backend registry: name -> adapter with attend(q, k, v, *, causal, scale, key_padding_mask=None) -> (out, lse).

Names: "reference" (float64 dense), "manual" (eager, chunked), "sdpa" (+ "sdpa_flash",
"sdpa_cudnn", "sdpa_efficient", "sdpa_math" to force one SDPA kernel), "flex", "flash"
(flash-attn), "xformers", "triton" (fused kernel, loaded lazily from backends/triton.py, which
defines BACKEND and optionally dilated_attention(q, k, v, pattern, *, scale) for the whole pattern).
See backends/base.py for the calling convention.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Optional

import torch

from hilbert_lab.attention.backends.base import Backend, BackendUnavailableError, check_block_inputs

BACKENDS = ("reference", "manual", "sdpa", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math",
            "flex", "flash", "xformers", "triton")

_CACHE: dict[str, Backend] = {}


def _load(name: str) -> Backend:
    if name in ("reference", "manual"):
        from hilbert_lab.attention.backends import manual

        return manual.REFERENCE if name == "reference" else manual.MANUAL
    if name.startswith("sdpa"):
        from hilbert_lab.attention.backends import sdpa

        return sdpa.make_backend("auto" if name == "sdpa" else name.split("_", 1)[1])
    if name == "flex":
        from hilbert_lab.attention.backends import flex

        return flex.FLEX
    if name in ("flash", "xformers"):
        from hilbert_lab.attention.backends import external

        return external.FLASH if name == "flash" else external.XFORMERS
    # "triton": the fused-kernel adapter lives in backends/triton.py and exposes BACKEND.
    try:
        module = importlib.import_module("hilbert_lab.attention.backends.triton")
    except ImportError as error:
        raise BackendUnavailableError(f"backend 'triton' cannot be loaded: {error} (it needs the 'triton' package and CUDA)") from error
    backend = getattr(module, "BACKEND", None)
    if not isinstance(backend, Backend):
        raise BackendUnavailableError("backend 'triton': hilbert_lab.attention.backends.triton defines no BACKEND (a backends.base.Backend)")
    fused = getattr(module, "dilated_attention", None)
    if backend.whole_pattern is None and callable(fused):
        backend = dataclasses.replace(backend, whole_pattern=fused)
    return backend


def get_backend(name: str) -> Backend:
    """The adapter called `name` (ValueError for an unknown name; ImportError when it cannot load)."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} (or 'auto' in the engine), got {name!r}")
    if name not in _CACHE:
        _CACHE[name] = _load(name)
    return _CACHE[name]


def unavailable_reason(name: str, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Optional[str]:
    """Why backend `name` cannot run on (device, dtype), or None when it can."""
    try:
        backend = get_backend(name)
    except ImportError as error:  # includes BackendUnavailableError
        return str(error)
    return backend.unavailable_reason(torch.device(device) if device is not None else None, dtype)


def available_backends(device: torch.device | str | None = "cpu", dtype: torch.dtype | None = None) -> list[str]:
    """Names of the backends that can run on (device, dtype) here."""
    return [name for name in BACKENDS if unavailable_reason(name, device, dtype) is None]


__all__ = ["BACKENDS", "Backend", "BackendUnavailableError", "available_backends", "check_block_inputs", "get_backend", "unavailable_reason"]
