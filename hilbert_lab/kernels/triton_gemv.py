"""One token's linear layer, y = x W^T + b for x of one row, as one Triton launch that streams the weight once.

`gemv(x, weight, bias=None, activation=None)`: x (..., K) holding one row in all, weight (N, K) with contiguous
rows, bias (N,) or None -> (..., N) in x's dtype, the sums in float32, then `activation` ("gelu": the exact, erf
GELU) on the float32 sums before the one rounding; all on one device. Each program reduces `block_n` rows of the
weight over K in chunks of `block_k` columns, so a launch holds ceil(N / block_n) programs that all stream their
rows at once.
A decoding step at batch 1 spends most of its time in such products (projections, MLP, head); cuBLAS's GEMM
with M = 1 reads small weights well below the bandwidth. Plain tensors in, nothing from hilbert_lab imported.
"""
from __future__ import annotations

import torch

from hilbert_lab.kernels.triton_support import HAVE_TRITON, require_triton, tl, triton  # None where Triton is missing

if HAVE_TRITON:

    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, stride_w, K: tl.constexpr,
                     HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr,
                     GELU: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_w + cols[None, :]
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        for start in range(0, K, BLOCK_K):
            if EVEN:
                w = tl.load(w_ptrs + start)
                x = tl.load(x_ptr + start + cols)
            else:
                inside = (start + cols) < K
                w = tl.load(w_ptrs + start, mask=(rows < N)[:, None] & inside[None, :], other=0.0)
                x = tl.load(x_ptr + start + cols, mask=inside, other=0.0)
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        y = tl.sum(acc, axis=1)
        if HAS_BIAS:
            y += tl.load(b_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
        if GELU:
            y = 0.5 * y * (1.0 + tl.erf(y * 0.7071067811865476))
        tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=rows < N)


def tuning(n: int, k: int) -> tuple[int, int, int]:
    """(block_n, block_k, num_warps) of `gemv` for a weight (n, k): one row per program, 512 columns at a time (the
    fastest single tuning over a 1B-class step's five weights on an H200, within 7% of each weight's fastest)."""
    return 1, min(512, triton.next_power_of_2(k)), 4


ACTIVATIONS = (None, "gelu")


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None, *,
         block_n: int | None = None, block_k: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """x (..., K) of one row, weight (N, K) (rows contiguous), bias (N,) or None -> activation(x W^T + b) (..., N);
    activation None or "gelu" (exact, erf)."""
    require_triton("gemv")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    n, k = weight.shape
    if x.shape[-1] != k or x.numel() != k:
        raise ValueError(f"x must hold one row of {k} values (weight {tuple(weight.shape)}), got {tuple(x.shape)}")
    if weight.stride(1) != 1:
        raise ValueError("weight must have contiguous rows (stride 1 along K)")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
    devices = {t.device for t in (x, weight, bias) if t is not None}
    if len(devices) > 1:
        raise ValueError(f"x, weight and bias must be on one device, got {sorted(map(str, devices))}")
    default = tuning(n, k)
    block_n, block_k = block_n or default[0], block_k or default[1]
    flat = x.reshape(k).contiguous()
    bias = None if bias is None else bias.contiguous()
    out = torch.empty(x.shape[:-1] + (n,), device=x.device, dtype=x.dtype)
    even = n % block_n == 0 and k % block_k == 0
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        flat, weight, bias if bias is not None else weight, out, n, weight.stride(0), K=k,
        HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k, EVEN=even, GELU=activation == "gelu",
        num_warps=num_warps or default[2])
    return out
