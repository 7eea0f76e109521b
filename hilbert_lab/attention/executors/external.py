"""Kernels of optional packages: flash-attn ("flash") and xFormers ("xformers").

Both call the package's forward that returns the LSE and its backward that accepts (out, lse), so the
merged output and LSE can be passed. Their calls get contiguous copies of each block (capability
in_place False); the LSE gradient goes through the executor's identity (kernel.call_backward).
"""
from __future__ import annotations

import inspect
import torch

from hilbert_lab.attention.executors.base import HALF_DTYPES, Capabilities
from hilbert_lab.attention.executors.blockwise import blockwise_executor
from hilbert_lab.attention.executors.kernel import DenseKernel
from hilbert_lab.attention.executors.manual import MANUAL_KERNEL


def _flash_forward(q, k, v, *, causal, scale, need_lse=True):
    from flash_attn import flash_attn_func

    out, lse, _ = flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=scale, causal=causal, return_attn_probs=True)
    return out, lse[:, :, : q.shape[1]].float(), None


def _flash_backward(grad_out, q, k, v, out, lse, aux=None, *, causal, scale):
    from flash_attn.flash_attn_interface import _flash_attn_backward

    params = inspect.signature(_flash_attn_backward).parameters
    do, q, k, v, out = (t.contiguous() for t in (grad_out.to(q.dtype), q, k, v, out))
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    kwargs = dict(dout=do, q=q, k=k, v=v, out=out, softmax_lse=lse.float().contiguous(), dq=dq, dk=dk, dv=dv,
                  dropout_p=0.0, softmax_scale=scale, causal=causal, window_size=(-1, -1), window_size_left=-1,
                  window_size_right=-1, softcap=0.0, alibi_slopes=None, deterministic=False, rng_state=None)
    _flash_attn_backward(**{name: kwargs[name] for name in params if name in kwargs})
    return dq, dk, dv


def _xformers_bias(causal):
    from xformers.ops import fmha

    return fmha.attn_bias.LowerTriangularMask() if causal else None


def _xformers_forward(q, k, v, *, causal, scale, need_lse=True):
    from xformers.ops import fmha

    out, lse = fmha.memory_efficient_attention_forward_requires_grad(q, k, v, attn_bias=_xformers_bias(causal), scale=scale)
    return out, lse[:, :, : q.shape[1]].float(), tuple(lse.shape)


def _xformers_backward(grad_out, q, k, v, out, lse, aux, *, causal, scale):
    from xformers.ops import fmha

    full = torch.zeros(aux, dtype=torch.float32, device=lse.device)
    full[:, :, : lse.shape[-1]] = lse
    return fmha.memory_efficient_attention_backward(grad_out.to(q.dtype), out, full, q, k, v,
                                                    attn_bias=_xformers_bias(causal), scale=scale)


def _xformers_aux(q, k, causal):
    """The shape of the LSE xFormers' forward returns: (b, h, Lq rounded up to 32), its kernels' LSE alignment."""
    return (q.shape[0], q.shape[2], -(-q.shape[1] // 32) * 32)


FLASH_KERNEL = DenseKernel("flash_attn", _flash_forward, _flash_backward, fallback=MANUAL_KERNEL, meta=False)
XFORMERS_KERNEL = DenseKernel("xformers", _xformers_forward, _xformers_backward, fallback=MANUAL_KERNEL,
                              meta=False, aux_for=_xformers_aux)


def executors() -> dict:
    """The executors of optional packages (name -> Executor)."""
    return {
        "flash": blockwise_executor("flash", lambda q: FLASH_KERNEL, Capabilities(
            devices=("cuda",), dtypes=HALF_DTYPES, head_dims=(256, 8), min_capability=(8, 0), in_place=False,
            package="flash_attn.flash_attn_interface", install="flash-attn"),
            description="flash-attn on contiguous block copies"),
        "xformers": blockwise_executor("xformers", lambda q: XFORMERS_KERNEL, Capabilities(
            devices=("cuda",), in_place=False, package="xformers"), description="xFormers on contiguous block copies"),
    }
