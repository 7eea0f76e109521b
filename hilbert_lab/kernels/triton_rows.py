"""Writing or adding the listed rows of shares into strided totals, in one launch (Triton).

`put_rows(pairs, rows, accumulate=True)`: total[rows[i]] += share[rows[i]] (accumulate=False: =) for up to three
(total, share) pairs of (R, h, D) tensors (h may differ between pairs; any strides, last dim contiguous), each
listed row once: plain loads and stores, no atomics, deterministic; a sum is taken in float32 and rounded once to
the total's dtype. A packed row's outputs, LSEs and gradient shares land at the rows of their runs only this way
(attention.executors.varlen), where torch needs a gather and an indexed write, or an atomic `index_add_`, per
tensor.
"""
from __future__ import annotations

from typing import Sequence

import torch

from hilbert_lab.kernels.triton_support import HAVE_TRITON, require_triton, tl, triton

__all__ = ["HAVE_TRITON", "ROW_DTYPES", "put_rows"]

ROW_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # totals a float32 sum is rounded to once
_TILE = 4096  # elements of one program: rows x heads x head dim, the last two as powers of two

if HAVE_TRITON:

    @triton.jit
    def _put_pair(total, share, row, listed, st_r, st_h, ss_r, ss_h, heads, dim, BH: tl.constexpr, BD: tl.constexpr,
                  ADD: tl.constexpr):
        h = tl.arange(0, BH)
        d = tl.arange(0, BD)
        mask = listed[:, None, None] & (h < heads)[None, :, None] & (d < dim)[None, None, :]
        x = tl.load(share + row[:, None, None] * ss_r + h[None, :, None] * ss_h + d[None, None, :], mask=mask,
                    other=0.0)
        at = total + row[:, None, None] * st_r + h[None, :, None] * st_h + d[None, None, :]
        if ADD:
            y = tl.load(at, mask=mask, other=0.0)
            tl.store(at, (y.to(tl.float32) + x.to(tl.float32)).to(total.dtype.element_ty), mask=mask)
        else:
            tl.store(at, x.to(total.dtype.element_ty), mask=mask)

    @triton.jit
    def _put_rows_kernel(t0, s0, t1, s1, t2, s2, rows, count, g0_tr, g0_th, g0_sr, g0_sh, g0_h, g1_tr, g1_th, g1_sr,
                         g1_sh, g1_h, g2_tr, g2_th, g2_sr, g2_sh, g2_h, dim,
                         BR: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr, ADD: tl.constexpr):
        i = tl.program_id(0) * BR + tl.arange(0, BR)
        pair = tl.program_id(1)
        listed = i < count
        row = tl.load(rows + i, mask=listed, other=0).to(tl.int64)
        if pair == 0:
            _put_pair(t0, s0, row, listed, g0_tr, g0_th, g0_sr, g0_sh, g0_h, dim, BH, BD, ADD)
        elif pair == 1:
            _put_pair(t1, s1, row, listed, g1_tr, g1_th, g1_sr, g1_sh, g1_h, dim, BH, BD, ADD)
        else:
            _put_pair(t2, s2, row, listed, g2_tr, g2_th, g2_sr, g2_sh, g2_h, dim, BH, BD, ADD)


def put_rows(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], rows: torch.Tensor, *,
             accumulate: bool = True) -> None:
    """total[rows] += share[rows] (accumulate=False: total[rows] = share[rows]) for each (total, share) of `pairs`
    (one to three): total (R, h, D) of a ROW_DTYPES dtype, share of its shape, all on one device with one R and D,
    last dims contiguous; rows (n,) int64 or int32 on that device, each row at most once."""
    require_triton("put_rows")
    if not 1 <= len(pairs) <= 3:
        raise ValueError(f"pairs must hold one to three (total, share) pairs, got {len(pairs)}")
    first = pairs[0][0]
    for total, share in pairs:
        if total.shape != share.shape or total.dim() != 3 or total.stride(-1) != 1 or share.stride(-1) != 1 or \
                total.shape[0] != first.shape[0] or total.shape[2] != first.shape[2] or total.dtype not in ROW_DTYPES:
            raise ValueError(f"each pair must be (R, h, D) tensors of one shape, one R and D across pairs, contiguous "
                             f"last dims, totals of {ROW_DTYPES}; got {tuple(total.shape)} {total.stride()} "
                             f"{total.dtype} and {tuple(share.shape)} {share.stride()}")
    count = rows.shape[0]
    if count == 0:
        return
    padded = list(pairs) + [pairs[0]] * (3 - len(pairs))  # unused slots: never read (the grid has len(pairs))
    geometry = [g for t, s in padded for g in (t.stride(0), t.stride(1), s.stride(0), s.stride(1), t.shape[1])]
    dim = first.shape[2]
    block_h = triton.next_power_of_2(max(t.shape[1] for t, _ in pairs))
    block_d = triton.next_power_of_2(dim)
    block_r = max(1, _TILE // (block_h * block_d))
    tensors = [x for pair in padded for x in pair]
    _put_rows_kernel[(triton.cdiv(count, block_r), len(pairs))](*tensors, rows, count, *geometry, dim, BR=block_r,
                                                                BH=block_h, BD=block_d, ADD=accumulate, num_warps=4)
