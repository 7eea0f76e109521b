"""Timing: medians with an interval, on the GPU with CUDA events, on the CPU with perf_counter.

`time_function(fn)` returns a `Timing` (median, 10th/90th percentiles, milliseconds): on CUDA with
Triton's do_bench (back-to-back calls after an L2 flush, CUDA events), else `repeats` calls after a
warm-up, each synchronised (CUDA events) or timed with perf_counter (CPU), with every sample kept. Never time on zeros and
rotate inputs that fit in cache: that is the caller's job (see `bench.inputs`).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch

try:
    from triton.testing import do_bench as _do_bench
except ImportError:  # pragma: no cover - CPU-only installs time with perf_counter / events
    _do_bench = None


@dataclass(frozen=True)
class Timing:
    """Milliseconds per call: median, 10th and 90th percentile, and the samples."""

    median: float
    low: float
    high: float
    samples: tuple[float, ...] = field(repr=False)

    def as_dict(self) -> dict:
        out = asdict(self)
        out["samples"] = [round(s, 5) for s in self.samples]
        return out


def summarize(samples_ms: list[float]) -> Timing:
    """Timing of a list of milliseconds (median and the 10th / 90th percentiles)."""
    if not samples_ms:
        raise ValueError("samples_ms must be non-empty")
    ordered = sorted(samples_ms)
    pick = lambda q: ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]  # noqa: E731
    return Timing(statistics.median(ordered), pick(0.1), pick(0.9), tuple(samples_ms))


def time_function(fn: Callable[[], object], *, device: Optional[torch.device | str] = None, warmup: int = 3,
                  repeats: int = 20, max_seconds: float = 10.0) -> Timing:
    """Time fn() (ms per call). CUDA: events around each call; CPU: perf_counter. Stops early after
    max_seconds of timed calls (at least 3 samples)."""
    if warmup < 0 or repeats < 1:
        raise ValueError(f"warmup must be >= 0 and repeats >= 1, got {warmup} and {repeats}")
    cuda = device is not None and torch.device(device).type == "cuda"
    if cuda and _do_bench is not None:
        # Triton's do_bench: back-to-back calls, each after an L2 flush, timed by events (GPU time,
        # as in a training loop where the host issues ahead of the device).
        fn()
        median, low, high = _do_bench(fn, warmup=25, rep=min(200, int(max_seconds * 1000)), quantiles=[0.5, 0.1, 0.9])
        return Timing(float(median), float(low), float(high), ())
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize(device)
    samples: list[float] = []
    spent = 0.0
    for _ in range(repeats):
        if cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            ms = start.elapsed_time(stop)
        else:
            begin = time.perf_counter()
            fn()
            ms = (time.perf_counter() - begin) * 1e3
        samples.append(ms)
        spent += ms / 1e3
        if spent > max_seconds and len(samples) >= 3:
            break
    return summarize(samples)


def time_interleaved(fns: dict[str, Callable[[], object]], *, device: Optional[torch.device | str] = None,
                     warmup: int = 2, rounds: int = 10, max_seconds: float = 30.0) -> dict[str, Timing]:
    """Time several variants A, B, ... interleaved (A B C A B C ...), so that drift hits all alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    begin = time.perf_counter()
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(time_function(fn, device=device, warmup=0, repeats=1).median)
        if time.perf_counter() - begin > max_seconds and len(samples[next(iter(fns))]) >= 3:
            break
    return {name: summarize(values) for name, values in samples.items()}
