"""Adding the listed rows of a share into a strided total, in one launch (Triton).

`add_rows(total, share, rows)`: total[rows[i]] += share[rows[i]] for (R, h, D) tensors of any strides (last dim
contiguous), each listed row once: plain loads and stores, no atomics, deterministic; the sum is taken in float32
and rounded once to the total's dtype. It adds a packed row's gradient shares at the rows of their runs only
(attention.executors.varlen), where torch's `index_add_` would add atomically.
"""
from __future__ import annotations

import torch

from hilbert_lab.kernels.triton_support import HAVE_TRITON, tl, triton

__all__ = ["HAVE_TRITON", "ROW_DTYPES", "add_rows"]

ROW_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # totals a float32 sum is rounded to once

_TILE = 4096  # elements of one program: rows x heads x head dim, the last two as powers of two

if HAVE_TRITON:

    @triton.jit
    def _add_rows_kernel(total, share, rows, count, st_r, st_h, ss_r, ss_h, heads, dim,
                         BR: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr):
        i = tl.program_id(0) * BR + tl.arange(0, BR)
        listed = i < count
        row = tl.load(rows + i, mask=listed, other=0).to(tl.int64)
        h = tl.arange(0, BH)
        d = tl.arange(0, BD)
        mask = listed[:, None, None] & (h < heads)[None, :, None] & (d < dim)[None, None, :]
        inner_t = h[None, :, None] * st_h + d[None, None, :]
        inner_s = h[None, :, None] * ss_h + d[None, None, :]
        x = tl.load(share + row[:, None, None] * ss_r + inner_s, mask=mask, other=0.0)
        at = total + row[:, None, None] * st_r + inner_t
        y = tl.load(at, mask=mask, other=0.0)
        tl.store(at, (y.to(tl.float32) + x.to(tl.float32)).to(total.dtype.element_ty), mask=mask)


def add_rows(total: torch.Tensor, share: torch.Tensor, rows: torch.Tensor) -> None:
    """total[rows] += share[rows]: total (R, h, D) of a ROW_DTYPES dtype, share (R, h, D) on its device, last dims
    contiguous; rows (n,) int64 or int32, each row at most once."""
    if not HAVE_TRITON:
        raise RuntimeError("add_rows needs the 'triton' package (pip install triton)")
    if total.shape != share.shape or total.dim() != 3 or total.stride(-1) != 1 or share.stride(-1) != 1:
        raise ValueError(f"total and share must be (R, h, D) of one shape with contiguous last dims; got "
                         f"{tuple(total.shape)} {total.stride()} and {tuple(share.shape)} {share.stride()}")
    count = rows.shape[0]
    if count == 0:
        return
    _, heads, dim = total.shape
    block_h, block_d = triton.next_power_of_2(heads), triton.next_power_of_2(dim)
    block_r = max(1, _TILE // (block_h * block_d))
    _add_rows_kernel[(triton.cdiv(count, block_r),)](total, share, rows, count, total.stride(0), total.stride(1),
                                                      share.stride(0), share.stride(1), heads, dim, BR=block_r,
                                                      BH=block_h, BD=block_d, num_warps=4)
