"""The executor table: the one list of attention executors (the names `backend=` takes), each declaring
its capabilities (executors.base.Capabilities).

reference / manual / sdpa_math: eager dense kernels (float64 oracle, chunked float32, PyTorch's math
formula); sdpa / sdpa_flash / sdpa_cudnn / sdpa_efficient: PyTorch's SDPA kernels reading the plan's
strided views; flex: FlexAttention; flash / xformers: optional packages; triton: the fused kernel over
the whole pattern; fa4: FlashAttention-4 reading and writing the plan's views in place (extra "fa4").
`auto` (attention.selection), the memory estimate (attention.memory) and the benchmark cases (bench.cases)
read this table and the capabilities; adding an executor is one module and one entry here.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from hilbert_lab.attention.executors.base import (
    BackendUnavailableError, Capabilities, Executor, Grads, Merged, Slots, lse_dtype,
)


def _table() -> dict[str, Executor]:
    from hilbert_lab.attention.executors import external, fa4, flex, fused, sdpa
    from hilbert_lab.attention.executors.blockwise import blockwise_executor
    from hilbert_lab.attention.executors.manual import EAGER_CAPABILITIES, MANUAL_KERNEL, REFERENCE_KERNEL

    table = {
        "reference": blockwise_executor("reference", lambda q: REFERENCE_KERNEL,
                                        dataclasses.replace(EAGER_CAPABILITIES, oracle=True),
                                        description="dense float64 softmax per block (exact, slow)"),
        "manual": blockwise_executor("manual", lambda q: MANUAL_KERNEL, EAGER_CAPABILITIES,
                                     description="eager chunked softmax per block (float32 compute)"),
    }
    table.update(sdpa.executors())
    table.update(flex.executors())
    table.update(external.executors())
    table["triton"] = fused.executor()
    table.update(fa4.executors())
    return table


EXECUTORS: dict[str, Executor] = _table()
BACKENDS: tuple[str, ...] = tuple(EXECUTORS)


def get_executor(name: str) -> Executor:
    """The executor called `name` (ValueError naming the allowed names)."""
    if name not in EXECUTORS:
        raise ValueError(f"backend must be one of {BACKENDS} (or 'auto'), got {name!r}")
    return EXECUTORS[name]


def unavailable_reason(name: str, device: torch.device | str | None = None, dtype: Optional[torch.dtype] = None,
                       head_dim: Optional[int] = None) -> Optional[str]:
    """Why executor `name` cannot run on (device, dtype, head_dim), or None when it can."""
    return get_executor(name).unavailable_reason(device, dtype, head_dim)


def available_backends(device: torch.device | str | None = "cpu", dtype: Optional[torch.dtype] = None) -> list[str]:
    """Names of the executors that can run on (device, dtype) here."""
    return [name for name in BACKENDS if unavailable_reason(name, device, dtype) is None]


__all__ = ["BACKENDS", "EXECUTORS", "BackendUnavailableError", "Capabilities", "Executor", "Grads", "Merged", "Slots",
           "available_backends", "get_executor", "lse_dtype", "unavailable_reason"]
