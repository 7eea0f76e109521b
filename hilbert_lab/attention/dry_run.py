"""dry_run: the peak bytes of an executor running a plan, counted on meta tensors (the memory estimate's method).

The run is the executor's own code (attention.function with the executor and the plan) on meta tensors, which
allocate nothing, while a dispatch mode (`Allocations`) counts every storage the run creates and frees: the peak
of live bytes is the estimate. Kernels report the buffers they allocate internally through
attention.target.holding_workspace; code that chooses by device answers for the device being estimated
(`estimate_target`).
Callers: attention.memory (estimate_memory), distributed.memory (the ring's terms), attention.selection (whether
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

__all__ = ["ASSUMED_CAPABILITY", "Allocations", "WORKSPACE", "dry_run", "dry_run_parts", "estimate_target"]

# A CUDA estimate on a machine without CUDA assumes the device the selection rules were measured on.
ASSUMED_CAPABILITY = (9, 0)
# the breakdown's name for buffers a kernel allocates inside one call (not tensors the run sees)
WORKSPACE = "kernel workspace"


class Allocations(TorchDispatchMode):
    """Counts the bytes of every storage created under it while it lives; `peak` is the most at once.
    `workspace(delta)`: kernel workspace no tensor shows, taken (delta > 0) or given back (delta < 0), counted
    as live meanwhile. `at_peak`: the bytes live at the peak by what created them ('aten.empty [2, 64, 4, 32]
    float32', ' x3' when several alike; WORKSPACE for kernel workspace); they add up to `peak`."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[str, int]] = {}
        self.current = self.peak = self.held = 0
        self.at_peak: dict[str, int] = {}

    def exclude(self, *tensors: torch.Tensor) -> None:
        """Storages that exist before the run (the inputs): never counted."""
        for t in tensors:
            self.live[t.untyped_storage()._cdata] = ("input", 0)

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, ("", 0))[1]

    def _reached(self) -> None:
        if self.current <= self.peak:
            return
        self.peak = self.current
        alike: dict[str, list[int]] = {}
        for name, nbytes in self.live.values():
            if nbytes:
                count_bytes = alike.setdefault(name, [0, 0])
                count_bytes[0] += 1
                count_bytes[1] += nbytes
        parts = {(name if count == 1 else f"{name} x{count}"): nbytes for name, (count, nbytes) in alike.items()}
        if self.held:
            parts[WORKSPACE] = self.held
        self.at_peak = parts

    def workspace(self, delta: int) -> None:
        self.held += delta
        self.current += delta
        self._reached()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage._cdata
                if key not in self.live:
                    what = f"{func.overloadpacket} {list(t.shape)} {str(t.dtype).removeprefix('torch.')}"
                    self.live[key] = (what, storage.nbytes())
                    self.current += storage.nbytes()
                    self._reached()
                    weakref.finalize(storage, self._free, key)
        return out


def estimate_target(device: str) -> tuple[str, Optional[tuple[int, int]], bool]:
    """(device type, compute capability, cuDNN present) that code choosing by device answers for while `device` is
    estimated: this machine's where it has that device, else an assumed GPU (ASSUMED_CAPABILITY)."""
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
    forward, forward_backward = dry_run_parts(executor, plan, shape, dtype, device, kv_heads, ordering)
    return sum(forward.values()), sum(forward_backward.values())


def dry_run_parts(executor: Executor, plan: Plan, shape: tuple[int, int, int, int], dtype: torch.dtype,
                  device: str, kv_heads: Optional[int] = None,
                  ordering: Optional[str] = None) -> tuple[dict[str, int], dict[str, int]]:
    """dry_run's two peaks as the bytes live at each, by the operator that allocated them (WORKSPACE: buffers a
    kernel holds inside one call); each dict adds up to its peak."""
    # Called under inference mode too (auto's choice in a generate loop), and inside a forward that
    # activation checkpointing records: identity hooks keep the dry run's own autograd graph out of the
    # checkpoint's saved tensors, which its recomputation (with the choice cached) would not save again.
    with torch.inference_mode(False), torch.autograd.graph.saved_tensors_hooks(_keep, _keep):
        return _dry_run(executor, plan, shape, dtype, device, kv_heads, ordering)


def _keep(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _dry_run(executor: Executor, plan: Plan, shape: tuple[int, int, int, int], dtype: torch.dtype, device: str,
             kv_heads: Optional[int], ordering: Optional[str]) -> tuple[dict[str, int], dict[str, int]]:
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
        tracker = Allocations()
        tracker.exclude(q, k, v, upstream)
        with estimating(*estimate_target(device), tracker.workspace), tracker:
            with torch.set_grad_enabled(training):
                read = [read_through_layout(t, ordering, block) if layout else t for t in (q, k, v)]
                out, lse = attention(job, *read, need_lse=training)
                del read
                if training:
                    out.backward(upstream)
            del out, lse
        peaks.append(tracker.at_peak)
    return peaks[0], peaks[1]
