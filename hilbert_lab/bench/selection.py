"""Timed backend selection: time the candidate backends on one input and store the fastest.

`time_candidates` runs every candidate that can run here (`attention.selection.candidate_backends`) on
one random (B, N, H, D) input, forward only, round-robin with the kit's `time_interleaved` (drift hits all
alike); a candidate that raises on this input is left out. `candidate_calls` makes those calls (also for
the backend dashboard, viz.backends). `measure_selection` stores the
fastest under `attention.selection.selection_key` in `attention.selection.cache_path()` (written
atomically, other keys kept), where `select_backend(..., timed=True)` reads it. The CLI command
`hilbert-lab select` calls it.
"""
from __future__ import annotations

import json
from typing import Callable, Optional, Sequence

import torch

from hilbert_lab.attention.engine import dilated_attention
from hilbert_lab.attention.selection import (
    cache_path, candidate_backends, read_selection_cache, rule_backend, selection_key,
)
from hilbert_lab.bench.timing import Timing, time_interleaved
from hilbert_lab.io import atomic_write


def candidate_calls(device: torch.device | str, dtype: torch.dtype, shape: Sequence[int],
                    segment_lengths: Sequence[int], dilation_rates: Optional[Sequence[int]] = None, *,
                    mode: str = "longnet", causal: bool = False, backends: Optional[Sequence[str]] = None,
                    seed: int = 0, keep_outputs: bool = False,
                    ) -> tuple[dict[str, Callable[[], torch.Tensor]], dict[str, torch.Tensor], dict[str, str]]:
    """(calls, outputs, errors): a no-grad forward call per backend on q, k, v of `shape` (B, N, H, D) from a
    seeded generator, each run once here. A backend that raises is left out of calls and gets its error line
    in errors; outputs (keep_outputs=True) holds each output of the others as float64. backends: the names
    (default: `candidate_backends`)."""
    device = torch.device(device)
    if len(shape) != 4 or any(int(extent) < 1 for extent in shape):
        raise ValueError(f"shape must be (B, N, H, D) with positive sizes, got {tuple(shape)!r}")
    rates = list(dilation_rates) if dilation_rates is not None else [1] * len(segment_lengths)
    _check_fits(device, dtype, shape, segment_lengths, rates, mode=mode, causal=causal)
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(tuple(int(x) for x in shape), generator=generator).to(device=device, dtype=dtype)
               for _ in range(3))

    def call(name: str) -> torch.Tensor:
        with torch.no_grad():
            return dilated_attention(q, k, v, segment_lengths=list(segment_lengths), dilation_rates=rates, mode=mode,
                                     causal=causal, backend=name)

    names = list(backends) if backends is not None else candidate_backends(device, dtype)
    calls, outputs, errors = {}, {}, {}
    for name in names:
        try:
            out = call(name)  # a candidate that fails on this input is simply not chosen
        except Exception as error:
            errors[name] = f"{type(error).__name__}: {error}"[:200]
            continue
        if keep_outputs:
            outputs[name] = out.to(torch.float64)
        calls[name] = lambda name=name: call(name)
    return calls, outputs, errors


def _check_fits(device: torch.device, dtype: torch.dtype, shape: Sequence[int], segment_lengths: Sequence[int],
                dilation_rates: Sequence[int], *, mode: str, causal: bool) -> None:
    """ValueError naming the shape, before anything is allocated, when the inputs and one forward of the
    engine (attention.memory's estimate) do not fit in the device's free memory (bench.checker)."""
    from hilbert_lab.attention.memory import MemoryConfig, estimate_memory
    from hilbert_lab.bench.checker import MemorySafetyChecker

    batch, seq_len, heads, head_dim = (int(extent) for extent in shape)
    config = MemoryConfig(seq_len=seq_len, batch_size=batch, num_heads=heads, head_dim=head_dim,
                          segment_lengths=tuple(segment_lengths), dilation_rates=tuple(dilation_rates), mode=mode,
                          causal=causal, dtype=str(dtype).removeprefix("torch."), device=str(device))
    estimate = estimate_memory(config)
    fits, reason = MemorySafetyChecker(device=str(device)).check_memory_available(
        estimate.inputs_bytes + estimate.forward_bytes)
    if not fits:
        raise ValueError(f"shape (B, N, H, D) = {tuple(shape)} does not fit: {reason}; choose a smaller seq_len "
                         "or batch_size")


def time_candidates(device: torch.device | str, dtype: torch.dtype, shape: Sequence[int],
                    segment_lengths: Sequence[int], dilation_rates: Optional[Sequence[int]] = None, *,
                    mode: str = "longnet", causal: bool = False, repeats: int = 3, warmup: int = 1,
                    backends: Optional[Sequence[str]] = None, seed: int = 0) -> dict[str, Timing]:
    """Forward Timing (ms) per candidate backend on q, k, v of `shape` (B, N, H, D) (`candidate_calls`),
    round-robin; candidates that raise on this input are left out. backends: the names to time (default:
    `candidate_backends`)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    running, _, _ = candidate_calls(device, dtype, shape, segment_lengths, dilation_rates, mode=mode, causal=causal,
                                    backends=backends, seed=seed)
    if not running:
        return {}
    return time_interleaved(running, device=device, warmup=warmup, rounds=repeats, max_seconds=float("inf"))


def measure_selection(device: torch.device | str, dtype: torch.dtype, shape: Sequence[int],
                      segment_lengths: Sequence[int], dilation_rates: Optional[Sequence[int]] = None, *,
                      mode: str = "longnet", causal: bool = False, repeats: int = 3, refresh: bool = False) -> dict:
    """Time the candidates for one key and store the fastest in `cache_path()`.

    A key already stored is returned without timing unless refresh=True. Returns {"key", "backend",
    "source" ("timed", "stored before", or "rule" when no candidate ran: nothing is stored then),
    "timings_ms" (median per timed candidate), "path"}.
    """
    key = selection_key(device, dtype, shape, segment_lengths, dilation_rates, mode=mode, causal=causal)
    path = cache_path()
    stored = read_selection_cache()
    if key in stored and not refresh:
        return {"key": key, "backend": stored[key], "source": "stored before", "timings_ms": {}, "path": str(path)}
    timings = time_candidates(device, dtype, shape, segment_lengths, dilation_rates, mode=mode, causal=causal,
                              repeats=repeats)
    medians = {name: timing.median for name, timing in timings.items()}
    if not medians:
        return {"key": key, "backend": rule_backend(device, dtype, shape=shape), "source": "rule", "timings_ms": {},
                "path": str(path)}
    best = min(medians, key=medians.get)
    stored = read_selection_cache()  # re-read: keep keys another process stored while this one timed
    stored[key] = best
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(stored, indent=1, sort_keys=True))
    return {"key": key, "backend": best, "source": "timed", "timings_ms": medians, "path": str(path)}
