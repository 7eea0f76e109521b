"""Model tests run torch single-threaded: tiny ops, and no thread oversubscription on a shared CPU."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _single_thread(single_thread):
    yield
