"""A transformer block's decoding step on a static cache with its linear layers prepared once: the attention norm
folded into the stacked q, k, v projection, the MLP's norm into its first linear layer (models.projection's
NormedLinear), so that on a GPU a step of up to kernels.triton_gemv.MAX_ROWS rows (batch 1, or a batch of one new
token per row) is four GEMVs and the cache's attention, with the norms, each row's rotary embedding and both
residual adds inside the GEMVs (kernels.triton_gemv), and no small op between them.

`decoding_projections(block, dtype)` -> the prepared layers (dict: "qkv", "out", "up", "down") or None where the
block is not the plain modules it folds; `decoding_layer(block, x, positions, cache, projections, rotary_tables)`
-> the block's output, equal to its forward (the float32 sums of each GEMV rounded once)."""
from __future__ import annotations

import torch
from torch import nn

from hilbert_lab.kernels.gemv_linear import few_rows_gemv, linear

from .projection import NormedLinear, fold_norm, foldable_norm, normed_linear, plain_linear
from .rotary import apply_rotary, inverse_frequencies

__all__ = ["decoding_layer", "decoding_projections", "rotates_in_gemv"]


def decoding_projections(block: nn.Module, dtype: torch.dtype | None = None) -> dict | None:
    """The linear layers of a DilatedTransformerBlock's decoding step in `dtype` (default the parameters'):
    "qkv": attention_norm, then the q, k and v projections stacked (NormedLinear, N = E + 2 E_kv); "out": the output
    projection (weight, bias); "up": mlp_norm, then the MLP's first linear layer (NormedLinear); "down": its second
    (weight, bias). Folded weights are copies detached from the parameters (a step then reads these, not the
    modules); the others are the parameters themselves where `dtype` is theirs. None where the norms are not plain
    nn.LayerNorms, the MLP is not a plain nn.Sequential(nn.Linear, nn.GELU(), nn.Linear), or a projection is not a
    plain nn.Linear (a subclass, or hooks the prepared layers would skip)."""
    mha = block.attention
    mlp = list(block.mlp) if type(block.mlp) is nn.Sequential else []
    if not (foldable_norm(block.attention_norm) and foldable_norm(block.mlp_norm) and len(mlp) == 3
            and plain_linear(mlp[0]) and plain_linear(mlp[2]) and type(mlp[1]) is nn.GELU
            and mlp[1].approximate == "none"
            and all(map(plain_linear, (mha.q_proj, mha.k_proj, mha.v_proj, mha.out_proj)))):
        return None
    dtype = mha.q_proj.weight.dtype if dtype is None else dtype

    def plain(layer: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
        bias = None if layer.bias is None else layer.bias.detach().to(dtype)
        return layer.weight.detach().to(dtype), bias

    return {"qkv": fold_norm(block.attention_norm, *mha.stacked_in_projection(), dtype), "out": plain(mha.out_proj),
            "up": fold_norm(block.mlp_norm, mlp[0].weight, mlp[0].bias, dtype), "down": plain(mlp[2])}


def rotates_in_gemv(x: torch.Tensor, projections: dict | None) -> bool:
    """Whether a decoding step of x (B, N, C) on these prepared projections rotates q and k inside its q, k, v
    GEMV (from the positions: no rotary tables needed), rather than through apply_rotary after F.linear."""
    return projections is not None and few_rows_gemv(x, projections["qkv"].weight, projections["qkv"].bias)


def _rotation(block: nn.Module, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions of the M rows of x (B, N, C) (M,), the block's rotary frequencies (D/2,) float64): what the q, k, v
    GEMV computes its rotary angles from, positions (N,) or (B, N)."""
    frequencies = inverse_frequencies(block.attention.head_dim, block.rotary_base, positions.device)
    return positions.expand(x.shape[:-1]).reshape(-1), frequencies


def decoding_layer(block: nn.Module, x: torch.Tensor, positions: torch.Tensor, cache, projections: dict,
                   rotary_tables: dict | None = None) -> torch.Tensor:
    """block(x, positions, cache=cache) on its decoding_projections: x (B, N, C) -> (B, N, C); the tokens follow
    those the cache holds (their keys and values are appended to it). Up to MAX_ROWS rows (batch 1, or one token per
    row) on a GPU with no gradient asked run as four GEMVs around the cache's attention; otherwise the same
    prepared weights through F.layer_norm (no affine) and F.linear. No dropout (the caller's concern: a training
    block with dropout keeps its forward)."""
    mha = block.attention
    qkv: NormedLinear = projections["qkv"]
    kv_dim = mha.num_kv_heads * mha.head_dim
    rotation = None
    if block.rotary and rotates_in_gemv(x, projections):
        rotation = (*_rotation(block, x, positions), mha.embed_dim + kv_dim)
    q, k, v = (t.unflatten(-1, (-1, mha.head_dim))
               for t in normed_linear(x, qkv, rotation=rotation).split((mha.embed_dim, kv_dim, kv_dim), dim=-1))
    if block.rotary and rotation is None:
        q = apply_rotary(q, positions, base=block.rotary_base, tables=rotary_tables)
        k = apply_rotary(k, positions, base=block.rotary_base, tables=rotary_tables)
    x = linear(cache.attend(q, k, v).flatten(-2), *projections["out"], residual=x)
    return linear(normed_linear(x, projections["up"], "gelu"), *projections["down"], residual=x)
