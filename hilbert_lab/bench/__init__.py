"""Safe benchmarking: limits (SafetyConfig), free-memory checks, peak-memory measurement, isolated runs,
case kinds, matrices, the append-only runner and the progressive length probe."""
from __future__ import annotations

from hilbert_lab.bench.cases import case_id, normalize_case, run_case
from hilbert_lab.bench.checker import MemoryInfo, MemorySafetyChecker, query_memory
from hilbert_lab.bench.config import SafetyConfig, format_bytes
from hilbert_lab.bench.env import collect_environment
from hilbert_lab.bench.isolate import IsolatedOutcome, run_isolated
from hilbert_lab.bench.matrix import expand_matrix, load_matrix_file
from hilbert_lab.bench.measure import PeakMeter
from hilbert_lab.bench.progressive import ProbeReport, ProbeStep, ProgressiveTester
from hilbert_lab.bench.runner import RunSummary, SafeBenchmarkRunner, read_results

__all__ = [
    "IsolatedOutcome", "MemoryInfo", "MemorySafetyChecker", "PeakMeter", "ProbeReport", "ProbeStep",
    "ProgressiveTester", "RunSummary", "SafeBenchmarkRunner", "SafetyConfig", "case_id", "collect_environment",
    "expand_matrix", "format_bytes", "load_matrix_file", "normalize_case", "query_memory", "read_results",
    "run_case", "run_isolated",
]
