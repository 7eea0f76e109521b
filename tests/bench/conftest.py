"""The benchmark script a test module names in its SCRIPT (a path under benchmarks/), loaded as a module."""
from __future__ import annotations

import importlib.util

import pytest


@pytest.fixture(scope="module")
def bench(request):
    path = request.module.SCRIPT
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
