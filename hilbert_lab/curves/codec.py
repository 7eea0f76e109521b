"""Hilbert and Morton encode/decode between (..., ndim) integer coordinates and int64 indices.

Hilbert convention: bit-identical to galtay/hilbertcurve ``HilbertCurve(order, ndim)
.distance_from_point(point)`` (John Skilling's transpose algorithm). Morton convention: plain
bit interleave in which bit ``b`` of ``coords[..., i]`` becomes index bit ``b*ndim + ndim-1-i``
(the last coordinate is the low bit; the same bit layout as the Hilbert transpose).
numpy in -> numpy out; torch in -> torch out on the input's device.
"""
from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from hilbert_lab.kernels import curves_numba as _kernels

CURVES = ("hilbert", "morton")
MAX_INDEX_BITS = 63  # indices are int64
PARALLEL_MIN_POINTS = 1 << 18  # below this the serial kernel wins (thread wake-up ~0.05-30 ms)


def _check_curve(curve: str) -> str:
    if not isinstance(curve, str) or curve not in CURVES:
        raise ValueError(f"curve must be one of {CURVES}, got {curve!r}")
    return curve


def _check_positive_int(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer (>= 1), got {value}")
    return int(value)


def physical_memory_bytes() -> int:
    """This machine's physical memory in bytes (2**40 where the OS does not say)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):  # pragma: no cover - non-POSIX hosts
        return 1 << 40


def _check_fits_memory(count: int, name: str, bytes_per_item: int, what: str) -> None:
    """ValueError unless `count` items of `bytes_per_item` fit in this machine's physical memory."""
    memory = physical_memory_bytes()
    limit = memory // bytes_per_item
    if count > limit:
        raise ValueError(
            f"{name} must be <= {limit} on this machine ({what}: about {bytes_per_item} bytes per item, "
            f"{count * bytes_per_item / 2**30:.3g} GiB for {count}; physical memory is {memory / 2**30:.3g} GiB)"
        )


def _check_bits(order: int, ndim: int) -> None:
    if ndim * order > MAX_INDEX_BITS:
        raise ValueError(
            f"ndim * order must be <= {MAX_INDEX_BITS} (int64 indices); got ndim={ndim}, order={order} "
            f"(ndim * order = {ndim * order}); the largest allowed order for ndim={ndim} is "
            f"{MAX_INDEX_BITS // ndim}"
        )


def _is_torch_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _as_integer_array(values: Any, name: str) -> np.ndarray:
    """numpy view (or copy) of ``values`` with a native-endian integer dtype; ValueError otherwise."""
    array = np.asarray(values)
    if array.dtype == np.bool_ or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name} must have an integer dtype (int8..int64, uint8..uint64), got {array.dtype}")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return array


def _torch_to_numpy(tensor: Any, name: str) -> np.ndarray:
    torch = sys.modules["torch"]
    if tensor.dtype == torch.bool or tensor.is_floating_point() or tensor.is_complex():
        raise ValueError(f"{name} must have an integer dtype (int8..int64, uint8..uint64), got {tensor.dtype}")
    return tensor.detach().cpu().numpy()


def _range_error(array: np.ndarray, name: str, bits: int, what: str) -> ValueError:
    upper = (1 << bits) - 1
    low = int(array.min())
    high = int(array.max())
    bad = low if low < 0 else high
    return ValueError(f"{name} must lie in [0, {upper}] ({what}); found {bad} (min {low}, max {high})")


def _kernel(name: str, count: int):
    """Parallel kernel `name`, or its serial twin for inputs too small to pay for the threads."""
    return getattr(_kernels, name if count >= PARALLEL_MIN_POINTS else f"{name}_serial")


def _encode_numpy(coords: np.ndarray, order: int, curve: str) -> np.ndarray:
    if coords.ndim == 0:
        raise ValueError("coords must have shape (..., ndim) with ndim >= 1, got a 0-d scalar")
    ndim = coords.shape[-1]
    if ndim < 1:
        raise ValueError(f"coords must have shape (..., ndim) with ndim >= 1, got shape {coords.shape}")
    _check_bits(order, ndim)
    flat = np.ascontiguousarray(coords.reshape(-1, ndim))
    out = np.empty(flat.shape[0], dtype=np.int64)
    if flat.shape[0] == 0:
        return out.reshape(coords.shape[:-1])
    if ndim == 2:
        interleaved = flat.reshape(-1)
        if curve == "morton":
            acc = _kernel("morton_encode_2d", len(out))(interleaved, out)
        else:
            acc = _kernel("hilbert_encode_2d", len(out))(interleaved, order, out)
    elif curve == "morton":
        acc = _kernel("morton_encode_nd", len(out))(flat, order, out)
    else:
        acc = _kernel("hilbert_encode_nd", len(out))(flat, order, out)
    if (int(acc) >> order) != 0:
        raise _range_error(flat, "coords", order, f"0 <= coords < 2**order with order={order}")
    return out.reshape(coords.shape[:-1])


def _decode_numpy(index: np.ndarray, order: int, ndim: int, curve: str) -> np.ndarray:
    bits = ndim * order
    flat = np.ascontiguousarray(index.reshape(-1))
    out = np.empty((flat.shape[0], ndim), dtype=np.int64)
    if flat.shape[0] == 0:
        return out.reshape(index.shape + (ndim,))
    if ndim == 2:
        interleaved = out.reshape(-1)
        if curve == "morton":
            acc = _kernel("morton_decode_2d", len(flat))(flat, interleaved)
        else:
            acc = _kernel("hilbert_decode_2d", len(flat))(flat, order, interleaved)
    elif curve == "morton":
        acc = _kernel("morton_decode_nd", len(flat))(flat, order, out)
    else:
        acc = _kernel("hilbert_decode_nd", len(flat))(flat, order, out)
    if (int(acc) >> bits) != 0:
        raise _range_error(flat, "index", bits, f"0 <= index < 2**(ndim*order) with ndim={ndim}, order={order}")
    return out.reshape(index.shape + (ndim,))


def _cuda_kernels():
    """The optional CUDA curve module, or None when it cannot be imported."""
    try:
        from hilbert_lab.kernels import cuda_curves  # noqa: PLC0415 (optional, GPU work)
    except Exception:  # noqa: BLE001 (any import failure means: use the CPU path)
        return None
    return cuda_curves


def encode(coords: Any, order: int, *, curve: str = "hilbert") -> Any:
    """Curve index of integer grid points.

    coords: (..., ndim) integer numpy array or torch tensor, each entry in [0, 2**order).
    order: bits per coordinate (>= 1), with ndim * order <= 63.
    curve: "hilbert" (galtay/hilbertcurve convention) or "morton" (bit interleave).
    Returns int64 indices of shape (...): numpy for numpy input, torch (same device) for torch input.
    """
    curve = _check_curve(curve)
    order = _check_positive_int(order, "order")
    if _is_torch_tensor(coords):
        torch = sys.modules["torch"]
        if coords.dim() == 0:
            raise ValueError("coords must have shape (..., ndim) with ndim >= 1, got a 0-d tensor")
        if coords.is_cuda:
            _check_bits(order, coords.shape[-1])
            cuda_curves = _cuda_kernels()
            if cuda_curves is not None:
                try:
                    return cuda_curves.encode(coords, order, curve)
                except NotImplementedError:
                    pass
        result = _encode_numpy(_torch_to_numpy(coords, "coords"), order, curve)
        return torch.from_numpy(result).to(coords.device)
    return _encode_numpy(_as_integer_array(coords, "coords"), order, curve)


def decode(index: Any, order: int, ndim: int, *, curve: str = "hilbert") -> Any:
    """Integer grid points of curve indices (inverse of ``encode``).

    index: (...) integer numpy array or torch tensor, each entry in [0, 2**(ndim*order)).
    order: bits per coordinate (>= 1); ndim: number of coordinates (>= 1); ndim * order <= 63.
    Returns int64 coordinates of shape (..., ndim): numpy for numpy input, torch for torch input.
    """
    curve = _check_curve(curve)
    order = _check_positive_int(order, "order")
    ndim = _check_positive_int(ndim, "ndim")
    _check_bits(order, ndim)
    if _is_torch_tensor(index):
        torch = sys.modules["torch"]
        if index.is_cuda:
            cuda_curves = _cuda_kernels()
            if cuda_curves is not None:
                try:
                    return cuda_curves.decode(index, order, ndim, curve)
                except NotImplementedError:
                    pass
        result = _decode_numpy(_torch_to_numpy(index, "index"), order, ndim, curve)
        return torch.from_numpy(result).to(index.device)
    return _decode_numpy(_as_integer_array(index, "index"), order, ndim, curve)
