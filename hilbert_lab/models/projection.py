"""Linear layers of a decoding step: x of one row (batch 1, one new token) on a GPU, with no gradient asked, runs
as one Triton GEMV (kernels.triton_gemv), which reads the weight nearer the memory bandwidth than cuBLAS's GEMM of
one row; everything else is F.linear or the module's own call."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from hilbert_lab.kernels.triton_gemv import ACTIVATIONS, NORM_MAX_K, gemv
from hilbert_lab.kernels.triton_support import runs_on

from .rotary import rotate

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


def _fused_norm(norm: nn.Module | None, x: torch.Tensor) -> tuple | None:
    """(weight, bias, eps) of a plain nn.LayerNorm over x's last dimension that the GEMV can apply, else None."""
    if type(norm) is not nn.LayerNorm or not _plain(norm) or norm.normalized_shape != (x.shape[-1],) \
            or x.shape[-1] > NORM_MAX_K:
        return None
    parameters = [t for t in (norm.weight, norm.bias) if t is not None]
    if any(not plain_tensor(t) or t.device != x.device or (torch.is_grad_enabled() and t.requires_grad)
           for t in parameters):
        return None
    return norm.weight, norm.bias, norm.eps


def _addable(residual: torch.Tensor, x: torch.Tensor, n: int) -> bool:
    """Whether the GEMV can add residual to its one row of n outputs: a plain tensor of the output's shape, dtype
    and device, with no gradient asked."""
    return (plain_tensor(residual) and residual.shape == x.shape[:-1] + (n,) and residual.dtype == x.dtype
            and residual.device == x.device and not (torch.is_grad_enabled() and residual.requires_grad))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           activation: str | None = None, *, norm: nn.Module | None = None, rotation: tuple | None = None,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """residual + rotation(activation(F.linear(norm(x), weight, bias))), where norm (a module, e.g. a pre-norm
    block's nn.LayerNorm), activation ("gelu": F.gelu), rotation ((cos, sin, rows): the first `rows` outputs, in
    heads of 2 cos.shape[-1], rotated by models.rotary.rotate: a stacked q/k/v projection's q and k) and residual
    are each optional. x (..., K) of one row (a decoding step at batch 1) on a GPU, with no gradient asked, runs as
    one Triton GEMV (kernels.triton_gemv), which reads the weight nearer the memory bandwidth than cuBLAS's GEMM of
    one row, with a plain nn.LayerNorm applied inside (another norm runs as its own module first) and the GELU, the
    rotation and the residual on its float32 sums."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if _one_row(x, weight, bias):
        fused = None if norm is None else _fused_norm(norm, x)
        if norm is not None and fused is None:
            x, norm = norm(x), None
        if _one_row(x, weight, bias):
            added = residual is not None and _addable(residual, x, weight.shape[0])
            turned = rotation is not None and _turnable(rotation, x, weight.shape[0])
            y = gemv(x, weight, bias, activation, norm=fused, residual=residual if added else None,
                     rotation=rotation if turned else None)
            y = y if turned or rotation is None else _rotated(y, rotation)
            return y if added or residual is None else residual + y
    if norm is not None:
        x = norm(x)
    y = F.linear(x, weight, bias)
    y = F.gelu(y) if activation == "gelu" else y
    y = y if rotation is None else _rotated(y, rotation)
    return y if residual is None else residual + y


def _rotated(y: torch.Tensor, rotation: tuple) -> torch.Tensor:
    """y (..., N) with its first `rows` values, in heads of 2 cos.shape[-1], rotated (models.rotary.rotate)."""
    cos, sin, rows = rotation
    heads = y[..., :rows].unflatten(-1, (-1, 2 * cos.shape[-1]))
    return torch.cat((rotate(heads, cos.to(y.dtype), sin.to(y.dtype)).flatten(-2), y[..., rows:]), dim=-1)


def _turnable(rotation: tuple, x: torch.Tensor, n: int) -> bool:
    """Whether the GEMV can rotate: tables of one position (D/2 values each), plain tensors on x's device, rows
    and n multiples of D."""
    cos, sin, rows = rotation
    half = cos.shape[-1]
    return (cos.numel() == sin.numel() == half and half >= 1 and plain_tensor(cos) and plain_tensor(sin)
            and cos.device == sin.device == x.device and rows % (2 * half) == 0 and n % (2 * half) == 0
            and 0 <= rows <= n)


def _exact_gelu(module: nn.Module) -> bool:
    """Whether module is a plain nn.GELU (erf, no hooks)."""
    return type(module) is nn.GELU and module.approximate == "none" and _plain(module)


def project(x: torch.Tensor, layer: nn.Module, norm: nn.Module | None = None,
            residual: torch.Tensor | None = None) -> torch.Tensor:
    """residual + layer(norm(x)) (norm and residual optional); a plain nn.Linear (not a subclass or a wrapper, no
    hooks) goes through `linear`, and so does each one inside a plain nn.Sequential, with the plain nn.GELU that
    follows it there as its activation, the norm given to the first module where it is such a Linear and the
    residual to the last."""
    if type(layer) is nn.Linear and _plain(layer):
        return linear(x, layer.weight, layer.bias, norm=norm, residual=residual)
    if type(layer) is nn.Sequential and _plain(layer) and len(layer):
        modules = list(layer)
        index = 0
        while index < len(modules):
            module = modules[index]
            if type(module) is nn.Linear and _plain(module):
                gelu = index + 1 < len(modules) and _exact_gelu(modules[index + 1])
                index += 2 if gelu else 1
                last = index == len(modules)
                x = linear(x, module.weight, module.bias, "gelu" if gelu else None, norm=norm,
                           residual=residual if last else None)
                if last:
                    return x
            else:
                x = project(x if norm is None else norm(x), module)
                index += 1
            norm = None
        return x if residual is None else residual + x
    y = layer(x if norm is None else norm(x))
    return y if residual is None else residual + y
