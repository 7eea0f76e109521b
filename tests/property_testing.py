"""hypothesis's ``given``, ``settings`` and ``strategies`` (as ``st``) for the property tests. Where hypothesis (a
dev extra) is not installed they are stand-ins: each property test skips with the reason, and the other tests of
its module still run."""
from __future__ import annotations

from typing import Any, Callable

import pytest

REASON = "hypothesis (dev extra: pip install 'hilbert-lab[dev]') draws the examples of this property test"

try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
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

__all__ = ["given", "settings", "st"]
