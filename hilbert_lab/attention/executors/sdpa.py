"""PyTorch's SDPA kernels through the aten ops that return the LSE and whose backward takes (out, LSE).

CPU: aten._scaled_dot_product_flash_attention_for_cpu and its backward (float32/float64/bf16/fp16).
CUDA: aten._scaled_dot_product_{flash,cudnn,efficient}_attention; flash and cuDNN read strided views
and their backward takes the merged out and LSE (out and grad_out in one dense layout); the efficient
kernel's fused backward disagreed with the float64 oracle in bf16 on an H100 (torch 2.11; dq off by
orders of magnitude, also without the LSE share), so its calls take the exact eager backward.
"math" is PyTorch's math formula in eager form (the manual kernel). `cuda_kernel_name` is the one
choice between cuDNN and flash.
"""
from __future__ import annotations

import functools

import torch

from hilbert_lab.attention.executors.base import ALL_DTYPES, HALF_DTYPES, Capabilities
from hilbert_lab.attention.executors.blockwise import blockwise_executor
from hilbert_lab.attention.executors.kernel import DenseKernel
from hilbert_lab.attention.executors.manual import EAGER_CAPABILITIES, MANUAL_KERNEL, dense_backward
from hilbert_lab.attention.target import device_facts

aten = torch.ops.aten


def cuda_kernel_name(dtype: torch.dtype, head_dim: int, capability: tuple[int, int], cudnn: bool) -> str:
    """The SDPA kernel for "sdpa" on CUDA: cuDNN on Hopper and newer (measured faster than flash there,
    forward and backward, on strided blocks too), flash on Ampere/Ada, efficient for fp32 or older GPUs, the
    eager math kernel for float64 (no fused CUDA kernel takes it)."""
    if dtype not in HALF_DTYPES and dtype != torch.float32:
        return "math"
    half = dtype in HALF_DTYPES and head_dim % 8 == 0
    if half and capability[0] >= 9 and head_dim <= 128 and cudnn:
        return "cudnn"
    if half and capability[0] >= 8 and head_dim <= 256:
        return "flash"
    return "efficient"


def _bhld(*tensors):
    return [t.transpose(1, 2) for t in tensors]


def _cpu_forward(q, k, v, *, causal, scale, need_lse=True):
    qh, kh, vh = _bhld(q, k, v)
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(qh, kh, vh, 0.0, causal, scale=scale)
    return out.transpose(1, 2), lse, None


def _cpu_backward(grad_out, q, k, v, out, lse, aux=None, *, causal, scale):
    qh, kh, vh, gh, oh = _bhld(q, k, v, grad_out.to(q.dtype), out)
    dq, dk, dv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
        gh, qh, kh, vh, oh, lse.contiguous(), 0.0, causal, scale=scale)
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


def _flash_forward(q, k, v, *, causal, scale, need_lse=True):
    qh, kh, vh = _bhld(q, k, v)
    out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_flash_attention(
        qh, kh, vh, 0.0, causal, False, scale=scale)
    return out.transpose(1, 2), lse, (cq, ck, mq, mk, seed, offset)


def _flash_backward(grad_out, q, k, v, out, lse, aux, *, causal, scale):
    # q, k, v are read in place (strided views work, measured on an H100); out and grad_out are packed.
    cq, ck, mq, mk, seed, offset = aux
    qh, kh, vh, gh, oh = _bhld(q, k, v, grad_out.to(q.dtype), out)
    gh, oh = gh.contiguous(), oh.contiguous()
    dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(
        gh, qh, kh, vh, oh, lse.float().contiguous(), cq, ck, mq, mk, 0.0, causal, seed, offset, scale=scale)
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


def _cudnn_forward(q, k, v, *, causal, scale, need_lse=True):
    qh, kh, vh = _bhld(q, k, v)
    out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_cudnn_attention(
        qh, kh, vh, None, need_lse, 0.0, causal, False, scale=scale)
    return out.transpose(1, 2), (lse.view(lse.shape[:3]) if need_lse else None), (cq, ck, mq, mk, seed, offset)


def _cudnn_backward(grad_out, q, k, v, out, lse, aux, *, causal, scale):
    cq, ck, mq, mk, seed, offset = aux
    qh, kh, vh, gh, oh = _bhld(q, k, v, grad_out.to(q.dtype), out)
    gh, oh = gh.contiguous(), oh.contiguous()
    dq, dk, dv = aten._scaled_dot_product_cudnn_attention_backward(
        gh, qh, kh, vh, oh, lse.float().contiguous().unsqueeze(-1), seed, offset, None, cq, ck, mq, mk, 0.0, causal,
        scale=scale)
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


@functools.lru_cache(maxsize=None)
def _unused_philox(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Seed and offset tensors as the flash and cuDNN forwards return them without dropout: their
    backwards read them only when dropout_p > 0 (made once per device)."""
    if device == "cpu":  # the flash forward's: 0-d CPU tensors
        return torch.zeros((), dtype=torch.int64), torch.zeros((), dtype=torch.int64)
    return torch.zeros(1, dtype=torch.int64, device=device), torch.zeros(1, dtype=torch.int64, device=device)


def _flash_aux(q, k, causal):
    """The aux `_flash_forward` returns for a call of these shapes: no cumulative lengths (one batch of
    equal lengths), the lengths as maxima, the unused seed and offset."""
    return (None, None, q.shape[1], k.shape[1], *_unused_philox("cpu"))


def _cudnn_aux(q, k, causal):
    """The aux `_cudnn_forward` returns for a call of these shapes (as `_flash_aux`; seed and offset on
    the device)."""
    return (None, None, q.shape[1], k.shape[1], *_unused_philox(str(q.device)))


def _efficient_forward(q, k, v, *, causal, scale, need_lse=True):
    qh, kh, vh = _bhld(q, k, v)
    out, lse, _, _ = aten._scaled_dot_product_efficient_attention(qh, kh, vh, None, True, 0.0, causal, scale=scale)
    return out.transpose(1, 2), lse[:, :, : q.shape[1]], None


def _efficient_backward(grad_out, q, k, v, out, lse, aux=None, *, causal, scale):
    return dense_backward(grad_out, q, k, v, out, lse, causal=causal, scale=scale)


def _flash_workspace(q, k, backward: bool) -> int:
    """The aten flash backward's packed (b, L, h, D) copies of dO and out, its float32 dQ accumulator
    (b, L_rounded, h, D) and softmax_d (b, h, L_rounded), L_rounded = L rounded up to 128."""
    if not backward:
        return 0
    batch, length, heads, dim = q.shape
    rounded = -(-length // 128) * 128
    return 2 * q.numel() * q.element_size() + batch * heads * rounded * (dim + 1) * 4


def _cudnn_workspace(q, k, backward: bool) -> int:
    """cudnn-frontend's float32 dQ accumulator of the call (backward)."""
    return q.numel() * 4 if backward else 0


CPU_FLASH = DenseKernel("cpu_flash", _cpu_forward, _cpu_backward, fallback=MANUAL_KERNEL)
FLASH = DenseKernel("flash", _flash_forward, _flash_backward, dense_out_lse=True, fallback=MANUAL_KERNEL,
                    workspace=_flash_workspace, aux_for=_flash_aux)
KERNELS = {
    "flash": FLASH,
    # cuDNN is chosen only where flash runs too (fp16/bf16, D <= 128, sm90+): decoding steps go there
    "cudnn": DenseKernel("cudnn", _cudnn_forward, _cudnn_backward, dense_out_lse=True, min_length=2,
                         fallback=MANUAL_KERNEL, workspace=_cudnn_workspace, varying_lengths=FLASH,
                         aux_for=_cudnn_aux),
    # calls of one query and one key found no cutlass kernel on an H100 (torch 2.11): the fallback takes them
    "efficient": DenseKernel("efficient", _efficient_forward, _efficient_backward, min_length=2,
                             fallback=MANUAL_KERNEL),
    "math": MANUAL_KERNEL,
}


def _kernel_for(choice: str):
    def pick(q: torch.Tensor) -> DenseKernel:
        device, capability, cudnn = device_facts(q)
        if device != "cuda":
            return MANUAL_KERNEL if choice == "math" else CPU_FLASH
        if choice == "auto":
            return KERNELS[_cuda_choice(q.dtype, q.shape[-1], capability, cudnn)]
        return KERNELS[choice]

    return pick


@functools.lru_cache(maxsize=64)
def _cuda_choice(dtype: torch.dtype, head_dim: int, capability: tuple[int, int], cudnn: bool) -> str:
    return cuda_kernel_name(dtype, head_dim, capability, cudnn)


# Head dims (largest, multiple) of the CUDA flash, cuDNN and efficient kernels: 16-byte aligned rows of fp16/bf16
# (the efficient kernel found no kernel to launch for bf16 D = 4 on an H100), at most 256 (flash).
CUDA_HEAD_DIMS = (256, 8)


def executors() -> dict:
    """The SDPA executors (name -> Executor)."""
    half_cuda = dict(dtypes=HALF_DTYPES, dense_out_lse=True)
    return {
        "sdpa": blockwise_executor("sdpa", _kernel_for("auto"), Capabilities(cuda_head_dims=CUDA_HEAD_DIMS),
                                   description="PyTorch SDPA kernels on the plan's strided views: cuDNN (Hopper) or "
                                               "flash (Ampere/Ada) for fp16/bf16 on CUDA, efficient otherwise; the CPU "
                                               "flash kernel on the CPU"),
        "sdpa_flash": blockwise_executor("sdpa_flash", _kernel_for("flash"), Capabilities(
            dtypes=ALL_DTYPES, cuda_head_dims=CUDA_HEAD_DIMS, min_capability=(8, 0), dense_out_lse=True),
            unavailable=lambda device, dtype: (
                "the SDPA flash kernel on CUDA needs float16/bfloat16" if device is not None and device.type == "cuda"
                and dtype is not None and dtype not in HALF_DTYPES else None),
            description="the flash kernel (CPU or CUDA) on strided views"),
        "sdpa_cudnn": blockwise_executor("sdpa_cudnn", _kernel_for("cudnn"), Capabilities(
            devices=("cuda",), head_dims=(128, 8), min_capability=(8, 0), min_block_length=2, **half_cuda),
            description="the cuDNN kernel on strided views"),
        "sdpa_efficient": blockwise_executor("sdpa_efficient", _kernel_for("efficient"), Capabilities(
            devices=("cuda",), dtypes=(torch.float16, torch.bfloat16, torch.float32), head_dims=CUDA_HEAD_DIMS),
            description="the memory-efficient kernel; eager exact backward"),
        "sdpa_math": blockwise_executor("sdpa_math", _kernel_for("math"), EAGER_CAPABILITIES,
                                        description="PyTorch's math formula, eager and chunked"),
    }
