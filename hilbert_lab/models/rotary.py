"""Rotary position embedding (RoPE) applied on original token positions."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

import torch

# The tables of the layers of one forward pass (shared_rotary_tables): positions -> (angles, {dtype: tables}).
# Nothing outlives the pass, so positions changed in place between two calls (inference tensors carry no version
# counter) are read anew.
_SHARED: contextvars.ContextVar[Optional[dict]] = contextvars.ContextVar("rotary_tables", default=None)


@contextlib.contextmanager
def shared_rotary_tables() -> Iterator[None]:
    """Inside it, the layers that rotate by one positions tensor compute its tables once (a model's forward
    opens it around its layers); the tables are dropped on exit."""
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def rotary_angles(positions: torch.Tensor, head_dim: int, *, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each (N, head_dim // 2) float64, for integer ``positions`` (N,)."""
    if head_dim % 2:
        raise ValueError(f"head_dim must be even for rotary embedding, got {head_dim}")
    if base <= 1.0:
        raise ValueError(f"base must be > 1, got {base}")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim
    inv_freq = base ** (-exponents)  # (D/2,)
    angles = positions.to(torch.float64).unsqueeze(-1) * inv_freq  # (N, D/2)
    return angles.cos(), angles.sin()


def rotary_tables(positions: torch.Tensor, head_dim: int, base: float, dtype: torch.dtype):
    """(cos, sin), each (1, N, 1, head_dim // 2) for positions (N,), (B, N, 1, head_dim // 2) for positions (B, N),
    in `dtype`: rotary_angles cast for (B, N, H, D) tensors; inside shared_rotary_tables computed once for the
    layers that share a positions tensor."""
    shared = None if torch.compiler.is_compiling() else _SHARED.get()
    if shared is None:
        cos, sin = rotary_angles(positions, head_dim, base=base)
        return _for_heads(cos.to(dtype)), _for_heads(sin.to(dtype))
    key = (id(positions), head_dim, base)
    entry = shared.get(key)
    if entry is None or entry[0] is not positions:
        entry = shared[key] = (positions, rotary_angles(positions, head_dim, base=base), {})
    if dtype not in entry[2]:
        cos, sin = entry[1]
        entry[2][dtype] = _for_heads(cos.to(dtype)), _for_heads(sin.to(dtype))
    return entry[2][dtype]


def _for_heads(table: torch.Tensor) -> torch.Tensor:
    """A table (N, D/2) or (B, N, D/2) as (1 or B, N, 1, D/2)."""
    return (table.unsqueeze(0) if table.dim() == 2 else table).unsqueeze(2)


def apply_rotary(x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0) -> torch.Tensor:
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
    cos, sin = rotary_tables(positions, x.shape[-1], base, x.dtype)
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
