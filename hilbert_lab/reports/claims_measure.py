"""Measurement kit of the claims report (reports.claims): rows, seeded inputs, interleaved timing of a
pair, ratios with 95% bootstrap intervals and their verdicts.

An ordering only permutes tokens in memory (per segment, after dilation), so the attention output is the
same and any speed or memory difference comes from layout alone. Timing claims tied to a GPU the machine at
hand does not have are measured on what is here and reported as "not reproducible here".
"""
from __future__ import annotations

import statistics
from typing import Any, Callable, Sequence

import torch

from hilbert_lab.reports.claims_verdict import ROW_VERDICTS as VERDICTS

CLAIM_ROW_COLUMNS = ("claim", "aspect", "configuration", "claimed", "measured", "verdict", "why")


def _row(claim: str, aspect: str, configuration: str, claimed: Any, measured: Any, verdict: str, why: str) -> dict:
    assert verdict in VERDICTS, verdict
    return {"claim": claim, "aspect": aspect, "configuration": configuration, "claimed": str(claimed),
            "measured": str(measured), "verdict": verdict, "why": why}



def make_inputs(seq_len: int, *, batch_size: int = 1, num_heads: int = 8, head_dim: int = 64,
                dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0):
    """q, k, v (B, N, H, D) from a seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch_size, seq_len, num_heads, head_dim, generator=generator).to(device=device, dtype=dtype)
                 for _ in range(3))


def ratio_with_bounds(baseline_ms: Sequence[float], candidate_ms: Sequence[float]) -> tuple[float, float, float]:
    """(speedup, low, high) of candidate over baseline: median(baseline) / median(candidate) with its 95%
    bootstrap interval (samples paired by index when both have the same length, as interleaved runs do)."""
    from hilbert_lab.bench.stats import ratio_ci

    return ratio_ci(baseline_ms, candidate_ms)


def time_pair(baseline: Callable[[], Any], candidate: Callable[[], Any], *, repeats: int,
              device: str = "cpu") -> tuple[list[float], list[float]]:
    """Times in ms of baseline and candidate run alternately (bench.timing.time_interleaved: wall time on
    the CPU, with one thread pinned so the two do not compete with other work differently; CUDA events
    after a device sync on the GPU)."""
    from hilbert_lab.bench.timing import time_interleaved

    cuda = device.startswith("cuda")
    with torch.no_grad():
        timings = time_interleaved({"baseline": baseline, "candidate": candidate}, device=device, warmup=1,
                                   rounds=repeats, max_seconds=float("inf"), threads=None if cuda else 1)
    return list(timings["baseline"].samples), list(timings["candidate"].samples)


def timing_verdict(claimed: float, low: float, high: float, *, claimed_on_gpu: bool, device: str) -> str:
    """Confirmed when the claimed ratio lies inside the measured [low, high]; a GPU claim on a CPU is
    not reproducible here (the measured CPU ratio is still reported)."""
    if claimed_on_gpu and not device.startswith("cuda"):
        return "not reproducible here"
    return "confirmed" if low <= claimed <= high else "refuted"


def _engine(q, k, v, segment_lengths, dilation_rates, *, ordering=None, backend="auto"):
    from hilbert_lab.attention.engine import dilated_attention

    return dilated_attention(q, k, v, segment_lengths=list(segment_lengths), dilation_rates=list(dilation_rates),
                             ordering=ordering, backend=backend)


def _clip_pattern(seq_len: int, segment_lengths: Sequence[int], dilation_rates: Sequence[int]):
    """Keep branches whose segment fits the sequence (at least one)."""
    kept = [(w, r) for w, r in zip(segment_lengths, dilation_rates) if w <= seq_len] or [(seq_len, 1)]
    return [w for w, _ in kept], [r for _, r in kept]


def ordering_speedup(seq_len: int, segment_lengths: Sequence[int], dilation_rates: Sequence[int], *,
                     ordering: str = "hilbert", repeats: int = 3, device: str = "cpu", num_heads: int = 8,
                     head_dim: int = 64, batch_size: int = 1, backend: str = "auto") -> dict[str, float]:
    """Identity vs `ordering` layout on the same inputs: speedup (median, bounds), ms, tokens/s, max |diff|."""
    q, k, v = make_inputs(seq_len, batch_size=batch_size, num_heads=num_heads, head_dim=head_dim, device=device)
    with torch.no_grad():
        difference = float((_engine(q, k, v, segment_lengths, dilation_rates, backend=backend)
                            - _engine(q, k, v, segment_lengths, dilation_rates, ordering=ordering, backend=backend))
                           .abs().max())
    identity, ordered = time_pair(lambda: _engine(q, k, v, segment_lengths, dilation_rates, backend=backend),
                                  lambda: _engine(q, k, v, segment_lengths, dilation_rates, ordering=ordering,
                                                  backend=backend), repeats=repeats, device=device)
    speedup, low, high = ratio_with_bounds(identity, ordered)
    return {"identity_ms": statistics.median(identity), "ordered_ms": statistics.median(ordered),
            "speedup": speedup, "speedup_low": low, "speedup_high": high,
            "identity_tokens_per_s": batch_size * seq_len / (statistics.median(identity) / 1e3),
            "ordered_tokens_per_s": batch_size * seq_len / (statistics.median(ordered) / 1e3),
            "max_abs_output_difference": difference}


# ---------------------------------------------------------------------------------------------------


def dilation_mask_sparsity(seq_len: int, segment_length: int, dilation_rate: int, num_heads: int) -> float:
    """Share of the dense (H, N, N) score matrix the dilated mask removes."""
    from hilbert_lab.attention.pattern import DilatedPattern

    mask = DilatedPattern.create([segment_length], [dilation_rate]).dense_mask(seq_len, num_heads)
    return 1.0 - float(mask.double().mean())
