"""SafetyConfig: the limits every safety check and safe run obeys."""
from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True)
class SafetyConfig:
    """Limits for memory checks, probing and isolated benchmark cases.

    max_memory_fraction: a case may plan to use at most this share of the device's total memory.
    min_free_bytes: memory that must stay free after the case's estimated peak.
    estimate_margin: the estimate is multiplied by this before it is compared (>= 1).
    max_seq_len: no probe or benchmark case goes beyond this sequence length.
    case_timeout_s: wall-clock limit of one isolated case (subprocess), seconds.
    max_case_seconds: the progressive tester stops growing once one run's measured time exceeds this.
    """

    max_memory_fraction: float = 0.85
    min_free_bytes: int = GIB // 2
    estimate_margin: float = 1.2
    max_seq_len: int = 1 << 22
    case_timeout_s: float = 600.0
    max_case_seconds: float = 60.0

    def __post_init__(self) -> None:
        if not (isinstance(self.max_memory_fraction, (int, float)) and 0.0 < self.max_memory_fraction <= 1.0):
            raise ValueError(f"max_memory_fraction must be in (0, 1], got {self.max_memory_fraction!r}")
        if not (isinstance(self.min_free_bytes, int) and self.min_free_bytes >= 0):
            raise ValueError(f"min_free_bytes must be an int >= 0, got {self.min_free_bytes!r}")
        if not (isinstance(self.estimate_margin, (int, float)) and math.isfinite(self.estimate_margin)
                and self.estimate_margin >= 1.0):
            raise ValueError(f"estimate_margin must be a finite number >= 1, got {self.estimate_margin!r}")
        if not (isinstance(self.max_seq_len, int) and self.max_seq_len >= 1):
            raise ValueError(f"max_seq_len must be an int >= 1, got {self.max_seq_len!r}")
        for name in ("case_timeout_s", "max_case_seconds"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0 seconds, got {value!r}")


def format_bytes(num_bytes: float) -> str:
    """Human-readable bytes: 1536 -> '1.50 KiB'."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024.0 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024.0
    return f"{value:.2f} TiB"  # pragma: no cover
