"""A region of kernel launches replayed as one CUDA graph, keyed by the addresses of the tensors it touches.

A step made of tens of library calls (one per block or document of an attention plan) spends tens of microseconds
of Python on each before it launches, and the host, not the GPU, then sets the step's time.
`GraphRegions.run(key, tensors, launch, keep)` runs `launch()` eagerly the first two times a key is seen, captures
it into a CUDA graph the third time (and replays that capture), and replays the graph from then on: one
`cudaGraphLaunch` instead of the region's Python.

A graph holds addresses, not values, so a replay is the region's launches on whatever the listed tensors hold
then. The key is therefore the caller's `key` (everything else the launches depend on: shapes of the work,
flags, scales) with the data pointer, shape, strides, dtype and gradient flag of every tensor the region reads
or writes, the stream and the autocast state. What a region may do:
- read and write only `tensors` (any views of them) and device data owned by the objects in `keep`, which the
  cache holds alive as long as the graph (cached metadata: its addresses stay valid); `keep` may be a function,
  called right after the capture (what the capture read from caches is then in them);
- allocate temporaries, which live in one memory pool per (device, stream) shared by the regions captured there
  (nothing allocated in a region may outlive it: the next replay of any region rewrites it);
- return nothing a caller keeps (`run` returns None);
- never read a device value on the host after its first run (which may: compiling, recording, caching). The
  second run of a key, eager as well, watches for torch's synchronizing operations
  (`torch.cuda.set_sync_debug_mode("warn")`); a key that synchronized is never captured, with the reason in
  `reasons`. The third run captures. (A capture that fails all the same is dropped and run eagerly, but
  PyTorch's allocator and generators may not recover from a failed capture: the watch keeps it from happening.)

The cache keeps `max_graphs` graphs, the least recently used dropped first. A dropped key that comes back is
captured again (a steady loop regains its replays after a phase of other shapes: an evaluation, other lengths),
up to `max_recaptures` times; a key dropped once more than that runs eagerly from then on (`reasons`): the keys in
use keep outnumbering the kept graphs, and capturing again would cost a capture on every call.

Nothing is captured inside another capture (the caller's own CUDA graph or `torch.compile`'s
"reduce-overhead" then records the launches themselves), off CUDA, or when `enabled` is False. A region
records no autograd history (it is captured under `torch.no_grad`).
"""
from __future__ import annotations

import contextlib
import threading
import warnings
from collections import OrderedDict
from typing import Any, Callable, Hashable, Iterable, Iterator, Optional

import torch

__all__ = ["GraphRegions"]

_CAPTURE = threading.Lock()
_SYNC_WARNING = "called a synchronizing CUDA operation"  # torch.cuda.set_sync_debug_mode("warn")


def _signature(t: Optional[torch.Tensor]) -> Optional[tuple]:
    if t is None:
        return None
    return (t.data_ptr(), t.shape, t.stride(), t.dtype, t.requires_grad)


def _raw_stream(index: int) -> int:
    """The device's current stream (cudaStream_t) as Triton and inductor read it: one C call, where
    `torch.cuda.current_stream(device)` builds a Stream object each time."""
    return torch._C._cuda_getCurrentRawStream(index)


def _synchronizes(launch: Callable[[], Any]) -> bool:
    """Run launch() once, eagerly, and tell whether it called a synchronizing CUDA operation (torch's sync debug
    mode "warn"; other warnings pass on)."""
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            launch()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    found = False
    for warning in caught:
        if _SYNC_WARNING in str(warning.message):
            found = True
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return found


class GraphRegions:
    """Cache of captured regions (see the module docstring): `max_graphs` graphs, least recently used dropped; a
    dropped key captured again when it returns, at most `max_recaptures` times.

    Attributes: `enabled`; `counts` {"eager", "captured", "replayed", "refused"}: how the regions ran; `reasons`
    {key: why a capture was abandoned}; `drops` {key: times its graph was dropped}."""

    def __init__(self, max_graphs: int = 128, max_recaptures: int = 2):
        if max_graphs < 1:
            raise ValueError(f"max_graphs must be at least 1, got {max_graphs}")
        if max_recaptures < 0:
            raise ValueError(f"max_recaptures must be at least 0, got {max_recaptures}")
        self.max_graphs, self.max_recaptures = max_graphs, max_recaptures
        self.enabled = True
        self.graphs: OrderedDict[tuple, tuple[torch.cuda.CUDAGraph, Any]] = OrderedDict()
        self.seen: OrderedDict[tuple, int] = OrderedDict()
        self.reasons: dict[tuple, str] = {}
        self.drops: dict[tuple, int] = {}
        self.counts = {"eager": 0, "captured": 0, "replayed": 0, "refused": 0}
        self._pools: dict[tuple[int, int], Any] = {}

    @contextlib.contextmanager
    def counting(self) -> Iterator[dict[str, int]]:
        """`with regions.counting() as done:` -> `done` holds, once the block ends, what the regions did inside it
        (`counts`' increments: eager, captured, replayed, refused)."""
        before = dict(self.counts)
        done = dict.fromkeys(self.counts, 0)
        try:
            yield done
        finally:
            done.update({kind: count - before.get(kind, 0) for kind, count in self.counts.items()})

    def clear(self) -> None:
        """Drop every graph (and the memory their temporaries held) and forget every key."""
        self.graphs.clear()
        self.seen.clear()
        self.reasons.clear()
        self.drops.clear()
        self._pools.clear()

    def run(self, key: Hashable, tensors: Iterable[Optional[torch.Tensor]], launch: Callable[[], Any],
            keep: Any = None) -> None:
        """Run `launch()` (its return value is dropped) eagerly, by capture or by replay (module docstring)."""
        tensors = tuple(tensors)
        device = next((t.device for t in tensors if t is not None), None)
        if not self._may_capture(device):
            self.counts["eager"] += 1
            launch()
            return
        full = (key, device.index, _raw_stream(device.index), torch.is_autocast_enabled("cuda"),
                torch.get_autocast_dtype("cuda"), tuple([_signature(t) for t in tensors]))
        entry = self.graphs.get(full)
        if entry is not None:
            self.graphs.move_to_end(full)
            entry[0].replay()
            self.counts["replayed"] += 1
            return
        seen = self.seen.get(full, 0)
        if full in self.reasons or seen < 2:
            self._note_seen(full)
            self.counts["eager"] += 1
            if full in self.reasons or seen == 0:
                launch()
            elif _synchronizes(launch):
                self.reasons[full] = "the region calls a synchronizing CUDA operation (reads the device on the host)"
                self.counts["refused"] += 1
            return
        self._capture(full, device, launch, keep)

    def _may_capture(self, device: Optional[torch.device]) -> bool:
        return self.enabled and device is not None and device.type == "cuda" and \
            not torch.cuda.is_current_stream_capturing()

    def _note_seen(self, full: tuple) -> None:
        self.seen[full] = self.seen.get(full, 0) + 1
        self.seen.move_to_end(full)
        while len(self.seen) > 4 * self.max_graphs:  # a forgotten key is watched again if it comes back
            forgotten, _ = self.seen.popitem(last=False)
            self.reasons.pop(forgotten, None)
            self.drops.pop(forgotten, None)

    def _capture(self, full: tuple, device: torch.device, launch: Callable[[], Any], keep: Any) -> None:
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(current)
        with _CAPTURE, torch.cuda.device(device):
            pool = self._pools.get(full[1:3])
            if pool is None:
                pool = self._pools[full[1:3]] = torch.cuda.graph_pool_handle()
            failure = None
            with torch.cuda.stream(side), torch.no_grad():
                graph.capture_begin(pool=pool, capture_error_mode="thread_local")
                try:
                    launch()
                except Exception as error:  # noqa: BLE001 - any failure inside a capture: run eagerly instead
                    failure = f"{type(error).__name__}: {error}"
                finally:
                    try:
                        graph.capture_end()
                    except Exception as error:  # noqa: BLE001
                        failure = failure or f"{type(error).__name__}: {error}"
        current.wait_stream(side)
        if failure is not None:
            del graph
            self._forget_unused_pools()
            self.reasons[full] = failure
            self.counts["refused"] += 1
            self.counts["eager"] += 1
            launch()
            return
        self.graphs[full] = (graph, keep() if callable(keep) else keep)
        if len(self.graphs) > self.max_graphs:
            while len(self.graphs) > self.max_graphs:
                dropped, _ = self.graphs.popitem(last=False)
                self.seen[dropped] = self.seen.get(dropped, 2)  # watched already: captured when it returns
                drops = self.drops[dropped] = self.drops.get(dropped, 0) + 1  # bounded with the seen keys
                if drops > self.max_recaptures:
                    self.reasons[dropped] = (f"dropped from the cache {drops} times: more keys in use than "
                                             f"max_graphs ({self.max_graphs})")
            self._forget_unused_pools()
        graph.replay()
        self.counts["captured"] += 1

    def _forget_unused_pools(self) -> None:
        """Drop the handles of pools no kept graph uses: PyTorch refuses to capture into a pool whose graphs are
        all gone (the next capture there takes a fresh pool)."""
        used = {full[1:3] for full in self.graphs}
        for place in [place for place in self._pools if place not in used]:
            del self._pools[place]
