"""Dense attention kernels and the one protocol every kernel call goes through.

A `DenseKernel` computes attention on one call's views: q (b, Lq, h, D), k and v (b, L, h_kv, D), last
dimension contiguous. forward -> (out (b, Lq, h, D), lse (b, h, Lq) float32/float64 or None when not
asked for, aux); backward(grad_out, q, k, v, out, lse, aux, grad_lse=None) -> (dq, dk, dv) for a given
(possibly *merged*) out and LSE, whose rows without keys hold +inf (so that p = exp(s - lse) = 0).

`call_forward` / `call_backward` wrap a kernel with what a kernel need not know, in one place:
- a call the kernel does not take (keys fewer than `min_length`) runs on the eager `fallback` kernel;
- fewer key/value heads than query heads on a kernel without `gqa`: the call reads k, v repeated per
  query head and sums dk, dv back over each group;
- causal with fewer queries than keys on a kernel without `bottom_right`: the keys before the queries'
  segment part are one non-causal call and the last Lq keys one causal call, merged by LSE (one query, a
  decoding step, sees every key: one call without a mask);
- the LSE gradient on a kernel without `grad_lse`: one more backward call with dO = e_0, O = -g e_0,
  V = 0 (base.lse_share_inputs);
- non-finite inputs on the CPU: a row's output and LSE depend only on the keys it attends, so the
  kernel runs on finite stand-ins and each row then gets NaN (a NaN/inf query, or an attended key
  with a NaN/inf) or the IEEE sum of the non-finite values it attends (NaN, +inf, -inf) per value
  dimension. Fused GPU kernels multiply a masked weight of 0 with a value inside a tile, as every
  fused attention kernel does; this check is left out there because it would cost a device sync.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from hilbert_lab.attention.executors.base import lse_share_inputs
from hilbert_lab.attention.merge import merge_lse
from hilbert_lab.attention.plan import Plan
from hilbert_lab.attention.target import counting_workspace, holding_workspace
from hilbert_lab.attention.validation import kernel_layout
from hilbert_lab.attention.views import plan_cached_values
from hilbert_lab.kernels.graph_regions import GraphRegions

_NO_WORKSPACE = contextlib.nullcontext()  # a call outside dry runs: nothing to count

# The calls of one plan on a kernel declaring `graphs` (a packed row's packs, or a plan's blocks) run as one CUDA
# graph per direction and (plan, tensor addresses) from the third call on (kernels.graph_regions): a plan's tens of
# calls then cost one graph launch of host time. `GRAPH_REGIONS.enabled = False` keeps every call eager.
GRAPH_REGIONS = GraphRegions()


def run_plan_graph(what: str, plans: tuple[Plan, ...], key: tuple, tensors, launch: Callable[[], Any], *,
                   keep: Any = ()) -> None:
    """launch(), the calls of plans[0] in one direction touching only `tensors`, as one region of GRAPH_REGIONS keyed
    by `what`, that plan object and `key`. The plans, `keep` and the device metadata cached for the plans live as
    long as the graph (a cache eviction cannot free what it reads)."""
    GRAPH_REGIONS.run((what, id(plans[0]), *key), tensors, launch,
                      keep=lambda: (plans, keep, plan_cached_values(*plans)))


@dataclass(frozen=True)
class DenseKernel:
    """One dense attention kernel and what it takes (see the module docstring)."""

    name: str
    forward: Callable[..., tuple[torch.Tensor, Optional[torch.Tensor], Any]]
    backward: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    min_length: int = 1
    gqa: bool = False
    bottom_right: bool = False
    grad_lse: bool = False
    dense_out_lse: bool = False  # its backward wants out and grad_out of a call packed (contiguous)
    fallback: Optional["DenseKernel"] = None
    workspace: Optional[Callable[[torch.Tensor, torch.Tensor, bool], int]] = None
    meta: bool = True
    writes_into: bool = False
    # the kernel for calls whose key count changes from call to call (decoding steps), where this one pays a
    # per-shape set-up on each new count (cuDNN builds an execution graph per shape: tens to hundreds of ms)
    varying_lengths: Optional["DenseKernel"] = None
    # its calls read no device value on the host, and their backward needs no more than call_state rebuilds: a
    # plan's calls on it may be captured and replayed as one CUDA graph (GRAPH_REGIONS)
    graphs: bool = False
    # (q, k, causal) -> the aux its forward returns for that call (k with its own key/value heads), from shapes
    # and device alone (no attention computed), for a backward run without the forward's states (attention.op);
    # None: its aux is None
    aux_for: Optional[Callable[[torch.Tensor, torch.Tensor, bool], Any]] = None

    def holding(self, q: torch.Tensor, k: torch.Tensor, backward: bool):
        """A context for one call: the call's internal workspace (bytes the kernel allocates out of sight), counted
        by a dry run while the call runs."""
        if self.workspace is None or not counting_workspace():
            return _NO_WORKSPACE
        return holding_workspace(self.workspace(q, k, backward))


@dataclass
class CallState:
    """What one call's backward needs: the kernel that ran and its aux, or the pieces it was split into."""

    kernel: DenseKernel
    aux: Any = None
    split: Optional[tuple] = None  # bottom-right causal: (prefix keys, state of prefix call, state of diagonal call)


def _expand(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(b, L, h_kv, D) -> (b, L, h_kv * groups, D): each key/value head repeated for its query heads."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=2)


def _reduce(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(b, L, h, D) -> (b, L, h / groups, D): shares of the query heads of a group summed."""
    return x if groups == 1 else x.unflatten(2, (-1, groups)).sum(3)


def _shapes_forward(q, k, v, *, causal, scale, need_lse=True, out=None):
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32, device=q.device)
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device) if out is None else out), lse, None


def _shapes_backward(grad_out, q, k, v, out, lse, aux=None, *, causal, scale, grad_lse=None, into=None):
    if into is not None:
        return into
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))


# What a kernel without meta support allocates (its outputs), for dry runs on meta tensors.
SHAPES = DenseKernel("shapes", _shapes_forward, _shapes_backward, gqa=True, bottom_right=True, grad_lse=True)


def _pick(kernel: DenseKernel, q: torch.Tensor, k: torch.Tensor) -> DenseKernel:
    if k.shape[1] < kernel.min_length and kernel.fallback is not None:
        kernel = kernel.fallback
    if q.device.type == "meta" and not kernel.meta:
        return DenseKernel(kernel.name, SHAPES.forward, SHAPES.backward, workspace=kernel.workspace, gqa=True,
                           bottom_right=True, grad_lse=True, writes_into=kernel.writes_into)
    return kernel


def call_forward(kernel: DenseKernel, q, k, v, *, causal: bool, scale: float, need_lse: bool = True,
                 out: Optional[torch.Tensor] = None):
    """(out (b, Lq, h, D), lse (b, h, Lq) or None, CallState) of one call; see the module docstring.
    out: where the caller keeps the result (a view); a kernel that `writes_into` writes it there in
    place and returns that very tensor, others return their own."""
    q, k, v = kernel_layout(q), kernel_layout(k), kernel_layout(v)
    kernel = _pick(kernel, q, k)
    lq, lk = q.shape[1], k.shape[1]
    if causal and lq == 1:  # one query at the bottom right sees every key: no mask (a decoding step)
        causal = False
    if causal and lq < lk and not kernel.bottom_right:
        prefix = lk - lq
        out_a, lse_a, state_a = call_forward(kernel, q, k[:, :prefix], v[:, :prefix], causal=False, scale=scale)
        out_b, lse_b, state_b = call_forward(kernel, q, k[:, prefix:], v[:, prefix:], causal=True, scale=scale)
        out, lse = merge_lse([out_a, out_b], [lse_a, lse_b])
        return out.to(q.dtype), lse, CallState(kernel, split=(prefix, state_a, state_b))
    if q.device.type == "cpu" and not all(all_finite(t) for t in (q, k, v)):
        return _nonfinite_forward(kernel, q, k, v, causal=causal, scale=scale)
    groups = q.shape[2] // k.shape[2]
    if not kernel.gqa:
        k, v = _expand(k, groups), _expand(v, groups)
    extra = {"out": out} if kernel.writes_into and out is not None else {}
    with kernel.holding(q, k, False):
        result, lse, aux = kernel.forward(q, k, v, causal=causal, scale=scale, need_lse=need_lse, **extra)
    return result, lse, CallState(kernel, aux)


def call_state(kernel: DenseKernel, q, k, *, causal: bool) -> CallState:
    """The CallState `call_forward` returns for this call, from the shapes alone: the same kernel pick, the
    same bottom-right split and the kernel's `aux_for`. A backward run without its forward's states (the
    custom op's, whose forward and backward are separate ops) rebuilds them with this."""
    q, k = kernel_layout(q), kernel_layout(k)
    kernel = _pick(kernel, q, k)
    lq, lk = q.shape[1], k.shape[1]
    if causal and lq == 1:
        causal = False
    if causal and lq < lk and not kernel.bottom_right:
        prefix = lk - lq
        return CallState(kernel, split=(prefix, call_state(kernel, q, k[:, :prefix], causal=False),
                                        call_state(kernel, q, k[:, prefix:], causal=True)))
    return CallState(kernel, None if kernel.aux_for is None else kernel.aux_for(q, k, causal))


def guard_lse(lse: torch.Tensor) -> torch.Tensor:
    """A merged LSE for kernel backwards: rows without keys (-inf) as +inf, so that p = exp(s - lse) = 0 (NaN and
    +inf kept; one elementwise launch, the layout of lse kept)."""
    return torch.nan_to_num(lse, nan=float("nan"), posinf=float("inf"), neginf=float("inf"))


def call_backward(state: CallState, grad_out, q, k, v, out, lse, *, causal: bool, scale: float,
                  grad_lse: Optional[torch.Tensor] = None,
                  into: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None, guarded: bool = False):
    """(dq, dk, dv) of one call for a given (merged) out and lse (b, h, Lq); grad_out (b, Lq, h, D) and
    grad_lse (b, h, Lq) may each be None (zero). into: views the shares may be written into (the caller
    owns those entries); a kernel that `writes_into` writes them there and returns those tensors.
    guarded: lse already went through `guard_lse` (once for every call of a plan)."""
    if causal and q.shape[1] == 1:  # as in call_forward
        causal = False
    if not guarded:
        lse = guard_lse(lse)
    kernel = state.kernel
    if state.split is not None:
        prefix, state_a, state_b = state.split
        dq_a, dk_a, dv_a = call_backward(state_a, grad_out, q, k[:, :prefix], v[:, :prefix], out, lse, causal=False,
                                         scale=scale, grad_lse=grad_lse, guarded=True)
        dq_b, dk_b, dv_b = call_backward(state_b, grad_out, q, k[:, prefix:], v[:, prefix:], out, lse, causal=True,
                                         scale=scale, grad_lse=grad_lse, guarded=True)
        return dq_a + dq_b, torch.cat([dk_a, dk_b], 1), torch.cat([dv_a, dv_b], 1)
    groups = q.shape[2] // k.shape[2]
    if not kernel.gqa:
        k, v = _expand(k, groups), _expand(v, groups)
    if kernel.grad_lse:
        if grad_out is None:
            grad_out = torch.zeros_like(q)
        extra = {"into": into} if kernel.writes_into and into is not None else {}
        with kernel.holding(q, k, True):
            dq, dk, dv = kernel.backward(grad_out, q, k, v, out, lse, state.aux, causal=causal, scale=scale,
                                         grad_lse=grad_lse, **extra)
    else:
        if grad_out is not None:
            with kernel.holding(q, k, True):
                dq, dk, dv = kernel.backward(grad_out, q, k, v, out, lse, state.aux, causal=causal, scale=scale)
        else:
            dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        if grad_lse is not None:
            unit, shifted, zero_v = lse_share_inputs(grad_lse, q, v)
            with kernel.holding(q, k, True):
                extra_q, extra_k, _ = kernel.backward(unit, q, k, zero_v, shifted, lse, state.aux, causal=causal,
                                                      scale=scale)
            dq, dk = dq + extra_q, dk + extra_k
    if not kernel.gqa:
        dk, dv = _reduce(dk, groups), _reduce(dv, groups)
    return dq, dk, dv


def all_finite(x: torch.Tensor) -> bool:
    """Whether every element of x is finite, by one reduction without an x-sized temporary (NaN propagates
    through the minimum and maximum)."""
    if x.numel() == 0:
        return True
    low, high = torch.aminmax(x)
    return bool(torch.isfinite(low) & torch.isfinite(high))


def allowed_pairs(lq: int, lk: int, causal: bool, device) -> torch.Tensor:
    """bool (Lq, Lk): query i (position lk - lq + i) may attend key j (bottom-right aligned when causal)."""
    if not causal:
        return torch.ones(lq, lk, dtype=torch.bool, device=device)
    return torch.arange(lk, device=device)[None, :] <= torch.arange(lk - lq, lk, device=device)[:, None]


def _nonfinite_forward(kernel: DenseKernel, q, k, v, *, causal: bool, scale: float):
    """The kernel on finite stand-ins, then each row's non-finite result from what it attends alone."""
    finite = [torch.where(t.isfinite(), t, torch.zeros((), dtype=t.dtype)) for t in (q, k, v)]
    out, lse, state = call_forward(kernel, *finite, causal=causal, scale=scale)
    groups = q.shape[2] // k.shape[2]
    allowed = allowed_pairs(q.shape[1], k.shape[1], causal, q.device).to(torch.float64)  # (Lq, Lk)

    def attended(indicator: torch.Tensor) -> torch.Tensor:
        """indicator (b, Lk, h_kv, *) -> per query row the count over the keys it attends: (b, Lq, h, *)."""
        counts = torch.einsum("qk,bkh...->bqh...", allowed, indicator.to(torch.float64))
        return counts.repeat_interleave(groups, dim=2) > 0

    has_keys = (allowed.sum(1) > 0)[None, :, None]
    bad_rows = (~q.isfinite().all(-1) | attended(~k.isfinite().all(-1))) & has_keys  # (b, Lq, h)
    nan = float("nan")
    values = torch.where(attended(v.isnan()) | (attended(v == float("inf")) & attended(v == float("-inf"))),
                         nan, torch.where(attended(v == float("inf")), float("inf"),
                                          torch.where(attended(v == float("-inf")), float("-inf"), out.double())))
    out = torch.where(bad_rows[..., None], nan, values).to(out.dtype)
    if lse is not None:
        lse = torch.where(bad_rows.transpose(1, 2), nan, lse)
    return out, lse, state
