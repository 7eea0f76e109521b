"""Fused Triton dilated attention (forward + backward) over the original (B, N, H, D) layout.

Semantics: branch i has segment length w_i (capped at N) and dilation r_i; head h
takes part in branch i with offset head_offsets[i, h] (-1: not at all). Position p is selected
in branch i iff (p mod w_i) mod r_i == offset; a selected query attends the selected keys of its
own segment (and only keys p' <= p when causal). All branches of a head are combined by one
online softmax, i.e. one softmax over the multiset union of their key sets: that is exactly the
LSE merge of the per-branch results, computed in a single pass. Rows selected in no branch give
output 0 and lse -inf.

Kernel layout: query rows (and, in the dK/dV kernel, key rows) are split into R residue
classes ("streams") p = c + R * t, with R = lcm of the dilation rates (capped). When every r_i
divides w_i and R, each branch either selects all rows of a stream tile or none, so no work is
wasted; in other cases per-row masks keep the result exact. Keys of a branch are read directly
from the original layout at positions segment_start + offset + r * j (no gathered copies).
Backward: the merged output and merged LSE give each branch's exact share of dQ/dK/dV
(the engine's exact-backward rule); the dK/dV kernel owns each key row exactly once, so no atomics are needed.

Public entry points (forward and backward, no autograd) take plain ints and tensors, never a pattern
object; the attention package wraps them in its one autograd function.
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import torch

from hilbert_lab.kernels.triton_support import HAVE_TRITON, interpreting, tl, triton  # None without Triton

__all__ = [
    "HAVE_TRITON",
    "interpreting",
    "stream_stride",
    "dilated_attention_forward",
    "dilated_attention_backward",
]

_LOG2E = 1.4426950408889634
_MAX_STREAM_STRIDE = 64


def _patch_interpreter_scalars() -> None:
    """Triton 3.6's interpreter turns loop bounds into ints with int(array of shape (1,)), which
    NumPy >= 2.4 refuses; make its tensor.__index__ read the single element instead (interpreter only)."""
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover
        return
    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or getattr(original, "_hilbert_lab_patched", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._hilbert_lab_patched = True
    interpreter._patch_lang_tensor = patched


if HAVE_TRITON and interpreting():
    _patch_interpreter_scalars()


def stream_stride(segment_lengths: Sequence[int], dilation_rates: Sequence[int], seq_len: int) -> int:
    """Row stride R of the query/key streams: lcm of the dilation rates (1 if that exceeds 64)."""
    stride = 1
    for rate in dilation_rates:
        stride = stride * int(rate) // math.gcd(stride, int(rate))
    if stride > _MAX_STREAM_STRIDE or stride > max(1, seq_len):
        return 1
    return stride


# Sizes that vary per call stay runtime values (one compiled kernel per dtype / head dim / causal).
_NO_SPECIALIZE = ["N", "H", "tiles_per_stream", "NUM_BRANCHES", "R"]

if HAVE_TRITON:

    @triton.jit
    def _mask2(rows_ok, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
        """(rows, BLOCK_D) load mask; no per-column term when the head dim fills the block,
        so that loads stay 16-byte vectors."""
        if HEAD_DIM == BLOCK_D:
            return rows_ok[:, None]
        else:
            return rows_ok[:, None] & (offs_d < HEAD_DIM)[None, :]

    @triton.jit
    def _load_rows(base, rows64, stride_row, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
        """(rows, BLOCK_D) tile of rows that are all in range: no row mask, so loads stay unmasked vectors."""
        ptrs = base + rows64[:, None] * stride_row + offs_d[None, :]
        if HEAD_DIM == BLOCK_D:
            return tl.load(ptrs)
        else:
            return tl.load(ptrs, mask=(offs_d < HEAD_DIM)[None, :], other=0.0)

    @triton.jit
    def _softmax_step(q, k, v, m_i, l_i, acc, mask, qk_scale, MASKED: tl.constexpr, IEEE: tl.constexpr,
                      DIAG: tl.constexpr):
        """One key block of the online softmax: scores q k^T, running max m_i / sum l_i (log2
        domain), acc += P V. mask (rows, keys) applies only when MASKED. DIAG (benchmarks only;
        the result is then not attention): 1 replaces exp2 by a multiply-add, 2 skips the whole
        softmax (the matrix products and loads alone)."""
        if IEEE:
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k))
        if DIAG == 2:
            p = qk
            alpha = m_i
            m_new = m_i
        else:
            if MASKED:
                qk = tl.where(mask, qk, float("-inf"))
            # scale folded into one FMA per score (the scaled scores are never stored)
            m_new = tl.maximum(m_i, tl.max(qk, axis=1) * qk_scale)
            if MASKED:
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            else:
                m_safe = m_new
            if DIAG == 1:
                p = qk * qk_scale - m_safe[:, None]
                alpha = m_i - m_safe
            else:
                p = tl.math.exp2(qk * qk_scale - m_safe[:, None])
                alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        if IEEE:
            acc += tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc += tl.dot(p.to(v.dtype), v)
        return m_new, l_i, acc

    @triton.jit(do_not_specialize=_NO_SPECIALIZE)
    def _fwd_kernel(
        Q, K, V, Out, Lse,
        Seg, Dil, Off,
        stride_qb, stride_qn, stride_qh,
        stride_kb, stride_kn, stride_kh,
        stride_vb, stride_vn, stride_vh,
        stride_ob, stride_on, stride_oh,
        stride_lb, stride_lh, stride_ln,
        N, H, qk_scale, tiles_per_stream,
        NUM_BRANCHES, R, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        IEEE: tl.constexpr, USE_TMA: tl.constexpr, DIAG: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        stream = pid_m // tiles_per_stream
        tile = pid_m % tiles_per_stream
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        pos = stream + R * rows
        row_valid = pos < N
        offs_d = tl.arange(0, BLOCK_D)

        q_base = Q + b.to(tl.int64) * stride_qb + h * stride_qh
        k_base = K + b.to(tl.int64) * stride_kb + h * stride_kh
        v_base = V + b.to(tl.int64) * stride_vb + h * stride_vh
        q = tl.load(q_base + pos.to(tl.int64)[:, None] * stride_qn + offs_d[None, :],
                    mask=_mask2(row_valid, offs_d, HEAD_DIM, BLOCK_D), other=0.0)

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

        for br in range(NUM_BRANCHES):
            w = tl.minimum(tl.load(Seg + br), N)
            r = tl.load(Dil + br)
            o = tl.load(Off + br * H + h)
            row_sel = row_valid & (((pos % w) % r) == o) & (o >= 0)
            n_sel = tl.sum(row_sel.to(tl.int32), axis=0)
            if n_sel > 0:
                p_min = tl.min(tl.where(row_sel, pos, N), axis=0)
                p_max = tl.max(tl.where(row_sel, pos, -1), axis=0)
                s_lo = p_min // w
                s_hi = p_max // w
                if USE_TMA:
                    # The branch's keys of this head as a 2D view: row j = position o + r * j.
                    n_rows = (N - o + r - 1) // r
                    k_desc = tl.make_tensor_descriptor(k_base + o * stride_kn, shape=[n_rows, HEAD_DIM],
                                                       strides=[r * stride_kn, 1], block_shape=[BLOCK_N, BLOCK_D])
                    v_desc = tl.make_tensor_descriptor(v_base + o * stride_vn, shape=[n_rows, HEAD_DIM],
                                                       strides=[r * stride_vn, 1], block_shape=[BLOCK_N, BLOCK_D])
                for s in range(s_lo, s_hi + 1):
                    seg_start = s * w
                    seg_len = tl.minimum(w, N - seg_start)
                    n_keys = tl.maximum((seg_len - o + r - 1) // r, 0)
                    row_in = row_sel & ((pos // w) == s)
                    seg_p_max = tl.max(tl.where(row_in, pos, -1), axis=0)
                    seg_p_min = tl.min(tl.where(row_in, pos, N), axis=0)
                    n_iter = n_keys
                    if CAUSAL:
                        n_iter = tl.minimum(n_keys, tl.maximum((seg_p_max - seg_start - o) // r + 1, 0))
                    # Key blocks below n_full need no mask when every tile row takes part.
                    n_full = n_keys * 0
                    if tl.sum(row_in.to(tl.int32), axis=0) == BLOCK_M:
                        n_full = n_keys
                        if CAUSAL:
                            n_full = tl.minimum(n_keys, tl.maximum((seg_p_min - seg_start - o) // r + 1, 0))
                        n_full = (n_full // BLOCK_N) * BLOCK_N
                    if USE_TMA and (seg_start % r == 0):
                        row0 = seg_start // r
                        for kb in range(0, n_full, BLOCK_N):
                            k = k_desc.load([row0 + kb, 0])
                            v = v_desc.load([row0 + kb, 0])
                            m_i, l_i, acc = _softmax_step(q, k, v, m_i, l_i, acc, row_in, qk_scale, False, IEEE, DIAG)
                    else:
                        for kb in range(0, n_full, BLOCK_N):
                            kpos = (seg_start + o + r * (kb + tl.arange(0, BLOCK_N))).to(tl.int64)
                            k = _load_rows(k_base, kpos, stride_kn, offs_d, HEAD_DIM, BLOCK_D)
                            v = _load_rows(v_base, kpos, stride_vn, offs_d, HEAD_DIM, BLOCK_D)
                            m_i, l_i, acc = _softmax_step(q, k, v, m_i, l_i, acc, row_in, qk_scale, False, IEEE, DIAG)
                    for kb in range(n_full, n_iter, BLOCK_N):
                        j = kb + tl.arange(0, BLOCK_N)
                        k_valid = j < n_keys
                        kpos = seg_start + o + r * j
                        kpos64 = kpos.to(tl.int64)
                        k = tl.load(k_base + kpos64[:, None] * stride_kn + offs_d[None, :],
                                    mask=_mask2(k_valid, offs_d, HEAD_DIM, BLOCK_D), other=0.0)
                        v = tl.load(v_base + kpos64[:, None] * stride_vn + offs_d[None, :],
                                    mask=_mask2(k_valid, offs_d, HEAD_DIM, BLOCK_D), other=0.0)
                        mask = row_in[:, None] & k_valid[None, :]
                        if CAUSAL:
                            mask = mask & (kpos[None, :] <= pos[:, None])
                        m_i, l_i, acc = _softmax_step(q, k, v, m_i, l_i, acc, mask, qk_scale, True, IEEE, DIAG)

        has_keys = l_i > 0.0
        l_safe = tl.where(has_keys, l_i, 1.0)
        out = acc / l_safe[:, None]
        lse = tl.where(has_keys, (m_i + tl.math.log2(l_safe)) * 0.6931471805599453, float("-inf"))
        o_base = Out + b.to(tl.int64) * stride_ob + h * stride_oh
        tl.store(o_base + pos.to(tl.int64)[:, None] * stride_on + offs_d[None, :],
                 out.to(Out.dtype.element_ty), mask=_mask2(row_valid, offs_d, HEAD_DIM, BLOCK_D))
        tl.store(Lse + b.to(tl.int64) * stride_lb + h * stride_lh + pos.to(tl.int64) * stride_ln, lse, mask=row_valid)

    @triton.jit
    def _dkdv_block(dk, dv, k, v, kpos, key_in, q_base, do_base, lse_base, delta_base, qb, seg_start, o, r, n_queries,
                    stride_qn, stride_gn, offs_d, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, IEEE: tl.constexpr, MASKED: tl.constexpr):
        """dK/dV contributions of the BLOCK_M selected queries j = qb.. of one segment."""
        j = qb + tl.arange(0, BLOCK_M)
        q_valid = j < n_queries
        qpos = seg_start + o + r * j
        qpos64 = qpos.to(tl.int64)
        qmask2 = _mask2(q_valid, offs_d, HEAD_DIM, BLOCK_D)
        q = tl.load(q_base + qpos64[:, None] * stride_qn + offs_d[None, :], mask=qmask2, other=0.0)
        do = tl.load(do_base + qpos64[:, None] * stride_gn + offs_d[None, :], mask=qmask2, other=0.0)
        lse = tl.load(lse_base + qpos, mask=q_valid, other=0.0)
        delta = tl.load(delta_base + qpos, mask=q_valid, other=0.0)
        if IEEE:
            qkT = tl.dot(k, tl.trans(q), input_precision="ieee")
        else:
            qkT = tl.dot(k, tl.trans(q))
        pT = tl.math.exp2(qkT * qk_scale - (lse * 1.4426950408889634)[None, :])
        if MASKED:
            mask = key_in[:, None] & q_valid[None, :]
            if CAUSAL:
                mask = mask & (kpos[:, None] <= qpos[None, :])
            pT = tl.where(mask, pT, 0.0)
        if IEEE:
            dv += tl.dot(pT.to(do.dtype), do, input_precision="ieee")
            dpT = tl.dot(v, tl.trans(do), input_precision="ieee")
        else:
            dv += tl.dot(pT.to(do.dtype), do)
            dpT = tl.dot(v, tl.trans(do))
        dsT = pT * (dpT - delta[None, :])
        if IEEE:
            dk += tl.dot(dsT.to(q.dtype), q, input_precision="ieee")
        else:
            dk += tl.dot(dsT.to(q.dtype), q)
        return dk, dv

    @triton.jit
    def _dq_block(dq, q, do, lse2, delta, pos, row_in, k_base, v_base, kb, seg_start, o, r, n_keys, stride_kn,
                  stride_vn, offs_d, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                  CAUSAL: tl.constexpr, IEEE: tl.constexpr, MASKED: tl.constexpr):
        """dQ contribution of the BLOCK_N selected keys j = kb.. of one segment."""
        j = kb + tl.arange(0, BLOCK_N)
        k_valid = j < n_keys
        kpos = seg_start + o + r * j
        kpos64 = kpos.to(tl.int64)
        kmask2 = _mask2(k_valid, offs_d, HEAD_DIM, BLOCK_D)
        k = tl.load(k_base + kpos64[:, None] * stride_kn + offs_d[None, :], mask=kmask2, other=0.0)
        v = tl.load(v_base + kpos64[:, None] * stride_vn + offs_d[None, :], mask=kmask2, other=0.0)
        if IEEE:
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k))
            dp = tl.dot(do, tl.trans(v))
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if MASKED:
            mask = row_in[:, None] & k_valid[None, :]
            if CAUSAL:
                mask = mask & (kpos[None, :] <= pos[:, None])
            p = tl.where(mask, p, 0.0)
        ds = p * (dp - delta[:, None])
        if IEEE:
            dq += tl.dot(ds.to(k.dtype), k, input_precision="ieee")
        else:
            dq += tl.dot(ds.to(k.dtype), k)
        return dq

    @triton.jit(do_not_specialize=_NO_SPECIALIZE)
    def _bwd_dkdv_kernel(
        Q, K, V, dO, Lse, Delta, dK, dV,
        Seg, Dil, Off,
        stride_qb, stride_qn, stride_qh,
        stride_kb, stride_kn, stride_kh,
        stride_vb, stride_vn, stride_vh,
        stride_gb, stride_gn, stride_gh,
        N, H, qk_scale, sm_scale, tiles_per_stream,
        NUM_BRANCHES, R, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        IEEE: tl.constexpr,
    ):
        """One program owns BLOCK_N key rows of one stream; loops over the queries that see them."""
        pid_n = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        stream = pid_n // tiles_per_stream
        tile = pid_n % tiles_per_stream
        rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        kpos = stream + R * rows
        key_valid = kpos < N
        offs_d = tl.arange(0, BLOCK_D)

        q_base = Q + b.to(tl.int64) * stride_qb + h * stride_qh
        k_base = K + b.to(tl.int64) * stride_kb + h * stride_kh
        v_base = V + b.to(tl.int64) * stride_vb + h * stride_vh
        g_base = b.to(tl.int64) * stride_gb + h * stride_gh  # dO, dK, dV share this layout
        kmask2 = _mask2(key_valid, offs_d, HEAD_DIM, BLOCK_D)
        k = tl.load(k_base + kpos.to(tl.int64)[:, None] * stride_kn + offs_d[None, :], mask=kmask2, other=0.0)
        v = tl.load(v_base + kpos.to(tl.int64)[:, None] * stride_vn + offs_d[None, :], mask=kmask2, other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        lse_base = Lse + pid_bh.to(tl.int64) * N
        delta_base = Delta + pid_bh.to(tl.int64) * N

        for br in range(NUM_BRANCHES):
            w = tl.minimum(tl.load(Seg + br), N)
            r = tl.load(Dil + br)
            o = tl.load(Off + br * H + h)
            key_sel = key_valid & (((kpos % w) % r) == o) & (o >= 0)
            n_sel = tl.sum(key_sel.to(tl.int32), axis=0)
            if n_sel > 0:
                k_min = tl.min(tl.where(key_sel, kpos, N), axis=0)
                k_max = tl.max(tl.where(key_sel, kpos, -1), axis=0)
                s_lo = k_min // w
                s_hi = k_max // w
                for s in range(s_lo, s_hi + 1):
                    seg_start = s * w
                    seg_len = tl.minimum(w, N - seg_start)
                    n_queries = tl.maximum((seg_len - o + r - 1) // r, 0)
                    key_in = key_sel & ((kpos // w) == s)
                    j_start = n_queries * 0
                    j_diag = n_queries * 0
                    if CAUSAL:
                        seg_k_min = tl.min(tl.where(key_in, kpos, N), axis=0)
                        j_start = tl.maximum((seg_k_min - seg_start - o + r - 1) // r, 0)
                        j_start = (j_start // BLOCK_M) * BLOCK_M
                        seg_k_max = tl.max(tl.where(key_in, kpos, -1), axis=0)
                        j_diag = tl.maximum((seg_k_max - seg_start - o + r - 1) // r, 0)
                    # Three phases: masked near the causal diagonal, unmasked full blocks (when all
                    # BLOCK_N keys take part), masked ragged tail.
                    j_mid = n_queries
                    j_full_end = n_queries
                    if tl.sum(key_in.to(tl.int32), axis=0) == BLOCK_N:
                        j_mid = j_start + ((tl.maximum(j_diag - j_start, 0) + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
                        j_full_end = j_mid + tl.maximum((n_queries - j_mid) // BLOCK_M, 0) * BLOCK_M
                    do_base = dO + g_base
                    for qb in range(j_start, tl.minimum(j_mid, n_queries), BLOCK_M):
                        dk, dv = _dkdv_block(dk, dv, k, v, kpos, key_in, q_base, do_base, lse_base, delta_base, qb,
                                             seg_start, o, r, n_queries, stride_qn, stride_gn, offs_d, qk_scale,
                                             HEAD_DIM, BLOCK_M, BLOCK_D, CAUSAL, IEEE, True)
                    for qb in range(j_mid, j_full_end, BLOCK_M):
                        dk, dv = _dkdv_block(dk, dv, k, v, kpos, key_in, q_base, do_base, lse_base, delta_base, qb,
                                             seg_start, o, r, n_queries, stride_qn, stride_gn, offs_d, qk_scale,
                                             HEAD_DIM, BLOCK_M, BLOCK_D, CAUSAL, IEEE, False)
                    for qb in range(j_full_end, n_queries, BLOCK_M):
                        dk, dv = _dkdv_block(dk, dv, k, v, kpos, key_in, q_base, do_base, lse_base, delta_base, qb,
                                             seg_start, o, r, n_queries, stride_qn, stride_gn, offs_d, qk_scale,
                                             HEAD_DIM, BLOCK_M, BLOCK_D, CAUSAL, IEEE, True)

        dk = dk * sm_scale
        out_off = g_base + kpos.to(tl.int64)[:, None] * stride_gn + offs_d[None, :]
        tl.store(dK + out_off, dk.to(dK.dtype.element_ty), mask=kmask2)
        tl.store(dV + out_off, dv.to(dV.dtype.element_ty), mask=kmask2)

    @triton.jit(do_not_specialize=_NO_SPECIALIZE)
    def _bwd_dq_kernel(
        Q, K, V, dO, Lse, Delta, dQ,
        Seg, Dil, Off,
        stride_qb, stride_qn, stride_qh,
        stride_kb, stride_kn, stride_kh,
        stride_vb, stride_vn, stride_vh,
        stride_gb, stride_gn, stride_gh,
        N, H, qk_scale, sm_scale, tiles_per_stream,
        NUM_BRANCHES, R, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        IEEE: tl.constexpr,
    ):
        """One program owns BLOCK_M query rows of one stream; loops over their keys."""
        pid_m = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        stream = pid_m // tiles_per_stream
        tile = pid_m % tiles_per_stream
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        pos = stream + R * rows
        row_valid = pos < N
        offs_d = tl.arange(0, BLOCK_D)

        q_base = Q + b.to(tl.int64) * stride_qb + h * stride_qh
        k_base = K + b.to(tl.int64) * stride_kb + h * stride_kh
        v_base = V + b.to(tl.int64) * stride_vb + h * stride_vh
        g_base = b.to(tl.int64) * stride_gb + h * stride_gh
        qmask2 = _mask2(row_valid, offs_d, HEAD_DIM, BLOCK_D)
        pos64 = pos.to(tl.int64)
        q = tl.load(q_base + pos64[:, None] * stride_qn + offs_d[None, :], mask=qmask2, other=0.0)
        do = tl.load(dO + g_base + pos64[:, None] * stride_gn + offs_d[None, :], mask=qmask2, other=0.0)
        lse = tl.load(Lse + pid_bh.to(tl.int64) * N + pos, mask=row_valid, other=0.0)
        lse2 = tl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)
        delta = tl.load(Delta + pid_bh.to(tl.int64) * N + pos, mask=row_valid, other=0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

        for br in range(NUM_BRANCHES):
            w = tl.minimum(tl.load(Seg + br), N)
            r = tl.load(Dil + br)
            o = tl.load(Off + br * H + h)
            row_sel = row_valid & (((pos % w) % r) == o) & (o >= 0)
            n_sel = tl.sum(row_sel.to(tl.int32), axis=0)
            if n_sel > 0:
                p_min = tl.min(tl.where(row_sel, pos, N), axis=0)
                p_max = tl.max(tl.where(row_sel, pos, -1), axis=0)
                s_lo = p_min // w
                s_hi = p_max // w
                for s in range(s_lo, s_hi + 1):
                    seg_start = s * w
                    seg_len = tl.minimum(w, N - seg_start)
                    n_keys = tl.maximum((seg_len - o + r - 1) // r, 0)
                    row_in = row_sel & ((pos // w) == s)
                    n_iter = n_keys
                    if CAUSAL:
                        seg_p_max = tl.max(tl.where(row_in, pos, -1), axis=0)
                        n_iter = tl.minimum(n_keys, tl.maximum((seg_p_max - seg_start - o) // r + 1, 0))
                    # Key blocks below n_full need no mask when every tile row takes part.
                    n_full = n_keys * 0
                    if tl.sum(row_in.to(tl.int32), axis=0) == BLOCK_M:
                        n_full = n_keys
                        if CAUSAL:
                            seg_p_min = tl.min(tl.where(row_in, pos, N), axis=0)
                            n_full = tl.minimum(n_keys, tl.maximum((seg_p_min - seg_start - o) // r + 1, 0))
                        n_full = (n_full // BLOCK_N) * BLOCK_N
                    for kb in range(0, n_full, BLOCK_N):
                        dq = _dq_block(dq, q, do, lse2, delta, pos, row_in, k_base, v_base, kb, seg_start, o, r, n_keys,
                                       stride_kn, stride_vn, offs_d, qk_scale, HEAD_DIM, BLOCK_N, BLOCK_D, CAUSAL, IEEE,
                                       False)
                    for kb in range(n_full, n_iter, BLOCK_N):
                        dq = _dq_block(dq, q, do, lse2, delta, pos, row_in, k_base, v_base, kb, seg_start, o, r, n_keys,
                                       stride_kn, stride_vn, offs_d, qk_scale, HEAD_DIM, BLOCK_N, BLOCK_D, CAUSAL, IEEE,
                                       True)

        dq = dq * sm_scale
        tl.store(dQ + g_base + pos64[:, None] * stride_gn + offs_d[None, :], dq.to(dQ.dtype.element_ty), mask=qmask2)


if HAVE_TRITON:

    @triton.jit
    def _delta_kernel(Out, dO, GradLse, Delta, stride_b, stride_n, stride_h, N, H,
                      HAS_GRAD_LSE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                      BLOCK_ROWS: tl.constexpr):
        """delta[b, h, n] = <dO, O>[b, n, h] - grad_lse[b, h, n] (float32), one pass over O and dO."""
        pid = tl.program_id(0)
        pid_bh = tl.program_id(1)
        b = pid_bh // H
        h = pid_bh % H
        rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        offs_d = tl.arange(0, BLOCK_D)
        mask = _mask2(rows < N, offs_d, HEAD_DIM, BLOCK_D)
        offset = b.to(tl.int64) * stride_b + h * stride_h + rows.to(tl.int64)[:, None] * stride_n + offs_d[None, :]
        o = tl.load(Out + offset, mask=mask, other=0.0).to(tl.float32)
        do = tl.load(dO + offset, mask=mask, other=0.0).to(tl.float32)
        delta = tl.sum(o * do, axis=1)
        if HAS_GRAD_LSE:
            g = tl.load(GradLse + pid_bh.to(tl.int64) * N + rows, mask=rows < N, other=0.0)
            delta -= tl.where((g == g) & (tl.abs(g) < float("inf")), g, 0.0)
        tl.store(Delta + pid_bh.to(tl.int64) * N + rows, delta, mask=rows < N)


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segment_lengths: Sequence[int],
                  dilation_rates: Sequence[int], head_offsets: torch.Tensor) -> None:
    if not HAVE_TRITON:
        raise ImportError("the fused dilated-attention kernel needs the 'triton' package (pip install triton)")
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError(f"q, k, v must share one shape (B, N, H, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"q, k, v dtype must be one of float16, bfloat16, float32 and equal; got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k, v must be on one device")
    if len(segment_lengths) != len(dilation_rates) or len(segment_lengths) == 0:
        raise ValueError("segment_lengths and dilation_rates must be non-empty lists of equal length")
    for w, r in zip(segment_lengths, dilation_rates):
        if int(w) < 1 or int(r) < 1 or int(r) > int(w):
            raise ValueError(f"segment_lengths/dilation_rates need 1 <= dilation <= segment; got {w}, {r}")
    num_heads = q.shape[2]
    if tuple(head_offsets.shape) != (len(segment_lengths), num_heads):
        raise ValueError(f"head_offsets must have shape (num_branches, H) = ({len(segment_lengths)}, {num_heads}); "
                         f"got {tuple(head_offsets.shape)}")
    if q.shape[3] > 256:
        raise ValueError(f"head dim D must be <= 256 for the fused kernel; got {q.shape[3]}")
    if q.device.type not in ("cuda", "meta") and not interpreting():
        raise ValueError(f"q, k, v must be CUDA tensors (or set TRITON_INTERPRET=1); got device {q.device}")


# Launch-configuration overrides for benchmarking variants: {"fwd": (BLOCK_M, BLOCK_N, warps, stages),
# "bwd": (dkdv BLOCK_M, dkdv BLOCK_N, dq BLOCK_M, dq BLOCK_N, warps, stages), "fwd_tma": bool (Hopper
# bulk tensor copies for the forward's full key blocks), "fwd_diag": 0 | 1 | 2 (benchmarks only, the
# result is then not attention: 1 = exp2 replaced by a multiply-add, 2 = no softmax at all)}.
CONFIG_OVERRIDES: dict[str, object] = {}
# Whether the forward reads full key blocks with the tensor-memory accelerator where it can.
USE_TMA_DEFAULT = False


def _tma_eligible(k: torch.Tensor, v: torch.Tensor) -> bool:
    """Device-side tensor descriptors need sm_90+, a power-of-2 head dim of >= 16 bytes, and 16-byte
    aligned base pointers and row strides (every dilated row stride is then aligned too)."""
    if interpreting() or k.device.type != "cuda" or torch.cuda.get_device_capability(k.device)[0] < 9:
        return False
    if not hasattr(tl, "make_tensor_descriptor"):
        return False
    head_dim, size = k.shape[-1], k.element_size()
    if head_dim & (head_dim - 1) or head_dim * size < 16:
        return False
    return all(t.data_ptr() % 16 == 0 and all(st * size % 16 == 0 for st in t.stride()[:3]) for t in (k, v))


_TMA_ALLOCATOR_SET = False


def _ensure_tma_allocator() -> None:
    """Device-side descriptors live in a global scratch buffer that Triton asks the allocator for."""
    global _TMA_ALLOCATOR_SET
    if not _TMA_ALLOCATOR_SET:
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        _TMA_ALLOCATOR_SET = True


def _check_scale(scale: float | None, head_dim: int) -> float:
    """The softmax scale (default D**-0.5); the kernels need it finite and > 0."""
    value = float(head_dim ** -0.5) if scale is None else float(scale)
    if not (value > 0.0 and math.isfinite(value)):
        raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
    return value


def _fwd_config(head_dim: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for the forward kernel."""
    if "fwd" in CONFIG_OVERRIDES:
        return CONFIG_OVERRIDES["fwd"]
    if interpreting():
        return 16, 16, 1, 1
    if dtype == torch.float32:
        return 64, 32, 4, 2
    if head_dim <= 64:
        return 128, 64, 4, 4
    if head_dim <= 128:
        return 128, 64, 8, 3
    return 64, 32, 4, 2


def _bwd_config(head_dim: int, dtype: torch.dtype) -> tuple[int, int, int, int, int, int]:
    """(dkdv BLOCK_M, dkdv BLOCK_N, dq BLOCK_M, dq BLOCK_N, num_warps, num_stages)."""
    if "bwd" in CONFIG_OVERRIDES:
        return CONFIG_OVERRIDES["bwd"]
    if interpreting():
        return 16, 16, 16, 16, 1, 1
    if dtype == torch.float32 or head_dim > 128:
        return 32, 64, 64, 32, 4, 2
    return 32, 128, 128, 32, 4, 3


def _grid_tiles(seq_len: int, stride: int, block: int) -> tuple[int, int]:
    rows_per_stream = -(-seq_len // stride)
    tiles_per_stream = -(-rows_per_stream // block)
    return tiles_per_stream, tiles_per_stream * stride


@functools.lru_cache(maxsize=64)
def _int32_on(values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Cached read-only int32 device tensor (avoids a host-to-device copy per call)."""
    return torch.tensor(values, dtype=torch.int32, device=device)


def _branch_tensors(segment_lengths: Sequence[int], dilation_rates: Sequence[int], head_offsets: torch.Tensor,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    seg = _int32_on(tuple(int(w) for w in segment_lengths), device)
    dil = _int32_on(tuple(int(r) for r in dilation_rates), device)
    if head_offsets.device == device and head_offsets.dtype == torch.int32 and head_offsets.is_contiguous():
        off = head_offsets
    else:
        off = _int32_on(tuple(int(o) for o in head_offsets.reshape(-1).tolist()), device).view(head_offsets.shape)
    return seg, dil, off


def _row_major_last(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def dilated_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
    segment_lengths: Sequence[int], dilation_rates: Sequence[int], head_offsets: torch.Tensor,
    causal: bool = False, scale: float | None = None, allow_tf32: bool = False,
    out: torch.Tensor | None = None, lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused forward. q, k, v: (B, N, H, D); head_offsets: int (num_branches, H), -1 = head not in branch.

    Returns out (B, N, H, D) in q's dtype and lse (B, H, N) float32 (natural log; -inf for rows
    selected in no branch). float32 inputs use IEEE fp32 dots unless allow_tf32. out / lse: tensors
    to write into (out of q's shape and dtype with a unit last stride; lse (B, H, N) float32, any
    strides, e.g. a transposed view of a token-major (B, N, H) buffer); every row is written.
    """
    scale = _check_scale(scale, q.shape[-1])
    _check_inputs(q, k, v, segment_lengths, dilation_rates, head_offsets)
    q, k, v = (_row_major_last(t) for t in (q, k, v))
    batch, seq_len, num_heads, head_dim = q.shape
    seg, dil, off = _branch_tensors(segment_lengths, dilation_rates, head_offsets, q.device)
    stride = stream_stride(segment_lengths, dilation_rates, seq_len)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if lse is None:
        lse = torch.empty((batch, num_heads, seq_len), dtype=torch.float32, device=q.device)
    if out.shape != q.shape or out.dtype != q.dtype or out.stride(-1) != 1 or lse.shape != (batch, num_heads, seq_len) \
            or lse.dtype != torch.float32:
        raise ValueError(f"out must be {tuple(q.shape)} {q.dtype} with a unit last stride and lse "
                         f"{(batch, num_heads, seq_len)} float32; got {tuple(out.shape)} {out.dtype} and "
                         f"{tuple(lse.shape)} {lse.dtype}")
    if q.device.type == "meta":  # a dry run (attention.memory) counts the buffers; nothing to launch
        return out, lse
    block_m, block_n, num_warps, num_stages = _fwd_config(head_dim, q.dtype)
    tiles_per_stream, num_tiles = _grid_tiles(seq_len, stride, block_m)
    block_d = max(16, triton.next_power_of_2(head_dim))
    use_tma = bool(CONFIG_OVERRIDES.get("fwd_tma", USE_TMA_DEFAULT)) and _tma_eligible(k, v)
    if use_tma:
        _ensure_tma_allocator()
    _fwd_kernel[(num_tiles, batch * num_heads)](
        q, k, v, out, lse, seg, dil, off,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0), lse.stride(1), lse.stride(2),
        seq_len, num_heads, scale * _LOG2E, tiles_per_stream, len(segment_lengths), stride,
        HEAD_DIM=head_dim, CAUSAL=bool(causal),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        IEEE=(q.dtype == torch.float32 and not allow_tf32), USE_TMA=use_tma,
        DIAG=int(CONFIG_OVERRIDES.get("fwd_diag", 0)),
        num_warps=num_warps, num_stages=num_stages,
    )
    return out, lse


def dilated_attention_backward(
    grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
    lse: torch.Tensor, *, segment_lengths: Sequence[int], dilation_rates: Sequence[int],
    head_offsets: torch.Tensor, causal: bool = False, scale: float | None = None, allow_tf32: bool = False,
    grad_lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact backward from the merged out and lse: returns dq, dk, dv (B, N, H, D) in q's dtype.

    grad_lse (B, H, N), optional: gradient reaching the lse output. Since d lse_i / d s_ij = P_ij,
    it enters as dS = P * (dP - (delta - grad_lse)), i.e. through the row correction delta.
    """
    scale = _check_scale(scale, q.shape[-1])
    _check_inputs(q, k, v, segment_lengths, dilation_rates, head_offsets)
    q, k, v = (_row_major_last(t) for t in (q, k, v))
    grad_out = grad_out.contiguous()
    batch, seq_len, num_heads, head_dim = q.shape
    seg, dil, off = _branch_tensors(segment_lengths, dilation_rates, head_offsets, q.device)
    stride = stream_stride(segment_lengths, dilation_rates, seq_len)
    # delta[b, h, n] = <dO, O> per row (float32) minus grad_lse: the softmax-backward row correction.
    out = out.contiguous()
    delta = torch.empty((batch, num_heads, seq_len), dtype=torch.float32, device=q.device)
    grad_lse_f = grad_lse.float().contiguous() if grad_lse is not None else delta
    if q.device.type == "meta":  # a dry run (attention.memory) counts the buffers; nothing to launch
        lse = lse.float().contiguous()
        return tuple(torch.empty(q.shape, dtype=q.dtype, device=q.device) for _ in range(3))
    block_d = max(16, triton.next_power_of_2(head_dim))
    rows = 16 if interpreting() else 64
    _delta_kernel[(triton.cdiv(seq_len, rows), batch * num_heads)](
        out, grad_out, grad_lse_f, delta, out.stride(0), out.stride(1), out.stride(2), seq_len, num_heads,
        HAS_GRAD_LSE=grad_lse is not None, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_ROWS=rows)
    lse = lse.float().contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty_like(dq)
    dv = torch.empty_like(dq)
    bm1, bn1, bm2, bn2, num_warps, num_stages = _bwd_config(head_dim, q.dtype)
    ieee = q.dtype == torch.float32 and not allow_tf32
    common = dict(HEAD_DIM=head_dim, CAUSAL=bool(causal), BLOCK_D=block_d, IEEE=ieee,
                  num_warps=num_warps, num_stages=num_stages)
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2), dq.stride(0), dq.stride(1), dq.stride(2))
    tiles_n, num_tiles_n = _grid_tiles(seq_len, stride, bn1)
    _bwd_dkdv_kernel[(num_tiles_n, batch * num_heads)](
        q, k, v, grad_out, lse, delta, dk, dv, seg, dil, off, *strides,
        seq_len, num_heads, scale * _LOG2E, scale, tiles_n, len(segment_lengths), stride,
        BLOCK_M=bm1, BLOCK_N=bn1, **common,
    )
    tiles_m, num_tiles_m = _grid_tiles(seq_len, stride, bm2)
    _bwd_dq_kernel[(num_tiles_m, batch * num_heads)](
        q, k, v, grad_out, lse, delta, dq, seg, dil, off, *strides,
        seq_len, num_heads, scale * _LOG2E, scale, tiles_m, len(segment_lengths), stride,
        BLOCK_M=bm2, BLOCK_N=bn2, **common,
    )
    return dq, dk, dv
