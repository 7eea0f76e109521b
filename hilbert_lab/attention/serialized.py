"""Serialized dilated attention: tokens of an image, video or point cloud are put in curve order,
the exact dilated engine runs on that sequence (the ordering is part of the *pattern* here: it
decides which spatial neighbours share a segment), and the result is put back in the input order.

A serialization is a pair (perm, inverse) of int64 tensors, (N,) for all samples or (B, N) per
sample (point clouds), with ``x_serialized = x[:, perm]`` and ``x = x_serialized[:, inverse]``
(``hilbert_lab.curves.serialize``). One pair serves every branch; a list of one pair per branch
gives each branch its own ordering (longnet mode), merged exactly by the branches' LSEs.
"""
from __future__ import annotations

import numbers
from typing import Optional, Sequence, Union

import torch
from torch import nn

from hilbert_lab.attention.engine import dilated_attention
from hilbert_lab.attention.merge import merge_lse
from hilbert_lab.attention.pattern import DilatedPattern

Serialization = tuple[torch.Tensor, torch.Tensor]


def permute_tokens(x: torch.Tensor, index: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """x[:, index] along `dim` for index (N,) (shared) or (B, N) (one row per sample, dim 0 = batch)."""
    if index.dim() == 1:
        return x.index_select(dim, index)
    shape = [1] * x.dim()
    shape[0], shape[dim] = index.shape[0], index.shape[1]
    return x.gather(dim, index.reshape(shape).expand(*x.shape[:dim], index.shape[1], *x.shape[dim + 1:]))


def _check_serialization(pair, seq_len: int, batch: int, device: torch.device, name: str) -> Serialization:
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise ValueError(f"{name} must be a (perm, inverse) pair of int64 tensors, got {type(pair).__name__}")
    perm, inverse = (torch.as_tensor(t, dtype=torch.int64, device=device) for t in pair)
    ok_shape = perm.shape == inverse.shape and (perm.shape == (seq_len,) or perm.shape == (batch, seq_len))
    if not ok_shape:
        raise ValueError(f"{name} tensors must have shape (N,) = ({seq_len},) or (B, N) = ({batch}, {seq_len}), "
                         f"got {tuple(perm.shape)} and {tuple(inverse.shape)}")
    return perm, inverse


def serialized_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    serialization: Union[Serialization, Sequence[Serialization]],
    *,
    segment_lengths: Sequence[int],
    dilation_rates: Sequence[int],
    causal: bool = False,
    mode: str = "longnet",
    backend: str = "auto",
    scale: Optional[float] = None,
    dropout_p: float = 0.0,
    return_lse: bool = False,
):
    """Dilated attention on serialized tokens: q, k, v (B, N, H, D) in input order -> out (B, N, H, D)
    [, lse (B, H, N)] in input order.

    serialization: (perm, inverse) (N,) or (B, N), or a list with one pair per branch (mode
    "longnet" only: each branch attends along its own ordering; branches merge by LSE). Segments,
    dilation and causality apply to serialized positions. Other arguments as in `dilated_attention`.
    """
    pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise ValueError(f"q must be a 4D tensor (B, N, H, D), got {getattr(q, 'shape', type(q))}")
    batch, seq_len = q.shape[0], q.shape[1]
    per_branch = isinstance(serialization, (list, tuple)) and len(serialization) > 0 and isinstance(
        serialization[0], (list, tuple))
    pairs = list(serialization) if per_branch else [serialization]
    if per_branch and len(pairs) != pattern.num_branches:
        raise ValueError(f"serialization must hold one (perm, inverse) pair per branch ({pattern.num_branches}), "
                         f"got {len(pairs)}")
    if per_branch and pattern.mode != "longnet" and pattern.num_branches > 1:
        raise ValueError(f"mode must be 'longnet' for one serialization per branch, got {pattern.mode!r}")
    pairs = [_check_serialization(p, seq_len, batch, q.device, "serialization") for p in pairs]
    kwargs = dict(causal=pattern.causal, mode=pattern.mode, backend=backend, scale=scale, dropout_p=dropout_p,
                  return_lse=True)
    if len(pairs) == 1:
        branches = [(pattern.segment_lengths, pattern.dilation_rates, pairs[0])]
    else:
        branches = [([w], [r], pair) for w, r, pair in zip(pattern.segment_lengths, pattern.dilation_rates, pairs)]
    outs, lses = [], []
    for segments, rates, (perm, inverse) in branches:
        out, lse = dilated_attention(*(permute_tokens(t, perm) for t in (q, k, v)), segment_lengths=segments,
                                     dilation_rates=rates, **kwargs)
        outs.append(permute_tokens(out, inverse))
        lses.append(permute_tokens(lse, inverse, dim=2))
    out, lse = merge_lse(outs, lses)
    out = out.to(q.dtype)
    return (out, lse) if return_lse else out


class SerializedDilatedAttention(nn.Module):
    """Dilated attention along a curve through a grid or point cloud: q, k, v (B, N, H, D) -> (B, N, H, D).

    ordering: a name in ``hilbert_lab.curves.SERIALIZATIONS``, or one per branch. grid_shape: (H, W)
    or (T, H, W) for tokens in row-major grid order (the serialization is then fixed and cached);
    without it, forward needs ``points`` (N, d) or (B, N, d), serialized with ``grid_size`` per call.
    Other keywords as in `DilatedAttention`; `dropout` applies in training mode.
    """

    def __init__(
        self,
        segment_lengths: Sequence[int],
        dilation_rates: Sequence[int],
        ordering: Union[str, Sequence[str]] = "hilbert",
        *,
        grid_shape: Optional[Sequence[int]] = None,
        grid_size: Optional[float] = None,
        causal: bool = False,
        mode: str = "longnet",
        backend: str = "auto",
        scale: Optional[float] = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        from hilbert_lab.curves import SERIALIZATIONS  # noqa: PLC0415 (curves is below attention; light import)

        self.pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
        orderings = (ordering,) if isinstance(ordering, str) else tuple(ordering)
        if not orderings or any(o not in SERIALIZATIONS for o in orderings):
            raise ValueError(f"ordering must be one of {SERIALIZATIONS} or a list of them (one per branch), "
                             f"got {ordering!r}")
        if len(orderings) > 1 and len(orderings) != self.pattern.num_branches:
            raise ValueError(f"ordering must name one ordering or one per branch ({self.pattern.num_branches}), "
                             f"got {len(orderings)}")
        if len(orderings) > 1 and mode != "longnet":
            raise ValueError(f"mode must be 'longnet' for one ordering per branch, got {mode!r}")
        self.orderings = orderings
        self.grid_shape = None if grid_shape is None else tuple(int(s) for s in grid_shape)
        self.grid_size = grid_size
        self.backend, self.scale = backend, scale
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be a float in [0, 1), got {dropout!r}")
        self.dropout = float(dropout)
        self._grid_cache: dict[str, list[Serialization]] = {}

    def serializations(self, device: torch.device, points: Optional[torch.Tensor] = None) -> list[Serialization]:
        """One (perm, inverse) pair per distinct entry of `self.orderings` (tensors on `device`)."""
        from hilbert_lab.curves import serialize  # noqa: PLC0415

        if points is None and self.grid_shape is None:
            raise ValueError("points are required when the module has no grid_shape")
        if points is None and str(device) in self._grid_cache:
            return self._grid_cache[str(device)]
        pairs = []
        for ordering in self.orderings:
            if points is not None:
                pair = serialize(points, ordering, grid_size=self.grid_size)
            else:
                pair = serialize(self.grid_shape, ordering)
            pairs.append(tuple(torch.as_tensor(t if isinstance(t, torch.Tensor) else t.copy(), device=device)
                               for t in pair))
        if points is None:
            self._grid_cache[str(device)] = pairs
        return pairs

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, points: Optional[torch.Tensor] = None,
                return_lse: bool = False):
        """q, k, v (B, N, H, D) in grid (row-major) or point order -> out (B, N, H, D) [, lse (B, H, N)]."""
        pairs = self.serializations(q.device, points)
        p = self.pattern
        return serialized_attention(
            q, k, v, pairs if len(pairs) > 1 else pairs[0], segment_lengths=p.segment_lengths,
            dilation_rates=p.dilation_rates, causal=p.causal, mode=p.mode, backend=self.backend, scale=self.scale,
            dropout_p=self.dropout if self.training else 0.0, return_lse=return_lse,
        )

    def extra_repr(self) -> str:
        p = self.pattern
        return (f"segment_lengths={list(p.segment_lengths)}, dilation_rates={list(p.dilation_rates)}, "
                f"ordering={list(self.orderings)}, grid_shape={self.grid_shape}, mode={p.mode!r}, causal={p.causal}")
