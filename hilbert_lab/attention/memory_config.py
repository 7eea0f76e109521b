"""MemoryConfig: one attention call to estimate (shapes, pattern, backend, dtype, device, ring size), validated,
with the sizes no device or host holds refused at once. The estimate itself: attention.memory.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from hilbert_lab.attention.executors import BACKENDS, EXECUTORS
from hilbert_lab.attention.pattern import MODES, DilatedPattern
from hilbert_lab.dtypes import DTYPES

__all__ = ["DTYPE_BYTES", "MAX_INPUT_BYTES", "MAX_NUM_HEADS", "MemoryConfig"]

DTYPE_BYTES = dict(zip(DTYPES, (4, 8, 2, 2)))
# Sizes no device or host holds are refused at once.
MAX_INPUT_BYTES = 1 << 50  # q, k, v together: 1 PiB
MAX_NUM_HEADS = 1 << 16


@dataclass(frozen=True)
class MemoryConfig:
    """One attention call to estimate: shapes (B, N, H, D), pattern, backend, dtype and device.

    world_size > 1: ring attention per rank (N is the global length), estimated by
    distributed.memory.estimate_memory_per_rank. ordering: the layout the
    engine reads q, k, v through (its copies count; hilbert_lab.attention.layout.read_through_layout).
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
        kind = self.device.split(":")[0]
        runs_here = ("auto",) + tuple(name for name in BACKENDS if kind in EXECUTORS[name].capabilities.devices)
        if self.backend not in runs_here:  # an estimate of a call that cannot run there answers nothing
            where = " or ".join(EXECUTORS[self.backend].capabilities.devices)
            raise ValueError(f"backend must be one that runs on {kind}: {', '.join(runs_here)}; got {self.backend!r} "
                             f"(it runs on {where} only)")
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
    def of(cls, config: "MemoryConfig | dict[str, Any]") -> "MemoryConfig":
        """config itself, or the config of a dict of its fields (lists taken as tuples; a bad field: ValueError
        naming it)."""
        if isinstance(config, dict):
            return cls(**{key: (tuple(value) if isinstance(value, list) else value) for key, value in config.items()})
        return config

    @classmethod
    def from_case(cls, case: dict[str, Any]) -> "MemoryConfig":
        """From a benchmark case dict (hilbert_lab.bench.cases); unknown keys are ignored."""
        names = set(cls.__dataclass_fields__)
        return cls(**{key: (tuple(value) if isinstance(value, list) else value)
                      for key, value in case.items() if key in names})

    @property
    def pattern(self) -> DilatedPattern:
        return DilatedPattern.create(self.segment_lengths, self.dilation_rates, mode=self.mode, causal=self.causal)
