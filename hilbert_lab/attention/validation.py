"""Input checks shared by every attention entry point (the engine and the ring): one place, one wording."""
from __future__ import annotations

import functools
import math
import numbers
from typing import Optional

import torch
from torch.fx.experimental.symbolic_shapes import guard_scalar


FLOAT32_MAX = torch.finfo(torch.float32).max


def concrete(value: int | float) -> int | float:
    """value (an int or float; while torch.compile traces with dynamic shapes, possibly a symbolic one) as a plain
    value: specialized under a guard while compiling (the graph recompiles when it changes), itself in eager. A
    call's plain values (its pattern, scale, documents: the op's config string) are such values."""
    return guard_scalar(value) if torch.compiler.is_compiling() else value


def validate_attention_inputs(q, k, v, *, scale: Optional[float] = None, dropout_p: float = 0.0,
                              shape: str = "(B, N, H, D)", grouped_heads: bool = False,
                              fewer_queries: bool = False) -> float:
    """ValueError naming the argument unless q, k, v are valid attention inputs; returns the scale to use.

    q, k, v: non-empty 4D floating tensors of one shape `shape` (e.g. "(B, N/P, H, D)" for ring
    shards), dtype and device; with grouped_heads, k and v may have H_kv heads where H % H_kv == 0
    (grouped-query attention: query head h reads key/value head h // (H / H_kv)); with fewer_queries, q
    may have fewer rows than k and v (q (B, Nq, H, D) with Nq <= N, the queries at the last Nq positions).
    scale: None (then D**-0.5) or a finite number > 0, at most float32's largest value for inputs other than
    float64 (they compute in float32). dropout_p: a number in [0, 1).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4D tensor {shape}, got {getattr(t, 'shape', type(t))}")
        if t.layout != torch.strided:
            raise ValueError(f"{name} must be a dense (strided) tensor, got layout {t.layout}; call .to_dense() first")
        if t.is_meta:
            raise ValueError(f"{name} must hold data (a CPU or CUDA tensor), got a tensor on the meta device")
        if t.is_complex() or not t.is_floating_point():
            raise ValueError(f"{name} must have a floating dtype (float16, bfloat16, float32, float64), got {t.dtype}")
    rows_ok = q.shape[1] == k.shape[1] or (fewer_queries and q.shape[1] <= k.shape[1])
    heads_ok = q.shape[2] == k.shape[2] or grouped_heads
    if not (k.shape == v.shape and q.shape[0] == k.shape[0] and q.shape[3] == k.shape[3] and rows_ok and heads_ok):
        allowed = "".join([" (q may have fewer rows Nq <= N: the last positions)" if fewer_queries else "",
                           " (k, v may have H_kv heads dividing H)" if grouped_heads else ""])
        rows = " (or more rows than q)" if fewer_queries else ""
        raise ValueError(f"q, k, v must have the same shape {shape}{allowed}: k and v one shape with q's B, N and "
                         f"D{rows}, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if grouped_heads and k.shape[2] and q.shape[2] % k.shape[2]:
        raise ValueError(f"k and v heads (H_kv = {k.shape[2]}) must divide q's heads (H = {q.shape[2]}): query head h "
                         f"reads key/value head h // (H / H_kv)")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must share a device, got {q.device}, {k.device}, {v.device}")
    if min(q.shape) == 0 or min(k.shape) == 0:
        raise ValueError(f"q, k, v must be non-empty, got shapes {tuple(q.shape)}, {tuple(k.shape)} {shape}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")
    if scale is None:
        return concrete(q.shape[3]) ** -0.5
    number = not isinstance(scale, bool) and isinstance(scale, numbers.Real)
    if number:
        scale = concrete(float(scale))
    if not number or not math.isfinite(scale) or not scale > 0:
        raise ValueError(f"scale must be None (D**-0.5) or a finite float > 0, got {scale!r}")
    if q.dtype != torch.float64 and scale > FLOAT32_MAX:
        raise ValueError(f"scale must be None (D**-0.5) or a finite float in (0, {FLOAT32_MAX:.8g}] for {q.dtype} "
                         f"inputs (attention on them computes in float32, whose largest value that is), got "
                         f"{scale!r}; use float64 inputs for a larger scale")
    return scale


def kernel_layout(x: torch.Tensor) -> torch.Tensor:
    """x itself when its last dimension is contiguous (every kernel reads such views in place), else one
    contiguous copy: kernels read rows of D elements at unit stride."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def validate_cu_seqlens(cu_seqlens, q: torch.Tensor, *,
                        seq_len: Optional[int] = None) -> Optional[tuple[tuple[int, int], ...]]:
    """The documents ((start, length), ...) of a packed row, or None for one document of N tokens.

    cu_seqlens: None, or a 1-D integer tensor [0, n1, n1 + n2, ..., N] on q's device or in host memory (the
    flash-attn convention of one packed row) with q (1, N, H, D), or the same boundaries as a list or tuple of
    host integers. seq_len: the row's length N when q holds a part of it (a ring shard: N = shard length x
    ranks); default q's. Documents of length 0 (repeated entries) are dropped. A tensor's values are read
    on the host (one device synchronisation for a CUDA tensor); host memory and host integers need none."""
    if cu_seqlens is None:
        return None
    return _documents(list(boundary_values(cu_seqlens, q)), q.shape[0], q.shape[1], seq_len)


def boundary_values(cu_seqlens, q: Optional[torch.Tensor] = None) -> tuple[int, ...]:
    """cu_seqlens (a tensor, or host integers) as host integers, its form checked (ValueError naming it; a device
    tensor is read back: one synchronisation)."""
    if isinstance(cu_seqlens, (list, tuple)):
        return tuple(_host_integers(cu_seqlens))
    check_cu_seqlens_tensor(cu_seqlens, q)
    return tuple(int(x) for x in cu_seqlens.tolist())


def host_boundaries(cu_seqlens, q: Optional[torch.Tensor] = None) -> torch.Tensor:
    """cu_seqlens (a tensor, or host integers) as an int64 tensor in host memory (a device tensor copied: one
    synchronisation), its form checked (ValueError naming it) and its values not read: what the op reads when it
    runs, with no device synchronisation and no value a compiled graph specializes on."""
    if isinstance(cu_seqlens, (list, tuple)):
        return torch.tensor(_host_integers(cu_seqlens), dtype=torch.int64)
    check_cu_seqlens_tensor(cu_seqlens, q)
    return cu_seqlens.to("cpu", torch.int64)


def _host_integers(values) -> list[int]:
    if len(values) < 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in values):
        raise ValueError(f"cu_seqlens given as host boundaries must be a list of at least 2 integers [0, n1, "
                         f"n1 + n2, ..., N], got {list(values)[:12]!r}")
    return [int(x) for x in values]


def check_cu_seqlens_tensor(cu_seqlens, q: Optional[torch.Tensor] = None) -> None:
    """ValueError naming cu_seqlens unless it is a 1-D integer tensor of at least 2 entries on q's device (where
    q is given) or in host memory (its values are not read here)."""
    if not isinstance(cu_seqlens, torch.Tensor):
        raise ValueError(f"cu_seqlens must be None, a 1-D integer tensor [0, n1, n1 + n2, ..., N] or a list of "
                         f"those integers, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be a 1-D integer tensor [0, n1, n1 + n2, ..., N] of at least 2 entries, got "
                         f"shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.is_floating_point() or cu_seqlens.is_complex() or cu_seqlens.dtype == torch.bool:
        raise ValueError(f"cu_seqlens must have an integer dtype (int32 or int64), got {cu_seqlens.dtype}")
    if q is not None and cu_seqlens.device != q.device and cu_seqlens.device.type != "cpu":
        raise ValueError(f"cu_seqlens must be on q's device {q.device} or in host memory (cpu), got "
                         f"{cu_seqlens.device}")


@functools.lru_cache(maxsize=256)
def packed_row_documents(values: tuple[int, ...], batch: int, queries: int,
                         keys: int) -> Optional[tuple[tuple[int, int], ...]]:
    """The documents ((start, length), ...) of a packed row whose boundaries were read into host integers, or None
    for one document (validate_cu_seqlens's documents and ValueErrors), of q (batch, queries, ...) and k (batch, keys,
    ...); ValueError unless there are as many queries as keys. Memoized: the engine and the op read the boundaries in
    every forward and backward, and every layer of a model passes the same ones."""
    documents = _documents(list(values), batch, keys, None)
    if documents is not None and queries != keys:
        raise ValueError("cu_seqlens (packed documents) needs q, k, v of one length; fewer queries than keys are "
                         "for decoding one sequence")
    return documents


def _documents(values: list[int], batch: int, length: int,
               seq_len: Optional[int]) -> Optional[tuple[tuple[int, int], ...]]:
    if batch != 1:
        raise ValueError(f"cu_seqlens packs documents into one row: q, k, v must be (1, N, H, D), got batch "
                         f"{batch}")
    what = "q's sequence length" if seq_len is None else \
        f"the row's length: {length} tokens per shard x {seq_len // max(length, 1)} ranks"
    seq_len = length if seq_len is None else seq_len
    if values[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {values[0]}")
    if values[-1] != seq_len:
        raise ValueError(f"cu_seqlens must end at N = {seq_len} ({what}), got {values[-1]}")
    if any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"cu_seqlens must be non-decreasing, got {values[:12]}{' ...' if len(values) > 12 else ''}")
    documents = tuple((a, b - a) for a, b in zip(values, values[1:]) if b > a)
    return None if len(documents) == 1 else documents


def validate_global_heads(global_heads, num_heads: int) -> Optional[tuple[int, int]]:
    """(start, total) when q's `num_heads` heads are the heads [start, start + num_heads) of a layer of `total`
    heads (a head-parallel rank's share, keeping the global heads' offsets), or None for all the heads.

    global_heads: None or a pair of integers (start, total) with 0 <= start and start + num_heads <= total;
    (0, num_heads) is None."""
    if global_heads is None:
        return None
    if (not isinstance(global_heads, (tuple, list)) or len(global_heads) != 2
            or not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in global_heads)):
        raise ValueError(f"global_heads must be None or a pair of integers (start, total), got {global_heads!r}")
    start, total = int(global_heads[0]), int(global_heads[1])
    if start < 0 or start + num_heads > total:
        raise ValueError(f"global_heads (start, total) must hold q's {num_heads} heads: 0 <= start and start + "
                         f"{num_heads} <= total, got {global_heads!r}")
    return None if (start, total) == (0, num_heads) else (start, total)
