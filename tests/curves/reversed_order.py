"""A pytest plugin that runs the collected tests in reverse order: ``-p reversed_order`` with tests/curves on
PYTHONPATH. With the forward run it shows a test that passes only after (or before) another one."""
from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items) -> None:
    items.reverse()
