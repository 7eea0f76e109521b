"""Linear layers of a decoding step: x of one row (batch 1, one new token) on a GPU, with no gradient asked, runs
as one Triton GEMV (kernels.triton_gemv), which reads the weight nearer the memory bandwidth than cuBLAS's GEMM of
one row; everything else is F.linear or the module's own call."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from hilbert_lab.kernels.triton_gemv import ACTIVATIONS, gemv
from hilbert_lab.kernels.triton_support import runs_on

__all__ = ["linear", "plain_tensor", "project"]


def plain_tensor(t: torch.Tensor) -> bool:
    """Whether t is a torch.Tensor or nn.Parameter, not a subclass (DTensor, a quantized weight) whose storage is not
    what its values say."""
    return type(t) in (torch.Tensor, nn.Parameter)


def _one_row(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether x (..., K) is one row on a GPU Triton runs on, in weight's dtype, x, weight and bias plain tensors on
    one device, with no gradient asked."""
    if x.numel() != x.shape[-1] or x.dtype != weight.dtype or x.device.type != "cuda" or not runs_on(x.device):
        return False
    if weight.device != x.device or (bias is not None and bias.device != x.device):
        return False  # F.linear names the mismatch
    if not (plain_tensor(x) and plain_tensor(weight) and (bias is None or plain_tensor(bias))):
        return False
    return not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))


def _plain(module: nn.Module) -> bool:
    """Whether calling module adds nothing to its forward (no hooks of its own)."""
    return not (module._forward_hooks or module._forward_pre_hooks)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           activation: str | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), then F.gelu where activation is "gelu"; x (..., K) of one row (a decoding step at
    batch 1) on a GPU, with no gradient asked, runs as one Triton GEMV (kernels.triton_gemv) with the GELU on its
    float32 sums, which reads the weight nearer the memory bandwidth than cuBLAS's GEMM of one row."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if _one_row(x, weight, bias):
        return gemv(x, weight, bias, activation)
    y = F.linear(x, weight, bias)
    return F.gelu(y) if activation == "gelu" else y


def _exact_gelu(module: nn.Module) -> bool:
    """Whether module is a plain nn.GELU (erf, no hooks)."""
    return type(module) is nn.GELU and module.approximate == "none" and _plain(module)


def project(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """layer(x); a plain nn.Linear (not a subclass or a wrapper, no hooks) goes through `linear`, and so does each
    one inside a plain nn.Sequential, with the plain nn.GELU that follows it there as its activation."""
    if type(layer) is nn.Linear and _plain(layer):
        return linear(x, layer.weight, layer.bias)
    if type(layer) is nn.Sequential and _plain(layer):
        modules = list(layer)
        index = 0
        while index < len(modules):
            module = modules[index]
            if type(module) is nn.Linear and _plain(module) and index + 1 < len(modules) \
                    and _exact_gelu(modules[index + 1]):
                x = linear(x, module.weight, module.bias, "gelu")
                index += 2
            else:
                x = project(x, module)
                index += 1
        return x
    return layer(x)
