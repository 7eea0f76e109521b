"""Shared pytest fixtures: seeded RNG and torch defaults, the headless browser."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Optional

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


CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def chromium_path() -> Optional[str]:
    """Debian's chromium on PATH or in /usr/bin, or None."""
    return shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)


def browser_unavailable_reason() -> Optional[str]:
    """Why the headless browser cannot run here (no chromium, no playwright), or None when it can."""
    if chromium_path() is None:
        return "Debian's chromium is not installed (make browser installs it)"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package drives chromium and is not installed"
    return None


@pytest.fixture
def browser():
    """Headless Debian chromium driven by playwright; skips with the reason when the host has no chromium
    or no playwright."""
    reason = browser_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        try:
            yield instance
        finally:
            instance.close()
