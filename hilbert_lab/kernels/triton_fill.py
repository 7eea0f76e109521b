"""Filling the entries of a (B, N, H, D) tensor that no dilated block of a head writes, in one launch (Triton).

`fill_unselected(x, heads, value)`: x[b, p, h, :] = value for every position p that head h does not select, where
head h selects p when (p % w) % r == o for its row (w, r, o) of `heads` (segment length, dilation rate, offset;
o = -1: no position; (1, 1, 0): every position). Only those entries are written: where a plan's blocks write the
selected rows (attention.plan.Plan.unselected), its outputs and gradient totals need zeros at the others alone, in
one pass over the bytes they hold instead of a fill of every dilated head. Any strides, last dim contiguous.
"""
from __future__ import annotations

import torch

from hilbert_lab.kernels.triton_support import HAVE_TRITON, require_triton, tl, triton

__all__ = ["FILL_DTYPES", "ROWS_PER_PROGRAM", "fill_unselected", "head_table"]

FILL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ROWS_PER_PROGRAM = 64  # positions one program takes for one head
_TABLES: dict[tuple, torch.Tensor] = {}  # (rows, device) -> int32 table; never dropped (a CUDA graph may read one)

if HAVE_TRITON:

    @triton.jit
    def _fill_kernel(x, table, count, length, s_b, s_n, s_h, dim, value, WIDE: tl.constexpr, BR: tl.constexpr,
                     BD: tl.constexpr):
        h = tl.program_id(1)
        w = tl.load(table + h * 3)
        r = tl.load(table + h * 3 + 1)
        o = tl.load(table + h * 3 + 2)
        if (r == 1) & (o == 0):  # the head selects every position: nothing to write
            return
        i = tl.program_id(0) * BR + tl.arange(0, BR)
        if WIDE:  # positions past 2^31 - 1
            i = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
            w = w.to(tl.int64)
            r = r.to(tl.int64)
            o = o.to(tl.int64)
        b = i // length
        p = i % length
        d = tl.arange(0, BD)
        mask = ((i < count) & ((p % w) % r != o))[:, None] & (d < dim)[None, :]
        at = x + (b.to(tl.int64) * s_b + p.to(tl.int64) * s_n + h.to(tl.int64) * s_h)[:, None] + d[None, :]
        fill = tl.zeros((BR, BD), dtype=tl.float32) + value
        tl.store(at, fill.to(x.dtype.element_ty), mask=mask)


def head_table(rows: tuple[tuple[int, int, int], ...], device: torch.device) -> torch.Tensor:
    """The (H, 3) int32 table of per-head (w, r, o) rows on `device`, made once per rows and device (kept for the
    process: a captured graph reads it)."""
    key = (rows, str(device))
    table = _TABLES.get(key)
    if table is None:
        table = _TABLES[key] = torch.tensor(rows, dtype=torch.int32, device=device).reshape(-1, 3)
    return table


def fill_unselected(x: torch.Tensor, heads: torch.Tensor, value: float = 0.0) -> torch.Tensor:
    """x (B, N, H, D) of FILL_DTYPES, last dim contiguous, with `value` at every (b, p, h) that row h (w, r, o) of
    `heads` ((H, 3) int32 on x's device, `head_table`) does not select; returns x."""
    require_triton("fill_unselected")
    if x.dim() != 4 or x.stride(-1) != 1 or x.dtype not in FILL_DTYPES:
        raise ValueError(f"x must be a (B, N, H, D) tensor of {FILL_DTYPES} with a contiguous last dim, got "
                         f"{tuple(x.shape)} {x.stride()} {x.dtype}")
    if heads.shape != (x.shape[2], 3) or heads.dtype != torch.int32 or heads.device != x.device:
        raise ValueError(f"heads must be an ({x.shape[2]}, 3) int32 table on {x.device}, got {tuple(heads.shape)} "
                         f"{heads.dtype} on {heads.device}")
    batch, length, num_heads, dim = x.shape
    count = batch * length
    if count == 0 or num_heads == 0 or dim == 0:
        return x
    block_d = triton.next_power_of_2(dim)
    block_r = max(1, min(ROWS_PER_PROGRAM, 16384 // block_d))
    _fill_kernel[(triton.cdiv(count, block_r), num_heads)](x, heads, count, length, x.stride(0), x.stride(1),
                                                           x.stride(2), dim, float(value),
                                                           WIDE=count + block_r >= 2**31, BR=block_r, BD=block_d,
                                                           num_warps=4)
    return x
