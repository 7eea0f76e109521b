"""One token's linear layer, y = x W^T + b for x of one row, as one Triton launch that streams the weight once.

`gemv(x, weight, bias=None, activation=None, norm=None, rotation=None, residual=None)`: x (..., K) holding one
row in all, weight (N, K) with contiguous rows, bias (N,) or None -> (..., N) in x's dtype, the sums in float32,
then `activation` ("gelu": the exact, erf GELU), `rotation` (RoPE on the q and k rows of a stacked q/k/v weight)
and `residual` (added) on the float32 sums before the one rounding; all on one device. `norm` layer-normalises x
first, in every program (x is one row: each program reads all of it anyway). So a pre-norm block's layer norms,
its rotary embedding and its residual adds need no launch of their own. Each program reduces `block_n` rows of the
weight over K in chunks of `block_k` columns (one chunk of the whole row with `norm`; with `rotation` the two rows
of a rotated pair), so a launch holds ceil(N / block_n) programs that all stream their rows at once.
A decoding step at batch 1 spends most of its time in such products (projections, MLP, head); cuBLAS's GEMM
with M = 1 reads small weights well below the bandwidth. Plain tensors in, nothing from hilbert_lab imported.
"""
from __future__ import annotations

import torch

from hilbert_lab.kernels.triton_support import HAVE_TRITON, require_triton, tl, triton  # None where Triton is missing

if HAVE_TRITON:

    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, g_ptr, beta_ptr, r_ptr, cos_ptr, sin_ptr, N, stride_w, eps,
                     rotated_rows, K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, EVEN: tl.constexpr, GELU: tl.constexpr, NORM: tl.constexpr,
                     NORM_WEIGHT: tl.constexpr, NORM_BIAS: tl.constexpr, RESIDUAL: tl.constexpr,
                     HALF: tl.constexpr):
        if HALF > 0:  # rotation pairs (BLOCK_N 2): rows j and j + HALF of one head of 2 HALF rows
            pair = tl.program_id(0)
            rows = (pair // HALF) * 2 * HALF + pair % HALF + tl.arange(0, 2) * HALF
        else:
            rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_w + cols[None, :]
        if NORM:  # one chunk holds the row (BLOCK_K >= K): x layer-normalised in registers, rounded to its dtype
            inside = cols < K
            x = tl.load(x_ptr + cols, mask=inside, other=0.0).to(tl.float32)
            centred = tl.where(inside, x - tl.sum(x, axis=0) / K, 0.0)
            normed = centred / tl.sqrt(tl.sum(centred * centred, axis=0) / K + eps)
            if NORM_WEIGHT:
                normed = normed * tl.load(g_ptr + cols, mask=inside, other=0.0).to(tl.float32)
            if NORM_BIAS:
                normed = normed + tl.load(beta_ptr + cols, mask=inside, other=0.0).to(tl.float32)
            normed = normed.to(x_ptr.dtype.element_ty).to(tl.float32)
            w = tl.load(w_ptrs, mask=(rows < N)[:, None] & inside[None, :], other=0.0)
            acc = w.to(tl.float32) * normed[None, :]
        else:
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
        if HALF > 0:
            if (pair // HALF) * 2 * HALF < rotated_rows:  # RoPE: (a, b) -> (a cos - b sin, a sin + b cos)
                cos = tl.load(cos_ptr + pair % HALF).to(tl.float32)
                sin = tl.load(sin_ptr + pair % HALF).to(tl.float32)
                first = tl.arange(0, 2) == 0
                a = tl.sum(tl.where(first, y, 0.0), axis=0)
                b = tl.sum(tl.where(first, 0.0, y), axis=0)
                y = tl.where(first, a * cos - b * sin, a * sin + b * cos)
        if RESIDUAL:
            y += tl.load(r_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
        tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=rows < N)


def tuning(n: int, k: int) -> tuple[int, int, int]:
    """(block_n, block_k, num_warps) of `gemv` for a weight (n, k): one row per program, 512 columns at a time (the
    fastest single tuning over a 1B-class step's five weights on an H200, within 7% of each weight's fastest)."""
    return 1, min(512, triton.next_power_of_2(k)), 4


ACTIVATIONS = (None, "gelu")


NORM_MAX_K = 4096  # the longest row `gemv` normalises (held in one program's registers)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None, *,
         norm: tuple | None = None, rotation: tuple | None = None, residual: torch.Tensor | None = None,
         block_n: int | None = None, block_k: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """x (..., K) of one row, weight (N, K) (rows contiguous), bias (N,) or None -> residual + rotation(activation(
    norm(x) W^T + b)) (..., N); activation None or "gelu" (exact, erf); norm: (weight (K,) or None, bias (K,) or
    None, eps), a layer norm of x (float32 statistics, the result rounded to x's dtype, as nn.LayerNorm gives it;
    K <= NORM_MAX_K, one block of columns); rotation: (cos (D/2,), sin (D/2,), rows), RoPE on the first `rows`
    outputs in heads of D (each head's halves rotated, as models.rotary.rotate does; rows and N multiples of D);
    residual (..., N) or None. The rotation and the residual act on the float32 sums before their one rounding."""
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
    norm_weight, norm_bias, eps = norm if norm is not None else (None, None, 0.0)
    if norm is not None and (k > NORM_MAX_K or any(t is not None and tuple(t.shape) != (k,)
                                                   for t in (norm_weight, norm_bias))):
        raise ValueError(f"norm needs K <= {NORM_MAX_K} and its weight and bias of shape ({k},) or None; got K {k}, "
                         f"{[None if t is None else tuple(t.shape) for t in (norm_weight, norm_bias)]}")
    cos, sin, rotated_rows = rotation if rotation is not None else (None, None, 0)
    half = 0 if rotation is None else cos.numel()
    if rotation is not None and (sin.numel() != half or half < 1 or n % (2 * half) or rotated_rows % (2 * half)
                                 or not 0 <= rotated_rows <= n):
        raise ValueError(f"rotation must be (cos (D/2,), sin (D/2,), rows) with N and rows multiples of D and rows "
                         f"<= N; got cos {tuple(cos.shape)}, sin {tuple(sin.shape)}, rows {rotated_rows}, N {n}")
    out_shape = x.shape[:-1] + (n,)
    if residual is not None and tuple(residual.shape) != tuple(out_shape):
        raise ValueError(f"residual must have the output's shape {tuple(out_shape)}, got {tuple(residual.shape)}")
    devices = {t.device for t in (x, weight, bias, norm_weight, norm_bias, cos, sin, residual) if t is not None}
    if len(devices) > 1:
        raise ValueError(f"x, weight, bias, norm, rotation and residual must be on one device, got "
                         f"{sorted(map(str, devices))}")
    default = tuning(n, k)
    block_n, block_k = block_n or default[0], block_k or default[1]
    if norm is not None:
        block_k = triton.next_power_of_2(k)
    if rotation is not None:
        block_n = 2
        cos, sin = cos.reshape(half).contiguous(), sin.reshape(half).contiguous()
    flat = x.reshape(k).contiguous()
    bias, norm_weight, norm_bias = (None if t is None else t.contiguous() for t in (bias, norm_weight, norm_bias))
    residual = None if residual is None else residual.reshape(n).contiguous()
    out = torch.empty(out_shape, device=x.device, dtype=x.dtype)
    even = n % block_n == 0 and k % block_k == 0
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        flat, weight, weight if bias is None else bias, out, weight if norm_weight is None else norm_weight,
        weight if norm_bias is None else norm_bias, weight if residual is None else residual,
        weight if cos is None else cos, weight if sin is None else sin, n, weight.stride(0), float(eps),
        rotated_rows, K=k, HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k, EVEN=even,
        GELU=activation == "gelu", NORM=norm is not None, NORM_WEIGHT=norm_weight is not None,
        NORM_BIAS=norm_bias is not None, RESIDUAL=residual is not None, HALF=half,
        num_warps=num_warps or default[2])
    return out
