"""estimate_memory: peak bytes of the engine's forward and forward+backward, derived from the plan.

Block sizes come from the public plan (attention.plan.cached_plan: Plan.blocks, Block.count / length /
num_heads); the executor that runs it decides what is allocated around them, one model each:
- the block executor (engine._DilatedFunction, every backend): attention.memory_blocks;
- the in-place executor (attention.inplace, "sdpa" backends on CUDA with fp16/bf16): attention.memory_inplace;
- the fused Triton kernel over the whole pattern: `_whole_pattern_estimate` below;
- ring attention per rank (world_size > 1): attention.memory_ring.
All figures are bytes *above the inputs* q, k, v (and above the caller's upstream gradient); the
inputs are reported separately as inputs_bytes.
Measured on the CPU (benchmarks/validate_memory.py, reports/results/memory_estimate_*cpu.json):
engine 0.94-1.11x of the measured peak over 13 cases; ring (2 gloo ranks, 6 cases) 0.94-1.08x.
GPU numbers come from the same script with --device cuda (H100, bf16, sdpa/flash: reports/results/
memory_estimate_gpu_h100.json, block executor: measured before "sdpa" ran in place).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from hilbert_lab.attention.inplace import kernel_for
from hilbert_lab.attention.memory_blocks import (
    DTYPE_BYTES, EAGER_BACKENDS, FUSED_BACKENDS, engine_blocks, engine_peaks, tensor_elements,
)
from hilbert_lab.attention.memory_inplace import inplace_peaks
from hilbert_lab.attention.memory_ring import ring_peaks
from hilbert_lab.attention.pattern import MODES
from hilbert_lab.attention.plan import IDENTITY_ORDERINGS
from hilbert_lab.dtypes import DTYPES

__all__ = ["ASSUMED_CAPABILITY", "DTYPE_BYTES", "EAGER_BACKENDS", "EXECUTORS", "FUSED_BACKENDS", "MAX_INPUT_BYTES",
           "MAX_NUM_HEADS", "MemoryConfig", "MemoryEstimate", "estimate_memory"]

# How the engine runs a plan: "blocks" (engine._DilatedFunction: block reads, per-block results, merge),
# "inplace" (attention.inplace: cuDNN / flash kernels on the plan's strided views), "whole_pattern"
# (a fused kernel over the whole pattern: backend "triton" on CUDA). "auto": the one the engine picks.
EXECUTORS = ("auto", "blocks", "inplace", "whole_pattern")
# A CUDA estimate on a machine without CUDA assumes the device the selection rules were measured on.
ASSUMED_CAPABILITY = (9, 0)
# Sizes no device or host holds are refused at once (the estimate walks heads one by one, so a
# head count in the billions would exhaust memory before any answer).
MAX_INPUT_BYTES = 1 << 50  # q, k, v together: 1 PiB
MAX_NUM_HEADS = 1 << 16


@dataclass(frozen=True)
class MemoryConfig:
    """One attention call to estimate: shapes (B, N, H, D), pattern, backend, dtype and device.

    world_size > 1 estimates ring attention per rank (N is the global length). executor: one of
    EXECUTORS; "auto" is the one the engine runs for this backend, device, dtype and ordering.
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
    executor: str = "auto"

    def __post_init__(self) -> None:
        for name in ("seq_len", "batch_size", "num_heads", "head_dim", "world_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.num_heads > MAX_NUM_HEADS:
            raise ValueError(f"num_heads must be <= {MAX_NUM_HEADS}, got {self.num_heads}")
        object.__setattr__(self, "segment_lengths", tuple(self.segment_lengths))
        object.__setattr__(self, "dilation_rates", tuple(self.dilation_rates))
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        if not isinstance(self.device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:<index>', got {self.device!r}")
        known = ("auto",) + EAGER_BACKENDS + FUSED_BACKENDS
        if self.backend not in known:
            raise ValueError(f"backend must be one of {', '.join(known)}; got {self.backend!r}")
        inputs = 3 * self.batch_size * self.seq_len * self.num_heads * self.head_dim * DTYPE_BYTES[self.dtype]
        if inputs > MAX_INPUT_BYTES:
            raise ValueError(
                f"q, k, v of batch_size={self.batch_size}, seq_len={self.seq_len}, num_heads={self.num_heads}, "
                f"head_dim={self.head_dim} ({self.dtype}) would take {inputs} bytes, more than any device holds "
                f"(limit {MAX_INPUT_BYTES}); lower one of them")
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}; got {self.executor!r}")
        if self.world_size > 1 and self.seq_len % self.world_size:
            raise ValueError(f"seq_len must be divisible by world_size ({self.world_size}) for ring attention, "
                             f"got {self.seq_len}")

    @classmethod
    def from_case(cls, case: dict[str, Any]) -> "MemoryConfig":
        """From a benchmark case dict (hilbert_lab.bench.cases); unknown keys are ignored."""
        names = set(cls.__dataclass_fields__)
        return cls(**{key: (tuple(value) if isinstance(value, list) else value)
                      for key, value in case.items() if key in names})


@dataclass
class MemoryEstimate:
    """Estimated peaks in bytes above the inputs: forward (inference, no grad) and forward+backward.

    inputs_bytes: q, k, v themselves. breakdown: the terms of each peak (name -> bytes).
    """

    forward_bytes: int
    forward_backward_bytes: int
    inputs_bytes: int
    backend: str
    per_rank: bool = False
    breakdown: dict[str, dict[str, int]] = field(default_factory=dict)
    executor: str = "blocks"

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



def _resolve_backend(config: MemoryConfig) -> str:
    """The backend named, or the one "auto" resolves to (the selection rule)."""
    if config.backend != "auto":
        return config.backend
    if config.device == "cpu" or torch.cuda.is_available():
        from hilbert_lab.attention.selection import rule_backend

        return rule_backend(config.device, getattr(torch, config.dtype), whole_pattern=config.world_size == 1)
    # a CUDA estimate on a machine without CUDA: the rule for Ampere and newer without flash-attn
    return "sdpa"


def estimate_memory(config: MemoryConfig | dict[str, Any]) -> MemoryEstimate:
    """Peak bytes above the inputs of one engine call: forward (no grad) and forward+backward.

    config: a MemoryConfig or a dict of its fields. ValueError for invalid settings (the engine's
    own pattern validator checks segment_lengths/dilation_rates/mode). world_size > 1: ring
    attention, per rank (block executor). The estimate's `executor` says which executor was modelled.
    """
    if isinstance(config, dict):
        config = MemoryConfig(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in config.items()})
    backend = _resolve_backend(config)
    element = DTYPE_BYTES[config.dtype]
    if config.world_size > 1:
        if config.executor not in ("auto", "blocks"):
            raise ValueError(f"executor must be 'auto' or 'blocks' for ring attention (world_size > 1), "
                             f"got {config.executor!r}")
        forward, forward_backward, breakdown = ring_peaks(config, backend)
        inputs = 3 * tensor_elements(config, config.seq_len // config.world_size) * element
        return MemoryEstimate(forward, forward_backward, inputs, backend, True, breakdown)
    executor, kernel = _resolve_executor(config, backend)
    if executor == "whole_pattern":
        return _whole_pattern_estimate(config)
    if executor == "inplace":
        forward, forward_backward, breakdown = inplace_peaks(config, kernel)
    else:
        blocks, partials = engine_blocks(config, config.seq_len)
        forward, forward_backward, breakdown = engine_peaks(config, backend, config.seq_len, blocks, partials)
    inputs = 3 * tensor_elements(config, config.seq_len) * element
    return MemoryEstimate(forward, forward_backward, inputs, backend, False, breakdown, executor)


def _whole_pattern_estimate(config: MemoryConfig) -> MemoryEstimate:
    """The fused Triton kernel (kernels/triton_dilated.py) reads the whole pattern in place: no block
    copies, no partial results, no merge, and orderings need no permutation. Forward: out (input
    dtype) and lse (float32). Backward: out and lse kept, the float32 row correction delta (B, H, N)
    and dq, dk, dv in the input dtype."""
    element = DTYPE_BYTES[config.dtype]
    tokens = tensor_elements(config, config.seq_len)
    rows = config.batch_size * config.num_heads * config.seq_len
    forward = tokens * element + rows * 4
    forward_backward = forward + rows * 4 + 3 * tokens * element
    return MemoryEstimate(forward, forward_backward, 3 * tokens * element, "triton", False,
                          {"forward": {"out_lse": forward},
                           "forward_backward": {"kept_out_lse": forward, "delta": rows * 4, "gradients": 3 * tokens * element}},
                          "whole_pattern")


def _inplace_kernel(config: MemoryConfig, backend: str) -> str | None:
    """The kernel the in-place executor would use (attention.inplace.kernel_for), or None where the engine
    runs the block executor (CPU, fp32/fp64, other backends, a layout ordering: index maps)."""
    if config.device == "cpu" or config.ordering not in IDENTITY_ORDERINGS:
        return None
    if torch.cuda.is_available():
        capability, cudnn = torch.cuda.get_device_capability(config.device), torch.backends.cudnn.is_available()
    else:
        capability, cudnn = ASSUMED_CAPABILITY, True
    return kernel_for(backend, getattr(torch, config.dtype), config.head_dim, capability, cudnn)


def _resolve_executor(config: MemoryConfig, backend: str) -> tuple[str, str | None]:
    """(executor, in-place kernel or None): the engine's choice for "auto", else the requested one when
    the engine can run it for this backend, device, dtype, head_dim and ordering."""
    if backend == "triton" and config.device != "cpu":
        possible = {"whole_pattern": None}
    else:
        kernel = _inplace_kernel(config, backend)
        possible = {"inplace": kernel, "blocks": None} if kernel else {"blocks": None}
    executor = next(iter(possible)) if config.executor == "auto" else config.executor
    if executor not in possible:
        raise ValueError(f"executor must be one of auto, {', '.join(possible)} for backend {backend!r} on "
                         f"{config.device} with {config.dtype}, head_dim {config.head_dim} and ordering "
                         f"{config.ordering!r}; got {config.executor!r}")
    return executor, possible[executor]
