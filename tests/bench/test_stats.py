"""Bootstrap intervals, ratio intervals, verdicts and the interleaved timer."""
from __future__ import annotations

import numpy as np
import pytest

from hilbert_lab.bench.stats import (bootstrap_median_ci, compare, format_ratio, ratio_ci, settled,
                                     verdict, verdict_sentence)


def _loop_bootstrap(values, resamples, seed, confidence=0.95):
    """Float64 reference: the same resampling written as a plain loop."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(values), size=(resamples, len(values)))
    medians = [float(np.median([values[i] for i in row])) for row in picks]
    alpha = (1 - confidence) / 2
    return np.quantile(medians, [alpha, 1 - alpha])


def test_bootstrap_matches_loop_reference_and_contains_median():
    values = np.random.default_rng(1).lognormal(size=17)
    median, low, high = bootstrap_median_ci(values, resamples=500, seed=3)
    assert median == pytest.approx(np.median(values))
    ref_low, ref_high = _loop_bootstrap(list(values), 500, 3)
    assert low == pytest.approx(min(ref_low, median)) and high == pytest.approx(max(ref_high, median))
    assert low <= median <= high


def test_bootstrap_interval_covers_true_median_about_95_percent():
    rng = np.random.default_rng(0)
    hits = 0
    for seed in range(200):
        _median, low, high = bootstrap_median_ci(rng.normal(10.0, 1.0, size=31), resamples=400, seed=seed)
        hits += low <= 10.0 <= high
    assert 0.85 <= hits / 200 <= 1.0


def test_bootstrap_single_sample_and_bad_input():
    assert bootstrap_median_ci([2.5]) == (2.5, 2.5, 2.5)
    with pytest.raises(ValueError, match="samples"):
        bootstrap_median_ci([float("nan")])
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_median_ci([1.0, 2.0], confidence=1.5)


def test_ratio_ci_value_and_pairing_cancels_shared_drift():
    rng = np.random.default_rng(2)
    drift = np.linspace(1.0, 3.0, 40)  # machine gets slower over the run, for both A and B
    a = 2.0 * drift * (1 + 0.01 * rng.standard_normal(40))
    b = 1.0 * drift * (1 + 0.01 * rng.standard_normal(40))
    ratio, low, high = ratio_ci(a, b)
    assert ratio == pytest.approx(np.median(a) / np.median(b))
    assert low <= ratio <= high
    _r, unpaired_low, unpaired_high = ratio_ci(a, b, paired=False)
    assert high - low < (unpaired_high - unpaired_low) / 3
    assert low > 1.9 and high < 2.1


def test_ratio_ci_same_distribution_contains_one():
    rng = np.random.default_rng(5)
    ratio, low, high = ratio_ci(rng.lognormal(0, 0.3, 25), rng.lognormal(0, 0.3, 25))
    assert low < 1.0 < high
    assert verdict(ratio, low, high) == "no difference"


def test_verdict_cases():
    assert verdict(0.5, 0.4, 0.6) == "A faster"
    assert verdict(2.0, 1.5, 2.5) == "B faster"
    assert verdict(1.1, 0.9, 1.3) == "no difference"
    assert verdict(1.02, 1.01, 1.03, min_effect=0.05) == "no difference"
    assert verdict(float("nan"), 0.1, 0.2) == "no difference"


def test_verdict_sentence_words_side_b_against_the_reference():
    sentences = {"A faster": "slower than the ring", "B faster": "faster than the ring",
                 "no difference": "no different from the ring"}
    assert {label: verdict_sentence(label, "the ring") for label in sentences} == sentences


def test_verdict_sentence_follows_the_ratio_and_refuses_other_words():
    # time(reference) / time(other) = 2: the other side takes half the time
    assert verdict_sentence(verdict(2.0, 1.5, 2.5), "contiguous") == "faster than contiguous"
    assert verdict_sentence(verdict(0.5, 0.4, 0.6), "the reference") == "slower than the reference"
    with pytest.raises(ValueError, match="verdict must be one of A faster, B faster, no difference"):
        verdict_sentence("faster than the ring", "the ring")


def test_compare_names_the_faster_side_and_formats_interval():
    fast, slow = [1.0, 1.1, 0.9, 1.0, 1.05] * 3, [2.0, 2.1, 1.9, 2.0, 2.05] * 3
    result = compare(fast, slow, "hilbert", "identity")
    assert result["verdict"] == "hilbert faster"
    assert result["speedup"] == pytest.approx(2.0)
    assert result["speedup_low"] <= 2.0 <= result["speedup_high"]
    assert "[" in result["text"] and "x" in result["text"]
    assert format_ratio(2.0, 1.5, 2.5) == "2.00x [1.50, 2.50]"
    assert compare(slow, fast, "a", "b")["verdict"] == "b faster"


@pytest.mark.parametrize("low, high, decided", [
    (0.80, 0.95, True),    # excludes 1: faster
    (1.02, 1.30, True),    # excludes 1: slower
    (0.97, 1.04, True),    # within 5% of 1: no difference
    (0.90, 1.10, False),   # contains 1, wider than 5%: open
    (0.96, 1.06, False),
    (float("nan"), 1.0, False),
])
def test_settled_needs_an_interval_that_excludes_one_or_stays_within_the_margin(low, high, decided):
    assert settled(low, high) is decided


def test_compare_says_whether_its_interval_settles():
    rng = np.random.default_rng(3)
    base = rng.uniform(5.0, 15.0, 20)
    assert compare(base * 0.5, base)["settled"] is True  # twice as fast, paired: decided
    noisy = compare(base, np.random.default_rng(0).permutation(base))  # same values, wide interval around 1
    assert noisy["verdict"] == "no difference" and noisy["speedup_low"] < 0.95 < 1.05 < noisy["speedup_high"]
    assert noisy["settled"] is False
