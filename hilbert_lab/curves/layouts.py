"""Sequence layouts: token permutations of a (B, N, H, D) sequence, and applying them (CPU / CUDA).

Convention (hilbert_lab.curves.orderings): ``perm[j]`` is the original position of the token stored at
layout slot ``j``, so ``x_layout = x[:, perm]`` and ``x = x_layout[:, inverse]``.

* ``layout_permutation(seq_len, block, ordering)``: one ordering inside every block of ``block``
  consecutive tokens, a shorter last block with the ordering of its own length (the engine's layout,
  the locality traces' 1D layouts, the viz tile tables).
* ``grid_layout(shape, ordering)``: a row-major 2D/3D token grid serialised by a curve
  (``hilbert_lab.curves.serialize``), as tensors.
* ``permute_sequence(x, perm)``: ``x.index_select(1, perm)``, differentiable. A permutation made by
  ``layout_permutation`` moves the tokens of every full block the same way; on CUDA tensors it runs
  through the per-segment permutation kernel (``hilbert_lab.kernels.cuda_curves``; 0.077 ms against
  index_select's 0.166 ms for bf16 (2, 32768, 12, 64) on an H100, reports/results/gpu_curves.json,
  measured with older code (rev unrecorded)),
  forward and backward. Everything else, and every CPU tensor, uses index_select.

The layout functions are cached (bounded LRU, per device); the returned tensors are shared: do not
write into them.
"""
from __future__ import annotations

import functools
import warnings
import weakref
from typing import Any, Optional

import numpy as np
import torch

from hilbert_lab.curves.codec import _check_fits_memory, _check_positive_int
from hilbert_lab.curves.orderings import ORDERINGS, PERMUTATION_BYTES_PER_TOKEN, segment_permutation
from hilbert_lab.curves.serialize import serialize

# The 1D layouts: the curve orderings, and "dilation_major" (each block sorted by
# (position mod dilation_rate, position), so every dilated group of the block is contiguous).
LAYOUTS = ORDERINGS + ("dilation_major",)
CACHE_SIZE = 64

__all__ = ["LAYOUTS", "grid_layout", "inverse_permutation", "layout_permutation", "permute_sequence"]


def inverse_permutation(perm: Any) -> Any:
    """The inverse of a permutation (N,) of 0..N-1 (numpy array or torch tensor, same kind and device)."""
    if isinstance(perm, torch.Tensor):
        return torch.empty_like(perm).scatter_(0, perm, torch.arange(perm.shape[0], dtype=perm.dtype,
                                                                       device=perm.device))
    perm = np.asarray(perm)
    inverse = np.empty_like(perm)
    inverse[perm] = np.arange(perm.shape[0], dtype=perm.dtype)
    return inverse


def _block_order(length: int, ordering: str, dilation_rate: int) -> np.ndarray:
    """perm (length,) int64 of one block."""
    if ordering == "dilation_major":
        local = np.arange(length, dtype=np.int64)
        return local[np.lexsort((local, local % dilation_rate))]
    return np.asarray(segment_permutation(length, ordering)[0], dtype=np.int64)


# Block structure of the tensors made by layout_permutation, for the CUDA kernel:
# id(tensor) -> (weak reference to it, block, (local, tail) of the tensor, (local, tail) of its inverse, the
# tensor's version counter then: a tensor changed in place since no longer has that structure).
_BLOCKS: dict[int, tuple[weakref.ref, int, tuple, tuple, int]] = {}


def _register(tensor: torch.Tensor, block: int, forward: tuple, backward: tuple) -> None:
    key = id(tensor)
    ref = weakref.ref(tensor, lambda _ref, key=key: _BLOCKS.pop(key, None))
    _BLOCKS[key] = (ref, block, forward, backward, tensor._version)


def _local_and_tail(perm: torch.Tensor, block: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    full = perm.shape[0] // block * block
    local = perm[:block].clone()
    tail = perm[full:] - full if full < perm.shape[0] else None
    return local, tail


@functools.lru_cache(maxsize=CACHE_SIZE)
def _cached_layout(seq_len: int, block: int, ordering: str, dilation_rate: int,
                   device: str) -> tuple[torch.Tensor, torch.Tensor]:
    # ordinary tensors even when first asked for under inference mode: they are shared by later calls, and an
    # in-place change is seen through their version counter, which inference tensors lack
    with torch.inference_mode(False):
        return _build_layout(seq_len, block, ordering, dilation_rate, device)


def _build_layout(seq_len: int, block: int, ordering: str, dilation_rate: int,
                  device: str) -> tuple[torch.Tensor, torch.Tensor]:
    if device != "cpu":
        perm, inverse = (t.to(device) for t in _cached_layout(seq_len, block, ordering, dilation_rate, "cpu"))
    else:
        full = seq_len // block
        parts = [(np.arange(full, dtype=np.int64)[:, None] * block
                  + _block_order(block, ordering, dilation_rate)[None, :]).reshape(-1)]
        if seq_len > full * block:
            parts.append(full * block + _block_order(seq_len - full * block, ordering, dilation_rate))
        perm = torch.from_numpy(np.concatenate(parts))
        inverse = inverse_permutation(perm)
    forward, backward = _local_and_tail(perm, block), _local_and_tail(inverse, block)
    _register(perm, block, forward, backward)
    _register(inverse, block, backward, forward)
    return perm, inverse


def _device_name(device: Any) -> str:
    try:
        return str(torch.device(device))
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be a torch device or its name (e.g. 'cpu', 'cuda:0'), got {device!r}") from None


@torch.compiler.assume_constant_result  # Python/numpy work: a compiled graph holds its result as a constant
def layout_permutation(seq_len: int, block: int, ordering: str, *, dilation_rate: int = 1,
                       device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(perm, inverse) int64 tensors (N,) on `device`: `ordering` applied inside each block of `block` tokens.

    x_layout = x[:, perm], x = x_layout[:, inverse]. block is clipped to seq_len; a shorter last block
    gets the ordering of its own length. ordering in LAYOUTS: "identity", "hilbert", "morton", "snake"
    (hilbert_lab.curves.segment_permutation of the block length) or "dilation_major" (block positions
    sorted by (position mod dilation_rate, position); dilation_rate is used by it only). Cached.
    """
    seq_len = _check_positive_int(seq_len, "seq_len")
    block = _check_positive_int(block, "block")
    if not isinstance(ordering, str) or ordering not in LAYOUTS:
        raise ValueError(f"ordering must be one of {LAYOUTS}, got {ordering!r}")
    dilation_rate = _check_positive_int(dilation_rate, "dilation_rate") if ordering == "dilation_major" else 1
    device = _device_name(device)
    _check_fits_memory(seq_len, "seq_len", PERMUTATION_BYTES_PER_TOKEN, "building a permutation")
    return _cached_layout(seq_len, min(block, seq_len), ordering, dilation_rate, device)


@functools.lru_cache(maxsize=CACHE_SIZE)
def _cached_grid_layout(shape: tuple[int, ...], ordering: str, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    perm, inverse = serialize(shape, ordering)
    return torch.tensor(perm, device=device), torch.tensor(inverse, device=device)


@torch.compiler.disable
def grid_layout(shape: Any, ordering: str, *, device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(perm, inverse) int64 tensors (prod(shape),) on `device` serialising a row-major (H, W) or (T, H, W)
    grid: hilbert_lab.curves.serialize(shape, ordering) (ordering in SERIALIZATIONS). Cached."""
    try:
        dims = tuple(_check_positive_int(side, "shape entries") for side in shape)
    except TypeError:
        dims = ()
    if len(dims) not in (2, 3):
        raise ValueError(f"shape must be a tuple (H, W) or (T, H, W) of positive ints, got {shape!r}")
    return _cached_grid_layout(dims, ordering, _device_name(device))


@functools.lru_cache(maxsize=1)
def _cuda_kernels():
    """hilbert_lab.kernels.cuda_curves when its CUDA extension builds and loads here, else None (warned once)."""
    from hilbert_lab.kernels import cuda_build, cuda_curves  # noqa: PLC0415 (GPU work only)

    try:
        cuda_build.load_extension()
    except (NotImplementedError, ImportError) as error:  # no toolchain or a failed build (cuda_build turns
        # both into NotImplementedError), or a built extension that does not import here
        warnings.warn(f"permute_sequence uses index_select on CUDA: {error}", RuntimeWarning, stacklevel=3)
        return None
    return cuda_curves


def _apply_blocks(x: torch.Tensor, block: int, local: torch.Tensor, tail: Optional[torch.Tensor]) -> torch.Tensor:
    return _cuda_kernels().apply_segment_permutation(x, local, block, tail_perm=tail, validate=False)


class _BlockPermutation(torch.autograd.Function):
    """x[:, perm] for a per-block perm by the CUDA kernel; backward applies the inverse the same way."""

    @staticmethod
    def forward(ctx, x, block, forward, backward):
        ctx.block, ctx.forward, ctx.backward = block, forward, backward
        return _apply_blocks(x, block, *forward)

    @staticmethod
    def backward(ctx, grad):
        return _BlockPermutation.apply(grad, ctx.block, ctx.backward, ctx.forward), None, None, None


@torch.compiler.disable
def _permute_blocks(x: torch.Tensor, perm: torch.Tensor) -> Optional[torch.Tensor]:
    """The CUDA kernel path of permute_sequence, or None where it does not apply."""
    entry = _BLOCKS.get(id(perm))
    if (entry is None or entry[0]() is not perm or perm._version != entry[4] or perm.device != x.device
            or _cuda_kernels() is None):
        return None
    _, block, forward, backward, _ = entry
    return _BlockPermutation.apply(x, block, forward, backward)


def permute_sequence(x: torch.Tensor, perm: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """x permuted along `dim` (default the sequence dim of (B, N, H, D)): x.index_select(dim, perm).

    perm: int64 tensor (N,), a permutation of 0..N-1 with N = x.shape[dim] (moved to x's device if needed).
    Differentiable. A (B, N, H, D) CUDA tensor with a perm (or inverse) from `layout_permutation` on x's
    device runs the per-block CUDA kernel, forward and backward; all else uses index_select.
    """
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        raise ValueError(f"x must be a tensor with at least one dimension, got {type(x).__name__}")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must be an int in [{-x.dim()}, {x.dim() - 1}] for x of shape {tuple(x.shape)}, "
                         f"got {dim!r}")
    dim %= x.dim()
    # size(0), not shape: a compiled graph's constant permutation (dynamic shapes) has no traceable .shape
    if not isinstance(perm, torch.Tensor) or perm.dim() != 1 or perm.size(0) != x.shape[dim] \
            or perm.is_floating_point():
        shape = tuple(perm.shape) if isinstance(perm, torch.Tensor) else type(perm).__name__
        raise ValueError(f"perm must be an integer tensor of shape ({x.shape[dim]},) (x.shape[{dim}]), got {shape}")
    if x.is_cuda and dim == 1 and x.dim() == 4 and not torch.compiler.is_compiling():  # compiled: index_select
        out = _permute_blocks(x, perm)
        if out is not None:
            return out
    return x.index_select(dim, perm.to(x.device))
