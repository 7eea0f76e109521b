"""Safe benchmarking: case kinds, matrices, the isolated append-only runner and the progressive length probe."""
from __future__ import annotations

from hilbert_lab.bench.cases import case_id, normalize_case, run_case
from hilbert_lab.bench.env import collect_environment
from hilbert_lab.bench.matrix import expand_matrix, load_matrix_file
from hilbert_lab.bench.progressive import ProbeReport, ProbeStep, ProgressiveTester
from hilbert_lab.bench.runner import RunSummary, SafeBenchmarkRunner, read_results

__all__ = [
    "ProbeReport", "ProbeStep", "ProgressiveTester", "RunSummary", "SafeBenchmarkRunner", "case_id",
    "collect_environment", "expand_matrix", "load_matrix_file", "normalize_case", "read_results", "run_case",
]
