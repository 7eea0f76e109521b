"""The property tests' settings: their own fixed examples, or HILBERT_LAB_FUZZ_EXAMPLES new ones (make fuzz)."""
from __future__ import annotations

import pytest

import property_testing
from property_testing import FUZZ_EXAMPLES, settings

pytest.importorskip("hypothesis", reason="hypothesis (dev extra) draws the property tests' examples")


def test_a_tests_own_settings_hold_without_the_variable(monkeypatch):
    monkeypatch.delenv(FUZZ_EXAMPLES, raising=False)
    chosen = settings(max_examples=40, deadline=None, derandomize=True, database=None)
    assert (chosen.max_examples, chosen.derandomize) == (40, True)


def test_the_variable_draws_that_many_new_examples(monkeypatch):
    monkeypatch.setenv(FUZZ_EXAMPLES, "123")
    chosen = settings(max_examples=40, deadline=None, derandomize=True, database=None)
    assert (chosen.max_examples, chosen.derandomize, chosen.database, chosen.deadline) == (123, False, None, None)


@pytest.mark.parametrize("value", ["many", "0", "-3", "2.5"])
def test_a_bad_count_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(FUZZ_EXAMPLES, value)
    with pytest.raises(ValueError, match=f"{FUZZ_EXAMPLES} must be a positive integer, got '{value}'"):
        property_testing.settings(max_examples=40)
