"""PyTorch SDPA kernels (flash / cuDNN / efficient / math) through the aten ops that return the LSE.

CUDA: aten._scaled_dot_product_{flash,cudnn,efficient}_attention forward and their fused backward
ops, which take the (merged) output and LSE as inputs. CPU: the CPU flash kernel
(aten._scaled_dot_product_flash_attention_for_cpu and its backward; float32/float64/bf16/fp16).
"math" is PyTorch's math formula in eager form (manual dense backend), since the math SDPA kernel
returns no LSE. The LSE-gradient share (needed for exact gradients through merge weights) comes
from one extra fused-backward call with grad_out = e_0, out = -grad_lse * e_0 and v = 0, which
makes the kernel's ds = p * (dp - rowsum(grad_out * out)) equal p * grad_lse.
"""
from __future__ import annotations

from typing import Optional

import torch

from hilbert_lab.attention.backends import manual
from hilbert_lab.attention.backends.base import Backend

KERNELS = ("auto", "flash", "cudnn", "efficient", "math")
aten = torch.ops.aten


def _cuda_kernel(kernel: str, q: torch.Tensor) -> str:
    """The CUDA kernel for "auto": cuDNN on Hopper and newer (measured faster than flash there, forward and
    backward, on strided blocks too), flash on Ampere/Ada, efficient for fp32 or older GPUs."""
    if kernel != "auto":
        return kernel
    major = torch.cuda.get_device_capability(q.device)[0]
    half = q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] % 8 == 0
    if half and major >= 9 and q.shape[-1] <= 128 and torch.backends.cudnn.is_available():
        return "cudnn"
    if half and major >= 8 and q.shape[-1] <= 256:
        return "flash"
    return "efficient"


def _unavailable(kernel: str):
    def reason(device=None, dtype=None) -> Optional[str]:
        device = torch.device(device) if device is not None else None
        if kernel == "math":
            return None
        if device is None or device.type == "cpu":
            if kernel in ("auto", "flash"):
                return None
            return f"SDPA kernel {kernel!r} needs CUDA (on CPU use 'sdpa' or 'sdpa_flash')"
        if device.type != "cuda":
            return f"SDPA kernels need a CPU or CUDA device, got {device}"
        if kernel in ("flash", "cudnn") and torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] < 8:
            return f"the SDPA {kernel} kernel needs compute capability >= 8.0 (Ampere or newer)"
        if kernel == "flash" and dtype not in (None, torch.float16, torch.bfloat16):
            return f"the SDPA flash kernel on CUDA needs float16/bfloat16, got {dtype}"
        if kernel == "cudnn" and dtype not in (None, torch.float16, torch.bfloat16):
            return f"the SDPA cuDNN kernel needs float16/bfloat16, got {dtype}"
        return None

    return reason


def _to_bhld(*tensors):
    return [t.transpose(1, 2) for t in tensors]


def _make_forward(kernel: str):
    def forward(q, k, v, *, causal, scale, key_padding_mask=None):
        # The fused CUDA kernels take fp16/bf16 (flash, cuDNN) or up to fp32 (efficient): float64 and
        # padded blocks on CUDA take the exact eager path.
        on_cuda = q.device.type == "cuda"
        if kernel == "math" or (on_cuda and (key_padding_mask is not None or q.dtype == torch.float64)):
            return manual.dense_forward(q, k, v, causal=causal, scale=scale, key_padding_mask=key_padding_mask)
        qh, kh, vh = _to_bhld(q, k, v)
        if q.device.type == "cpu":
            mask = None
            if key_padding_mask is not None:  # the CPU kernel takes an additive mask in the input dtype
                mask = torch.zeros(key_padding_mask.shape, dtype=q.dtype, device=q.device)
                mask = mask.masked_fill(key_padding_mask, float("-inf"))[:, None, None, :]
            out, lse = aten._scaled_dot_product_flash_attention_for_cpu(qh, kh, vh, 0.0, causal, attn_mask=mask, scale=scale)
            out, lse = _empty_rows_to_zero(out, lse, key_padding_mask, causal)
            return out.transpose(1, 2), lse, ("cpu", mask)
        chosen = _cuda_kernel(kernel, q)
        if chosen == "flash":
            out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_flash_attention(
                qh, kh, vh, 0.0, causal, False, scale=scale)
            aux = ("flash", (cq, ck, mq, mk, seed, offset), lse.shape)
        elif chosen == "cudnn":
            out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_cudnn_attention(
                qh, kh, vh, None, True, 0.0, causal, False, scale=scale)
            aux = ("cudnn", (cq, ck, mq, mk, seed, offset), lse.shape)
        elif chosen == "efficient":
            out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(
                qh, kh, vh, None, True, 0.0, causal, scale=scale)
            aux = ("efficient", (seed, offset), lse.shape)
        else:
            raise ValueError(f"kernel must be one of {KERNELS}, got {chosen!r}")
        rows = q.shape[1]
        lse = lse.reshape(lse.shape[0], lse.shape[1], -1)[:, :, :rows]
        return out.transpose(1, 2), lse, aux

    return forward


def _empty_rows_to_zero(out, lse, key_padding_mask, causal):
    """Rows with no key (all padded) -> out 0, lse -inf, whatever the kernel produced."""
    if key_padding_mask is None:
        return out, lse
    rows = torch.arange(out.shape[2], device=out.device)
    keep = ~key_padding_mask  # (B, L)
    if causal:
        any_key = torch.cumsum(keep.to(torch.int64), dim=1)[:, : out.shape[2]] > 0  # (B, L)
    else:
        any_key = keep.any(dim=1, keepdim=True).expand(-1, rows.numel())
    empty = ~any_key[:, None, :]  # (B, 1, L)
    out = torch.where(empty[..., None], torch.zeros((), dtype=out.dtype, device=out.device), out)
    lse = torch.where(empty, torch.full((), float("-inf"), dtype=lse.dtype, device=lse.device), lse)
    return out, lse


def _fused_backward(aux, grad_out, q, k, v, out, lse, causal, scale):
    """One fused backward call in (B, H, L, D) layout; lse (B, H, L) with -inf rows already guarded."""
    kind = aux[0]
    if kind == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, causal, attn_mask=aux[1], scale=scale)
    lse_shape = tuple(aux[2])  # flash (B, H, L); efficient (B, H, L padded to 32); cuDNN (B, H, L, 1)
    if tuple(lse.shape) != lse_shape:
        full = torch.zeros(lse_shape[:3], dtype=torch.float32, device=lse.device)
        full[:, :, : lse.shape[-1]] = lse
        lse = full.reshape(lse_shape)
    lse = lse.to(torch.float32).contiguous()
    # q, k, v are read in place (strided block views work, measured on an H100); the kernels assume
    # one dense layout for out and grad_out, so those two are made contiguous.
    grad_out, out = grad_out.contiguous(), out.contiguous()
    if kind == "flash":
        cq, ck, mq, mk, seed, offset = aux[1]
        return aten._scaled_dot_product_flash_attention_backward(
            grad_out, q, k, v, out, lse, cq, ck, mq, mk, 0.0, causal, seed, offset, scale=scale)
    if kind == "cudnn":
        cq, ck, mq, mk, seed, offset = aux[1]
        return aten._scaled_dot_product_cudnn_attention_backward(
            grad_out, q, k, v, out, lse, seed, offset, None, cq, ck, mq, mk, 0.0, causal, scale=scale)
    seed, offset = aux[1]
    dq, dk, dv, _ = aten._scaled_dot_product_efficient_attention_backward(
        grad_out, q, k, v, None, out, lse, seed, offset, 0.0, [True, True, True, False], causal, scale=scale)
    return dq, dk, dv


def _make_backward(kernel: str):
    def backward(grad_out, grad_lse, q, k, v, out, lse, aux, *, causal, scale, key_padding_mask=None):
        if aux is None:  # forward took the eager math path
            return manual.dense_backward(grad_out, grad_lse, q, k, v, out, lse, causal=causal, scale=scale,
                                         key_padding_mask=key_padding_mask)
        if aux[0] == "efficient":
            # The efficient kernel's fused backward disagreed with the float64 oracle in bf16 on an
            # H100 (torch 2.11; dq off by orders of magnitude, also without the LSE share), so this
            # adapter keeps the efficient forward and takes the exact chunked eager backward.
            return manual.dense_backward(grad_out, grad_lse, q, k, v, out, lse, causal=causal, scale=scale)
        # lse = -inf (row without keys) -> +inf so that the kernel's p = exp(s - lse) is 0, not NaN.
        lse = torch.where(torch.isfinite(lse), lse, torch.full_like(lse, float("inf")))
        qh, kh, vh, doh, oh = _to_bhld(q, k, v, grad_out.to(q.dtype), out)
        dq, dk, dv = _fused_backward(aux, doh, qh, kh, vh, oh, lse, causal, scale)
        if grad_lse is not None:
            unit = torch.zeros_like(doh)
            unit[..., 0] = 1
            shifted = torch.zeros_like(oh)
            shifted[..., 0] = -grad_lse.to(q.dtype)
            extra_q, extra_k, _ = _fused_backward(aux, unit, qh, kh, torch.zeros_like(vh), shifted, lse, causal, scale)
            dq, dk = dq + extra_q, dk + extra_k
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)

    return backward


def make_backend(kernel: str) -> Backend:
    """The SDPA adapter for one kernel choice ("auto" picks flash, else efficient, on CUDA)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    name = "sdpa" if kernel == "auto" else f"sdpa_{kernel}"
    return Backend(name, _make_forward(kernel), _make_backward(kernel), _unavailable(kernel))
