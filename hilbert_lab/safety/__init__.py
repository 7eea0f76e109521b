"""Memory safety: limits (SafetyConfig), free-memory checks, peak-memory estimates and measurement, isolated runs."""
from __future__ import annotations

from hilbert_lab.safety.checker import MemoryInfo, MemorySafetyChecker, query_memory
from hilbert_lab.safety.config import SafetyConfig, format_bytes
from hilbert_lab.safety.estimate import MemoryConfig, MemoryEstimate, estimate_memory
from hilbert_lab.safety.isolate import IsolatedOutcome, run_isolated

_BENCH_NAMES = ("ProgressiveTester", "SafeBenchmarkRunner")


def __getattr__(name: str):
    """ProgressiveTester and SafeBenchmarkRunner live in hilbert_lab.bench (they run cases); found here too."""
    if name in _BENCH_NAMES:
        import hilbert_lab.bench as bench

        return getattr(bench, name)
    raise AttributeError(f"module 'hilbert_lab.safety' has no attribute {name!r}")


__all__ = [
    "IsolatedOutcome", "MemoryConfig", "MemoryEstimate", "MemoryInfo", "MemorySafetyChecker", "SafetyConfig",
    "estimate_memory", "format_bytes", "query_memory", "run_isolated",
]
