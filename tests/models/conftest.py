"""Model tests run torch single-threaded: tiny ops, and no thread oversubscription on a shared CPU."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
