"""dry_run: the peak bytes of an executor running a plan, counted on meta tensors (the memory estimate's method).

The run is the executor's own code (attention.function with the executor and the plan) on meta tensors, which
allocate nothing, while a dispatch mode (`_Allocations`) counts every storage the run creates and frees: the peak
of live bytes is the estimate. Kernels report the buffers they allocate internally through
attention.target.note_workspace; code that chooses by device answers for the device being estimated (`_target`).
Callers: attention.memory (estimate_memory), attention.memory_ring (the ring's terms), attention.selection (whether
the in-place executor's buffers fit).
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hilbert_lab.attention.executors.base import Executor
from hilbert_lab.attention.function import attention, make_job, plan_part
from hilbert_lab.attention.layout import read_through_layout
from hilbert_lab.attention.plan import IDENTITY_ORDERINGS, Plan
from hilbert_lab.attention.target import estimating

__all__ = ["ASSUMED_CAPABILITY", "dry_run"]

# A CUDA estimate on a machine without CUDA assumes the device the selection rules were measured on.
ASSUMED_CAPABILITY = (9, 0)


class _Allocations(TorchDispatchMode):
    """Counts the bytes of every storage created under it while it lives; `peak` is the most at once,
    `transient(n)` a buffer of n bytes held only during the current operation."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = self.peak = 0

    def exclude(self, *tensors: torch.Tensor) -> None:
        """Storages that exist before the run (the inputs): never counted."""
        for t in tensors:
            self.live[t.untyped_storage()._cdata] = 0

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def transient(self, nbytes: int) -> None:
        self.peak = max(self.peak, self.current + nbytes)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage._cdata
                if key not in self.live:
                    self.live[key] = storage.nbytes()
                    self.current += storage.nbytes()
                    self.peak = max(self.peak, self.current)
                    weakref.finalize(storage, self._free, key)
        return out


def _target(device: str) -> tuple[str, Optional[tuple[int, int]], bool]:
    if not device.startswith("cuda"):
        return "cpu", None, False
    if torch.cuda.is_available():
        return "cuda", torch.cuda.get_device_capability(torch.device(device)), torch.backends.cudnn.is_available()
    return "cuda", ASSUMED_CAPABILITY, True


def dry_run(executor: Executor, plan: Plan, shape: tuple[int, int, int, int], dtype: torch.dtype, device: str,
            kv_heads: Optional[int] = None, ordering: Optional[str] = None) -> tuple[int, int]:
    """(forward, forward+backward) peak bytes of `executor` running `plan` on inputs of (B, N, H, D) `shape`
    on `device`, measured on meta tensors: inference (no LSE wanted, no gradient), then a training pass
    (forward with autograd, backward with an upstream gradient on the output; q, k, v gradients count).
    ordering: a layout the inputs are read through first (engine.read_through_layout), counted too."""
    with torch.inference_mode(False):  # called under inference mode too (auto's choice in a generate loop)
        return _dry_run(executor, plan, shape, dtype, device, kv_heads, ordering)


def _dry_run(executor: Executor, plan: Plan, shape: tuple[int, int, int, int], dtype: torch.dtype, device: str,
             kv_heads: Optional[int], ordering: Optional[str]) -> tuple[int, int]:
    batch, seq_len, heads, dim = shape
    kv_shape = (batch, plan.seq_len, kv_heads or heads, dim)
    q = torch.empty((batch, plan.queries, heads, dim), dtype=dtype, device="meta")
    k, v = (torch.empty(kv_shape, dtype=dtype, device="meta") for _ in range(2))
    upstream = torch.empty(q.shape, dtype=dtype, device="meta")
    job = make_job([plan_part(executor, plan)], dim ** -0.5)
    block = max(plan.pattern.segment_lengths)
    layout = ordering is not None and ordering not in IDENTITY_ORDERINGS
    if layout:  # the layout's index maps are built (and cached) outside the count, as a warm engine has them
        for t in (q, k):
            read_through_layout(t, ordering, block)
    peaks = []
    for training in (False, True):
        for t in (q, k, v):
            t.requires_grad_(training)
            t.grad = None
        tracker = _Allocations()
        tracker.exclude(q, k, v, upstream)
        with estimating(*_target(device), tracker.transient), tracker:
            with torch.set_grad_enabled(training):
                read = [read_through_layout(t, ordering, block) if layout else t for t in (q, k, v)]
                out, lse = attention(job, *read, need_lse=training)
                del read
                if training:
                    out.backward(upstream)
            del out, lse
        peaks.append(tracker.peak)
    return peaks[0], peaks[1]
