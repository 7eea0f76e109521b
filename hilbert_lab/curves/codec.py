"""Hilbert and Morton encode/decode between (..., ndim) integer coordinates and integer indices.

Hilbert convention: bit-identical to galtay/hilbertcurve ``HilbertCurve(order, ndim)
.distance_from_point(point)`` (John Skilling's transpose algorithm). Morton convention: plain
bit interleave in which bit ``b`` of ``coords[..., i]`` becomes index bit ``b*ndim + ndim-1-i``
(the last coordinate is the low bit; the same bit layout as the Hilbert transpose).
numpy in -> numpy out; torch in -> torch out on the input's device. Index dtype rule (numpy):
uint32 when ndim * order <= 32, int64 otherwise; torch: int64. Both take `out=` (no allocation)
and `dtype=`.
"""
from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

from hilbert_lab.kernels import hilbert_numba, morton_numba

CURVES = ("hilbert", "morton")
MAX_INDEX_BITS = 63  # indices are int64
NARROW_INDEX_BITS = 32  # numpy indices of at most this many bits default to uint32
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
    module = morton_numba if name.startswith("morton") else hilbert_numba
    return getattr(module, name if count >= PARALLEL_MIN_POINTS else f"{name}_serial")


def index_dtype(order: int, ndim: int) -> np.dtype:
    """Default index dtype for numpy input: uint32 when ndim * order <= 32, int64 otherwise."""
    return np.dtype(np.uint32) if ndim * order <= NARROW_INDEX_BITS else np.dtype(np.int64)


def _holds(dtype: np.dtype, bits: int) -> bool:
    """Whether integer `dtype` holds every value in [0, 2**bits)."""
    return dtype.kind in "iu" and dtype != np.bool_ and bits <= 8 * dtype.itemsize - (dtype.kind == "i")


def _check_dtype(dtype: Any, bits: int, name: str) -> np.dtype:
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        resolved = None
    if resolved is None or not _holds(resolved, bits):
        raise ValueError(f"{name} must be an integer dtype that holds {bits}-bit values (e.g. uint32 for <= 32 "
                         f"bits, int64 for <= 63), got {dtype!r}")
    return resolved


def _check_out(out: Any, shape: tuple[int, ...], bits: int, name: str) -> np.ndarray:
    if not isinstance(out, np.ndarray) or out.shape != shape or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"out must be a writeable C-contiguous numpy array of shape {shape}, got "
                         f"{type(out).__name__} {getattr(out, 'shape', '')}")
    if not _holds(out.dtype, bits) or not out.dtype.isnative:
        raise ValueError(f"out must have a native integer dtype that holds {bits}-bit {name} values, got {out.dtype}")
    return out


def _target(out: Any, dtype: Any, default: np.dtype, shape: tuple[int, ...], bits: int, name: str) -> np.ndarray:
    """The array to write: `out` (checked), or a new one of `dtype` (default `default`)."""
    if out is None:
        return np.empty(shape, dtype=default if dtype is None else _check_dtype(dtype, bits, "dtype"))
    out = _check_out(out, shape, bits, name)
    if dtype is not None and np.dtype(_check_dtype(dtype, bits, "dtype")) != out.dtype:
        raise ValueError(f"dtype {dtype!r} and out.dtype {out.dtype} disagree (give one of them)")
    return out


def _encode_numpy(coords: np.ndarray, order: int, curve: str, out: Any = None, dtype: Any = None) -> np.ndarray:
    if coords.ndim == 0:
        raise ValueError("coords must have shape (..., ndim) with ndim >= 1, got a 0-d scalar")
    ndim = coords.shape[-1]
    if ndim < 1:
        raise ValueError(f"coords must have shape (..., ndim) with ndim >= 1, got shape {coords.shape}")
    _check_bits(order, ndim)
    target = _target(out, dtype, index_dtype(order, ndim), coords.shape[:-1], ndim * order, "index")
    flat = np.ascontiguousarray(coords.reshape(-1, ndim))
    result = target.reshape(-1)
    if flat.shape[0] == 0:
        return target
    if ndim == 2 and curve == "hilbert" and flat.dtype.kind == "u" and flat.dtype.itemsize <= 4 \
            and sys.byteorder == "little":
        # one load per point: (N, 2) unsigned coordinates viewed as (N,) words x | y << width
        packed = flat.view(np.dtype(f"u{2 * flat.dtype.itemsize}")).reshape(-1)
        acc = _kernel("hilbert_encode_2d_packed", len(result))(packed, order, result, 8 * flat.dtype.itemsize)
    elif ndim == 2:
        interleaved = flat.reshape(-1)
        if curve == "morton":
            acc = _kernel("morton_encode_2d", len(result))(interleaved, result)
        else:
            acc = _kernel("hilbert_encode_2d", len(result))(interleaved, order, result)
    elif curve == "morton":
        acc = _kernel("morton_encode_nd", len(result))(flat, order, result)
    else:
        acc = _kernel("hilbert_encode_nd", len(result))(flat, order, result)
    if (int(acc) >> order) != 0:
        raise _range_error(flat, "coords", order, f"0 <= coords < 2**order with order={order}")
    return target


def _decode_numpy(index: np.ndarray, order: int, ndim: int, curve: str, out: Any = None,
                  dtype: Any = None) -> np.ndarray:
    bits = ndim * order
    target = _target(out, dtype, np.dtype(np.int64), index.shape + (ndim,), order, "coordinate")
    flat = np.ascontiguousarray(index.reshape(-1))
    result = target.reshape(-1, ndim)
    if flat.shape[0] == 0:
        return target
    if ndim == 2 and curve == "hilbert" and target.dtype.itemsize <= 4 and sys.byteorder == "little":
        # one store per point: (N, 2) narrow coordinates viewed as (N,) words x | y << width
        width = 8 * target.dtype.itemsize
        packed = result.view(np.dtype(f"u{2 * target.dtype.itemsize}")).reshape(-1)
        acc = _kernel("hilbert_decode_2d_packed", len(flat))(flat, order, packed, width)
    elif ndim == 2:
        interleaved = result.reshape(-1)
        if curve == "morton":
            acc = _kernel("morton_decode_2d", len(flat))(flat, interleaved)
        else:
            acc = _kernel("hilbert_decode_2d", len(flat))(flat, order, interleaved)
    elif curve == "morton":
        acc = _kernel("morton_decode_nd", len(flat))(flat, order, result)
    else:
        acc = _kernel("hilbert_decode_nd", len(flat))(flat, order, result)
    if (int(acc) >> bits) != 0:
        raise _range_error(flat, "index", bits, f"0 <= index < 2**(ndim*order) with ndim={ndim}, order={order}")
    return target


def _cuda_kernels():
    """The optional CUDA curve module, or None when it cannot be imported."""
    try:
        from hilbert_lab.kernels import cuda_curves  # noqa: PLC0415 (optional, GPU work)
    except Exception:  # noqa: BLE001 (any import failure means: use the CPU path)
        return None
    return cuda_curves


def _torch_numpy_dtype(dtype: Any) -> Any:
    """numpy dtype of a torch integer dtype (other values pass through for numpy to judge)."""
    torch = sys.modules["torch"]
    if isinstance(dtype, torch.dtype):
        return torch.empty(0, dtype=dtype).numpy().dtype
    return dtype


def _torch_out(out: Any, device: Any) -> Any:
    torch = sys.modules["torch"]
    if out is None:
        return None
    if not isinstance(out, torch.Tensor) or out.device != device:
        raise ValueError(f"out must be a torch tensor on {device} for torch input, got {type(out).__name__}")
    return out.numpy()  # shares memory (CPU); shape, dtype and layout are checked on the array


def encode(coords: Any, order: int, *, curve: str = "hilbert", out: Any = None, dtype: Any = None) -> Any:
    """Curve index of integer grid points.

    coords: (..., ndim) integer numpy array or torch tensor, each entry in [0, 2**order).
    order: bits per coordinate (>= 1), with ndim * order <= 63.
    curve: "hilbert" (galtay/hilbertcurve convention) or "morton" (bit interleave).
    out: optional preallocated (...) integer array (torch tensor for torch input), C-contiguous,
    of a dtype that holds ndim * order bits; it is filled and returned (no allocation).
    dtype: index dtype when out is None. Default for numpy: uint32 when ndim * order <= 32,
    int64 otherwise (half the bytes to write; note uint32 differences wrap: cast before
    subtracting). Default for torch: int64 (torch has few uint32 operations).
    Returns indices of shape (...): numpy for numpy input, torch (same device) for torch input.
    Inputs of >= PARALLEL_MIN_POINTS points run on all numba threads.
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
                    if out is None and dtype is not None:
                        out = torch.empty(coords.shape[:-1], dtype=dtype, device=coords.device)
                    return cuda_curves.encode(coords, order, curve, out=out)
                except NotImplementedError:
                    pass
            if out is not None:
                raise ValueError("out must be None for CUDA input without the CUDA curve kernels")
        array_out = _torch_out(out, coords.device)
        if dtype is None and out is None:
            dtype = np.int64
        result = _encode_numpy(_torch_to_numpy(coords, "coords"), order, curve, array_out,
                               None if dtype is None else _torch_numpy_dtype(dtype))
        return out if out is not None else torch.from_numpy(result).to(coords.device)
    return _encode_numpy(_as_integer_array(coords, "coords"), order, curve, out, dtype)


def decode(index: Any, order: int, ndim: int, *, curve: str = "hilbert", out: Any = None, dtype: Any = None) -> Any:
    """Integer grid points of curve indices (inverse of ``encode``).

    index: (...) integer numpy array or torch tensor, each entry in [0, 2**(ndim*order)).
    order: bits per coordinate (>= 1); ndim: number of coordinates (>= 1); ndim * order <= 63.
    out: optional preallocated (..., ndim) C-contiguous integer array (torch tensor for torch
    input) of a dtype that holds `order` bits (e.g. uint16 for order <= 16); filled and returned.
    dtype: coordinate dtype when out is None (default int64, so that differences do not wrap).
    Returns coordinates of shape (..., ndim): numpy for numpy input, torch for torch input.
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
                    if out is None and dtype is not None:
                        out = torch.empty(tuple(index.shape) + (ndim,), dtype=dtype, device=index.device)
                    return cuda_curves.decode(index, order, ndim, curve, out=out)
                except NotImplementedError:
                    pass
            if out is not None:
                raise ValueError("out must be None for CUDA input without the CUDA curve kernels")
        array_out = _torch_out(out, index.device)
        result = _decode_numpy(_torch_to_numpy(index, "index"), order, ndim, curve, array_out,
                               None if dtype is None else _torch_numpy_dtype(dtype))
        return out if out is not None else torch.from_numpy(result).to(index.device)
    return _decode_numpy(_as_integer_array(index, "index"), order, ndim, curve, out, dtype)
