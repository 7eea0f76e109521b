"""Rotary position embedding (RoPE) applied on original token positions."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

import torch
from torch._subclasses.fake_tensor import is_fake

from hilbert_lab.attention.validation import concrete


def rotary_angles(positions: torch.Tensor, head_dim: int, *, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each (N, head_dim // 2) float64, for integer ``positions`` (N,)."""
    head_dim, base = _rotation(head_dim, base)
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary embedding, got {head_dim}")
    if base <= 1.0:
        raise ValueError(f"base must be > 1, got {base}")
    angles = positions.to(torch.float64).unsqueeze(-1) * inverse_frequencies(head_dim, base, positions.device)
    both = torch.stack((angles.cos(), angles.sin()))  # one pass where compiled: each value one cosine or one sine
    return both[0], both[1]


_INVERSE_FREQUENCIES: dict = {}  # inverse_frequencies' results by their arguments


@torch.compiler.assume_constant_result  # a compiled pass holds them as a constant: no float64 pow per pass
def inverse_frequencies(head_dim: int, base: float, device: torch.device) -> torch.Tensor:
    """base ** (-2i / head_dim) for i < head_dim / 2, float64 (head_dim // 2,) on device. Cached; do not modify."""
    key = (int(head_dim), float(base), torch.device(device))
    frequencies = _INVERSE_FREQUENCIES.get(key)
    if frequencies is None:
        with torch.inference_mode(False):  # a plain tensor, whatever mode the first call ran in
            exponents = torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim
            frequencies = base ** (-exponents)
        if not is_fake(frequencies):  # a tracer's fake tensor is never kept
            if len(_INVERSE_FREQUENCIES) >= 64:
                _INVERSE_FREQUENCIES.clear()
            _INVERSE_FREQUENCIES[key] = frequencies
    return frequencies


def pass_rotary_tables(positions: torch.Tensor, rotations: Iterable[tuple[int, float]],
                       dtype: Optional[torch.dtype] = None) -> dict:
    """The rotary tables of one forward pass over `positions`, for its layers' (head_dim, base) pairs: the float64
    angles' cosines and sines, computed once per pair (rotary_angles), and their casts to `dtype` (the layers'
    q and k dtype) where given; for rotary_tables' `shared`."""
    tables = {}
    for head_dim, base in sorted({_rotation(head_dim, base) for head_dim, base in rotations}):
        cos, sin = tables[head_dim, base] = rotary_angles(positions, head_dim, base=base)
        if dtype is not None:
            tables[head_dim, base, dtype] = _for_heads(cos.to(dtype)), _for_heads(sin.to(dtype))
    return tables


def rotary_tables(positions: torch.Tensor, head_dim: int, base: float, dtype: torch.dtype,
                  shared: Optional[dict] = None):
    """(cos, sin), each (1, N, 1, head_dim // 2) for positions (N,), (B, N, 1, head_dim // 2) for positions (B, N),
    in `dtype`: rotary_angles cast for (B, N, H, D) tensors. shared: the pass's tables over these positions
    (pass_rotary_tables), only read (a dict changed inside a checkpointed layer would break its compiled graph);
    where they lack (head_dim, base) or its cast to `dtype`, those are computed here."""
    head_dim, base = _rotation(head_dim, base)
    angles = None if shared is None else shared.get((head_dim, base))
    if angles is None:
        angles = rotary_angles(positions, head_dim, base=base)
    cast = None if shared is None else shared.get((head_dim, base, dtype))
    return cast or (_for_heads(angles[0].to(dtype)), _for_heads(angles[1].to(dtype)))


def _rotation(head_dim: int, base: float) -> tuple[int, float]:
    """(head_dim, base) as plain values, the tables' keys (a compiled graph with dynamic shapes traces a module's
    integers symbolically: they are specialized under a guard)."""
    return concrete(int(head_dim)), concrete(float(base))


def _for_heads(table: torch.Tensor) -> torch.Tensor:
    """A table (N, D/2) or (B, N, D/2) as (1 or B, N, 1, D/2)."""
    return (table.unsqueeze(0) if table.dim() == 2 else table).unsqueeze(2)


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0,
                 tables: Optional[dict] = None) -> torch.Tensor:
    """Rotate pairs (x[..., :D/2], x[..., D/2:]) of x (B, N, H, D) by angle position * base^(-2i/D).

    ``positions`` (N,) are the tokens' original positions, so a permuted layout (Hilbert ordering,
    a ring shard) gets the same embedding as the natural one; (B, N) gives each row its own (decoding rows
    of different lengths). Angles are computed in float64 and cast to x's dtype, so float64 models stay exact.
    """
    if x.dim() != 4:
        raise ValueError(f"x must have shape (B, N, H, D), got {tuple(x.shape)}")
    if positions.shape not in ((x.shape[1],), tuple(x.shape[:2])):
        raise ValueError(f"positions must have shape (N,) = ({x.shape[1]},) or (B, N) = {tuple(x.shape[:2])}, got "
                         f"{tuple(positions.shape)}")
    cos, sin = rotary_tables(positions, x.shape[-1], base, x.dtype, tables)
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
