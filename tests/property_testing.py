"""hypothesis's ``given``, ``settings`` and ``strategies`` (as ``st``) for the property tests. Where hypothesis (a
dev extra) is not installed they are stand-ins: each property test skips with the reason, and the other tests of
its module still run.

A test's own settings fix its examples (derandomized, a few dozen: what `make test` runs). With
HILBERT_LAB_FUZZ_EXAMPLES=N in the environment (`make fuzz`) every property test draws N new random examples
instead (conftest marks them `property`)."""
from __future__ import annotations

import os
from typing import Any, Callable

import pytest

REASON = "hypothesis (dev extra: pip install 'hilbert-lab[dev]') draws the examples of this property test"

FUZZ_EXAMPLES = "HILBERT_LAB_FUZZ_EXAMPLES"

try:
    from hypothesis import given
    from hypothesis import settings as _settings
    from hypothesis import strategies as st

    def settings(*args: Any, **kwargs: Any) -> Any:
        """hypothesis.settings; with HILBERT_LAB_FUZZ_EXAMPLES=N: N examples, drawn anew on every run."""
        examples = os.environ.get(FUZZ_EXAMPLES)
        if examples:
            if not examples.isdigit() or int(examples) < 1:
                raise ValueError(f"{FUZZ_EXAMPLES} must be a positive integer, got {examples!r}")
            kwargs.update(max_examples=int(examples), derandomize=False, database=None)
        return _settings(*args, **kwargs)
except ImportError:

    class _AnyStrategy:
        """Every strategy, whatever its arguments: nothing is drawn without hypothesis."""

        def __getattr__(self, name: str) -> "_AnyStrategy":
            return self

        def __call__(self, *args: Any, **kwargs: Any) -> "_AnyStrategy":
            return self

    st = _AnyStrategy()

    def settings(*args: Any, **kwargs: Any) -> Callable[[Callable], Callable]:
        return lambda test: test

    def given(*args: Any, **kwargs: Any) -> Callable[[Callable], Callable]:
        def skipping(test: Callable) -> Callable:
            def property_test() -> None:
                pytest.skip(REASON)

            for name in ("__name__", "__qualname__", "__doc__", "__module__"):
                setattr(property_test, name, getattr(test, name))
            return property_test

        return skipping

__all__ = ["FUZZ_EXAMPLES", "given", "settings", "st"]
