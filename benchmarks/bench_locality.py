"""Benchmark the locality simulators on one CPU core; writes reports/results/locality_cpu.json.

Usage: .venv/bin/python benchmarks/bench_locality.py [--repeats 3] [--output PATH]
Targets: fully associative LRU, 4096 lines, 5M accesses >= 50M accesses/s on one core;
miss_curve over 10M accesses in seconds. Every case is warmed up (Numba compile) and timed
`repeats` times (hilbert_lab.bench.timing.time_function, wall time; the CPU seconds of this process
are read around each call too); the best and all timings are stored. Traces are fixed-seed. The JSON
carries the environment block of hilbert_lab.bench.env.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hilbert_lab.bench.env import collect_environment  # noqa: E402
from hilbert_lab.bench.timing import time_function  # noqa: E402
from hilbert_lab.locality import (  # noqa: E402
    compare_orderings,
    evaluate_claims,
    lru_misses,
    miss_curve,
    window_attention_trace,
)

CAPACITY = 4096
LRU_ACCESSES = 5_000_000
CURVE_ACCESSES = 10_000_000


def _load_average() -> list[float] | None:
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def _pin_to_one_core() -> int | None:
    """Restrict this process to one CPU (the first it may use); returns it, or None where unsupported."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def _time(function, repeats: int) -> tuple[list[float], list[float], object]:
    """(wall seconds, CPU seconds of this process, result) per repeat, after one warm-up call.

    CPU seconds count only the time this process ran: on a shared machine they are the per-core
    throughput, while wall seconds also include time spent waiting for the core.
    """
    cpu: list[float] = []
    result: list[object] = [None]

    def call() -> None:
        start_cpu = time.process_time()
        result[0] = function()
        cpu.append(time.process_time() - start_cpu)

    timing = time_function(call, warmup=1, repeats=repeats, max_seconds=float("inf"))  # warm-up: Numba compilation
    return [ms / 1e3 for ms in timing.samples], cpu[1:], result[0]


def _traces(rng: np.random.Generator) -> dict[str, np.ndarray]:
    attention = window_attention_trace((128, 128), 8, "hilbert", tile_size=64, head_dim=64, element_bytes=2).lines
    return {
        "uniform over 2x capacity": rng.integers(0, 2 * CAPACITY, LRU_ACCESSES),
        "cyclic scan of capacity+1 lines": np.resize(np.arange(CAPACITY + 1), LRU_ACCESSES),
        "2D window attention K/V trace (128x128, window 8, hilbert), repeated": np.resize(attention, LRU_ACCESSES),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", type=Path, default=ROOT / "reports" / "results" / "locality_cpu.json")
    args = parser.parse_args()
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    pinned_cpu = _pin_to_one_core()
    rng = np.random.default_rng(0)
    traces = _traces(rng)
    curve_trace = rng.integers(0, 1 << 20, CURVE_ACCESSES)
    curve_capacities = np.unique(np.logspace(0, 20, 41, base=2).astype(np.int64))

    cases = []
    for name, trace in traces.items():
        cases.append((f"lru_misses fully associative, capacity {CAPACITY}, {name}", trace.size,
                      lambda trace=trace: lru_misses(trace, CAPACITY)))
    cases.append((f"lru_misses 16-way set associative, capacity {CAPACITY}, uniform over 2x capacity",
                  LRU_ACCESSES, lambda: lru_misses(traces["uniform over 2x capacity"], CAPACITY, ways=16)))
    cases.append((f"miss_curve, {curve_capacities.size} capacities 1..2^20, uniform over 2^20 lines",
                  CURVE_ACCESSES, lambda: miss_curve(curve_trace, curve_capacities)))
    cases.append(("compare_orderings() defaults", None, lambda: len(compare_orderings(progress=False))))
    cases.append(("evaluate_claims()", None, lambda: len(evaluate_claims())))

    results = []
    for name, accesses, function in tqdm(cases, desc="bench_locality"):
        wall, cpu, result = _time(function, args.repeats)
        best = min(wall)
        entry = {"case": name, "seconds_best": best, "seconds_all": wall, "cpu_seconds_all": cpu}
        if accesses is not None:
            entry["accesses"] = int(accesses)
            entry["accesses_per_second"] = accesses / best
            entry["accesses_per_cpu_second"] = accesses / min(cpu)
        if isinstance(result, np.ndarray):
            entry["result"] = {"capacities": curve_capacities.tolist()[:5] + ["..."], "misses_first": result[:5].tolist()}
        else:
            entry["result"] = int(result)
        results.append(entry)
        rate = (f", {entry['accesses_per_second'] / 1e6:.1f} M accesses/s wall, "
                f"{entry['accesses_per_cpu_second'] / 1e6:.1f} M/s CPU") if accesses else ""
        tqdm.write(f"{name}: best {best:.3f} s{rate}")

    document = {"benchmark": "bench_locality", "pinned_cpu": pinned_cpu, "repeats": args.repeats,
                "load_average_1_5_15_min": _load_average(), "env": collect_environment("cpu"), "results": results}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(document, indent=2, default=str))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
