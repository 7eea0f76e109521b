"""Timing statistics: bootstrap medians, ratio intervals, verdicts and their wording (`verdict_sentence`); the
samples come from `bench.timing`.

Every timing comparison the reports print goes through `compare` (or `ratio_ci` + `verdict`): a ratio
is never shown without its 95% interval; an interval that contains 1 reads "no difference", and `settled` says
whether it is narrow enough (within NO_DIFFERENCE_MARGIN of 1) to say so.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
VERDICTS = ("A faster", "B faster", "no difference")
# An interval that contains 1 settles "no difference" only when it also lies within 1 -/+ this margin.
NO_DIFFERENCE_MARGIN = 0.05


def _as_samples(samples: Sequence[float], name: str) -> np.ndarray:
    array = np.asarray(samples, dtype=np.float64).ravel()
    array = array[np.isfinite(array)]
    if array.size == 0:
        raise ValueError(f"{name} must hold at least one finite sample, got {list(samples)!r}")
    return array


def _check_confidence(confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")


def bootstrap_median_ci(samples: Sequence[float], confidence: float = CONFIDENCE,
                        resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> tuple[float, float, float]:
    """(median, low, high): the sample median and its percentile-bootstrap `confidence` interval.

    samples: (n,) finite values (NaN/inf dropped). One sample gives a zero-width interval.
    """
    _check_confidence(confidence)
    values = _as_samples(samples, "samples")
    median = float(np.median(values))
    if values.size == 1:
        return median, median, median
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, values.size, size=(resamples, values.size))
    medians = np.median(values[picks], axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(medians, [alpha, 1.0 - alpha])
    return median, float(min(low, median)), float(max(high, median))


def ratio_ci(a_samples: Sequence[float], b_samples: Sequence[float], confidence: float = CONFIDENCE,
             resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0, paired: bool | None = None
             ) -> tuple[float, float, float]:
    """(ratio, low, high) with ratio = median(a) / median(b) and its bootstrap `confidence` interval.

    a_samples: (n,), b_samples: (m,), e.g. times of A and B. Paired samples (interleaved runs, n == m;
    the default when the lengths match) are resampled by pair, so drift shared by both cancels;
    otherwise each side is resampled on its own.
    """
    _check_confidence(confidence)
    a_all = np.asarray(a_samples, dtype=np.float64).ravel()
    b_all = np.asarray(b_samples, dtype=np.float64).ravel()
    if paired is None:
        paired = a_all.size == b_all.size
    if paired:
        if a_all.size != b_all.size:
            raise ValueError(f"paired samples must have equal lengths, got {a_all.size} and {b_all.size}")
        keep = np.isfinite(a_all) & np.isfinite(b_all)
        a, b = _as_samples(a_all[keep], "a_samples"), _as_samples(b_all[keep], "b_samples")
    else:
        a, b = _as_samples(a_all, "a_samples"), _as_samples(b_all, "b_samples")
    if np.median(b) <= 0 or np.any(b <= 0):
        raise ValueError("b_samples must be positive to form a ratio")
    ratio = float(np.median(a) / np.median(b))
    if a.size == 1 and b.size == 1:
        return ratio, ratio, ratio
    rng = np.random.default_rng(seed)
    picks_a = rng.integers(0, a.size, size=(resamples, a.size))
    picks_b = picks_a if paired else rng.integers(0, b.size, size=(resamples, b.size))
    ratios = np.median(a[picks_a], axis=1) / np.median(b[picks_b], axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(ratios, [alpha, 1.0 - alpha])
    return ratio, float(min(low, ratio)), float(max(high, ratio))


def verdict(ratio: float, low: float, high: float, min_effect: float = 0.0) -> str:
    """"A faster" / "B faster" / "no difference" for a time ratio A/B and its interval [low, high].

    The interval containing 1 (or an effect smaller than `min_effect`, e.g. 0.05 for 5%) is "no difference".
    """
    values = np.asarray([ratio, low, high], dtype=np.float64)
    if not np.all(np.isfinite(values)):
        return "no difference"
    if min_effect < 0:
        raise ValueError(f"min_effect must be >= 0, got {min_effect!r}")
    if abs(ratio - 1.0) < min_effect:
        return "no difference"
    if high < 1.0:
        return "A faster"
    if low > 1.0:
        return "B faster"
    return "no difference"


def verdict_sentence(verdict: str, reference: str) -> str:
    """How side B reads against side A, the reference named `reference`, for a `verdict` (VERDICTS) of the time
    ratio time(A) / time(B): 'faster than <reference>', 'slower than <reference>' or 'no different from
    <reference>'."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, got {verdict!r}")
    if verdict == "no difference":
        return f"no different from {reference}"
    return f"{'slower' if verdict == 'A faster' else 'faster'} than {reference}"


def settled(low: float, high: float, margin: float = NO_DIFFERENCE_MARGIN) -> bool:
    """Whether a ratio's interval [low, high] decides: it excludes 1 (a difference), or it lies within
    [1 / (1 + margin), 1 + margin] (no difference larger than `margin`). A wider interval around 1 is open."""
    if not np.all(np.isfinite([low, high])):
        return False
    return high < 1.0 or low > 1.0 or (low >= 1.0 / (1.0 + margin) and high <= 1.0 + margin)


def format_ratio(ratio: float, low: float, high: float, digits: int = 2) -> str:
    """'1.23x [1.10, 1.41]' (never a ratio without its interval)."""
    if not np.all(np.isfinite([ratio, low, high])):
        return "n/a"
    return f"{ratio:.{digits}f}x [{low:.{digits}f}, {high:.{digits}f}]"


def compare(a_samples: Sequence[float], b_samples: Sequence[float], a_name: str = "A", b_name: str = "B",
            *, confidence: float = CONFIDENCE, min_effect: float = 0.0, seed: int = 0,
            paired: bool | None = None) -> dict[str, Any]:
    """Medians with intervals, speedup of A over B (= time B / time A) with interval, and the verdict.

    paired: as in ratio_ci (default: paired when the sample counts match, as interleaved runs are); pass
    False for samples from separate runs, whose i-th repeats have nothing in common.

    Returns {a_median, a_low, a_high, b_median, ..., speedup, speedup_low, speedup_high, verdict, settled, text},
    verdict naming the faster side ("<a_name> faster", "<b_name> faster") or "no difference"; settled: whether the
    interval decides (`settled`: a "no difference" whose interval is wider than the margin is not settled).
    """
    a_median, a_low, a_high = bootstrap_median_ci(a_samples, confidence, seed=seed)
    b_median, b_low, b_high = bootstrap_median_ci(b_samples, confidence, seed=seed)
    speedup, low, high = ratio_ci(b_samples, a_samples, confidence, seed=seed, paired=paired)
    # speedup = time B / time A: above 1 means A is faster.
    label = verdict(1.0 / speedup, 1.0 / high, 1.0 / low, min_effect)
    named = {"A faster": f"{a_name} faster", "B faster": f"{b_name} faster"}.get(label, label)
    return {"a_median": a_median, "a_low": a_low, "a_high": a_high, "b_median": b_median, "b_low": b_low,
            "b_high": b_high, "speedup": speedup, "speedup_low": low, "speedup_high": high,
            "samples": int(min(np.size(a_samples), np.size(b_samples))), "verdict": named,
            "settled": settled(low, high),
            "text": f"{a_name} vs {b_name}: {format_ratio(speedup, low, high)} ({named})"}
