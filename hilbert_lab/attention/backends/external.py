"""Adapters for optional packages: flash-attn ("flash") and xFormers ("xformers").

Both call the package's forward that returns the LSE and its backward that accepts (out, lse), so
the engine can pass the merged output and LSE. The LSE-gradient share uses the same extra
backward call as the SDPA adapter (grad_out = e_0, out = -grad_lse * e_0, v = 0).
"""
from __future__ import annotations

import importlib.util
import inspect
from typing import Optional

import torch

from hilbert_lab.attention.backends.base import Backend


def _package_reason(package: str, pip_name: str, device, dtype) -> Optional[str]:
    if importlib.util.find_spec(package) is None:
        return f"the package {pip_name!r} is not installed (pip install {pip_name})"
    if device is not None and torch.device(device).type != "cuda":
        return f"{pip_name} needs a CUDA device, got {device}"
    if dtype is not None and dtype not in (torch.float16, torch.bfloat16) and package == "flash_attn":
        return f"flash-attn needs float16/bfloat16, got {dtype}"
    return None


def _with_lse_grad(call_backward, grad_out, grad_lse, q, k, v, out, lse):
    """Run the package backward (layout B, L, H, D) plus the LSE-gradient share when grad_lse is given."""
    lse = torch.where(torch.isfinite(lse), lse, torch.full_like(lse, float("inf")))
    dq, dk, dv = call_backward(grad_out, q, k, v, out, lse)
    if grad_lse is not None:
        unit = torch.zeros_like(grad_out)
        unit[..., 0] = 1
        shifted = torch.zeros_like(out)
        shifted[..., 0] = -grad_lse.transpose(1, 2).to(out.dtype)
        extra_q, extra_k, _ = call_backward(unit, q, k, torch.zeros_like(v), shifted, lse)
        dq, dk = dq + extra_q, dk + extra_k
    return dq, dk, dv


# ---- flash-attn -------------------------------------------------------------------------------
def _flash_forward(q, k, v, *, causal, scale, key_padding_mask=None):
    if key_padding_mask is not None:
        raise ValueError("backend 'flash' does not take key_padding_mask (use 'sdpa' or 'manual')")
    from flash_attn import flash_attn_func

    out, lse, _ = flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=scale, causal=causal, return_attn_probs=True)
    return out, lse[:, :, : q.shape[1]].float(), None


def _flash_backward(grad_out, grad_lse, q, k, v, out, lse, aux=None, *, causal, scale, key_padding_mask=None):
    from flash_attn.flash_attn_interface import _flash_attn_backward

    params = inspect.signature(_flash_attn_backward).parameters

    def call(do, q_, k_, v_, o_, lse_):
        do, q_, k_, v_, o_ = (t.contiguous() for t in (do, q_, k_, v_, o_))
        dq, dk, dv = torch.empty_like(q_), torch.empty_like(k_), torch.empty_like(v_)
        kwargs = dict(dout=do, q=q_, k=k_, v=v_, out=o_, softmax_lse=lse_.float().contiguous(), dq=dq, dk=dk, dv=dv,
                      dropout_p=0.0, softmax_scale=scale, causal=causal, window_size=(-1, -1), window_size_left=-1,
                      window_size_right=-1, softcap=0.0, alibi_slopes=None, deterministic=False, rng_state=None)
        _flash_attn_backward(**{name: kwargs[name] for name in params if name in kwargs})
        return dq, dk, dv

    return _with_lse_grad(call, grad_out, grad_lse, q, k, v, out, lse)


FLASH = Backend("flash", _flash_forward, _flash_backward,
                lambda device=None, dtype=None: _package_reason("flash_attn", "flash-attn", device, dtype))


# ---- xFormers ---------------------------------------------------------------------------------
def _xformers_bias(causal):
    from xformers.ops import fmha

    return fmha.attn_bias.LowerTriangularMask() if causal else None


def _xformers_forward(q, k, v, *, causal, scale, key_padding_mask=None):
    if key_padding_mask is not None:
        raise ValueError("backend 'xformers' does not take key_padding_mask (use 'sdpa' or 'manual')")
    from xformers.ops import fmha

    out, lse = fmha.memory_efficient_attention_forward_requires_grad(q, k, v, attn_bias=_xformers_bias(causal), scale=scale)
    return out, lse[:, :, : q.shape[1]].float(), tuple(lse.shape)


def _xformers_backward(grad_out, grad_lse, q, k, v, out, lse, aux=None, *, causal, scale, key_padding_mask=None):
    from xformers.ops import fmha

    def call(do, q_, k_, v_, o_, lse_):
        full = torch.zeros(aux, dtype=torch.float32, device=lse_.device)
        full[:, :, : lse_.shape[-1]] = lse_
        return fmha.memory_efficient_attention_backward(do, o_, full, q_, k_, v_, attn_bias=_xformers_bias(causal), scale=scale)

    return _with_lse_grad(call, grad_out, grad_lse, q, k, v, out, lse)


XFORMERS = Backend("xformers", _xformers_forward, _xformers_backward,
                   lambda device=None, dtype=None: _package_reason("xformers", "xformers", device, dtype))
