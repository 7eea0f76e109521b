"""Serialized dilated attention: tokens of an image, video or point cloud are put in curve order,
the exact dilated engine runs on that sequence (the ordering is part of the *pattern* here: it
decides which spatial neighbours share a segment), and the result is put back in the input order.

A serialization is a pair (perm, inverse) of int64 tensors, (N,) for all samples or (B, N) per
sample (point clouds), with ``x_serialized = x[:, perm]`` and ``x = x_serialized[:, inverse]``
(``hilbert_lab.curves.serialize``). One pair serves every branch; a list of one pair per branch
gives each branch its own ordering (longnet mode), merged exactly by the branches' LSEs.
k and v may have fewer heads than q (grouped-query attention, as in `dilated_attention`). Packed
documents (cu_seqlens, B = 1) need a serialization that keeps every document's tokens inside its
range (each document serialized on its own, as SerializedDilatedAttention does for point clouds).
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


def _check_documents(pair: Serialization, cu_seqlens: torch.Tensor, seq_len: int, name: str) -> None:
    """ValueError unless the serialization maps every document of the packed row onto its own positions."""
    perm = pair[0].reshape(-1)
    if perm.numel() != seq_len:
        raise ValueError(f"{name} must be one (N,) or (1, N) pair with cu_seqlens (one packed row)")
    bounds = cu_seqlens.to(device=perm.device, dtype=torch.int64)[1:]
    document = torch.searchsorted(bounds, torch.arange(seq_len, device=perm.device), right=True)
    if not torch.equal(document[perm], document):
        raise ValueError(f"{name} moves tokens between the documents of cu_seqlens: serialize each document on its "
                         f"own (positions of document d must map into document d)")


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
    cu_seqlens: Optional[torch.Tensor] = None,
):
    """Dilated attention on serialized tokens: q (B, N, H, D), k, v (B, N, H_kv, D) in input order ->
    out (B, N, H, D) [, lse (B, H, N)] in input order.

    serialization: (perm, inverse) (N,) or (B, N), or a list with one pair per branch (mode
    "longnet" only: each branch attends along its own ordering; branches merge by LSE). Segments,
    dilation and causality apply to serialized positions. cu_seqlens: packed documents (B = 1); each
    serialization must keep every document's tokens in its range (ValueError otherwise). Other
    arguments as in `dilated_attention`.
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
    if cu_seqlens is not None:
        if not isinstance(cu_seqlens, torch.Tensor):
            raise ValueError(f"cu_seqlens must be None or a 1-D integer tensor, got {type(cu_seqlens).__name__}")
        for pair in pairs:
            _check_documents(pair, cu_seqlens, seq_len, "serialization")
    kwargs = dict(causal=pattern.causal, mode=pattern.mode, backend=backend, scale=scale, dropout_p=dropout_p,
                  return_lse=True, cu_seqlens=cu_seqlens)
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

    def serializations(self, device: torch.device, points: Optional[torch.Tensor] = None,
                       cu_seqlens: Optional[torch.Tensor] = None) -> list[Serialization]:
        """One (perm, inverse) pair per distinct entry of `self.orderings` (tensors on `device`); with
        cu_seqlens each document's points are serialized on their own (a packed row of point clouds)."""
        from hilbert_lab.curves import serialize  # noqa: PLC0415

        if points is None and self.grid_shape is None:
            raise ValueError("points are required when the module has no grid_shape")
        if cu_seqlens is not None:
            if points is None:
                raise ValueError("cu_seqlens needs points: a module with grid_shape serializes one grid per row; pack "
                                 "point clouds (points (N, d) of the whole row) or call serialized_attention")
            return [self._packed(points, cu_seqlens, ordering, device) for ordering in self.orderings]
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

    def _packed(self, points: torch.Tensor, cu_seqlens: torch.Tensor, ordering: str, device) -> Serialization:
        """(perm, inverse) (N,) of a packed row: each document's points serialized on their own."""
        from hilbert_lab.curves import serialize  # noqa: PLC0415

        cloud = points[0] if points.dim() == 3 and points.shape[0] == 1 else points
        if cloud.dim() != 2:
            raise ValueError(f"points must be (N, d) or (1, N, d) with cu_seqlens, got {tuple(points.shape)}")
        bounds = [int(b) for b in cu_seqlens.tolist()]
        perms = []
        for start, end in zip(bounds, bounds[1:]):
            if end > start:
                perm, _ = serialize(cloud[start:end], ordering, grid_size=self.grid_size)
                perms.append(torch.as_tensor(perm if isinstance(perm, torch.Tensor) else perm.copy(), device=device)
                             + start)
        perm = torch.cat(perms).to(torch.int64)
        return perm, torch.argsort(perm)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, points: Optional[torch.Tensor] = None,
                return_lse: bool = False, cu_seqlens: Optional[torch.Tensor] = None):
        """q (B, N, H, D), k, v (B, N, H_kv, D) in grid (row-major) or point order -> out (B, N, H, D)
        [, lse (B, H, N)]; cu_seqlens (with points, B = 1): a packed row of point clouds."""
        pairs = self.serializations(q.device, points, cu_seqlens)
        p = self.pattern
        return serialized_attention(
            q, k, v, pairs if len(pairs) > 1 else pairs[0], segment_lengths=p.segment_lengths,
            dilation_rates=p.dilation_rates, causal=p.causal, mode=p.mode, backend=self.backend, scale=self.scale,
            dropout_p=self.dropout if self.training else 0.0, return_lse=return_lse, cu_seqlens=cu_seqlens,
        )

    def extra_repr(self) -> str:
        p = self.pattern
        return (f"segment_lengths={list(p.segment_lengths)}, dilation_rates={list(p.dilation_rates)}, "
                f"ordering={list(self.orderings)}, grid_shape={self.grid_shape}, mode={p.mode!r}, causal={p.causal}")
