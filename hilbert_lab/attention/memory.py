"""estimate_memory: peak bytes of one attention call, forward and forward+backward, by a dry run.

An executor's estimate is a run of its own code (attention.function with the executor and the plan the
engine would use) on meta tensors, which allocate nothing, while a dispatch mode counts every storage the
run creates and frees: the peak of live bytes is the estimate, and whatever an executor allocates is
counted as it is allocated, with no model to keep in step with the code. Kernels report the buffers they
allocate internally (cudnn-frontend's float32 dQ accumulator, the flash backward's packed copies) through
attention.target.note_workspace; code that chooses by device (the SDPA kernel, the fused merge) answers
for the device being estimated. Ring attention per rank (world_size > 1): attention.memory_ring.
All figures are bytes *above the inputs* q, k, v (and above the caller's upstream gradient); the inputs
are reported separately as inputs_bytes.
"""
from __future__ import annotations

import functools
import re
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hilbert_lab.attention.executors import BACKENDS, Executor, get_executor
from hilbert_lab.attention.function import attention, make_job
from hilbert_lab.attention.pattern import MODES, DilatedPattern
from hilbert_lab.attention.plan import IDENTITY_ORDERINGS, Plan, cached_plan
from hilbert_lab.attention.target import estimating
from hilbert_lab.dtypes import DTYPES

__all__ = ["ASSUMED_CAPABILITY", "DTYPE_BYTES", "MAX_INPUT_BYTES", "MAX_NUM_HEADS", "MemoryConfig", "MemoryEstimate",
           "dry_run", "estimate_memory"]

DTYPE_BYTES = dict(zip(DTYPES, (4, 8, 2, 2)))
# A CUDA estimate on a machine without CUDA assumes the device the selection rules were measured on.
ASSUMED_CAPABILITY = (9, 0)
# the breakdown's name for buffers a kernel allocates inside one call (not tensors the run sees)
WORKSPACE = "kernel workspace"
# Sizes no device or host holds are refused at once.
MAX_INPUT_BYTES = 1 << 50  # q, k, v together: 1 PiB
MAX_NUM_HEADS = 1 << 16


@dataclass(frozen=True)
class MemoryConfig:
    """One attention call to estimate: shapes (B, N, H, D), pattern, backend, dtype and device.

    world_size > 1 estimates ring attention per rank (N is the global length). ordering: the layout the
    engine reads q, k, v through (its copies count; hilbert_lab.attention.engine.read_through_layout).
    """

    seq_len: int
    batch_size: int = 1
    num_heads: int = 8
    head_dim: int = 64
    segment_lengths: tuple[int, ...] = (2048,)
    dilation_rates: tuple[int, ...] = (1,)
    mode: str = "longnet"
    causal: bool = False
    backend: str = "auto"
    dtype: str = "float32"
    device: str = "cpu"
    ordering: str | None = None
    world_size: int = 1

    def __post_init__(self) -> None:
        for name in ("seq_len", "batch_size", "num_heads", "head_dim", "world_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.num_heads > MAX_NUM_HEADS:
            raise ValueError(f"num_heads must be <= {MAX_NUM_HEADS}, got {self.num_heads}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        if not isinstance(self.device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:<index>', got {self.device!r}")
        known = ("auto",) + BACKENDS
        if self.backend not in known:
            raise ValueError(f"backend must be one of {', '.join(known)}; got {self.backend!r}")
        pattern = DilatedPattern.create(self.segment_lengths, self.dilation_rates, mode=self.mode, causal=self.causal)
        object.__setattr__(self, "segment_lengths", pattern.segment_lengths)
        object.__setattr__(self, "dilation_rates", pattern.dilation_rates)
        inputs = 3 * self.batch_size * self.seq_len * self.num_heads * self.head_dim * DTYPE_BYTES[self.dtype]
        if inputs > MAX_INPUT_BYTES:
            raise ValueError(
                f"q, k, v of batch_size={self.batch_size}, seq_len={self.seq_len}, num_heads={self.num_heads}, "
                f"head_dim={self.head_dim} ({self.dtype}) would take {inputs} bytes, more than any device holds "
                f"(limit {MAX_INPUT_BYTES}); lower one of them")
        if self.world_size > 1 and self.seq_len % self.world_size:
            raise ValueError(f"seq_len must be divisible by world_size ({self.world_size}) for ring attention, "
                             f"got {self.seq_len}")

    @classmethod
    def from_case(cls, case: dict[str, Any]) -> "MemoryConfig":
        """From a benchmark case dict (hilbert_lab.bench.cases); unknown keys are ignored."""
        names = set(cls.__dataclass_fields__)
        return cls(**{key: (tuple(value) if isinstance(value, list) else value)
                      for key, value in case.items() if key in names})

    @property
    def pattern(self) -> DilatedPattern:
        return DilatedPattern.create(self.segment_lengths, self.dilation_rates, mode=self.mode, causal=self.causal)


@dataclass
class MemoryEstimate:
    """Estimated peaks in bytes above the inputs: forward (inference, no grad) and forward+backward.

    inputs_bytes: q, k, v themselves. executor: the executor estimated. breakdown: per pass ("forward",
    "forward_backward"), named parts: on one device the bytes live at the peak by the operator that allocated
    them (WORKSPACE: inside a kernel call), adding up to the peak; per rank of a ring, the peaks of its phases
    and the sizes of its terms (attention.memory_ring).
    """

    forward_bytes: int
    forward_backward_bytes: int
    inputs_bytes: int
    backend: str
    per_rank: bool = False
    breakdown: dict[str, dict[str, int]] = field(default_factory=dict)
    executor: str = ""

    @property
    def total_forward_bytes(self) -> int:
        return self.inputs_bytes + self.forward_bytes

    @property
    def total_forward_backward_bytes(self) -> int:
        return self.inputs_bytes + self.forward_backward_bytes

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(total_forward_bytes=self.total_forward_bytes,
                    total_forward_backward_bytes=self.total_forward_backward_bytes)
        return data


class _Allocations(TorchDispatchMode):
    """Counts the bytes of every storage created under it while it lives; `peak` is the most at once,
    `transient(n)` a buffer of n bytes held only during the current operation. `at_peak`: the bytes live at
    the peak by what created them ('aten.empty [2, 64, 4, 32] float32', ' x3' when several alike; WORKSPACE for
    transient buffers); they add up to `peak`."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[str, int]] = {}
        self.current = self.peak = 0
        self.at_peak: dict[str, int] = {}

    def exclude(self, *tensors: torch.Tensor) -> None:
        """Storages that exist before the run (the inputs): never counted."""
        for t in tensors:
            self.live[t.untyped_storage()._cdata] = ("input", 0)

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key, ("", 0))[1]

    def _reached(self, total: int, workspace: int = 0) -> None:
        if total <= self.peak:
            return
        self.peak = total
        alike: dict[str, list[int]] = {}
        for name, nbytes in self.live.values():
            if nbytes:
                count_bytes = alike.setdefault(name, [0, 0])
                count_bytes[0] += 1
                count_bytes[1] += nbytes
        parts = {(name if count == 1 else f"{name} x{count}"): nbytes for name, (count, nbytes) in alike.items()}
        if workspace:
            parts[WORKSPACE] = workspace
        self.at_peak = parts

    def transient(self, nbytes: int) -> None:
        self._reached(self.current + nbytes, nbytes)

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
                    self._reached(self.current)
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
    forward, forward_backward = dry_run_parts(executor, plan, shape, dtype, device, kv_heads, ordering)
    return sum(forward.values()), sum(forward_backward.values())


def dry_run_parts(executor: Executor, plan: Plan, shape: tuple[int, int, int, int], dtype: torch.dtype,
                  device: str, kv_heads: Optional[int] = None,
                  ordering: Optional[str] = None) -> tuple[dict[str, int], dict[str, int]]:
    """dry_run's two peaks as the bytes live at each, by the operator that allocated them (WORKSPACE: buffers a
    kernel holds inside one call); each dict adds up to its peak."""
    with torch.inference_mode(False):  # called under inference mode too (auto's choice in a generate loop)
        return _dry_run(executor, plan, shape, dtype, device, kv_heads, ordering)


def _dry_run(executor: Executor, plan: Plan, shape: tuple[int, int, int, int], dtype: torch.dtype, device: str,
             kv_heads: Optional[int], ordering: Optional[str]) -> tuple[dict[str, int], dict[str, int]]:
    batch, seq_len, heads, dim = shape
    kv_shape = (batch, plan.seq_len, kv_heads or heads, dim)
    q = torch.empty((batch, plan.queries, heads, dim), dtype=dtype, device="meta")
    k, v = (torch.empty(kv_shape, dtype=dtype, device="meta") for _ in range(2))
    upstream = torch.empty(q.shape, dtype=dtype, device="meta")
    from hilbert_lab.attention.engine import plan_part, read_through_layout

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
        peaks.append(tracker.at_peak)
    return peaks[0], peaks[1]


def resolve_backend(config: MemoryConfig) -> str:
    """The backend named, or the one "auto" resolves to (the selection rule for the config)."""
    if config.backend != "auto":
        return config.backend
    from hilbert_lab.attention.selection import rule_backend

    if config.device == "cpu" or torch.cuda.is_available():
        return rule_backend(config.device, getattr(torch, config.dtype), whole_pattern=config.world_size == 1)
    return "sdpa"  # a CUDA estimate on a machine without CUDA: the rule without the fused kernel


def estimate_memory(config: MemoryConfig | dict[str, Any]) -> MemoryEstimate:
    """Peak bytes above the inputs of one attention call: forward (no grad) and forward+backward.

    config: a MemoryConfig or a dict of its fields (ValueError naming a bad field). world_size > 1:
    ring attention, per rank.
    """
    if isinstance(config, dict):
        config = MemoryConfig(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in config.items()})
    return _estimate(config)


@functools.lru_cache(maxsize=256)
def _estimate(config: MemoryConfig) -> MemoryEstimate:
    backend = resolve_backend(config)
    element = DTYPE_BYTES[config.dtype]
    if config.world_size > 1:
        from hilbert_lab.attention.memory_ring import ring_peaks

        forward, forward_backward, breakdown = ring_peaks(config, backend)
        inputs = 3 * config.batch_size * (config.seq_len // config.world_size) * config.num_heads * config.head_dim
        return MemoryEstimate(forward, forward_backward, inputs * element, backend, True, breakdown, backend)
    executor = get_executor(backend)
    plan = cached_plan(config.pattern, config.seq_len, config.num_heads)
    shape = (config.batch_size, config.seq_len, config.num_heads, config.head_dim)
    forward, forward_backward = dry_run_parts(executor, plan, shape, getattr(torch, config.dtype), config.device,
                                              ordering=config.ordering)
    inputs = 3 * config.batch_size * config.seq_len * config.num_heads * config.head_dim * element
    breakdown = {"forward": forward, "forward_backward": forward_backward}
    return MemoryEstimate(sum(forward.values()), sum(forward_backward.values()), inputs, backend, False, breakdown,
                          executor.name)
