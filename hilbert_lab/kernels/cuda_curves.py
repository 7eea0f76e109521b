"""CUDA curve maps (Hilbert/Morton encode, decode) and per-segment token permutation for CUDA tensors.

Conventions match hilbert_lab.curves (Hilbert: galtay/hilbertcurve's; Morton: bit interleave with
coordinate 0 as the most significant bit of each ndim-bit group). Unsupported cases (CPU tensors,
ndim other than 2 or 3, other curves or dtypes, no CUDA toolchain) raise NotImplementedError so
that hilbert_lab.curves falls back to its CPU kernels; invalid arguments raise ValueError.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from hilbert_lab.kernels import cuda_build  # load_extension is looked up at each call (a replaced one is seen)

CURVES = {"hilbert": 0, "morton": 1}
_INT_DTYPES = (torch.int32, torch.int64)


def _curve_id(curve: str) -> int:
    if curve not in CURVES:
        raise NotImplementedError(f"curve {curve!r} has no CUDA kernel (supported: {sorted(CURVES)})")
    return CURVES[curve]


def _check_order(order: int, ndim: int) -> int:
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or order < 1:
        raise ValueError(f"order must be a positive integer, got {order!r}")
    if ndim * int(order) > 63:
        raise ValueError(f"ndim * order must be <= 63 (int64 indices), got ndim={ndim}, order={order}")
    return int(order)


def _stream() -> int:
    return torch.cuda.current_stream().cuda_stream


METHODS = {"table": 0, "bitscan": 1}
# "auto": the faster form measured on an H100 (reports/results/gpu_curves.json, launch_sweep; measured with
# older code (rev unrecorded)): the table for both directions (the prefix-scan encode is 30% slower, its
# decode within 2%).
AUTO_METHOD = {"encode": "table", "decode": "table"}


def _method_id(method: str, direction: str) -> int:
    if method == "auto":
        method = AUTO_METHOD[direction]
    if method not in METHODS:
        raise ValueError(f"method must be 'auto' or one of {sorted(METHODS)}, got {method!r}")
    return METHODS[method]


def encode(coords: torch.Tensor, order: int, curve: str = "hilbert", *, out: Optional[torch.Tensor] = None,
           validate: bool = True, method: str = "auto") -> torch.Tensor:
    """coords (..., ndim) int32/int64 CUDA tensor, each in [0, 2**order) -> index (...) int64 (or `out`'s dtype).

    validate=False skips the range check (one extra read of coords) for callers that checked already.
    method (2D Hilbert, int32 in and out, order <= 15): "table" (4-bit state machine in shared
    memory), "bitscan" (branch-free prefix-scan form) or "auto"; all give identical indices.
    """
    method_id = _method_id(method, "encode")
    if not isinstance(coords, torch.Tensor) or coords.device.type != "cuda":
        raise NotImplementedError("cuda_curves.encode needs a CUDA tensor")
    if coords.dtype not in _INT_DTYPES:
        raise NotImplementedError(f"coords dtype {coords.dtype} has no CUDA kernel (int32, int64)")
    if coords.dim() < 1:
        raise ValueError("coords must have shape (..., ndim)")
    ndim = coords.shape[-1]
    if ndim not in (2, 3):
        raise NotImplementedError(f"ndim {ndim} has no CUDA kernel (2 or 3)")
    curve_id = _curve_id(curve)
    order = _check_order(order, ndim)
    coords = coords.contiguous()
    if validate and coords.numel():
        lo, hi = torch.aminmax(coords)
        if int(lo) < 0 or int(hi) >= (1 << order):
            raise ValueError(f"coords must lie in [0, 2**order) = [0, {1 << order}); got range [{int(lo)}, {int(hi)}]")
    shape = coords.shape[:-1]
    if out is None:
        out = torch.empty(shape, dtype=torch.int64, device=coords.device)
    elif out.shape != shape or out.dtype not in _INT_DTYPES or out.device != coords.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous int32/int64 tensor of shape {tuple(shape)} on {coords.device}")
    if out.dtype == torch.int32 and ndim * order > 31:
        raise ValueError(f"out dtype int32 holds indices of ndim * order <= 31 bits; got {ndim * order}")
    ext = cuda_build.load_extension()
    ext.curve_encode(coords.data_ptr(), out.data_ptr(), out.numel(), ndim, order, curve_id,
                     coords.dtype == torch.int64, out.dtype == torch.int64, method_id, _stream())
    return out


def decode(index: torch.Tensor, order: int, ndim: int, curve: str = "hilbert", *,
           out: Optional[torch.Tensor] = None, validate: bool = True, method: str = "auto") -> torch.Tensor:
    """index (...) int32/int64 CUDA tensor in [0, 2**(ndim*order)) -> coords (..., ndim) int64 (or `out`'s dtype).

    method: as for `encode` ("auto", "table", "bitscan").
    """
    method_id = _method_id(method, "decode")
    if not isinstance(index, torch.Tensor) or index.device.type != "cuda":
        raise NotImplementedError("cuda_curves.decode needs a CUDA tensor")
    if index.dtype not in _INT_DTYPES:
        raise NotImplementedError(f"index dtype {index.dtype} has no CUDA kernel (int32, int64)")
    if ndim not in (2, 3):
        raise NotImplementedError(f"ndim {ndim} has no CUDA kernel (2 or 3)")
    curve_id = _curve_id(curve)
    order = _check_order(order, ndim)
    index = index.contiguous()
    if validate and index.numel():
        lo, hi = torch.aminmax(index)
        if int(lo) < 0 or int(hi) >= (1 << (ndim * order)):
            raise ValueError(f"index must lie in [0, 2**(ndim*order)) = [0, {1 << (ndim * order)}); "
                             f"got range [{int(lo)}, {int(hi)}]")
    shape = (*index.shape, ndim)
    if out is None:
        out = torch.empty(shape, dtype=torch.int64, device=index.device)
    elif tuple(out.shape) != shape or out.dtype not in _INT_DTYPES or out.device != index.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous int32/int64 tensor of shape {shape} on {index.device}")
    ext = cuda_build.load_extension()
    ext.curve_decode(index.data_ptr(), out.data_ptr(), index.numel(), ndim, order, curve_id,
                     index.dtype == torch.int64, out.dtype == torch.int64, method_id, _stream())
    return out


def set_launch_config(items: int = 4, threads: int = 256, encode_points: int = 4, decode_points: int = 2) -> None:
    """Launch configuration of the vectorised 2D int32 kernels (a benchmarking knob; the defaults are
    the fastest measured on an H100, reports/results/gpu_curves.json, measured with older code (rev
    unrecorded)): ``items`` vectors per thread
    (1, 2, 4 or 8), ``threads`` per block (a multiple of 32 in [32, 512]), points per vector to encode
    and to decode (2, or 4: 16-byte index vectors). Results never depend on it."""
    if items not in (1, 2, 4, 8):
        raise ValueError(f"items must be one of (1, 2, 4, 8), got {items!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or not 32 <= threads <= 512 or threads % 32:
        raise ValueError(f"threads must be a multiple of 32 in [32, 512], got {threads!r}")
    for name, value in (("encode_points", encode_points), ("decode_points", decode_points)):
        if value not in (2, 4):
            raise ValueError(f"{name} must be 2 or 4, got {value!r}")
    cuda_build.load_extension().curve_launch_config(int(items), int(threads), int(encode_points), int(decode_points))


def _perm_tensor(perm, length: int, name: str, device: torch.device, validate: bool) -> torch.Tensor:
    if isinstance(perm, np.ndarray):
        perm = torch.from_numpy(np.ascontiguousarray(perm))
    if not isinstance(perm, torch.Tensor) or perm.dim() != 1 or perm.shape[0] != length:
        raise ValueError(f"{name} must be a 1D integer array of length {length}")
    if perm.dtype not in _INT_DTYPES:
        raise ValueError(f"{name} must hold integers (int32/int64), got {perm.dtype}")
    if validate:
        cpu = perm.detach().to("cpu", torch.int64)
        if not torch.equal(torch.sort(cpu).values, torch.arange(length)):
            raise ValueError(f"{name} must be a permutation of 0..{length - 1}")
    return perm.to(device=device, dtype=torch.int64).contiguous()


def apply_segment_permutation(x: torch.Tensor, perm, segment_length: int, *, tail_perm=None,
                              out: Optional[torch.Tensor] = None, validate: bool = True) -> torch.Tensor:
    """x (B, N, H, D) CUDA -> out with out[:, s*L + j] = x[:, s*L + perm[j]] per segment of L = segment_length.

    A shorter last segment (N % L tokens) uses tail_perm (required then). Pass the inverse
    permutation to undo a layout. validate=False skips the permutation check (a host sync).
    """
    if not isinstance(x, torch.Tensor) or x.device.type != "cuda":
        raise NotImplementedError("apply_segment_permutation needs a CUDA tensor")
    if x.dim() != 4:
        raise ValueError(f"x must be (B, N, H, D), got shape {tuple(x.shape)}")
    if isinstance(segment_length, bool) or not isinstance(segment_length, (int, np.integer)) or segment_length < 1:
        raise ValueError(f"segment_length must be a positive integer, got {segment_length!r}")
    batch, seq_len = x.shape[0], x.shape[1]
    segment_length = int(segment_length)
    perm_t = _perm_tensor(perm, segment_length, "perm", x.device, validate)
    tail = seq_len % segment_length if seq_len >= segment_length else seq_len
    if seq_len < segment_length:
        raise ValueError(f"segment_length ({segment_length}) must not exceed N ({seq_len}); "
                         f"pass perm of length N for a single short segment")
    if tail:
        if tail_perm is None:
            raise ValueError(f"N = {seq_len} is not a multiple of segment_length = {segment_length}: "
                             f"tail_perm of length {tail} is required")
        tail_t = _perm_tensor(tail_perm, tail, "tail_perm", x.device, validate)
    else:
        tail_t = perm_t
    x = x.contiguous()
    if out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or out.dtype != x.dtype or out.device != x.device or not out.is_contiguous():
        raise ValueError("out must be a contiguous tensor of x's shape, dtype and device")
    row_bytes = x.shape[2] * x.shape[3] * x.element_size()
    ext = cuda_build.load_extension()
    ext.permute_rows(x.data_ptr(), out.data_ptr(), batch, seq_len, row_bytes, perm_t.data_ptr(), segment_length,
                     tail_t.data_ptr(), _stream())
    return out
