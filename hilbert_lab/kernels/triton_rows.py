"""Writing or adding shares into strided totals, in one launch (Triton).

- `put_rows(pairs, rows, accumulate=True)`: total[rows[i]] += share[rows[i]] (accumulate=False: =) for up to three
  (total, share) pairs of (R, h, D) tensors (h may differ between pairs), each listed row once. A packed row's
  outputs, LSEs and gradient shares land at the rows of their runs only this way (attention.executors.varlen), where
  torch needs a gather and an indexed write, or an atomic `index_add_`, per tensor.
- `add_views(pairs)`: total += share for up to three (total, share) pairs of (B, L, h, D) views (L and h may differ
  between pairs): a plan call's dq, dk and dv shares added into the strided views of the totals that a dilated
  branch selects (attention.executors.blockwise), where torch runs one strided elementwise add per tensor.

Any strides, last dims contiguous; plain loads and stores, no atomics, deterministic; a sum is taken in float32 and
rounded once to the total's dtype (as torch's add of half-precision tensors does).
"""
from __future__ import annotations

from typing import Sequence

import torch

from hilbert_lab.kernels.triton_support import HAVE_TRITON, require_triton, tl, triton

__all__ = ["HAVE_TRITON", "ROW_DTYPES", "add_views", "put_rows"]

ROW_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # totals a float32 sum is rounded to once
_TILE = 4096  # elements of one program: rows x heads x head dim, the last two as powers of two

if HAVE_TRITON:

    @triton.jit
    def _put(total, share, t_row, s_row, listed, st_h, ss_h, heads, dim, BH: tl.constexpr, BD: tl.constexpr,
             ADD: tl.constexpr):
        """total[t_row + h * st_h + d] (+)= share[s_row + h * ss_h + d] for the listed rows (element offsets)."""
        h = tl.arange(0, BH)
        d = tl.arange(0, BD)
        mask = listed[:, None, None] & (h < heads)[None, :, None] & (d < dim)[None, None, :]
        x = tl.load(share + s_row[:, None, None] + h[None, :, None] * ss_h + d[None, None, :], mask=mask, other=0.0)
        at = total + t_row[:, None, None] + h[None, :, None] * st_h + d[None, None, :]
        if ADD:
            y = tl.load(at, mask=mask, other=0.0)
            tl.store(at, (y.to(tl.float32) + x.to(tl.float32)).to(total.dtype.element_ty), mask=mask)
        else:
            tl.store(at, x.to(total.dtype.element_ty), mask=mask)

    @triton.jit
    def _put_pair(total, share, row, listed, st_r, st_h, ss_r, ss_h, heads, dim, BH: tl.constexpr, BD: tl.constexpr,
                  ADD: tl.constexpr):
        _put(total, share, row * st_r, row * ss_r, listed, st_h, ss_h, heads, dim, BH, BD, ADD)

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

    @triton.jit
    def _add_view(total, share, i, length, count, tb, tl_, th, sb, sl, sh, heads, dim, BH: tl.constexpr,
                  BD: tl.constexpr):
        listed = i < count
        b = (i // length).to(tl.int64)
        position = (i % length).to(tl.int64)
        _put(total, share, b * tb + position * tl_, b * sb + position * sl, listed, th, sh, heads, dim, BH, BD, True)

    @triton.jit
    def _add_views_kernel(t0, s0, t1, s1, t2, s2, g0_l, g0_n, g0_tb, g0_tl, g0_th, g0_sb, g0_sl, g0_sh, g0_h,
                          g1_l, g1_n, g1_tb, g1_tl, g1_th, g1_sb, g1_sl, g1_sh, g1_h,
                          g2_l, g2_n, g2_tb, g2_tl, g2_th, g2_sb, g2_sl, g2_sh, g2_h, dim,
                          BR: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
        pair = tl.program_id(1)
        if pair == 0:
            _add_view(t0, s0, i, g0_l, g0_n, g0_tb, g0_tl, g0_th, g0_sb, g0_sl, g0_sh, g0_h, dim, BH, BD)
        elif pair == 1:
            _add_view(t1, s1, i, g1_l, g1_n, g1_tb, g1_tl, g1_th, g1_sb, g1_sl, g1_sh, g1_h, dim, BH, BD)
        else:
            _add_view(t2, s2, i, g2_l, g2_n, g2_tb, g2_tl, g2_th, g2_sb, g2_sl, g2_sh, g2_h, dim, BH, BD)


def _checked(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], layout: str) -> torch.Tensor:
    """The first total of `pairs`, once they are one to three (total, share) pairs of tensors of `layout` ("(R, h, D)"
    or "(B, L, h, D)"): one shape per pair, one first and last dim across pairs, last dims contiguous, totals of
    ROW_DTYPES."""
    if not 1 <= len(pairs) <= 3:
        raise ValueError(f"pairs must hold one to three (total, share) pairs, got {len(pairs)}")
    first = pairs[0][0]
    dims = layout.count(",") + 1
    for total, share in pairs:
        if total.shape != share.shape or total.dim() != dims or total.stride(-1) != 1 or share.stride(-1) != 1 or \
                total.shape[0] != first.shape[0] or total.shape[-1] != first.shape[-1] or total.dtype not in ROW_DTYPES:
            raise ValueError(f"each pair must be {layout} tensors of one shape, one {layout[1]} and D across pairs, "
                             f"contiguous last dims, totals of {ROW_DTYPES}; got {tuple(total.shape)} {total.stride()} "
                             f"{total.dtype} and {tuple(share.shape)} {share.stride()}")
    return first


def put_rows(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], rows: torch.Tensor, *,
             accumulate: bool = True) -> None:
    """total[rows] += share[rows] (accumulate=False: total[rows] = share[rows]) for each (total, share) of `pairs`
    (one to three): total (R, h, D) of a ROW_DTYPES dtype, share of its shape, all on one device with one R and D,
    last dims contiguous; rows (n,) int64 or int32 on that device, each row at most once."""
    require_triton("put_rows")
    first = _checked(pairs, "(R, h, D)")
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


def add_views(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """total += share for each (total, share) of `pairs` (one to three): (B, L, h, D) views of one shape per pair, one
    B and D across pairs, totals of a ROW_DTYPES dtype, last dims contiguous, all on one device."""
    require_triton("add_views")
    first = _checked(pairs, "(B, L, h, D)")
    counts = [t.shape[0] * t.shape[1] for t, _ in pairs]
    if max(counts) == 0 or first.shape[3] == 0:
        return
    padded = list(pairs) + [pairs[0]] * (3 - len(pairs))  # unused slots: never read (the grid has len(pairs))
    geometry = [g for t, s in padded for g in (t.shape[1], t.shape[0] * t.shape[1], t.stride(0), t.stride(1),
                                                t.stride(2), s.stride(0), s.stride(1), s.stride(2), t.shape[2])]
    dim = first.shape[3]
    block_h = triton.next_power_of_2(max(t.shape[2] for t, _ in pairs))
    block_d = triton.next_power_of_2(dim)
    block_r = max(1, _TILE // (block_h * block_d))
    tensors = [x for pair in padded for x in pair]
    _add_views_kernel[(triton.cdiv(max(counts), block_r), len(pairs))](*tensors, *geometry, dim, BR=block_r,
                                                                        BH=block_h, BD=block_d, num_warps=4)
