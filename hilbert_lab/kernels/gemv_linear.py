"""Linear layers of a decoding step: x of a few rows (one new token per row of a batch of at most
kernels.triton_gemv.MAX_ROWS) on a GPU, with no gradient asked, runs as one Triton GEMV (kernels.triton_gemv), which
reads the weight once for all rows and nearer the memory bandwidth than cuBLAS's GEMM of one row; everything else
is F.linear.

`linear(x, weight, bias, activation, residual=)` is that choice for one call; `GemvLinear` is an nn.Linear whose
forward makes it, and `use_gemv_linears(model)` turns the plain nn.Linear modules of any model (a Hugging Face
model's projections, MLP and head) into it in place: parameters, state dict, hooks and every other call stay as
they were, and its decoding steps (under torch.compile and CUDA graphs too) read their weights through the GEMV."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from hilbert_lab.kernels.triton_gemv import ACTIVATIONS, MAX_ROWS, gemv
from hilbert_lab.kernels.triton_support import runs_on

__all__ = ["GEMV_DTYPES", "GemvLinear", "few_rows_gemv", "linear", "plain_tensor", "same_place", "use_gemv_linears"]


GEMV_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # float32 sums: float64 keeps F.linear


def plain_tensor(t: torch.Tensor) -> bool:
    """Whether t is a torch.Tensor or nn.Parameter, not a subclass (DTensor, a quantized weight) whose storage is not
    what its values say."""
    return type(t) in (torch.Tensor, nn.Parameter)


def same_place(t: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether t is a plain tensor on x's device."""
    return plain_tensor(t) and t.device == x.device


def few_rows_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether x (..., K) holds 1 to MAX_ROWS rows on a GPU Triton runs on, in weight's dtype (float16, bfloat16 or
    float32), x, weight and bias plain tensors on one device, with no gradient asked and no autocast (whose F.linear
    computes in its own dtype)."""
    if not 1 <= x.numel() // max(1, x.shape[-1]) <= MAX_ROWS or x.shape[-1] < 1 or x.dtype not in GEMV_DTYPES \
            or x.dtype != weight.dtype:
        return False
    if x.device.type != "cuda" or not runs_on(x.device) or torch.is_autocast_enabled("cuda"):
        return False
    if not (plain_tensor(x) and same_place(weight, x) and (bias is None or same_place(bias, x))):
        return False  # F.linear names a device mismatch
    return not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           activation: str | None = None, *, residual: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), then F.gelu where activation is "gelu", then + residual (x's shape but the last
    dim, N) where given; x (..., K) of a few rows (a decoding step: few_rows_gemv) on a GPU, with no gradient
    asked, runs as one Triton GEMV (kernels.triton_gemv) with the GELU and the residual on its float32 sums (one
    rounding), which reads the weight once for all rows, nearer the memory bandwidth than cuBLAS's GEMM."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if few_rows_gemv(x, weight, bias) and (residual is None or same_place(residual, x)):
        return gemv(x, weight, bias, activation, residual=residual)
    y = F.linear(x, weight, bias)
    y = F.gelu(y) if activation == "gelu" else y
    return y if residual is None else residual + y


class GemvLinear(nn.Linear):
    """nn.Linear whose forward is `linear`: x of 1 to MAX_ROWS rows on a GPU with no gradient asked runs as the
    Triton GEMV, anything else as nn.Linear runs it. Same parameters and state dict as nn.Linear."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def use_gemv_linears(model: nn.Module) -> int:
    """Turn every module of `model` that is exactly an nn.Linear (not a subclass: a quantized or LoRA layer keeps its
    own forward) into a GemvLinear in place; returns how many. The model's outputs are the same up to the
    rounding of the sums (float32 in both); `model` itself if it is an nn.Linear."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    changed = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = GemvLinear
            changed += 1
    return changed

