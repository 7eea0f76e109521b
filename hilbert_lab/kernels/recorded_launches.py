"""Calls into a compiled-kernel library, recorded once per call key and then replayed without its Python.

Libraries of JIT-compiled kernels (FlashAttention-4's CuTe interface) spend tens of microseconds of Python on
every call choosing tiles and building arguments before they launch a kernel held in the `compile_cache` of an
entry function. `RecordedEntry(module, entry, outputs)` runs the entry once per call key while it records
every compiled launch the call makes; later calls with that key replay those launches. The key holds every
tensor's shape, strides, dtype, device, 16-byte alignment and gradient flag, and the non-tensor arguments.

A recorded argument is one of:
- the caller's tensor, or a view of it at the recorded offset (the library's reshapes);
- a buffer the library allocated, allocated again per replay as it was found at its first launch: left
  uninitialised (the recording hands out NaN- or sentinel-filled `torch.empty` buffers, so "never written
  before the launch" is seen) or filled with one value (`torch.zeros`);
- a constant (scalars, None, flags).

A call is replayed only after its replay, run once on the recording's inputs into fresh outputs (its
uninitialised buffers poisoned as in the recording, so entries no launch writes, such as the rows a varlen call
skips, compare equal), gave the library's own results (bitwise, or within `tolerance` where kernels add
atomically). Anything else (a buffer holding data before its first launch, which the library may have computed
from the inputs with a torch op; a tensor hidden inside an argument object; a result that is none of the recorded
buffers; a failed check) keeps that key on the library's own path, with the reason in `RecordedEntry.reasons`.
A buffer filled with one value is assumed to take that value whatever the inputs (zeros, a parameter of the key).

A recording holds copies beside the call (the outputs as they were, the replay's outputs and buffers) and checks
them in bounded pieces (`kernels.piecewise`); where those copies do not fit in memory the key stays on the
library's path (its outputs put back first when the entry had not returned): a first call never fails for them.
"""
from __future__ import annotations

import importlib
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from hilbert_lab.kernels.piecewise import close_piecewise, holds_everywhere

__all__ = ["RecordedEntry"]

MAX_RECORDS = 4096  # call keys kept per entry (a new one past this starts the records afresh)
_RECORDING = threading.RLock()


class NotReplayable(Exception):
    """A call whose launches cannot be replayed from a record (the message says why)."""


class _RecordingOutOfMemory(Exception):
    """The recording ran out of memory before the entry returned (its outputs put back as they were)."""


@dataclass(frozen=True)
class _Buffer:
    """A buffer the library allocates: storage elements of `dtype`, its start as found at the first launch."""

    numel: int
    dtype: torch.dtype
    device: torch.device
    init: str  # "empty" | "fill"
    value: Any = None  # the fill value
    shape: tuple[int, ...] = ()  # the shape it is allocated in (its first use, where that is the whole of it)

    def allocate(self) -> torch.Tensor:
        shape = self.shape or (self.numel,)
        if self.init == "empty":
            return torch.empty(shape, dtype=self.dtype, device=self.device)
        return torch.full(shape, self.value, dtype=self.dtype, device=self.device)


@dataclass
class _Record:
    launches: tuple  # ((compiled function, argument template), ...)
    buffers: tuple[_Buffer, ...]
    result: Any  # template of the entry's return value


def _poison(t: torch.Tensor) -> torch.Tensor:
    """Fill a freshly allocated buffer with a value no kernel writes by chance (NaN, or an odd sentinel)."""
    if t.is_floating_point() or t.is_complex():
        return t.fill_(float("nan"))
    if t.dtype == torch.bool:
        return t
    return t.fill_(-0x5A5A5A5 if t.dtype.is_signed and t.element_size() >= 4 else 0x5A)


def _poisoned(fn: Callable) -> Callable:
    def allocate(*args, **kwargs):
        return _poison(fn(*args, **kwargs))
    return allocate


class _PoisonTorch(types.SimpleNamespace):
    """The `torch` a library module sees while it is recorded: empty buffers come back poisoned."""

    def __init__(self):
        super().__init__(empty=_poisoned(torch.empty), empty_like=_poisoned(torch.empty_like),
                         empty_strided=_poisoned(torch.empty_strided))

    def __getattr__(self, name):
        return getattr(torch, name)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _signature(t: Optional[torch.Tensor]):
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype, t.get_device(), t.data_ptr() & 15, t.requires_grad)


class _Recorder:
    """Turns the arguments of each compiled launch of one call into templates (see the module docstring)."""

    def __init__(self, tensors: dict[str, Optional[torch.Tensor]]):
        self.inputs = {name: t for name, t in tensors.items() if t is not None}
        self.launches: list[tuple[Callable, Any]] = []
        self.buffers: list[_Buffer] = []
        self.buffer_of: dict[int, int] = {}  # storage pointer -> buffer index
        self.keep: list[torch.Tensor] = []  # every buffer stays alive: no address is reused during the call
        self.failure: Optional[str] = None
        self.thread = threading.get_ident()

    def launch(self, fn: Callable, args: tuple) -> None:
        if self.failure is not None:
            return
        try:
            self.launches.append(_launch_program(fn, tuple(self.template(a, True) for a in args)))
        except NotReplayable as why:
            self.failure = str(why)

    def template(self, value, launching: bool):
        if isinstance(value, torch.Tensor):
            return self.tensor(value, launching)
        if isinstance(value, (tuple, list)):
            items = tuple(self.template(v, launching) for v in value)
            return ("seq", type(value), items) if any(_has_tensor(v) for v in value) else ("const", value)
        if _has_tensor(value):
            raise NotReplayable(f"a tensor inside an argument of type {type(value).__name__}")
        return ("const", value)

    def tensor(self, t: torch.Tensor, launching: bool):
        geometry = (tuple(t.shape), t.stride())
        for name, x in self.inputs.items():  # the caller's tensor itself
            if x.data_ptr() == t.data_ptr() and (tuple(x.shape), x.stride()) == geometry and x.dtype == t.dtype:
                return ("input", name)
        ptr = _storage_ptr(t)
        owners = [name for name, x in self.inputs.items() if _storage_ptr(x) == ptr]
        if owners:
            if len(owners) > 1 or self.inputs[owners[0]].dtype != t.dtype:
                raise NotReplayable("a view of memory several inputs share, or of another dtype")
            delta = t.storage_offset() - self.inputs[owners[0]].storage_offset()
            return ("view", owners[0], geometry[0], geometry[1], delta)
        if ptr not in self.buffer_of:
            if not launching:
                raise NotReplayable("a returned tensor no launch wrote")
            self.buffer_of[ptr] = len(self.buffers)
            self.buffers.append(_first_state(t))
            self.keep.append(t)
        index = self.buffer_of[ptr]
        buffer = self.buffers[index]
        if buffer.dtype != t.dtype:
            raise NotReplayable("one buffer read as two dtypes")
        if buffer.shape == geometry[0] and t.is_contiguous() and t.storage_offset() == 0:
            return ("whole", index)  # the buffer as it is allocated
        return ("buffer", index, geometry[0], geometry[1], t.storage_offset())


def _has_tensor(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)):
        return any(_has_tensor(v) for v in value)
    fields = getattr(value, "__dict__", None)
    return isinstance(fields, dict) and any(isinstance(v, torch.Tensor) for v in fields.values())


def _first_state(t: torch.Tensor) -> _Buffer:
    """How a library buffer looked at its first launch: poisoned (never written) or one value."""
    nbytes = t.untyped_storage().nbytes()
    flat = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), 0, (nbytes // t.element_size(),))
    whole = t.is_contiguous() and t.storage_offset() == 0 and t.numel() == flat.numel()
    shape = tuple(t.shape) if whole else ()
    if flat.numel() == 0:
        return _Buffer(0, t.dtype, t.device, "empty", shape=shape)
    probe = torch.empty(1, dtype=t.dtype, device=t.device)
    _poison(probe)
    never_written = (lambda piece: torch.isnan(piece).all()) if t.is_floating_point() else \
        None if t.dtype == torch.bool else (lambda piece: (piece == probe).all())
    if never_written is not None and holds_everywhere(flat, never_written):
        return _Buffer(flat.numel(), t.dtype, t.device, "empty", shape=shape)
    first = flat[0]
    if holds_everywhere(flat, lambda piece: (piece == first).all()):
        return _Buffer(flat.numel(), t.dtype, t.device, "fill", first.item(), shape=shape)
    raise NotReplayable(f"a {nbytes}-byte buffer the library filled with data before launching")


class _RecordingCache:
    """A library's compile cache seen through a recorder: lookups hand back the compiled function wrapped so
    that each launch is recorded before it runs."""

    def __init__(self, cache, recorder: _Recorder):
        self._cache, self._recorder = cache, recorder

    def __contains__(self, key) -> bool:
        return key in self._cache

    def __getitem__(self, key):
        fn = self._cache[key]

        def launch(*args):
            if threading.get_ident() == self._recorder.thread:  # another thread's call is not this record's
                self._recorder.launch(fn, args)
            return fn(*args)
        return launch

    def __setitem__(self, key, value) -> None:
        self._cache[key] = value

    def __getattr__(self, name):
        return getattr(self._cache, name)


def _resolve(template, tensors: dict, buffers: list):
    kind = template[0]
    if kind == "const":
        return template[1]
    if kind == "input":
        t = tensors[template[1]]
        return t.detach() if t.requires_grad else t
    if kind == "view":
        t = tensors[template[1]]
        return t.detach().as_strided(template[2], template[3], t.storage_offset() + template[4])
    if kind == "whole":
        return buffers[template[1]]
    if kind == "buffer":
        return buffers[template[1]].as_strided(template[2], template[3], template[4])
    items = [_resolve(item, tensors, buffers) for item in template[2]]
    return template[1](*items) if hasattr(template[1], "_fields") else template[1](items)


def _launch_program(fn: Callable, template: tuple):
    """(fn, constant arguments, [(position, argument template)]): a launch whose constants are placed once."""
    constants = [a[1] if a[0] == "const" else None for a in template]
    return fn, constants, [(i, a) for i, a in enumerate(template) if a[0] != "const"]


def _replay(record: _Record, tensors: dict, poison: bool = False):
    """Run a record's launches on `tensors`; poison=True fills its uninitialised buffers as the recording did
    (so entries no launch writes compare equal in the replay check)."""
    buffers = [buffer.allocate() for buffer in record.buffers]
    if poison:
        for buffer, t in zip(record.buffers, buffers):
            if buffer.init == "empty":
                _poison(t)
    for fn, constants, variable in record.launches:
        args = constants.copy()
        for position, template in variable:
            args[position] = _resolve(template, tensors, buffers)
        fn(*args)
    return _resolve(record.result, tensors, buffers)


def _results(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _results(v)]
    return []


class RecordedEntry:
    """`entry(**tensors, **params)` of `module` (a name or module), recorded per call key and replayed (see the
    module docstring). outputs: the tensor arguments the entry writes (out=, dq=, ...); tolerance: the
    relative difference the replay check accepts (0: bitwise; kernels that add atomically need a little).
    `enabled = False` calls the entry every time."""

    def __init__(self, module: str | types.ModuleType, entry: str, *, outputs: tuple[str, ...] = (),
                 tolerance: float = 0.0):
        self._module, self.entry_name, self.outputs, self.tolerance = module, entry, tuple(outputs), tolerance
        self.enabled = True
        self.records: dict[tuple, Optional[_Record]] = {}
        self.reasons: dict[tuple, str] = {}

    @property
    def module(self) -> types.ModuleType:
        """The library module, looked up on every call (a test may stand another in for it)."""
        if not isinstance(self._module, str):
            return self._module
        return sys.modules.get(self._module) or importlib.import_module(self._module)

    def __call__(self, tensors: dict[str, Optional[torch.Tensor]], params: dict[str, Any]):
        module = self.module
        entry = getattr(module, self.entry_name)
        if not self.enabled:
            return entry(**tensors, **params)
        key = (id(entry), *self.key(tensors, params))
        record = self.records.get(key, False)
        if record is None:
            return entry(**tensors, **params)
        if record is not False:
            return _replay(record, tensors)
        if _capturing():  # a recording reads values on the host: not inside a CUDA graph capture
            return entry(**tensors, **params)
        if len(self.records) >= MAX_RECORDS:
            self.records.clear()
            self.reasons.clear()
        try:
            result, record = self._record(module, entry, key, tensors, params)
        except _RecordingOutOfMemory:  # the recording's copies did not fit beside the call: the library's path
            self.records[key] = None
            self.reasons[key] = "out of memory while recording (copies beside the call): the library's path"
            return entry(**tensors, **params)
        self.records[key] = record
        return result

    def key(self, tensors: dict, params: dict) -> tuple:
        return (tuple(tensors), tuple([_signature(t) for t in tensors.values()]), tuple(params.items()))

    def _record(self, module: types.ModuleType, entry: Callable, key: tuple, tensors: dict, params: dict):
        """(the entry's result, its record or None). Out of memory before the entry returns: the outputs are put
        back as they were and _RecordingOutOfMemory raised (the caller then runs the library's path); out of
        memory while checking the replay: the result, no record."""
        try:
            before = {name: tensors[name].clone() for name in self.outputs if tensors.get(name) is not None}
        except torch.OutOfMemoryError as error:
            raise _RecordingOutOfMemory() from error
        try:
            return self._record_with(module, entry, key, tensors, params, before)
        except torch.OutOfMemoryError as error:
            for name, value in before.items():
                tensors[name].copy_(value)
            raise _RecordingOutOfMemory() from error

    def _record_with(self, module: types.ModuleType, entry: Callable, key: tuple, tensors: dict, params: dict,
                     before: dict):
        recorder = _Recorder(tensors)
        with _RECORDING:  # one recording at a time patches a module
            owners = [obj for obj in vars(module).values() if callable(obj) and hasattr(obj, "compile_cache")]
            caches = [owner.compile_cache for owner in owners]
            real_torch = vars(module).get("torch")
            try:
                for owner, cache in zip(owners, caches):
                    owner.compile_cache = _RecordingCache(cache, recorder)
                if real_torch is torch:
                    module.torch = _PoisonTorch()
                result = entry(**tensors, **params)
            finally:
                for owner, cache in zip(owners, caches):
                    owner.compile_cache = cache
                if real_torch is torch:
                    module.torch = real_torch
        try:
            if recorder.failure is not None:
                raise NotReplayable(recorder.failure)
            if not recorder.launches:
                raise NotReplayable("the call launched no compiled kernel")
            record = _Record(tuple(recorder.launches), tuple(recorder.buffers), recorder.template(result, False))
            del recorder
            self._check(record, tensors, before, result)
        except NotReplayable as why:
            self.reasons[key] = str(why)
            return result, None
        except torch.OutOfMemoryError:
            self.reasons[key] = "out of memory while checking the replay: the library's path"
            return result, None
        return result, record

    def _check(self, record: _Record, tensors: dict, before: dict, result) -> None:
        """Replay on the recorded inputs into copies of the outputs as they were before the call; the results must
        equal the library's."""
        trial = dict(tensors)
        for name, value in before.items():
            copy = torch.empty_strided(value.shape, tensors[name].stride(), dtype=value.dtype, device=value.device)
            trial[name] = copy.copy_(value)
        replayed = _replay(record, trial, poison=True)
        pairs = list(zip(_results(result), _results(replayed)))
        pairs += [(tensors[name], trial[name]) for name in before]
        if len(_results(result)) != len(_results(replayed)):
            raise NotReplayable("the replay returned other results")
        for official, again in pairs:
            if not close_piecewise(official, again, self.tolerance):
                raise NotReplayable("the replay's results differ from the library's")
