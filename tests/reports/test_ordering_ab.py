"""The interleaved A/B of the benchmark report adds rounds until its interval settles, and says when it cannot."""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from hilbert_lab.bench import timing
from hilbert_lab.reports.benchmark import ordering_ab

CASE = dict(device="cpu", dtype="float32", seq_lens=[64], modes=["longnet"], orderings=["identity", "hilbert"],
            segment_lengths=[32, 64], dilation_rates=[1, 2], batch_size=1, num_heads=2, head_dim=8, backend="manual")


def _fake_rounds(monkeypatch, identity_ms, ordered_ms):
    """time_interleaved returning the next samples of two endless sequences; records each call's rounds."""
    streams = {"identity": itertools.cycle(identity_ms), "ordered": itertools.cycle(ordered_ms)}
    calls = []

    def fake(fns, *, rounds, **kwargs):
        calls.append(rounds)
        return {name: SimpleNamespace(samples=[next(streams[name]) for _ in range(rounds)]) for name in fns}

    monkeypatch.setattr(timing, "time_interleaved", fake)
    return calls


def test_a_clear_difference_settles_in_the_first_rounds(monkeypatch):
    calls = _fake_rounds(monkeypatch, [10.0, 10.5, 9.5], [5.0, 5.2, 4.8])
    (row,) = ordering_ab(repeats=6, **CASE).to_dict("records")
    assert calls == [6] and row["rounds"] == 6 and row["settled"] is True
    assert row["max_abs_difference"] < 1e-5  # the real attention of both layouts


def test_a_wide_interval_around_one_gets_more_rounds_then_is_reported_open(monkeypatch):
    noise = [6.0, 14.0, 9.0, 11.0, 7.0, 13.0, 8.0]
    calls = _fake_rounds(monkeypatch, noise, list(reversed(noise)))
    (row,) = ordering_ab(repeats=5, max_rounds=12, **CASE).to_dict("records")
    assert calls == [5, 5, 2] and row["rounds"] == 12 and row["settled"] is False
    assert len(row["identity_times_ms"]) == len(row["ordered_times_ms"]) == 12


def test_bad_round_counts_are_refused():
    with pytest.raises(ValueError, match="max_rounds"):
        ordering_ab(repeats=5, max_rounds=3, **CASE)
