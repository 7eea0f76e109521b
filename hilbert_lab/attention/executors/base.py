"""The executor type: the capabilities an attention executor declares and the operations it offers.

An executor runs a plan (attention.plan) on q (B, Nq, H, D), k, v (B, N, H_kv, D):
- `forward(plan, q, k, v, slots, *, scale)` writes each branch's (or, for a whole-pattern executor, the
  merged) output and LSE into the caller's `Slots` and returns the state its backward needs;
- `backward(plan, state, q, k, v, merged, grads, *, scale)` adds (or writes) its exact share of dq, dk,
  dv for the *merged* output and LSE (`Merged`: every block's kernel backward is called with the merged
  out and LSE, so the gradients through the merge weights are exact) into `Grads`. state None: the
  forward ran in another op (attention.op); the executor rebuilds what it needs from the plan and shapes.
The bytes an executor allocates above the inputs are a dry run of its own forward and backward on meta
tensors (attention.dry_run.dry_run(executor, plan, shape, dtype, device)), so no model can drift from the code.
Everything the registry, `auto`, the memory estimate and the benchmark cases know about an executor is
read from its `Capabilities`; nothing dispatches on names.
"""
from __future__ import annotations

import functools
import importlib.util
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from hilbert_lab.kernels.beside import Beside
from hilbert_lab.kernels.triton_rows import ROW_DTYPES, add_views
from hilbert_lab.kernels.triton_support import runs_on

ALL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
HALF_DTYPES = (torch.float16, torch.bfloat16)


class BackendUnavailableError(ImportError, ValueError):
    """An executor cannot run here (missing package, device or dtype); catchable as either base."""


def _nothing(beside: Optional[Beside] = None) -> None:
    return None


def zero_whole(x: torch.Tensor, beside: Optional[Beside] = None) -> torch.Tensor:
    """x.zero_(), always in line: the calls then overwrite some of its entries, so it may not run beside them (the
    signature of a plan's clear, `Plan.clear_unselected`, which writes only entries no call writes)."""
    return x.zero_()


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """LSE dtype for inputs of `dtype`: float64 for float64, float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass(frozen=True)
class Capabilities:
    """What an executor can run, as data.

    devices / dtypes / head_dims: where it runs (head_dims: (largest, multiple), the head dims D it takes:
    D <= largest and D % multiple == 0); cuda_head_dims: the same for its CUDA kernels where they take fewer
    (None: head_dims); `auto` reads them (attention.selection). min_capability: CUDA compute capability it
    needs. in_place: its kernels read the plan's strided views of q, k, v (no gather) and its results land
    in views of the caller's buffers. whole_pattern: it runs every branch
    of the plan in one pass (the merged result, no per-branch partials). dense_out_lse: its backward
    reads out and grad_out in one dense (B, N, H, D) layout. min_block_length: shorter blocks go to the
    fallback kernel. grad_lse: its backward takes an LSE gradient itself (else the executor adds the
    LSE's share through the identity of `lse_share_inputs`). gqa: a kernel call may read fewer key/value
    heads than query heads. bottom_right: a causal kernel call may have fewer queries than keys aligned at
    the bottom right. varlen: its kernel takes many sequences of different lengths in one call
    (cu_seqlens), so the blocks of the documents of a packed row run in a few calls
    (executors.varlen). backward / dropout: whether it differentiates / drops attention weights.
    package / install: an optional package it imports and what installs it (a pip requirement). oracle: exact and
    slow (the float64 reference), never a speed candidate.
    """

    devices: tuple[str, ...] = ("cpu", "cuda")
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES
    head_dims: tuple[int, int] = (1 << 30, 1)
    cuda_head_dims: Optional[tuple[int, int]] = None
    min_capability: tuple[int, int] = (0, 0)
    in_place: bool = True
    whole_pattern: bool = False
    dense_out_lse: bool = False
    min_block_length: int = 1
    grad_lse: bool = False
    gqa: bool = False
    bottom_right: bool = False
    varlen: bool = False
    backward: bool = True
    dropout: bool = False
    package: Optional[str] = None
    install: Optional[str] = None
    oracle: bool = False

    def head_dims_on(self, device_type: Optional[str] = None) -> tuple[int, int]:
        """(largest, multiple) head dims it takes on `device_type`; None: on every device it runs on."""
        if self.cuda_head_dims is None or device_type not in (None, "cuda"):
            return self.head_dims
        if device_type == "cuda" or self.devices == ("cuda",):
            return self.cuda_head_dims
        largest, multiple = self.head_dims
        cuda_largest, cuda_multiple = self.cuda_head_dims
        return min(largest, cuda_largest), math.lcm(multiple, cuda_multiple)

    def takes_head_dim(self, head_dim: int, device_type: Optional[str] = None) -> bool:
        """Whether it takes head dim `head_dim` on `device_type` (None: on every device it runs on)."""
        largest, multiple = self.head_dims_on(device_type)
        return 1 <= head_dim <= largest and head_dim % multiple == 0


@dataclass
class Slots:
    """Where executors write partial results: outs (P, B, Nq, H, D) and lses (P, B, Nq, H) (token-major like
    the outputs; -inf where a slot holds nothing), slot_of[branch] the slot of each branch, need_lse
    whether the LSE is wanted (without a merge an executor may then leave it unwritten, and no -inf is filled in).
    prepare(beside=None): what still initialises them (zeros where no call writes an output, -inf LSEs where the LSE
    is wanted) before the first write; the zeros of exactly the entries no call writes may go `beside` the calls
    (kernels.beside); `take_prepare` hands it over once. finish(): the merge of the slots into `results` (the
    result's buffers, allocated before), pending where the one part's executor may run it after its last write
    (`take_finish`), else None."""

    outs: torch.Tensor
    lses: torch.Tensor
    slot_of: dict[int, int]
    need_lse: bool = True
    prepare: Optional[Callable[..., None]] = None
    finish: Optional[Callable[[], None]] = None
    results: tuple[torch.Tensor, ...] = ()

    def take_prepare(self) -> Callable[..., None]:
        """The pending initialisation, for the caller to run before its first write (an executor declaring
        `prepares_slots` runs it inside its captured region, where its launches cost no host time); taken on the
        host at every call, so a replayed region that holds it leaves nothing pending. Later takes get a no-op."""
        prepare, self.prepare = self.prepare, None
        return prepare if prepare is not None else _nothing

    def take_finish(self) -> Optional[Callable[[], None]]:
        """The pending merge, for an executor to run after its last write to the slots (inside its captured region,
        which then writes `results` too), or None; taken once, as `take_prepare`."""
        finish, self.finish = self.finish, None
        return finish

    def out(self, branch: int) -> torch.Tensor:
        return self.outs[self.slot_of[branch]]

    def lse(self, branch: int) -> torch.Tensor:
        return self.lses[self.slot_of[branch]]


@dataclass
class Merged:
    """The merged result and its upstream gradients: out (B, Nq, H, D), lse (B, H, Nq), grad_out (None:
    zero), grad_lse (None: zero). dense_out / dense_grad_out: contiguous copies made once for executors
    whose backward reads out and grad_out in one dense layout."""

    out: torch.Tensor
    lse: torch.Tensor
    grad_out: Optional[torch.Tensor]
    grad_lse: Optional[torch.Tensor]
    _dense: dict = field(default_factory=dict)

    def dense(self, name: str) -> Optional[torch.Tensor]:
        if name not in self._dense:
            value = getattr(self, name)
            self._dense[name] = None if value is None else value.contiguous()
        return self._dense[name]


def _views_kernel_runs(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    """Whether `add_views` takes these pairs (see Grads.store_shares)."""
    view = pairs[0][0]
    return runs_on(view.device) and len(pairs) <= 3 and all(
        total.dim() == 4 and total.shape == share.shape and total.dtype in ROW_DTYPES and share.dtype in ROW_DTYPES
        and total.stride(-1) == 1 and share.stride(-1) == 1 and total.device == view.device == share.device
        and total.shape[0] == view.shape[0] and total.shape[3] == view.shape[3] for total, share in pairs)


class Grads:
    """The dq, dk, dv totals (B, N, H, D) of q, k, v that executors' backwards write into.

    accumulate=False: every entry has one owner, whose share is written. accumulate=True: several shares
    touch one entry (branches that merge, or several parts) and add up, in `dtype`; the shares of
    `first_branch` (a branch whose calls cover every entry and run first) are written, not added, so the
    totals need no zeros. Totals are allocated on first use, zeroed unless every entry is written; a
    whole-tensor share (a whole-pattern executor's) given before anything else becomes the total itself,
    later shares adding into it with one rounding each.
    """

    def __init__(self, like: tuple[torch.Tensor, torch.Tensor, torch.Tensor], *, accumulate: bool,
                 dtype: torch.dtype, written: bool = False, first_branch: Optional[int] = None,
                 clear: Optional[Callable[..., torch.Tensor]] = None):
        self.like, self.accumulate, self.dtype, self.written = like, accumulate, dtype, written
        # zeroes the entries no share writes (plan.clear_unselected: clear(x, beside=None)), for owned totals
        self.clear = clear
        self.first_branch = first_branch if accumulate else None
        self._totals: list[Optional[torch.Tensor]] = [None, None, None]

    def _new_total(self, index: int) -> tuple[torch.Tensor, Optional[Callable[[torch.Tensor], Any]]]:
        """(an uninitialised total, what zeroes its entries that no share writes: None when shares write them all,
        the plan's clear where it knows them, else a whole zero fill)."""
        like = self.like[index]
        dtype = self.dtype if self.accumulate else like.dtype
        total = torch.empty(like.shape, dtype=dtype, device=like.device)
        if (self.first_branch is not None) if self.accumulate else self.written:
            return total, None
        if self.accumulate or self.clear is None or like.shape[2] != self.like[0].shape[2]:
            return total, zero_whole
        return total, self.clear

    def total(self, index: int) -> torch.Tensor:
        if self._totals[index] is None:
            total, clear = self._new_total(index)
            self._totals[index] = total if clear is None else clear(total)
        return self._totals[index]

    def allocate(self) -> Callable[..., None]:
        """Allocate the totals not yet allocated, leaving their zeroing to the returned function: a caller runs it
        before any share is stored, inside the region its calls are captured in (executors.kernel.run_plan_graph),
        where its launches cost no host time. Called with `beside` (kernels.beside), the plan's fills of exactly the
        entries no share writes run beside the calls that store the shares (the caller joins it)."""
        pending = []
        for index in range(3):
            if self._totals[index] is None:
                self._totals[index], clear = self._new_total(index)
                if clear is not None:
                    pending.append((clear, self._totals[index]))

        def clear_pending(beside: Optional[Beside] = None) -> None:
            for clear, total in pending:
                clear(total, beside=beside)

        return clear_pending

    @property
    def dq(self) -> torch.Tensor:
        return self.total(0)

    @property
    def dk(self) -> torch.Tensor:
        return self.total(1)

    @property
    def dv(self) -> torch.Tensor:
        return self.total(2)

    def owned(self, branch: Optional[int]) -> bool:
        """Whether shares of `branch` are written (their entries are not yet touched by any other share)."""
        return not self.accumulate or (branch is not None and branch == self.first_branch)

    def store(self, index: int, view: torch.Tensor, share: torch.Tensor, branch: Optional[int] = None) -> None:
        """Write (owned) or add one share into a view of dq / dk / dv (index 0 / 1 / 2)."""
        if self.owned(branch):
            view.copy_(share)
        elif view.dtype != share.dtype and share.dtype.itemsize > view.dtype.itemsize:
            view.copy_(view.to(share.dtype) + share)  # a low-precision total: one rounding of the exact sum
        else:
            view.add_(share)

    def store_shares(self, pairs: list[tuple[torch.Tensor, torch.Tensor]], branch: Optional[int] = None, *,
                     fused: bool = False) -> None:
        """`store` for each (view of dq / dk / dv, share) of `pairs`. fused: added shares (not owned) go in one launch
        of `kernels.triton_rows.add_views` where it takes them (Triton on CUDA or its interpreter, totals of
        ROW_DTYPES, (B, L, h, D) views and shares with contiguous last dims): the same sums, one rounding each, in
        one pass where torch runs one strided add per tensor; for calls replayed as a graph, whose launches cost no
        host time."""
        if fused and pairs and not self.owned(branch) and _views_kernel_runs(pairs):
            add_views(pairs)
            return
        for view, share in pairs:
            self.store(0, view, share, branch)

    def add_whole(self, index: int, share: torch.Tensor) -> None:
        """A share covering the whole tensor: the total itself when nothing came before."""
        if self._totals[index] is None:
            self._totals[index] = share
        else:
            self.store(index, self._totals[index], share)

    def results(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The totals in the inputs' dtypes."""
        return tuple(self.total(i).to(t.dtype) for i, t in enumerate(self.like))


@dataclass(frozen=True)
class Executor:
    """An attention executor: its declared capabilities and its operations (see the module docstring).

    unavailable: (device, dtype) -> None when it runs there, else why not (missing package, ...).
    kernel_for: q -> the dense kernel (executors.kernel.DenseKernel) its calls use, for callers that
    run their own calls on it (the ring's steps); None for whole-pattern executors. prepares_slots: its forward
    runs `Slots.take_prepare()`'s initialisation itself before writing (else the caller runs it first).
    """

    name: str
    capabilities: Capabilities
    forward: Callable[..., Any]
    backward: Callable[..., None]
    unavailable: Callable[[Optional[torch.device], Optional[torch.dtype]], Optional[str]] = lambda device, dtype: None
    description: str = ""
    kernel_for: Optional[Callable[[torch.Tensor], Any]] = None
    prepares_slots: bool = False

    def unavailable_reason(self, device: torch.device | str | None = None, dtype: Optional[torch.dtype] = None,
                           head_dim: Optional[int] = None) -> Optional[str]:
        """Why this executor cannot run on (device, dtype, head_dim), or None when it can."""
        caps = self.capabilities
        device = torch.device(device) if device is not None else None
        if caps.package is not None and not _importable(caps.package):
            return f"the package {caps.package!r} is not installed (pip install '{caps.install or caps.package}')"
        if device is not None and device.type not in caps.devices:
            return f"it runs on {' or '.join(caps.devices)}, not {device.type}"
        reason = self.unavailable(device, dtype)
        if reason is not None:
            return reason
        if dtype is not None and dtype not in caps.dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in caps.dtypes)
            return f"dtype must be one of {names}; got {str(dtype).removeprefix('torch.')}"
        if head_dim is not None and not caps.takes_head_dim(head_dim, None if device is None else device.type):
            largest, multiple = caps.head_dims_on(None if device is None else device.type)
            where = f" on {device.type}" if device is not None else ""
            return f"head dim must be a multiple of {multiple} up to {largest}{where}; got {head_dim}"
        if device is not None and device.type == "cuda" and caps.min_capability > (0, 0) and torch.cuda.is_available():
            capability = torch.cuda.get_device_capability(device)
            if capability < caps.min_capability:
                return (f"it needs compute capability >= {caps.min_capability[0]}.{caps.min_capability[1]}, "
                        f"got {capability[0]}.{capability[1]}")
        return None


@functools.lru_cache(maxsize=None)
def _importable(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):  # a parent package is missing
        return False


def lse_share_inputs(grad_lse: torch.Tensor, q: torch.Tensor, v: torch.Tensor):
    """(grad_out, out, v) that make a kernel backward return the LSE's gradient share in dq and dk.

    With dO = e_0, O = -g e_0 and V = 0 the kernel's dS = P * (dP - rowsum(dO * O)) = P * g: exactly
    d(g * LSE)/dS. q: a (b, Lq, h, D) call view; grad_lse (b, h, Lq); v: the call's value view (its zero
    stand-in has v's shape). g is rounded to q's dtype."""
    unit = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    unit[..., 0] = 1
    shifted = torch.zeros_like(unit)
    shifted[..., 0] = -grad_lse.transpose(1, 2).to(q.dtype)
    return unit, shifted, torch.zeros(v.shape, dtype=v.dtype, device=v.device)
