"""Shared pytest fixtures: seeded RNG and torch defaults."""
from __future__ import annotations

import numpy as np
import pytest
import torch


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def _seed_torch():
    torch.manual_seed(0)
    yield


def pytest_report_header(config):
    return f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}"
