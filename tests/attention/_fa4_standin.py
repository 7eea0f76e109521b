"""A stand-in for `flash_attn.cute.interface` on the CPU, in float64, with FlashAttention-4's call semantics, so the
fa4 executor's glue (views, outputs written in place, gradients into the caller's views, varlen runs) is tested
against the oracle without a GPU.

Dense calls: q (B, Lq, H, D), k, v (B, L, H_kv, D); fewer queries align at the bottom right; LSE (B, H, Lq), None
without `return_lse` on inputs that need no gradient; `out=`
and `dq=`, `dk=`, `dv=` are written in place where given. Varlen calls: sequence i is rows [cu[i], cu[i] +
seqused[i]) (cu[i + 1] - cu[i] without seqused); only those rows are written; LSE (H, rows); rows of no sequence
come back as NaN where the kernel allocates its own outputs."""
from __future__ import annotations

import dataclasses
import sys
import types

import torch

from hilbert_lab.attention.executors import fa4
from hilbert_lab.attention.executors.blockwise import blockwise_executor
from hilbert_lab.attention.executors.manual import dense_backward, dense_forward


def _sequences(cu, used):
    starts = cu.tolist()
    lengths = used.tolist() if used is not None else [b - a for a, b in zip(starts, starts[1:])]
    return [(a, n) for a, n in zip(starts, lengths)]


def _forward(q, k, v, *, softmax_scale, causal, return_lse, out=None, cu_seqlens_q=None, cu_seqlens_k=None,
             seqused_q=None, seqused_k=None, max_seqlen_q=None, max_seqlen_k=None):
    if cu_seqlens_q is None:
        result, lse, _ = dense_forward(q, k, v, causal=causal, scale=softmax_scale)
        if out is not None:
            out.copy_(result)
            result = out
        wanted = return_lse or any(t.requires_grad for t in (q, k, v))  # as the kernel: no LSE where none is asked
        return result, lse if wanted else None, None, None, None
    assert return_lse and q.dim() == 3 and cu_seqlens_q.dtype == torch.int32 and out.shape == q.shape
    assert cu_seqlens_q.data_ptr() % 16 == 0, "FlashAttention-4 copies metadata off a 16-byte boundary"
    sequences = _sequences(cu_seqlens_q, seqused_q)
    assert torch.equal(cu_seqlens_q, cu_seqlens_k) and cu_seqlens_q.shape[0] - 1 == len(sequences)
    lse = torch.full((q.shape[1], q.shape[0]), float("nan"), dtype=torch.float64)  # float32 in the kernel
    for a, n in sequences:
        assert n <= max_seqlen_q
        o, l, _ = dense_forward(q[a:a + n][None], k[a:a + n][None], v[a:a + n][None], causal=causal,
                                scale=softmax_scale)
        out[a:a + n] = o[0]
        lse[:, a:a + n] = l[0]
    return out, lse, None, None, None


def _backward(q, k, v, out, dout, lse, *, softmax_scale, causal, dq=None, dk=None, dv=None, dlse=None,
              cu_seqlens_q=None, cu_seqlens_k=None, seqused_q=None, seqused_k=None, max_seqlen_q=None,
              max_seqlen_k=None):
    assert lse.is_contiguous()
    if cu_seqlens_q is None:
        shares = dense_backward(dout, q, k, v, out, lse, causal=causal, scale=softmax_scale, grad_lse=dlse)
        return tuple(share if into is None else into.copy_(share) for share, into in zip(shares, (dq, dk, dv)))
    assert lse.shape == (q.shape[1], q.shape[0])
    dq, dk, dv = (torch.full_like(t, float("nan")) if d is None else d for t, d in ((q, dq), (k, dk), (v, dv)))
    for a, n in _sequences(cu_seqlens_q, seqused_q):
        part = lambda t: t[a:a + n][None]  # noqa: E731
        shares = dense_backward(part(dout), part(q), part(k), part(v), part(out), lse[:, a:a + n][None], causal=causal,
                                scale=softmax_scale, grad_lse=None if dlse is None else dlse[:, a:a + n][None])
        for total, share in zip((dq, dk, dv), shares):
            total[a:a + n] = share[0]
    return dq, dk, dv


def standin_modules() -> dict[str, types.ModuleType]:
    """The modules `flash_attn`, `flash_attn.cute` and `flash_attn.cute.interface` of the stand-in, by name (for
    sys.modules)."""
    interface = types.ModuleType("flash_attn.cute.interface")
    interface._flash_attn_fwd, interface._flash_attn_bwd = _forward, _backward
    return {"flash_attn": types.ModuleType("flash_attn"), "flash_attn.cute": types.ModuleType("flash_attn.cute"),
            "flash_attn.cute.interface": interface}


def install_fa4_standin(monkeypatch) -> None:
    """Put the stand-in where `flash_attn.cute.interface` is imported from, for one test."""
    for name, module in standin_modules().items():
        monkeypatch.setitem(sys.modules, name, module)


# the fa4 executor's glue declared for the CPU in float64, so that it runs on the stand-in
CPU_FA4 = blockwise_executor("fa4", lambda q: fa4.FA4_KERNEL,
                             dataclasses.replace(fa4.CAPABILITIES, devices=("cpu",), dtypes=(torch.float64,),
                                                 min_capability=(0, 0), package=None),
                             varlen_for=lambda q: fa4.FA4_VARLEN)
