"""The GPU kernel time of a step, by kind (torch.profiler): what a floor and a wall time are compared with.

`kernel_profile(step, calls=5)` runs `step` a few times to warm up, then `calls` times under the profiler, and
returns per call the summed CUDA kernel time (`ms_total`), that time by kind of kernel (`ms_by_kind`: attention,
merge, copies, fills, adds/conversions, other) and the costliest kernels (`top_kernels`). A floor is at the
kernel when its wall time is within a few percent of its `ms_total`.
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["KERNEL_KINDS", "kernel_kind", "kernel_profile"]

KERNEL_KINDS = (("merge", ("merge", "accumulate")),
                ("attention", ("attention", "fmha", "flash", "cudnn", "sm90", "dilated", "kernel_cutlass", "cute",
                               "_fwd_kernel", "_bwd_dkdv", "_bwd_dq", "_delta_kernel")),
                ("copies", ("copy", "memcpy", "Memcpy", "contiguous", "clone")), ("fills", ("fill", "zero")),
                ("adds/conversions", ("add", "put_rows", "to_copy", "cast", "elementwise", "vectorized")))


def kernel_kind(name: str) -> str:
    """The kind of a kernel, from its name (the first of KERNEL_KINDS whose words it holds), or "other"."""
    lowered = name.lower()
    for kind, words in KERNEL_KINDS:
        if any(word.lower() in lowered for word in words):
            return kind
    return "other"


def kernel_profile(step: Callable[[], None], calls: int = 5, warmup: int = 3, top: int = 12) -> dict:
    """{"ms_total", "ms_by_kind", "top_kernels"}: CUDA kernel milliseconds per call of `step`."""
    from torch.profiler import ProfilerActivity, profile

    if calls < 1:
        raise ValueError(f"calls must be at least 1, got {calls}")
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    kinds: dict[str, float] = {}
    kernels: dict[str, float] = {}
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if device_us <= 0:
            continue
        kind = kernel_kind(event.key)
        kinds[kind] = kinds.get(kind, 0.0) + device_us / calls / 1000
        kernels[event.key[:90]] = round(device_us / calls / 1000, 4)
    return {"ms_by_kind": {k: round(v, 4) for k, v in sorted(kinds.items())}, "ms_total": round(sum(kinds.values()), 4),
            "top_kernels": dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:top])}
