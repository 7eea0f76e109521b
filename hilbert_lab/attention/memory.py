"""estimate_memory: peak bytes of one attention call, forward and forward+backward, by a dry run.

An executor's estimate is a run of its own code (attention.function with the executor and the plan the
engine would use) on meta tensors, which allocate nothing, while a dispatch mode counts every storage the
run creates and frees: the peak of live bytes is the estimate, and whatever an executor allocates is
counted as it is allocated, with no model to keep in step with the code. Kernels report the buffers they
allocate internally (cudnn-frontend's float32 dQ accumulator, the flash backward's packed copies) through
attention.target.holding_workspace; code that chooses by device (the SDPA kernel, the fused merge) answers
for the device being estimated. The run and its counter: attention.dry_run; the call described:
attention.memory_config. Ring attention per rank (world_size > 1): distributed.memory.
All figures are bytes *above the inputs* q, k, v (and above the caller's upstream gradient); the inputs
are reported separately as inputs_bytes.
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from hilbert_lab.attention.dry_run import ASSUMED_CAPABILITY, dry_run, dry_run_parts
from hilbert_lab.attention.executors import get_executor
from hilbert_lab.attention.memory_config import DTYPE_BYTES, MAX_INPUT_BYTES, MAX_NUM_HEADS, MemoryConfig
from hilbert_lab.attention.plan import cached_plan

__all__ = ["ASSUMED_CAPABILITY", "DTYPE_BYTES", "MAX_INPUT_BYTES", "MAX_NUM_HEADS", "MemoryConfig", "MemoryEstimate",
           "dry_run", "estimate_memory"]


@dataclass
class MemoryEstimate:
    """Estimated peaks in bytes above the inputs: forward (inference, no grad) and forward+backward.

    inputs_bytes: q, k, v themselves. executor: the executor estimated. breakdown: per pass ("forward",
    "forward_backward"), named parts: on one device the bytes live at the peak by the operator that allocated
    them (WORKSPACE: inside a kernel call), adding up to the peak; per rank of a ring, the peaks of its phases
    and the sizes of its terms (distributed.memory).
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

    config: a MemoryConfig or a dict of its fields (ValueError naming a bad field) of world_size 1 (ring attention
    per rank: distributed.memory.estimate_memory_per_rank).
    """
    config = MemoryConfig.of(config)
    if config.world_size > 1:
        raise ValueError(f"world_size {config.world_size} is ring attention per rank: estimate it with "
                         "hilbert_lab.distributed.memory.estimate_memory_per_rank (estimate_memory takes world_size 1)")
    return _estimate(config)


@functools.lru_cache(maxsize=256)
def _estimate(config: MemoryConfig) -> MemoryEstimate:
    backend = resolve_backend(config)
    element = DTYPE_BYTES[config.dtype]
    executor = get_executor(backend)
    plan = cached_plan(config.pattern, config.seq_len, config.num_heads)
    shape = (config.batch_size, config.seq_len, config.num_heads, config.head_dim)
    forward, forward_backward = dry_run_parts(executor, plan, shape, getattr(torch, config.dtype), config.device,
                                              ordering=config.ordering)
    inputs = 3 * config.batch_size * config.seq_len * config.num_heads * config.head_dim * element
    breakdown = {"forward": forward, "forward_backward": forward_backward}
    return MemoryEstimate(sum(forward.values()), sum(forward_backward.values()), inputs, backend, False, breakdown,
                          executor.name)
