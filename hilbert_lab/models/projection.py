"""Linear layers of a decoding step: x of a few rows (one new token per row of a batch of at most
kernels.triton_gemv.MAX_ROWS) on a GPU, with no gradient asked, runs as one Triton GEMV (kernels.triton_gemv), which
reads the weight once for all rows and nearer the memory bandwidth than cuBLAS's GEMM of one row, with the layer
norm before it, the rotary embedding and the residual add after it in the same launch; everything else is F.linear
or the module's own call.

A layer norm followed by a linear layer is held as a `NormedLinear`: the norm's affine folded into the layer's
weight and bias (kernels.triton_gemv.fold_layer_norm), so that one GEMV normalises the row while it reads the
weight."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from hilbert_lab.kernels.triton_gemv import ACTIVATIONS, MAX_ROWS, fold_layer_norm, gemv
from hilbert_lab.kernels.triton_support import runs_on

__all__ = ["NormedLinear", "fold_norm", "foldable_norm", "linear", "normed_linear", "few_rows_gemv", "plain_linear",
           "plain_tensor", "project"]


GEMV_DTYPES = (torch.float16, torch.bfloat16, torch.float32)  # float32 sums: float64 keeps F.linear


def plain_tensor(t: torch.Tensor) -> bool:
    """Whether t is a torch.Tensor or nn.Parameter, not a subclass (DTensor, a quantized weight) whose storage is not
    what its values say."""
    return type(t) in (torch.Tensor, nn.Parameter)


def few_rows_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether x (..., K) holds 1 to MAX_ROWS rows on a GPU Triton runs on, in weight's dtype (float16, bfloat16 or
    float32), x, weight and bias plain tensors on one device, with no gradient asked."""
    if not 1 <= x.numel() // max(1, x.shape[-1]) <= MAX_ROWS or x.shape[-1] < 1 or x.dtype not in GEMV_DTYPES \
            or x.dtype != weight.dtype:
        return False
    if x.device.type != "cuda" or not runs_on(x.device):
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
           activation: str | None = None, *, residual: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias), then F.gelu where activation is "gelu", then + residual (x's shape but the last
    dim, N) where given; x (..., K) of a few rows (a decoding step: few_rows_gemv) on a GPU, with no gradient
    asked, runs as one Triton GEMV (kernels.triton_gemv) with the GELU and the residual on its float32 sums (one
    rounding), which reads the weight once for all rows, nearer the memory bandwidth than cuBLAS's GEMM."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    if few_rows_gemv(x, weight, bias) and (residual is None or _same_place(residual, x)):
        return gemv(x, weight, bias, activation, residual=residual)
    y = F.linear(x, weight, bias)
    y = F.gelu(y) if activation == "gelu" else y
    return y if residual is None else residual + y


class NormedLinear(NamedTuple):
    """A layer norm (eps) and the linear layer after it, as one: weight (N, K) and bias (N,) hold the norm's affine
    folded in (kernels.triton_gemv.fold_layer_norm), row_sums (N,) float32 the folded weight's row sums."""
    weight: torch.Tensor
    bias: torch.Tensor
    row_sums: torch.Tensor
    eps: float


def foldable_norm(norm: nn.Module) -> bool:
    """Whether norm is a plain nn.LayerNorm over the last dimension (no hooks), whose affine can be folded."""
    return type(norm) is nn.LayerNorm and _plain(norm) and len(norm.normalized_shape) == 1


def fold_norm(norm: nn.LayerNorm, weight: torch.Tensor, bias: torch.Tensor | None,
              dtype: torch.dtype | None = None) -> NormedLinear:
    """norm, then F.linear(., weight, bias), as a NormedLinear in `dtype` (default weight's): copies detached from
    the parameters. ValueError where norm is not a plain nn.LayerNorm over the last dimension."""
    if not foldable_norm(norm):
        raise ValueError(f"norm must be a plain nn.LayerNorm over the last dimension, got {norm!r}")
    folded, folded_bias, row_sums = fold_layer_norm(weight, bias, norm.weight, norm.bias, dtype)
    return NormedLinear(folded, folded_bias, row_sums, float(norm.eps))


def normed_linear(x: torch.Tensor, layer: NormedLinear, activation: str | None = None, *,
                  rotation: tuple[torch.Tensor, torch.Tensor, int] | None = None) -> torch.Tensor:
    """linear(layer_norm(x), ...) of a NormedLinear, x (..., K) -> (..., N): a few rows on a GPU with no gradient
    asked (few_rows_gemv) as one GEMV that normalises each row from the chunks it reads (and rotates the first
    outputs' pairs: rotation (cos, sin, rows), cos and sin (D/2,) or one row of D/2 per row of x,
    kernels.triton_gemv.gemv); otherwise F.layer_norm without affine, then `linear` (rotation is then refused: the
    caller rotates)."""
    if few_rows_gemv(x, layer.weight, layer.bias) and (rotation is None or _same_place(rotation[0], x)):
        return gemv(x, layer.weight, layer.bias, activation, normalize=(layer.row_sums, layer.eps), rotation=rotation)
    if rotation is not None:
        raise ValueError(f"rotation runs inside the GEMV only (x of 1 to {MAX_ROWS} rows on a GPU, no gradient "
                         f"asked)")
    return linear(F.layer_norm(x, x.shape[-1:], eps=layer.eps), layer.weight, layer.bias, activation)


def _same_place(t: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether t is a plain tensor on x's device."""
    return plain_tensor(t) and t.device == x.device


def plain_linear(module: nn.Module) -> bool:
    """Whether module is a plain nn.Linear (not a subclass or a wrapper, no hooks)."""
    return type(module) is nn.Linear and _plain(module)


def _exact_gelu(module: nn.Module) -> bool:
    """Whether module is a plain nn.GELU (erf, no hooks)."""
    return type(module) is nn.GELU and module.approximate == "none" and _plain(module)


def project(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """layer(x); a plain nn.Linear (not a subclass or a wrapper, no hooks) goes through `linear`, and so does each
    one inside a plain nn.Sequential, with the plain nn.GELU that follows it there as its activation."""
    if plain_linear(layer):
        return linear(x, layer.weight, layer.bias)
    if type(layer) is nn.Sequential and _plain(layer):
        modules = list(layer)
        index = 0
        while index < len(modules):
            module = modules[index]
            if plain_linear(module) and index + 1 < len(modules) \
                    and _exact_gelu(modules[index + 1]):
                x = linear(x, module.weight, module.bias, "gelu")
                index += 2
            else:
                x = project(x, module)
                index += 1
        return x
    return layer(x)
