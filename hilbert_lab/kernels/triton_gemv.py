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

from hilbert_lab.kernels.triton_support import HAVE_TRITON, dependent_launch, require_triton, tl, triton  # None where Triton is missing

if HAVE_TRITON:

    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, N, stride_w, K: tl.constexpr,
                     HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr,
                     GELU: tl.constexpr, PDL: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_w + cols[None, :]
        # the first chunk of the weight is read while the kernel ahead may still run (nothing writes a weight)
        if EVEN:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=(rows < N)[:, None] & (cols < K)[None, :], other=0.0)
        if PDL:  # then x, which the kernel ahead writes
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        if EVEN:
            x = tl.load(x_ptr + cols)
        else:
            x = tl.load(x_ptr + cols, mask=cols < K, other=0.0)
        acc = w.to(tl.float32) * x.to(tl.float32)[None, :]
        for start in range(BLOCK_K, K, BLOCK_K):
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
         block_n: int | None = None, block_k: int | None = None, num_warps: int | None = None,
         pdl: bool | None = None) -> torch.Tensor:
    """x (..., K) of one row, weight (N, K) (rows contiguous), bias (N,) or None -> activation(x W^T + b) (..., N);
    activation None or "gelu" (exact, erf). pdl: launch as a programmatic dependent launch, the first weight chunk
    read before waiting for the kernel ahead (default: where triton_support.dependent_launch says the device takes
    it)."""
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
    pdl = dependent_launch(x.device) if pdl is None else bool(pdl)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        flat, weight, bias if bias is not None else weight, out, n, weight.stride(0), K=k,
        HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k, EVEN=even, GELU=activation == "gelu",
        PDL=pdl, num_warps=num_warps or default[2], launch_pdl=pdl)
    return out


def _gemv_fake(x, weight, bias, activation):
    return x.new_empty(x.shape[:-1] + (weight.shape[0],))


# `gemv` as the op hilbert_lab::gemv, which a compiled graph calls as one op (its launch then keeps the programmatic
# dependent launch, which torch.compile's tracing of a Triton kernel would drop); defined through
# torch.library.Library, whose dispatcher adds no Python wrapper of its own per call.
_LIBRARY = torch.library.Library("hilbert_lab", "FRAGMENT")
_LIBRARY.define("gemv(Tensor x, Tensor weight, Tensor? bias, str? activation) -> Tensor")
_LIBRARY.impl("gemv", lambda x, weight, bias, activation: gemv(x, weight, bias, activation),
              "CompositeExplicitAutograd")
torch.library.register_fake("hilbert_lab::gemv", _gemv_fake, lib=_LIBRARY)
gemv_op = torch.ops.hilbert_lab.gemv.default
