"""Projections of a decoding step beyond one linear layer (kernels.gemv_linear: x of a few rows on a GPU, with
no gradient asked, as one Triton GEMV): a layer norm and the linear layer after it held as a `NormedLinear`, the
norm's affine folded into the layer's weight and bias (kernels.triton_gemv.fold_layer_norm), so that one GEMV
normalises the row while it reads the weight, with the rotary embedding of its outputs in the same launch; and
`project`, which runs a plain nn.Linear, or a plain nn.Sequential's Linear -> exact GELU as one launch, that way.
Everything else is F.linear or the module's own call."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from hilbert_lab.kernels.gemv_linear import few_rows_gemv, linear, same_place
from hilbert_lab.kernels.triton_gemv import MAX_ROWS, fold_layer_norm, gemv

__all__ = ["NormedLinear", "fold_norm", "foldable_norm", "normed_linear", "plain_linear", "project"]


def _plain(module: nn.Module) -> bool:
    """Whether calling module adds nothing to its forward (no hooks of its own)."""
    return not (module._forward_hooks or module._forward_pre_hooks)


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
    outputs' pairs: rotation (positions, frequencies, rows), one position for every row of x or one per row,
    kernels.triton_gemv.gemv); otherwise F.layer_norm without affine, then `linear` (rotation is then refused: the
    caller rotates)."""
    if few_rows_gemv(x, layer.weight, layer.bias) and (rotation is None or same_place(rotation[0], x)):
        return gemv(x, layer.weight, layer.bias, activation, normalize=(layer.row_sums, layer.eps), rotation=rotation)
    if rotation is not None:
        raise ValueError(f"rotation runs inside the GEMV only (x of 1 to {MAX_ROWS} rows on a GPU, no gradient "
                         f"asked)")
    return linear(F.layer_norm(x, x.shape[-1:], eps=layer.eps), layer.weight, layer.bias, activation)


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
