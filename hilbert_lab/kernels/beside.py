"""Launches that run beside the current CUDA stream's work, joined back before anything reads what they wrote.

`Beside(device)`: `run(fn, *args)` issues `fn(*args)` on a side stream of the device that first waits for all
work queued so far on the current stream; the current stream's later launches then overlap it; `join()` makes the
current stream wait for everything run beside. For work whose writes are disjoint from those of the launches it
overlaps (a fill of the entries no attention block writes, next to the blocks' kernels): a bandwidth-bound pass
hides under compute-bound kernels instead of following them. Inside a CUDA graph capture the fork and the join are
captured (the graph holds two branches); the caller must join before the capture ends and before any tensor
written beside is freed. On other devices, or where `enabled` is False, `run` calls `fn` in line.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["Beside", "enabled"]

enabled = True  # False: every run in line (for comparisons)
_STREAMS: dict[int, torch.cuda.Stream] = {}  # device index -> its side stream


class Beside:
    """Work run beside the current stream of `device` until `join()` (see the module docstring)."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.side = None
        self.current = None
        if enabled and self.device.type == "cuda":
            self.current = torch.cuda.current_stream(self.device)
            index = self.current.device_index
            if index not in _STREAMS:
                _STREAMS[index] = torch.cuda.Stream(self.device)
            if _STREAMS[index] != self.current:  # else the caller runs on the side stream itself: in line
                self.side = _STREAMS[index]
        self.pending = False

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args) on the side stream after the current stream's queued work (in line where there is none)."""
        if self.side is None:
            return fn(*args)
        self.side.wait_stream(self.current)
        self.pending = True
        with torch.cuda.stream(self.side):
            return fn(*args)

    def join(self) -> None:
        """The current stream waits for everything run beside."""
        if self.pending:
            self.current.wait_stream(self.side)
            self.pending = False
