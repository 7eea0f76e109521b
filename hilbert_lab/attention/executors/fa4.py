"""FlashAttention-4 (the CuTe DSL kernels of `flash_attn.cute`, optional extra "fa4") on the plan's views.

Every call reads q, k, v as strided views of the caller's (B, N, H, D) tensors and writes its output
straight into the caller's slot view (`out=`) and, where the caller owns the entries, its gradients
straight into views of dq, dk, dv (`dq=`, `dk=`, `dv=`); the LSE gradient is the kernel's own `dlse`.
Queries fewer than keys are aligned at the bottom right and several query heads may read one key/value
head, as the kernel itself defines them. Views must have a unit last stride and 16-byte aligned strides
(head dims that are multiples of 8 in fp16/bf16); Hopper (sm90) and newer.
"""
from __future__ import annotations

import torch

from hilbert_lab.attention.executors.base import HALF_DTYPES, Capabilities
from hilbert_lab.attention.executors.blockwise import blockwise_executor
from hilbert_lab.attention.executors.kernel import DenseKernel
from hilbert_lab.attention.executors.manual import MANUAL_KERNEL
from hilbert_lab.attention.executors.varlen import Runs, VarlenKernel, write_rows
from hilbert_lab.kernels.recorded_launches import RecordedEntry

PACKAGE = "flash_attn.cute"
# The interface's entries, recorded once per call key and then replayed without their per-call Python
# (kernels.recorded_launches); the backward adds dQ atomically, so its replay check allows rounding.
FA4_FORWARD = RecordedEntry(PACKAGE + ".interface", "_flash_attn_fwd", outputs=("out",))
FA4_BACKWARD = RecordedEntry(PACKAGE + ".interface", "_flash_attn_bwd", outputs=("dq", "dk", "dv"), tolerance=1e-2)


def _forward(q, k, v, *, causal, scale, need_lse=True, out=None):
    result = FA4_FORWARD(dict(q=q, k=k, v=v, out=out), dict(softmax_scale=scale, causal=causal, return_lse=need_lse))
    return result[0], result[1], None


def _backward(grad_out, q, k, v, out, lse, aux=None, *, causal, scale, grad_lse=None, into=None):
    dq, dk, dv = into if into is not None else (None, None, None)
    result = FA4_BACKWARD(dict(q=q, k=k, v=v, out=out, dout=grad_out.to(q.dtype), lse=lse.float().contiguous(),
                               dq=dq, dk=dk, dv=dv, dlse=None if grad_lse is None else grad_lse.float().contiguous()),
                          dict(softmax_scale=scale, causal=causal))
    return result[0], result[1], result[2]


def _varlen_tensors(runs: Runs) -> dict:
    return dict(cu_seqlens_q=runs.cu, cu_seqlens_k=runs.cu, seqused_q=runs.used, seqused_k=runs.used)


def _varlen_params(runs: Runs) -> dict:
    return dict(max_seqlen_q=runs.max_length, max_seqlen_k=runs.max_length)


def _varlen_forward(q, k, v, runs: Runs, *, causal, scale, out, lse):
    result = FA4_FORWARD(dict(q=q, k=k, v=v, out=out, **_varlen_tensors(runs)),
                         dict(softmax_scale=scale, causal=causal, return_lse=True, **_varlen_params(runs)))
    if result[0] is not out:
        write_rows(out, result[0], runs.index)
    write_rows(lse, result[1].transpose(0, 1), runs.index)  # the kernel's LSE is (h, rows)
    return None


def _varlen_backward(state, grad_out, q, k, v, out, lse, runs: Runs, *, causal, scale, grad_lse=None, into=None):
    # (h, rows), float32 for the kernel's dtypes; a row that saw no key (-inf) gets +inf: zero probabilities
    lse = torch.nan_to_num(lse.transpose(0, 1), nan=float("nan"), posinf=float("inf"), neginf=float("inf"))
    lse = lse.contiguous()
    dout = torch.zeros(q.shape, dtype=q.dtype, device=q.device) if grad_out is None else grad_out.to(q.dtype)
    dq, dk, dv = into if into is not None else (None, None, None)
    dlse = None if grad_lse is None else grad_lse.transpose(0, 1).contiguous()
    result = FA4_BACKWARD(dict(q=q, k=k, v=v, out=out, dout=dout, lse=lse, dq=dq, dk=dk, dv=dv, dlse=dlse,
                               **_varlen_tensors(runs)),
                          dict(softmax_scale=scale, causal=causal, **_varlen_params(runs)))
    return result[0], result[1], result[2]


FA4_VARLEN = VarlenKernel("fa4_varlen", _varlen_forward, _varlen_backward, graphs=True)


def _workspace(q: torch.Tensor, k: torch.Tensor, backward: bool) -> int:
    """The backward's float32 dQ accumulator (b, h, Lq_rounded * D_rounded) and its two row buffers
    (b, h, Lq_rounded), Lq rounded up to 128 and D to 64."""
    if not backward:
        return 0
    batch, length, heads, dim = q.shape
    rows = batch * heads * (-(-length // 128) * 128)
    return rows * (-(-dim // 64) * 64 + 2) * 4


FA4_KERNEL = DenseKernel("fa4", _forward, _backward, gqa=True, bottom_right=True, grad_lse=True, writes_into=True,
                         fallback=MANUAL_KERNEL, workspace=_workspace, meta=False, graphs=True)
CAPABILITIES = Capabilities(devices=("cuda",), dtypes=HALF_DTYPES, head_dims=(256, 8), min_capability=(9, 0),
                            grad_lse=True, gqa=True, bottom_right=True, varlen=True, package=PACKAGE,
                            install="hilbert-lab[fa4]")


def executors() -> dict:
    """The FlashAttention-4 executor (name -> Executor)."""
    return {"fa4": blockwise_executor("fa4", lambda q: FA4_KERNEL, CAPABILITIES,
                                      description="FlashAttention-4 on the plan's views, reading and writing in place",
                                      varlen_for=lambda q: FA4_VARLEN)}
