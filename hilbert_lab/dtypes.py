"""The floating-point dtype vocabulary (names as the CLI, bench cases and configs spell them).

A leaf module: torch is imported only by torch_dtype, so validating a name stays light.
"""
from __future__ import annotations

from typing import Any

DTYPES = ("float32", "float64", "float16", "bfloat16")


def torch_dtype(name: str) -> Any:
    """The torch.dtype named `name`, one of DTYPES; ValueError naming the allowed values otherwise."""
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {name!r}")
    import torch

    return getattr(torch, name)
