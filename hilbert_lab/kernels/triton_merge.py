"""One-pass LSE merge of P partial attention results (Triton), max-subtracted and sum-normalised.

`merge_partials(outs, lses, out, lse)`: outs (P, R, D) (any float dtype; entries whose LSE is -inf
are never read into the result, so they may hold garbage), lses (P, R) float32 ->
out (R, D) = sum_p w_p outs_p / sum_p w_p with w_p = exp(lse_p - max_p lse_p), and
lse (R,) = max + log(sum_p w_p); rows with every lse_p = -inf give out 0 and lse -inf; a NaN
lse_p gives NaN in out and lse. With `over_first=True` out and lse are outs[0] and lses[0] themselves: the merge is
written over the first part, and the rows that part alone holds (every other lse_p -inf, its own finite), which
already are their merge, are neither read nor written. Plain tensors in, nothing from hilbert_lab imported.
"""
from __future__ import annotations

import torch

from hilbert_lab.kernels.triton_support import HAVE_TRITON, require_triton, tl, triton  # None where Triton is missing

if HAVE_TRITON:

    @triton.jit
    def _merge_kernel(outs_ptr, lses_ptr, out_ptr, lse_ptr, rows, dim, P: tl.constexpr, BLOCK_R: tl.constexpr,
                      BLOCK_D: tl.constexpr, OVER_FIRST: tl.constexpr):
        pid = tl.program_id(0)
        r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
        c = tl.arange(0, BLOCK_D)
        rmask = r < rows
        lse_index = r
        first = tl.load(lses_ptr + lse_index, mask=rmask, other=float("-inf"))
        peak = tl.maximum(tl.full((BLOCK_R,), float("-inf"), tl.float32), first)
        nan = first != first
        others_empty = rmask
        for p in tl.static_range(1, P):
            part = tl.load(lses_ptr + p * rows + lse_index, mask=rmask, other=float("-inf"))
            nan = nan | (part != part)
            peak = tl.maximum(peak, part)
            others_empty = others_empty & (part == float("-inf"))
        if OVER_FIRST:  # rows the first part alone holds are their merge already: not read, not written
            rmask = rmask & ~(others_empty & (first > float("-inf")) & (first < float("inf")))
        mask = rmask[:, None] & (c[None, :] < dim)
        peak = tl.where(peak == float("-inf"), 0.0, peak)
        total = tl.zeros((BLOCK_R,), tl.float32)
        acc = tl.zeros((BLOCK_R, BLOCK_D), tl.float32)
        offsets = r.to(tl.int64)[:, None] * dim + c[None, :]
        for p in tl.static_range(P):
            w = tl.exp(tl.load(lses_ptr + p * rows + lse_index, mask=rmask, other=float("-inf")) - peak)
            w = tl.where(w == w, w, 0.0)
            total += w
            x = tl.load(outs_ptr + (p * rows).to(tl.int64) * dim + offsets, mask=mask & (w[:, None] > 0), other=0.0).to(tl.float32)
            acc += w[:, None] * x
        positive = total > 0
        acc = acc / tl.where(positive, total, 1.0)[:, None]
        acc = tl.where(nan[:, None], float("nan"), acc)
        merged = tl.where(positive, peak + tl.log(tl.where(positive, total, 1.0)), float("-inf"))
        tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(lse_ptr + lse_index, tl.where(nan, float("nan"), merged), mask=rmask)


def merge_partials(outs: torch.Tensor, lses: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, *,
                   over_first: bool = False) -> None:
    """Write the merge of outs (P, R, D) / lses (P, R) float32 into out (R, D) and lse (R,) (all contiguous).
    over_first: out and lse are outs[0] and lses[0] (the same memory); rows that only the first part holds are left
    as they are."""
    require_triton("merge_partials")
    parts, rows, dim = outs.shape
    if lses.shape != (parts, rows) or out.shape != (rows, dim) or lse.shape != (rows,):
        raise ValueError(f"shapes must be outs (P, R, D), lses (P, R), out (R, D), lse (R,); got {tuple(outs.shape)}, "
                         f"{tuple(lses.shape)}, {tuple(out.shape)}, {tuple(lse.shape)}")
    if not all(t.is_contiguous() for t in (outs, lses, out, lse)) or lses.dtype != torch.float32 or lse.dtype != torch.float32:
        raise ValueError("outs, lses, out, lse must be contiguous, lses and lse float32")
    if over_first and (out.data_ptr() != outs.data_ptr() or lse.data_ptr() != lses.data_ptr()
                       or out.dtype != outs.dtype):
        raise ValueError("over_first=True needs out and lse to be outs[0] and lses[0] themselves")
    block_d = triton.next_power_of_2(dim)
    block_r = max(1, min(128, 4096 // block_d))
    _merge_kernel[(triton.cdiv(rows, block_r),)](outs, lses, out, lse, rows, dim, P=parts, BLOCK_R=block_r,
                                                  BLOCK_D=block_d, OVER_FIRST=over_first, num_warps=4)


if HAVE_TRITON:

    @triton.jit
    def _accumulate_kernel(acc_ptr, acc_lse_ptr, part_ptr, part_lse_ptr, rows, dim, BLOCK_R: tl.constexpr,
                           BLOCK_D: tl.constexpr):
        pid = tl.program_id(0)
        r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
        c = tl.arange(0, BLOCK_D)
        rmask = r < rows
        mask = rmask[:, None] & (c[None, :] < dim)
        a = tl.load(acc_lse_ptr + r, mask=rmask, other=float("-inf"))
        b = tl.load(part_lse_ptr + r, mask=rmask, other=float("-inf"))
        nan = (a != a) | (b != b)
        a = tl.where(nan, float("-inf"), a)
        b = tl.where(nan, float("-inf"), b)
        peak = tl.maximum(a, b)
        peak = tl.where(peak == float("-inf"), 0.0, peak)
        wa = tl.exp(a - peak)
        wb = tl.exp(b - peak)
        total = wa + wb
        positive = total > 0
        norm = tl.where(positive, total, 1.0)
        offsets = r.to(tl.int64)[:, None] * dim + c[None, :]
        acc = tl.load(acc_ptr + offsets, mask=mask & (wa[:, None] > 0), other=0.0)
        x = tl.load(part_ptr + offsets, mask=mask & (wb[:, None] > 0), other=0.0).to(tl.float32)
        merged = tl.where(nan[:, None], float("nan"), (wa[:, None] * acc + wb[:, None] * x) / norm[:, None])
        tl.store(acc_ptr + offsets, merged, mask=mask)
        merged_lse = tl.where(positive, peak + tl.log(norm), float("-inf"))
        tl.store(acc_lse_ptr + r, tl.where(nan, float("nan"), merged_lse), mask=rmask)


def accumulate(acc: torch.Tensor, acc_lse: torch.Tensor, part: torch.Tensor, part_lse: torch.Tensor) -> None:
    """Merge one partial result into a running one, in place: acc (R, D) float32 and acc_lse (R,) float32
    become the LSE merge of themselves and part (R, D) (any float dtype) / part_lse (R,) float32 (all
    contiguous; rows whose lse is -inf on one side take the other side; -inf on both stay -inf; NaN on
    either side gives NaN)."""
    require_triton("accumulate")
    rows, dim = acc.shape
    if acc_lse.shape != (rows,) or part.shape != (rows, dim) or part_lse.shape != (rows,):
        raise ValueError(f"shapes must be acc (R, D), acc_lse (R,), part (R, D), part_lse (R,); got "
                         f"{tuple(acc.shape)}, {tuple(acc_lse.shape)}, {tuple(part.shape)}, {tuple(part_lse.shape)}")
    if not all(t.is_contiguous() for t in (acc, acc_lse, part, part_lse)) or \
            any(t.dtype != torch.float32 for t in (acc, acc_lse, part_lse)):
        raise ValueError("acc, acc_lse, part, part_lse must be contiguous; acc, acc_lse and part_lse float32")
    block_d = triton.next_power_of_2(dim)
    block_r = max(1, min(128, 4096 // block_d))
    _accumulate_kernel[(triton.cdiv(rows, block_r),)](acc, acc_lse, part, part_lse, rows, dim, BLOCK_R=block_r,
                                                      BLOCK_D=block_d, num_warps=4)
