"""Timing: medians with an interval, on the GPU with CUDA events, on the CPU with perf_counter.

`time_function(fn)` returns a `Timing` (median, 10th/90th percentiles, milliseconds): on CUDA with Triton's do_bench
(back-to-back calls after an L2 flush, CUDA events), else `repeats` calls after a warm-up, each synchronised (CUDA
events) or timed with perf_counter (CPU), with every sample kept. `time_interleaved({name: fn})` times variants
round-robin in one process (A/B comparisons; the samples feed `bench.stats`), one call per sample or, with
`burst_ms`, a burst timed as do_bench times; `time_pair({a: fa, b: fb})` does that for two and gives a / b with its
interval. `graphed(fn, device=...)` replays fn
from a CUDA graph: timing that gives its kernels alone (a floor at the kernel carries no host time). Never time on
zeros and rotate inputs that fit in cache: that is the caller's job.
"""
from __future__ import annotations

import functools
import gc
import itertools
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import torch

from hilbert_lab.attention.executors.kernel import GRAPH_REGIONS
from hilbert_lab.bench.stats import ratio_ci

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


def _synchronize(device: Optional[torch.device | str]) -> None:
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _one_call_ms(fn: Callable[[], object], cuda: bool) -> float:
    """One call of fn in ms: between CUDA events (the device idle before it), or by perf_counter."""
    if cuda:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop)
    begin = time.perf_counter()
    fn()
    return (time.perf_counter() - begin) * 1e3


def time_function(fn: Callable[[], object], *, device: Optional[torch.device | str] = None, warmup: int = 3,
                  repeats: int = 20, max_seconds: float = 10.0) -> Timing:
    """Time fn() (ms per call). CUDA with Triton: do_bench (no samples kept); CUDA without Triton: events
    around each call; CPU (device None or cpu): perf_counter, wall time. Stops early after max_seconds of
    timed calls (at least 3 samples; float("inf"): exactly `repeats`, as callers that must agree on a
    call count, e.g. ranks of a collective, need)."""
    if warmup < 0 or repeats < 1:
        raise ValueError(f"warmup must be >= 0 and repeats >= 1, got {warmup} and {repeats}")
    cuda = device is not None and torch.device(device).type == "cuda"
    if cuda and _do_bench is not None:
        # Triton's do_bench: back-to-back calls, each after an L2 flush, timed by events (GPU time,
        # as in a training loop where the host issues ahead of the device).
        fn()
        rep = int(min(200.0, max_seconds * 1000))
        median, low, high = _do_bench(fn, warmup=25, rep=rep, quantiles=[0.5, 0.1, 0.9])
        return Timing(float(median), float(low), float(high), ())
    for _ in range(warmup):
        fn()
    _synchronize(device)
    samples: list[float] = []
    spent = 0.0
    for _ in range(repeats):
        ms = _one_call_ms(fn, cuda)
        samples.append(ms)
        spent += ms / 1e3
        if spent > max_seconds and len(samples) >= 3:
            break
    return summarize(samples)


def graphed(fn: Callable[[], object], *, device: torch.device | str, warmup: int = 3) -> Callable[[], None]:
    """fn captured once in a CUDA graph (after `warmup` calls on a side stream) -> a function that replays it:
    the kernels of fn with no host time per launch, what a floor at the kernel times. fn must not read device
    values on the host; its tensors are the graph's (replays rewrite them in place)."""
    if torch.device(device).type != "cuda":
        raise ValueError(f"device must be a CUDA device to capture a CUDA graph, got {device}")
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def time_interleaved(fns: dict[str, Callable[[], object]], *, device: Optional[torch.device | str] = None,
                     warmup: int = 2, rounds: int = 10, max_seconds: float = 30.0, threads: Optional[int] = None,
                     progress: bool = False, burst_ms: Optional[float] = None) -> dict[str, Timing]:
    """Time several variants round-robin, one sample each per round, in `round_orders` (every name right after
    every other about equally often), so that drift, cache warmth and what the call just before left behind hit
    all alike. Each sample is one call: between CUDA events after a device sync, or wall time by perf_counter on
    the CPU (never do_bench here).

    burst_ms: each sample is instead a burst of calls issued back to back for about that long (how many, per
    variant, from the fastest of SIZING_CALLS more calls after its warm-up, one of which may still capture a graph;
    at least MIN_BURST_CALLS, so that the median is never the first call, which waits for the host after the sync):
    on CUDA each call between its own events after an L2 flush, the host free to run ahead, as Triton's do_bench
    times (so a round-robin of bursts is do_bench interleaved), on the CPU each by perf_counter; the sample is the
    burst's median per call.

    threads: torch's intra-op threads while timing (restored after; None leaves them). Stops after
    max_seconds once every variant has 3 samples (float("inf"): exactly `rounds`).
    """
    if warmup < 0 or rounds < 1:
        raise ValueError(f"warmup must be >= 0 and rounds >= 1, got {warmup} and {rounds}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1 or None, got {threads}")
    if burst_ms is not None and not burst_ms > 0:
        raise ValueError(f"burst_ms must be None or > 0, got {burst_ms}")
    cuda = device is not None and torch.device(device).type == "cuda"
    names = list(fns)
    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(int(threads))
    samples: dict[str, list[float]] = {name: [] for name in names}
    calls = dict.fromkeys(names, 1)
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device) if cuda and burst_ms else None
    try:
        for name in names:
            for _ in range(warmup):
                fns[name]()
            if burst_ms:  # the fastest of SIZING_CALLS more calls sizes the bursts
                _synchronize(device)
                each_ms = min(_one_call_ms(fns[name], cuda) for _ in range(SIZING_CALLS))
                calls[name] = max(MIN_BURST_CALLS, min(MAX_BURST_CALLS, round(burst_ms / max(each_ms, 1e-6))))
        begin = time.perf_counter()
        orders = round_orders(names, rounds)
        for index in _progress(range(rounds), progress):
            for name in orders[index]:
                _synchronize(device)
                samples[name].append(_burst_ms(fns[name], calls[name], cuda, flush) if burst_ms else
                                     _one_call_ms(fns[name], cuda))
            if time.perf_counter() - begin > max_seconds and index >= 2:
                break
    finally:
        torch.set_num_threads(previous)
    return {name: summarize(values) for name, values in samples.items()}


PAIR_BURST_MS = 25.0  # time_pair's default burst: long enough that host time to issue the calls hides behind them


def time_pair(fns: dict[str, Callable[[], object]], *, device: Optional[torch.device | str] = None, rounds: int = 10,
              warmup: int = 2, burst_ms: float = PAIR_BURST_MS) -> dict:
    """Two variants ({first: fn, second: fn}) timed round by round together (`time_interleaved`, bursts of burst_ms,
    exactly `rounds`): {first: Timing dict, second: Timing dict, "ratio": first / second, "interval": its 95% interval
    over the paired rounds, "of": "first / second", "rounds"}."""
    if len(fns) != 2:
        raise ValueError(f"fns must name two variants, got {list(fns)}")
    (first, _), (second, _) = fns.items()
    timings = time_interleaved(fns, device=device, warmup=warmup, rounds=rounds, max_seconds=float("inf"),
                               burst_ms=burst_ms)
    ratio, low, high = ratio_ci(timings[first].samples, timings[second].samples)
    return {first: timings[first].as_dict(), second: timings[second].as_dict(), "ratio": ratio,
            "interval": [low, high], "of": f"{first} / {second}", "rounds": rounds}


L2_FLUSH_BYTES = 256 << 20  # what a burst's calls each overwrite first (as Triton's do_bench), beyond any L2
MAX_BURST_CALLS = 1000
# the fewest calls in a burst: its first call waits for the host after the sync (for the packed row's fwd+bwd on an
# H100, 8.8 ms where the calls behind it take 8.1), and the median of three or more is never that call
MIN_BURST_CALLS = 3
# calls after the warm-up whose fastest sizes a variant's bursts: a call that still captures a CUDA graph region
# (kernels.graph_regions captures a key's third call) would otherwise size them as the fewest calls, far shorter than
# burst_ms
SIZING_CALLS = 3


def _burst_ms(fn: Callable[[], object], calls: int, cuda: bool, flush: Optional[torch.Tensor]) -> float:
    """The median ms per call of `calls` calls of fn issued back to back: on CUDA each between its own events after
    `flush` is overwritten (the host is not waited for between calls), on the CPU each by perf_counter."""
    if not cuda:
        return statistics.median(_one_call_ms(fn, False) for _ in range(calls))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    stops = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    for start, stop in zip(starts, stops):
        flush.zero_()
        start.record()
        fn()
        stop.record()
    stops[-1].synchronize()
    return statistics.median(start.elapsed_time(stop) for start, stop in zip(starts, stops))


def round_orders(names: Sequence[str], rounds: int) -> list[list[str]]:
    """The order of each round of time_interleaved: round by round, the order after which every name has run
    right after every other name most evenly over the whole sequence of calls (a round's first call follows the
    round before's last): first the fewest between the most and the least frequent ordered pair, then x right
    after y as often as y right after x, then the most even counts, then the first name that has led fewest rounds.
    A call can run slower right after another (on an H200 the second of two back-to-back fwd+bwd calls of one
    executor at 512K tokens ran about 5% slower), and a plain rotation keeps each name right after the same one.
    Up to 6 names every order is a candidate (from 4 names on, a rotation and its reversal leave some ordered
    pairs out entirely): after any number of rounds up to 40 the ordered pairs' counts differ by at most 1 (6 names:
    by 2 after 5, 15, 25 or 35 rounds) and, over an even number, x follows y as often as y follows x. From 7 names
    the candidates are the rows of a Williams design and the rotations of `names` with their reversals."""
    names = list(names)
    return [[names[i] for i in order] for order in _round_orders(len(names), rounds)]


@functools.lru_cache(maxsize=64)
def _round_orders(count: int, rounds: int) -> tuple[tuple[int, ...], ...]:
    """round_orders on the indices 0 .. count - 1."""
    if count == 0:
        return tuple(() for _ in range(rounds))
    indices = list(range(count))
    if count <= 6:
        candidates = list(itertools.permutations(indices))
    else:
        first, low, high = [0], 1, count - 1  # a Williams design's first row: 0, 1, n - 1, 2, n - 2, ...
        while len(first) < count:
            first.append(low)
            low += 1
            if len(first) < count:
                first.append(high)
                high -= 1
        rows = [tuple((x + shift) % count for x in first) for shift in range(count)]
        rotations = [tuple(indices[shift:] + indices[:shift]) for shift in range(count)]
        candidates = list(dict.fromkeys(rows + [r[::-1] for r in rows] + rotations + [r[::-1] for r in rotations]))
    pairs = [(x, y) for x in indices for y in indices if x != y]
    follows = dict.fromkeys(pairs, 0)
    leads = [0] * count
    orders: list[tuple[int, ...]] = []

    def pairs_of(order: tuple[int, ...]) -> list[tuple[int, int]]:
        calls = ((orders[-1][-1],) if orders else ()) + order
        return [(x, y) for x, y in zip(calls, calls[1:]) if x != y]

    def cost(order: tuple[int, ...]) -> tuple[int, int, int, int]:
        counts = dict(follows)
        for pair in pairs_of(order):
            counts[pair] += 1
        values = counts.values()
        uneven = sum(abs(counts[x, y] - counts[y, x]) for x, y in pairs if x < y)
        return max(values) - min(values) if values else 0, uneven, sum(v * v for v in values), leads[order[0]]

    for _ in range(rounds):
        order = min(candidates, key=cost)
        for pair in pairs_of(order):
            follows[pair] += 1
        leads[order[0]] += 1
        orders.append(order)
    return tuple(orders)


def _progress(rounds: range, show: bool):
    if not show:
        return rounds
    from tqdm.auto import tqdm

    return tqdm(rounds, desc="rounds")


def free_cell_memory(device: torch.device | str) -> None:
    """Free what a finished benchmark cell held on `device`: its plans' captured regions (keyed by its tensors'
    addresses, which no later cell meets again, their graph pools holding the cell's temporaries) and the
    allocator's cached blocks, so that a sweep's last cells have the memory its first ones had."""
    GRAPH_REGIONS.clear()
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
