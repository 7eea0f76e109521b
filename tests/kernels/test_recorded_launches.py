"""Recorded launches of a compiled-kernel library: a replay gives the library's own results on new inputs,
and every call the record cannot reproduce stays on the library's path (a fake library on the CPU)."""
from __future__ import annotations

import types

import pytest
import torch

from hilbert_lab.kernels.recorded_launches import RecordedEntry


def _library() -> types.ModuleType:
    """A library in the style of FlashAttention-4's interface: Python that allocates and decides, then calls
    compiled kernels looked up in a compile cache hung on the entry function."""
    lib = types.ModuleType("fake_kernels")
    lib.torch = torch
    lib.python_calls = 0

    def scale_kernel(x, tmp, factor):  # tmp = x * factor (tmp arrives uninitialised)
        tmp.copy_(x * factor)

    def accumulate_kernel(tmp, y, acc_flat):  # acc += tmp + y (acc must start at zero), acc read as a flat view
        acc_flat.add_((tmp + y).reshape(-1))

    def write_kernel(acc, out_flat):  # a kernel reading the caller's out through a reshaped view
        out_flat.copy_(acc.reshape(-1))

    def entry(x, y, out=None, factor=1.0, copy_input=False):
        lib.python_calls += 1
        out = torch.empty_like(x) if out is None else out
        tmp = lib.torch.empty(x.shape, dtype=x.dtype)
        acc = lib.torch.zeros(x.shape, dtype=x.dtype)
        if copy_input:  # a buffer filled from the inputs by a torch op: no record can reproduce it
            tmp = lib.torch.empty(x.shape, dtype=x.dtype).copy_(x * 0 + y)
        cache = entry.compile_cache
        for key, kernel in (("scale", scale_kernel), ("acc", accumulate_kernel), ("write", write_kernel)):
            if key not in cache:
                cache[key] = kernel
        if not copy_input:
            cache["scale"](x, tmp, factor)
        cache["acc"](tmp, y, acc.view(-1))
        cache["write"](acc, out.view(-1))
        return out, acc

    entry.compile_cache = {}
    lib.entry = entry
    return lib


def _inputs(seed: int, shape=(4, 64)):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64), torch.randn(shape, generator=gen, dtype=torch.float64)


def _call_checked(recorded: RecordedEntry, seed: int, factor: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """One call of `_library()`'s entry through `recorded` into a fresh `out`: (its acc, the expected x * factor + y),
    its `out` checked against that."""
    x, y = _inputs(seed)
    out = torch.empty_like(x)
    result, acc = recorded({"x": x, "y": y, "out": out}, {"factor": factor})
    assert result is out
    torch.testing.assert_close(out, x * factor + y, rtol=0, atol=0)
    return acc, x * factor + y


def test_a_replay_gives_the_librarys_results_on_new_inputs_without_its_python():
    lib = _library()
    recorded = RecordedEntry(lib, "entry", outputs=("out",))
    for seed in range(4):
        acc, expected = _call_checked(recorded, seed)
        torch.testing.assert_close(acc, expected, rtol=0, atol=0)  # a zero-started buffer, zeroed on every replay
    assert lib.python_calls == 1  # the recording call; three replays after it
    assert recorded.reasons == {}


def test_each_key_is_recorded_once_and_a_new_shape_or_parameter_records_again():
    lib = _library()
    recorded = RecordedEntry(lib, "entry", outputs=("out",))
    for shape, factor in [((4, 64), 2.0), ((4, 64), 2.0), ((8, 32), 2.0), ((4, 64), 3.0), ((8, 32), 2.0)]:
        x, y = _inputs(1, shape)
        out = torch.empty_like(x)
        recorded({"x": x, "y": y, "out": out}, {"factor": factor})
        torch.testing.assert_close(out, x * factor + y, rtol=0, atol=0)
    assert lib.python_calls == 3 and len(recorded.records) == 3


def test_a_call_that_leaves_rows_of_a_buffer_unwritten_is_replayed():
    """A varlen-style call writes only the rows of its runs into a buffer it allocates uninitialised (the
    LSE of FlashAttention-4's varlen forward): the check compares the written rows and still replays."""
    lib = types.ModuleType("fake_varlen")
    lib.torch = torch
    lib.python_calls = 0

    def rows_kernel(x, lse, rows):  # lse[r] = sum of x[r] for the runs' rows only
        lse[rows] = x[rows].sum(-1)

    def entry(x, rows):
        lib.python_calls += 1
        lse = lib.torch.empty(x.shape[0], dtype=x.dtype)
        if "rows" not in entry.compile_cache:
            entry.compile_cache["rows"] = rows_kernel
        entry.compile_cache["rows"](x, lse, rows)
        return lse

    entry.compile_cache = {}
    lib.entry = entry
    recorded = RecordedEntry(lib, "entry")
    rows = torch.tensor([0, 1, 4, 5, 6])
    for seed in range(3):
        x, _ = _inputs(seed, (8, 16))
        lse = recorded({"x": x, "rows": rows}, {})
        torch.testing.assert_close(lse[rows], x[rows].sum(-1), rtol=0, atol=0)
    assert recorded.reasons == {} and lib.python_calls == 1


@pytest.mark.parametrize("shape,nbytes", [((64, 512), 262144), ((4, 64), 2048)])
def test_a_buffer_filled_from_the_inputs_keeps_the_call_on_the_librarys_path(shape, nbytes):
    """A buffer the library computes from the inputs with a torch op before a launch, small or large, cannot come
    from a record: every call of that key runs the library, with its own results."""
    lib = _library()
    recorded = RecordedEntry(lib, "entry", outputs=("out",))
    for seed in range(3):
        x, y = _inputs(seed, shape)
        out = torch.empty_like(x)
        recorded({"x": x, "y": y, "out": out}, {"factor": 1.0, "copy_input": True})
        torch.testing.assert_close(out, 2 * y, rtol=0, atol=0)
    assert lib.python_calls == 3
    assert list(recorded.reasons.values()) == [f"a {nbytes}-byte buffer the library filled with data before launching"]


def test_disabled_calls_the_library_every_time():
    lib = _library()
    recorded = RecordedEntry(lib, "entry", outputs=("out",))
    recorded.enabled = False
    for seed in range(2):
        x, y = _inputs(seed)
        out = torch.empty_like(x)
        recorded({"x": x, "y": y, "out": out}, {"factor": 1.0})
        torch.testing.assert_close(out, x + y, rtol=0, atol=0)
    assert lib.python_calls == 2 and recorded.records == {}


def test_the_recording_leaves_the_library_as_it_was():
    lib = _library()
    cache = lib.entry.compile_cache
    x, y = _inputs(0)
    RecordedEntry(lib, "entry", outputs=("out",))({"x": x, "y": y, "out": torch.empty_like(x)}, {"factor": 1.0})
    assert lib.torch is torch and lib.entry.compile_cache is cache and set(cache) == {"scale", "acc", "write"}


def test_an_entry_that_fails_leaves_the_library_as_it_was_and_raises():
    lib = _library()
    x, y = _inputs(0)
    with pytest.raises(RuntimeError):
        RecordedEntry(lib, "entry", outputs=("out",))({"x": x, "y": y[:, :3], "out": torch.empty_like(x)},
                                                      {"factor": 1.0})
    assert lib.torch is torch and isinstance(lib.entry.compile_cache, dict)


def test_launches_of_another_thread_during_a_recording_are_not_recorded():
    """A launch another thread makes through the library while a call is being recorded runs, but is not part
    of the record (the replay launches only what the recorded call launched)."""
    import threading

    lib = _library()
    entry = lib.entry
    elsewhere = []

    def entry_with_a_neighbour(x, y, out=None, factor=1.0, copy_input=False):
        result = entry(x, y, out=out, factor=factor, copy_input=copy_input)
        other = torch.zeros_like(x)
        thread = threading.Thread(target=lambda: entry.compile_cache["write"](x, other.view(-1)))
        thread.start()
        thread.join()
        elsewhere.append(other)
        return result

    entry_with_a_neighbour.compile_cache = entry.compile_cache
    lib.entry_with_a_neighbour = entry_with_a_neighbour
    recorded = RecordedEntry(lib, "entry_with_a_neighbour", outputs=("out",))
    for seed in range(3):
        x, y = _inputs(seed)
        out = torch.empty_like(x)
        recorded({"x": x, "y": y, "out": out}, {"factor": 2.0})
        torch.testing.assert_close(out, 2 * x + y, rtol=0, atol=0)
    assert torch.equal(elsewhere[0], _inputs(0)[0])  # the other thread's launch ran
    (record,) = recorded.records.values()
    assert record is not None and len(record.launches) == 3 and lib.python_calls == 1


def _accumulating_library(fail_at_call: set[int]) -> types.ModuleType:
    """A library whose entry adds x * factor into the caller's `out` (so a half-run call must be undone) and runs
    out of memory at the calls numbered in `fail_at_call` (1 = its first call), after its first launch."""
    lib = types.ModuleType("fake_accumulating")
    lib.torch = torch
    lib.python_calls = 0

    def add_kernel(x, out, factor):
        out.add_(x * factor)

    def entry(x, out, factor=1.0):
        lib.python_calls += 1
        if "add" not in entry.compile_cache:
            entry.compile_cache["add"] = add_kernel
        entry.compile_cache["add"](x, out, factor)
        if lib.python_calls in fail_at_call:
            raise torch.OutOfMemoryError("CUDA out of memory (a stand-in)")
        return out

    entry.compile_cache = {}
    lib.entry = entry
    return lib


def test_a_recording_out_of_memory_before_the_entry_returns_puts_the_outputs_back_and_runs_the_library():
    lib = _accumulating_library({1})
    recorded = RecordedEntry(lib, "entry", outputs=("out",))
    x, start = _inputs(0)
    out = start.clone()
    result = recorded({"x": x, "out": out}, {"factor": 2.0})
    assert result is out
    torch.testing.assert_close(out, start + 2 * x, rtol=0, atol=0)  # added once: the half-run recording undone
    key = next(iter(recorded.reasons))
    assert recorded.records[key] is None and "out of memory while recording" in recorded.reasons[key]
    assert lib.python_calls == 2
    recorded({"x": x, "out": out}, {"factor": 2.0})  # the key stays on the library's path
    assert lib.python_calls == 3 and lib.torch is torch


def test_a_replay_check_out_of_memory_keeps_the_librarys_result_and_path(monkeypatch):
    from hilbert_lab.kernels import recorded_launches

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory (a stand-in)")

    monkeypatch.setattr(recorded_launches, "_replay", no_memory)
    lib = _library()
    recorded = RecordedEntry(lib, "entry", outputs=("out",))
    for seed in range(2):
        _call_checked(recorded, seed)
    assert lib.python_calls == 2
    assert list(recorded.reasons.values()) == ["out of memory while checking the replay: the library's path"]
