"""The GPU kernel time of a step, by kind (torch.profiler): what a floor and a wall time are compared with.

`kernel_profile(step, calls=5)` runs `step` a few times to warm up, then `calls` times under the profiler, and
returns per call the summed CUDA kernel time (`ms_total`), that time by kind of kernel (`ms_by_kind`: attention,
merge, copies, fills, adds/conversions, other), the costliest kernels (`top_kernels`, names cut to 90 characters and
summed) and where the GPU waited (`device_timeline`): the span from the first kernel's start to the last one's end
(`ms_span`), the time in it with no kernel running (`ms_idle`) and the kernel pairs around the longest of those
waits (`largest_gaps`). A floor is at the kernel when its wall time is within a few percent of its `ms_total`; a
wall time above the kernels' is idle time of the GPU, between kernels or between calls.
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["KERNEL_KINDS", "device_timeline", "kernel_kind", "kernel_profile"]

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
        kernels[event.key[:90]] = kernels.get(event.key[:90], 0.0) + device_us / calls / 1000
    intervals = [(event.time_range.start, event.time_range.end, event.name) for event in prof.events()
                 if event.device_type == torch.autograd.DeviceType.CUDA and event.time_range.end > event.time_range.start]
    return {"ms_by_kind": {k: round(v, 4) for k, v in sorted(kinds.items())}, "ms_total": round(sum(kinds.values()), 4),
            "top_kernels": {k: round(v, 4) for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:top]},
            **device_timeline(intervals, calls)}


def device_timeline(intervals: list[tuple[float, float, str]], calls: int, top: int = 5) -> dict:
    """Per call of `calls`, from the device intervals (start_us, end_us, kernel name) they ran: `ms_span` (first start
    to last end), `ms_idle` (the span's time with no interval running) and `largest_gaps`, the `top` (kernel before,
    kernel after) pairs (names cut to 60 characters) whose waits add up the most, with their microseconds per call
    and how many waits per call."""
    if not intervals:
        return {"ms_span": 0.0, "ms_idle": 0.0, "largest_gaps": []}
    ordered = sorted(intervals)
    first, end, before = ordered[0]
    idle = 0.0
    gaps: dict[tuple[str, str], list[float]] = {}
    for start, finish, name in ordered[1:]:
        if start > end:
            idle += start - end
            gaps.setdefault((before[:60], name[:60]), []).append(start - end)
        if finish > end:
            end, before = finish, name
    largest = sorted(gaps.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {"ms_span": round((end - first) / calls / 1000, 4), "ms_idle": round(idle / calls / 1000, 4),
            "largest_gaps": [{"before": a, "after": b, "us_per_call": round(sum(waits) / calls, 2),
                              "waits_per_call": round(len(waits) / calls, 2)} for (a, b), waits in largest]}
