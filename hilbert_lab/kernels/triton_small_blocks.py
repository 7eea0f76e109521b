"""Many small attention problems in one launch each way (Triton): gathered rows, exact softmax, no per-problem call.

A problem p has nq[p] <= LQ queries and nk[p] <= LK keys (at most 64 each), each a row of a (B, N, H, D) tensor
named by its (batch, position, head) in `query_rows` (P, LQ, 3) / `key_rows` (P, LK, 3) (int32; entries past
nq / nk are never read). Causal problems align their queries bottom right: query i sees keys j <= i + nk - nq.
Scores, softmax and both products run in float32 (exact float32 dots), whatever the inputs' dtype.

- `small_attention_forward(...)` writes each problem's output and LSE into out (S, B, Nq, H, D) and lse
  (S, B, Nq, H) at slot[p].
- `small_attention_backward(...)` returns the problems' shares of dq (P * LQ, D) and dk, dv (P * LK, D), in float32,
  for a given (merged) out, LSE (B, H, Nq) and upstream gradients.
- `scatter_rows(...)` adds such shares into totals, one program per destination row. It sums the row's
  contributions in a fixed order (deterministic, no atomics), adds the total's value unless the row is owned,
  and rounds once.

Plain tensors in; nothing from hilbert_lab above the kernels is imported.
"""
from __future__ import annotations

from typing import Optional

import torch

from hilbert_lab.kernels.triton_support import HAVE_TRITON, require_triton, tl, triton  # None where Triton is missing

__all__ = ["HAVE_TRITON", "INPUT_DTYPES", "MAX_HEAD_DIM", "scatter_rows", "small_attention_backward",
           "small_attention_forward", "tile_length"]

INPUT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # the dtypes of q, k, v the kernels take
# the largest head dim the kernels take: at 256 the backward's tiles need 272 KiB of shared memory, past the 227 KiB
# of an H100 or H200 (measured: triton OutOfResources)
MAX_HEAD_DIM = 128

if HAVE_TRITON:

    @triton.jit
    def _rows(meta, p, L: tl.constexpr, s_b, s_n, s_h):
        """Element offsets (L,) of problem p's rows (batch, position, head) for strides (s_b, s_n, s_h)."""
        at = meta + (p * L + tl.arange(0, L)) * 3
        return (tl.load(at).to(tl.int64) * s_b + tl.load(at + 1).to(tl.int64) * s_n
                + tl.load(at + 2).to(tl.int64) * s_h)

    @triton.jit
    def _scores(q, k, v, query_rows, key_rows, lengths, p, sqb, sqn, sqh, skb, skn, skh, svb, svn, svh, scale, dim,
                CAUSAL: tl.constexpr, LQ: tl.constexpr, LK: tl.constexpr, BD: tl.constexpr):
        i = tl.arange(0, LQ)
        j = tl.arange(0, LK)
        d = tl.arange(0, BD)
        nq = tl.load(lengths + 2 * p)
        nk = tl.load(lengths + 2 * p + 1)
        dmask = d < dim
        qmask, kmask = i < nq, j < nk
        qt = tl.load(q + _rows(query_rows, p, LQ, sqb, sqn, sqh)[:, None] + d[None, :],
                     mask=qmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
        kt = tl.load(k + _rows(key_rows, p, LK, skb, skn, skh)[:, None] + d[None, :],
                     mask=kmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
        vt = tl.load(v + _rows(key_rows, p, LK, svb, svn, svh)[:, None] + d[None, :],
                     mask=kmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)
        s = tl.dot(qt, tl.trans(kt), input_precision="ieee") * scale
        allowed = qmask[:, None] & kmask[None, :]
        if CAUSAL:
            allowed = allowed & (j[None, :] <= i[:, None] + (nk - nq))
        return qt, kt, vt, tl.where(allowed, s, float("-inf")), allowed, qmask, kmask, dmask

    @triton.jit
    def _forward_kernel(q, k, v, out, lse, query_rows, key_rows, lengths, slot, sqb, sqn, sqh, skb, skn, skh, svb,
                        svn, svh, sos, sob, son, soh, sls, slb, sln, slh, scale, dim, CAUSAL: tl.constexpr,
                        LQ: tl.constexpr, LK: tl.constexpr, BD: tl.constexpr):
        p = tl.program_id(0)
        qt, kt, vt, s, allowed, qmask, kmask, dmask = _scores(
            q, k, v, query_rows, key_rows, lengths, p, sqb, sqn, sqh, skb, skn, skh, svb, svn, svh, scale, dim,
            CAUSAL, LQ, LK, BD)
        peak = tl.max(s, 1)
        peak = tl.where(peak == float("-inf"), 0.0, peak)
        e = tl.where(allowed, tl.exp(s - peak[:, None]), 0.0)
        total = tl.sum(e, 1)
        o = tl.dot(e, vt, input_precision="ieee") / tl.where(total > 0, total, 1.0)[:, None]
        lse_rows = tl.where(total > 0, peak + tl.log(tl.where(total > 0, total, 1.0)), float("-inf"))
        slot_p = tl.load(slot + p).to(tl.int64)
        d = tl.arange(0, BD)
        tl.store(out + slot_p * sos + _rows(query_rows, p, LQ, sob, son, soh)[:, None] + d[None, :],
                 o.to(out.dtype.element_ty), mask=qmask[:, None] & dmask[None, :])
        tl.store(lse + slot_p * sls + _rows(query_rows, p, LQ, slb, sln, slh), lse_rows, mask=qmask)

    @triton.jit
    def _backward_kernel(q, k, v, out, dout, lse, dlse, dq, dk, dv, query_rows, key_rows, lengths, sqb, sqn, sqh, skb,
                         skn, skh, svb, svn, svh, sob, son, soh, sgb, sgn, sgh, slb, sln, slh, sdb, sdn, sdh, scale,
                         dim, CAUSAL: tl.constexpr, HAS_DOUT: tl.constexpr, HAS_DLSE: tl.constexpr, LQ: tl.constexpr,
                         LK: tl.constexpr, BD: tl.constexpr):
        p = tl.program_id(0)
        qt, kt, vt, s, allowed, qmask, kmask, dmask = _scores(
            q, k, v, query_rows, key_rows, lengths, p, sqb, sqn, sqh, skb, skn, skh, svb, svn, svh, scale, dim,
            CAUSAL, LQ, LK, BD)
        merged = tl.load(lse + _rows(query_rows, p, LQ, slb, sln, slh), mask=qmask, other=0.0)
        merged = tl.where((merged == float("inf")) | (merged == float("-inf")), 0.0, merged)
        weights = tl.where(allowed, tl.exp(s - merged[:, None]), 0.0)
        ds = tl.zeros((LQ, LK), tl.float32)
        grad_v = tl.zeros((LK, BD), tl.float32)
        d = tl.arange(0, BD)
        rmask = qmask[:, None] & dmask[None, :]
        if HAS_DOUT:
            g = tl.load(dout + _rows(query_rows, p, LQ, sgb, sgn, sgh)[:, None] + d[None, :], mask=rmask,
                        other=0.0).to(tl.float32)
            o = tl.load(out + _rows(query_rows, p, LQ, sob, son, soh)[:, None] + d[None, :], mask=rmask,
                        other=0.0).to(tl.float32)
            delta = tl.sum(g * o, 1)
            ds = weights * (tl.dot(g, tl.trans(vt), input_precision="ieee") - delta[:, None])
            grad_v = tl.dot(tl.trans(weights), g, input_precision="ieee")
        if HAS_DLSE:
            ds += weights * tl.load(dlse + _rows(query_rows, p, LQ, sdb, sdn, sdh), mask=qmask, other=0.0)[:, None]
        grad_q = tl.dot(ds, kt, input_precision="ieee") * scale
        grad_k = tl.dot(tl.trans(ds), qt, input_precision="ieee") * scale
        i = tl.arange(0, LQ)
        j = tl.arange(0, LK)
        kmask2 = kmask[:, None] & dmask[None, :]
        tl.store(dq + (p * LQ + i).to(tl.int64)[:, None] * dim + d[None, :], grad_q, mask=rmask)
        tl.store(dk + (p * LK + j).to(tl.int64)[:, None] * dim + d[None, :], grad_k, mask=kmask2)
        tl.store(dv + (p * LK + j).to(tl.int64)[:, None] * dim + d[None, :], grad_v, mask=kmask2)

    @triton.jit
    def _scatter_kernel(share_a, total_a, share_b, total_b, rows, starts, members, owned, sab, san, sah, sbb, sbn,
                        sbh, dim, PAIR: tl.constexpr, MAXC: tl.constexpr, BD: tl.constexpr):
        r = tl.program_id(0)
        first = tl.load(starts + r)
        count = tl.load(starts + r + 1) - first
        c = tl.arange(0, MAXC)
        d = tl.arange(0, BD)
        dmask = d < dim
        cmask = c < count
        flat = tl.load(members + first + c, mask=cmask, other=0).to(tl.int64)
        at = rows + r * 3
        b, n, h = tl.load(at).to(tl.int64), tl.load(at + 1).to(tl.int64), tl.load(at + 2).to(tl.int64)
        keep = dmask & (tl.load(owned + r) == 0)
        x = tl.load(share_a + flat[:, None] * dim + d[None, :], mask=cmask[:, None] & dmask[None, :], other=0.0)
        dst = total_a + b * sab + n * san + h * sah + d
        tl.store(dst, (tl.load(dst, mask=keep, other=0.0).to(tl.float32) + tl.sum(x, 0)).to(total_a.dtype.element_ty),
                 mask=dmask)
        if PAIR:
            y = tl.load(share_b + flat[:, None] * dim + d[None, :], mask=cmask[:, None] & dmask[None, :], other=0.0)
            dst_b = total_b + b * sbb + n * sbn + h * sbh + d
            tl.store(dst_b, (tl.load(dst_b, mask=keep, other=0.0).to(tl.float32) + tl.sum(y, 0))
                     .to(total_b.dtype.element_ty), mask=dmask)


def tile_length(length: int) -> int:
    """Rows per problem the kernels take for problems of up to `length` rows: a power of two, at least 16."""
    return max(16, 1 << max(0, length - 1).bit_length())


def _tiles(query_rows: torch.Tensor, key_rows: torch.Tensor) -> tuple[int, int]:
    lq, lk = query_rows.shape[1], key_rows.shape[1]
    if tile_length(lq) != lq or tile_length(lk) != lk:
        raise ValueError(f"query_rows and key_rows must hold tile_length(...) rows per problem (a power of two, at "
                         f"least 16); got {lq} and {lk}")
    return lq, lk


def _check_head_dim(dim: int) -> None:
    if dim > MAX_HEAD_DIM:
        raise ValueError(f"head dim must be at most MAX_HEAD_DIM = {MAX_HEAD_DIM} for the small-block kernels, "
                         f"got {dim}")


def _strides3(x: torch.Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def _warps(dim: int) -> int:
    return 4 if dim <= 64 else 8


def small_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, query_rows: torch.Tensor,
                            key_rows: torch.Tensor, lengths: torch.Tensor, slot: torch.Tensor, out: torch.Tensor,
                            lse: torch.Tensor, *, scale: float, causal: bool) -> None:
    """Write every problem's output into out (S, B, Nq, H, D) and its LSE into lse (S, B, Nq, H) at slot[p].

    q (B, Nq, H, D), k, v (B, N, H_kv, D) in one dtype of INPUT_DTYPES, last dim contiguous; query_rows (P, LQ, 3) and
    key_rows (P, LK, 3) int32 (LQ, LK: `tile_length` of the longest); lengths (P, 2) int32 (nq, nk); slot (P,)
    int32; lse float32."""
    _check_head_dim(q.shape[-1])
    require_triton("small_attention_forward")
    problems, dim = query_rows.shape[0], q.shape[-1]
    lq, lk = _tiles(query_rows, key_rows)
    _forward_kernel[(problems,)](q, k, v, out, lse, query_rows, key_rows, lengths, slot, *_strides3(q),
                                 *_strides3(k), *_strides3(v), out.stride(0), *out.stride()[1:4], lse.stride(0),
                                 *lse.stride()[1:4], scale, dim, CAUSAL=causal, LQ=lq, LK=lk, BD=tile_length(dim),
                                 num_warps=_warps(dim))


def small_attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                             grad_out: Optional[torch.Tensor], lse: torch.Tensor, grad_lse: Optional[torch.Tensor],
                             query_rows: torch.Tensor, key_rows: torch.Tensor, lengths: torch.Tensor, *,
                             scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq (P * LQ, D), dk (P * LK, D), dv (P * LK, D)) float32: every problem's shares for the given out
    (B, Nq, H, D), LSE (B, H, Nq) (+-inf rows read as 0) and upstream gradients grad_out (like out) and grad_lse
    (B, H, Nq), each None for zero. Row p * LQ + i is problem p's query i (p * LK + j its key j); rows past
    nq / nk hold garbage. Inputs as in `small_attention_forward`."""
    _check_head_dim(q.shape[-1])
    require_triton("small_attention_backward")
    problems, dim = query_rows.shape[0], q.shape[-1]
    lq, lk = _tiles(query_rows, key_rows)
    dq = torch.empty((problems * lq, dim), dtype=torch.float32, device=q.device)
    dk = torch.empty((problems * lk, dim), dtype=torch.float32, device=q.device)
    dv = torch.empty_like(dk)
    lse_strides = (lse.stride(0), lse.stride(2), lse.stride(1))  # (b, position, head) of a (B, H, Nq) tensor
    grad_strides = (0, 0, 0) if grad_lse is None else (grad_lse.stride(0), grad_lse.stride(2), grad_lse.stride(1))
    _backward_kernel[(problems,)](
        q, k, v, out, out if grad_out is None else grad_out, lse, lse if grad_lse is None else grad_lse, dq, dk, dv,
        query_rows, key_rows, lengths, *_strides3(q), *_strides3(k), *_strides3(v), *_strides3(out),
        *(_strides3(out) if grad_out is None else _strides3(grad_out)), *lse_strides, *grad_strides, scale, dim,
        CAUSAL=causal, HAS_DOUT=grad_out is not None, HAS_DLSE=grad_lse is not None, LQ=lq, LK=lk, BD=tile_length(dim),
        num_warps=_warps(dim))
    return dq, dk, dv


def scatter_rows(shares: tuple[torch.Tensor, ...], totals: tuple[torch.Tensor, ...], rows: torch.Tensor,
                 starts: torch.Tensor, members: torch.Tensor, owned: torch.Tensor, *, max_count: int) -> None:
    """Add one or two shares (M, D) float32 into totals (B, N, H, D) (same strides each pair, last dim
    contiguous): destination row r (rows (R, 3) int32: batch, position, head) receives the sum of the share rows
    members[starts[r]:starts[r + 1]] (int32; at most max_count), added to the total's value there unless
    owned[r] (int8) is set; one rounding to the total's dtype."""
    require_triton("scatter_rows")
    if len(shares) not in (1, 2) or len(totals) != len(shares):
        raise ValueError(f"shares and totals must be one or two tensors each; got {len(shares)} and {len(totals)}")
    dim = totals[0].shape[-1]
    pair = len(shares) == 2
    share_b, total_b = (shares[1], totals[1]) if pair else (shares[0], totals[0])
    _scatter_kernel[(rows.shape[0],)](shares[0], totals[0], share_b, total_b, rows, starts, members, owned,
                                      *_strides3(totals[0]), *_strides3(total_b), dim, PAIR=pair,
                                      MAXC=max(2, triton.next_power_of_2(max_count)), BD=tile_length(dim),
                                      num_warps=_warps(dim))
