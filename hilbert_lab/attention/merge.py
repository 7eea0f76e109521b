"""The LSE merge of partial attention results (-inf safe, NaN propagating, differentiable), in one home.

`merge_lse` merges a list of parts under autograd; `merge_slots` merges the slot buffers of the one
attention function (the fused Triton merge is its fast path on CUDA); `shifted_exp` is the guarded
softmax core that the eager kernels and the float64 oracle share.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from hilbert_lab.attention.target import device_facts
from hilbert_lab.kernels import triton_merge

FUSED_MERGE_DEVICES = ("cuda",)  # where the Triton merge runs (tests add "cpu" with a stand-in for it)


def shifted_exp(x: torch.Tensor, dim: int, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Max-subtracted exponentials of `scale * x` along `dim`, for softmaxes exact at any score scale.

    Returns (weights, total, lse): weights = exp((x - m) * scale) with m = max over `dim` (the
    largest weight is exactly 1; all 0 for slices whose scaled scores are all -inf, underflowed
    ones included), total = their sum over `dim` (keepdim; 1 for such slices, so that dividing by
    it is safe) and lse = m * scale + log(total) with `dim` removed (-inf for such slices). The max
    is subtracted before scaling (scale > 0), so no weight overflows, even where scale * x would;
    the LSE is then its value rounded to x's dtype (inf beyond its range). A NaN in a slice makes
    its weights, total and lse NaN. Normalise with weights / total (never exp(x - lse): at large
    scores lse is rounded and those weights would not sum to 1). Differentiable, with finite
    (zero) gradients for all -inf slices.
    """
    peak = x.detach().amax(dim=dim, keepdim=True)
    empty = (peak if scale == 1.0 else peak * scale) == float("-inf")  # every scaled score -inf: no weight
    peak = torch.where(empty, float("inf"), torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak)))
    weights = torch.exp(x - peak if scale == 1.0 else (x - peak) * scale)
    total = weights.sum(dim=dim, keepdim=True)
    total = torch.where(empty, torch.ones_like(total), total)
    lse = torch.where(empty, torch.full_like(total, float("-inf")),
                      (peak if scale == 1.0 else peak * scale) + torch.log(total))
    return weights, total, lse.squeeze(dim)


def safe_logsumexp(x: torch.Tensor, dim: int) -> torch.Tensor:
    """logsumexp over `dim` that returns -inf for all -inf slices with finite (zero) gradients."""
    return shifted_exp(x, dim)[2]


def merge_lse(
    outs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge partial attention results over disjoint (multi)sets of keys.

    outs: each (B, N, H, D), the normalised partial outputs; lses: each (B, H, N), their
    log-sum-exps (-inf where a part saw no keys; such a part's output is never read). Returns
    (out (B, N, H, D), lse (B, H, N)). Max-subtracted and sum-normalised, so the weights sum to 1
    at any score scale: m = max_i lse_i, w_i = exp(lse_i - m), out = sum_i w_i out_i / sum_i w_i,
    lse = m + log(sum_i w_i). Rows with no keys in any part give out 0 and lse -inf without NaN in
    forward or backward; a NaN lse_i gives NaN. Gradients flow through the merge weights. Weights
    and the sum are computed in the LSE dtype (float32 or float64). The merge adds no error of its
    own; what remains is the rounding of the lse_i themselves (ulp(|lse_i|) / 2: ~5e-4 at 1e4 in
    float32), which shifts weights of parts whose lse_i differ by O(1).
    """
    if len(outs) != len(lses) or not outs:
        raise ValueError(f"outs and lses must be non-empty and of equal length, got {len(outs)} and {len(lses)}")
    for o, l in zip(outs, lses):
        if o.dim() != 4 or l.shape != (o.shape[0], o.shape[2], o.shape[1]):
            raise ValueError(
                f"outs must be (B, N, H, D) and lses (B, H, N); got {tuple(o.shape)} and {tuple(l.shape)}"
            )
    if len(outs) == 1:
        return outs[0], lses[0]
    stacked = torch.stack(list(lses), dim=0)  # (P, B, H, N)
    weights, total, lse = shifted_exp(stacked, dim=0)  # weights in [0, 1], total (1, B, H, N) in [1, P]
    out = None
    for weight, part, part_lse in zip(weights, outs, lses):
        read = part_lse.detach() != float("-inf")  # an empty part's output is never read (it may be garbage)
        term = weight.transpose(1, 2).unsqueeze(-1) * torch.where(
            read.transpose(1, 2).unsqueeze(-1), part.to(weight.dtype), torch.zeros((), dtype=weight.dtype, device=part.device))
        out = term if out is None else out + term
    out = out / total[0].transpose(1, 2).unsqueeze(-1)
    return out.to(outs[0].dtype), lse


def fused_merge_applies(outs: torch.Tensor, lses: torch.Tensor) -> bool:
    """Whether `merge_slots` takes the fused Triton merge for these slot buffers (device and dtypes)."""
    return (triton_merge.HAVE_TRITON and device_facts(outs)[0] in FUSED_MERGE_DEVICES
            and lses.dtype == torch.float32 and outs.dtype != torch.float64)


def merge_slots(outs: torch.Tensor, lses: torch.Tensor, dtype: torch.dtype, *,
                over_first: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge slot partials outs (P, B, N, H, D), lses (P, B, N, H) (token-major, as the slots are written)
    by LSE: (out (B, N, H, D) in `dtype`, lse (B, H, N)). With several slots, entries whose lse is -inf are
    never read, so those buffers need no zeros.

    over_first: the fused merge may write the result over the first slot and return views of outs[0] and lses[0]:
    the entries that slot alone holds (every other slot's LSE -inf) are then neither read nor written (a LongNet
    forward whose first branch has dilation 1 holds 3/8 of its rows in one slot at [1, 2, 4]). The returned views
    keep all the slots alive as long as they live: not for a result kept for a backward."""
    if outs.shape[0] == 1:  # one slot is the result itself (its rows without keys were zeroed by the caller)
        return outs[0].to(dtype), lses[0].transpose(1, 2)
    pending = fused_merge(outs, lses, dtype, over_first=over_first)
    if pending is not None:
        out, lse, run = pending
        run()
        return out, lse
    out, lse = merge_lse(list(outs), [t.transpose(1, 2) for t in lses])
    return out.to(dtype).contiguous(), lse


def fused_merge(outs: torch.Tensor, lses: torch.Tensor, dtype: torch.dtype, *,
                over_first: bool = False) -> Optional[tuple[torch.Tensor, torch.Tensor, Callable[[], None]]]:
    """`merge_slots` of several slots by the fused Triton merge, split in two: (out (B, N, H, D), lse (B, H, N), run)
    with the result's buffers allocated (or, over_first, views of the first slot) and run() writing the merge into
    them (nothing on meta tensors: a dry run counts the buffers); None where the fused merge does not apply. A
    caller may run run() later, e.g. inside a captured region after the slots' last write."""
    parts, dim = outs.shape[0], outs.shape[-1]
    if parts < 2 or not fused_merge_applies(outs, lses):
        return None
    if over_first and outs.dtype == dtype:
        out, lse = outs[0], lses[0]
    else:
        over_first = False
        out = torch.empty(outs.shape[1:], dtype=dtype, device=outs.device)
        lse = torch.empty(lses.shape[1:], dtype=torch.float32, device=outs.device)

    def run() -> None:
        if outs.device.type == "meta":
            return
        if over_first:  # the first slot itself is written: views, never copies
            parts_out, parts_lse = outs.view(parts, -1, dim), lses.view(parts, -1)
        else:
            parts_out, parts_lse = outs.reshape(parts, -1, dim), lses.reshape(parts, -1)
        triton_merge.merge_partials(parts_out, parts_lse, out.view(-1, dim), lse.view(-1), over_first=over_first)

    return out, lse.transpose(1, 2), run


def merge_into(acc: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Merge one partial result into a running one, in place (a ring step's result into its rows' running
    result): acc (B, N, H, D) and acc_lse (B, H, N) in the LSE dtype become `merge_lse` of themselves and
    out (B, N, H, D) / lse (B, H, N). The fused Triton merge where `merge_slots` takes it and acc is stored
    (B, H, N, D)."""
    if fused_merge_applies(acc, acc_lse) and acc.transpose(1, 2).is_contiguous() and acc_lse.is_contiguous():
        dim = acc.shape[-1]
        if acc.device.type != "meta":
            triton_merge.accumulate(acc.transpose(1, 2).view(-1, dim), acc_lse.view(-1),
                                    out.transpose(1, 2).contiguous().view(-1, dim), lse.float().contiguous().view(-1))
        return
    merged, merged_lse = merge_lse([acc, out], [acc_lse, lse.to(acc_lse.dtype)])
    acc.copy_(merged)
    acc_lse.copy_(merged_lse)
