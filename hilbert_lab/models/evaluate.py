"""Evaluation statistics of the retrieval task: the Wilson interval of an accuracy and accuracy per
bucket of needle-to-query distance (powers of two). Pure functions of counts; `loop.evaluate` counts."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

Z_95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(successes: float, total: float, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval (low, high) of a binomial proportion successes / total (95% by default).

    (0.0, 1.0) when total is 0. Unlike the normal approximation it stays inside [0, 1] and is not
    degenerate at 0 or total successes.
    """
    if not (total >= 0 and 0 <= successes <= total):
        raise ValueError(f"successes and total must satisfy 0 <= successes <= total, got {successes}, {total}")
    if not z > 0:
        raise ValueError(f"z must be > 0, got {z}")
    if total == 0:
        return 0.0, 1.0
    p = successes / total
    z2 = z * z
    centre = (p + z2 / (2 * total)) / (1 + z2 / total)
    half = z / (1 + z2 / total) * math.sqrt(p * (1 - p) / total + z2 / (4 * total * total))
    return max(0.0, centre - half), min(1.0, centre + half)


def num_distance_buckets(seq_len: int) -> int:
    """Buckets [2^k, 2^(k+1)) for k = 0 .. floor(log2(seq_len - 1)): every distance in [1, seq_len)."""
    return max(1, (int(seq_len) - 1).bit_length())


def distance_bucket(distance: torch.Tensor) -> torch.Tensor:
    """int64 bucket k = floor(log2(d)) of distances d >= 1 (any shape)."""
    distance = torch.as_tensor(distance, dtype=torch.int64)
    if distance.numel() and int(distance.min()) < 1:
        raise ValueError(f"distance must be >= 1, got minimum {int(distance.min())}")
    return (torch.frexp(distance.double())[1] - 1).to(torch.int64)  # exact for d < 2**53


def bucket_rows(hits: Sequence[float], counts: Sequence[float]) -> list[dict[str, Any]]:
    """Per non-empty bucket k: distance_low 2^k, distance_high 2^(k+1) (exclusive), count, correct,
    accuracy and its Wilson 95% interval (accuracy_low, accuracy_high)."""
    if len(hits) != len(counts):
        raise ValueError(f"hits and counts must have the same length, got {len(hits)} and {len(counts)}")
    rows = []
    for k, (correct, count) in enumerate(zip(hits, counts)):
        if count <= 0:
            continue
        low, high = wilson_interval(correct, count)
        rows.append({"distance_low": 1 << k, "distance_high": 1 << (k + 1), "count": int(count),
                     "correct": int(correct), "accuracy": correct / count, "accuracy_low": low, "accuracy_high": high})
    return rows


def pooled_accuracy(evals: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Pooled over runs (e.g. seeds) from each eval's ``correct`` and ``count``: correct, count,
    accuracy, accuracy_low, accuracy_high (Wilson 95%), and the per-run accuracies."""
    correct = sum(float(e["correct"]) for e in evals)
    count = sum(float(e["count"]) for e in evals)
    low, high = wilson_interval(correct, count)
    return {"correct": int(correct), "count": int(count), "accuracy": correct / count if count else None,
            "accuracy_low": low, "accuracy_high": high, "runs": len(evals),
            "run_accuracies": [float(e["accuracy"]) for e in evals]}
