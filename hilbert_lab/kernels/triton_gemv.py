"""A decoding step's linear layer, y = x W^T + b for x of one row (or a few), as one Triton launch that streams the
weight once.

`gemv(x, weight, bias=None, activation=None, *, normalize=None, rotation=None, residual=None)`: x (..., K) holding
M rows in all (1 <= M <= MAX_ROWS: one token, or one per row of a batched step), weight (N, K) with contiguous
rows, bias (N,) or None -> (..., N) in x's dtype, the sums in float32 and one rounding at the end. On the float32
sums of each row, in this order:
- normalize (row_sums (N,), eps): x is layer-normalised first, x_hat = (x - mean) / sqrt(var + eps) (biased
  variance, as nn.LayerNorm), with the norm's weight and bias already folded into `weight` and `bias`
  (`fold_layer_norm`); mean and variance are summed from the same chunks of x that the product reads, shifted by
  the row's first value (no cancellation where the row's mean is large), so the weight is still read once and
  nothing else is;
- activation "gelu": the exact (erf) GELU;
- rotation (positions, frequencies, rows): rotary embedding of the first `rows` outputs, whose heads are
  D = 2 frequencies.numel() wide: output j and j + D/2 of a head become (y_j cos_j - y_{j+D/2} sin_j,
  y_j sin_j + y_{j+D/2} cos_j) (the pairs of models.rotary.apply_rotary) at angle_j = position * frequency_j,
  the angle, its cosine and sine in float64 in the kernel (models.rotary.rotary_angles' values, so no table is
  computed or read), each row of x at its own position where positions holds one per row; a program then holds
  the two rows of a pair;
- residual (..., N): added last.
All on one device. Each program reduces `block_n` rows of the weight over K in chunks of `block_k` columns, so a
launch holds ceil(N / block_n) programs that all stream their rows at once. With several rows of x, a small weight
gives each row its own programs, side by side (the weight read from memory once, then from L2), and a larger one is
read once for all rows, which sit in one tensor-core tile (`tuning`).
A decoding step spends most of its time in such products (projections, MLP, head); cuBLAS's GEMM with M = 1 reads
small weights well below the bandwidth, and a batched step's small ops around its GEMMs cost a launch each. The
launch is the op `hilbert_lab::gemv` (`gemv_op`), which torch.compile holds as one call (a compiled step launches it
as an eager call does). Plain tensors in, nothing from hilbert_lab imported.
"""
from __future__ import annotations

import torch

# triton and tl are None where Triton is missing
from hilbert_lab.kernels.triton_support import HAVE_TRITON, define_op, require_triton, tl, triton

if HAVE_TRITON:

    @triton.jit
    def _gemv_chunk(x_ptr, w, start, cols, shift, acc, sum1, sum2, K: tl.constexpr, EVEN: tl.constexpr,
                    NORM: tl.constexpr):
        """acc += w * x[start:start + BLOCK_K] (x shifted by `shift` where NORM; sum1, sum2 its sums)."""
        if EVEN:
            x = tl.load(x_ptr + start + cols).to(tl.float32)
            if NORM:
                x = x - shift
        else:
            inside = (start + cols) < K
            x = tl.load(x_ptr + start + cols, mask=inside, other=0.0).to(tl.float32)
            if NORM:
                x = tl.where(inside, x - shift, 0.0)
        if NORM:
            sum1 += x
            sum2 += x * x
        return acc + w.to(tl.float32) * x[None, :], sum1, sum2

    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, sums_ptr, pos_ptr, freq_ptr, res_ptr, N, stride_w, eps,
                     K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     EVEN: tl.constexpr, GELU: tl.constexpr, NORM: tl.constexpr, HALF: tl.constexpr,
                     ROTATED: tl.constexpr, HAS_RESIDUAL: tl.constexpr, ROWS: tl.constexpr):
        """BLOCK_N weight rows (or a rotary pair) for one row of x; with ROWS > 1 rows of x, programs pid * ROWS ..
        pid * ROWS + ROWS - 1 take the same weight rows for rows 0 .. ROWS - 1 of x (run side by side: the weight
        read from memory once, then from L2)."""
        pid = tl.program_id(0)
        if ROWS > 1:
            m = pid % ROWS
            pid = pid // ROWS
            x_ptr += m * K
            y_ptr += m * N
            res_ptr += m * N
            pos_ptr += m
        if HALF > 0:  # BLOCK_N == 2: the rows j and j + HALF of one head
            pair = pid % HALF
            rows = (pid // HALF) * (2 * HALF) + pair + tl.arange(0, BLOCK_N) * HALF
        else:
            rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        cols = tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_w + cols[None, :]
        # the first chunk, then the rest (one body, _gemv_chunk)
        if EVEN:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=(rows < N)[:, None] & (cols < K)[None, :], other=0.0)
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        sum1 = tl.zeros((BLOCK_K,), dtype=tl.float32)
        sum2 = tl.zeros((BLOCK_K,), dtype=tl.float32)
        shift = 0.0
        if NORM:
            shift = tl.load(x_ptr).to(tl.float32)
        acc, sum1, sum2 = _gemv_chunk(x_ptr, w, 0, cols, shift, acc, sum1, sum2, K, EVEN, NORM)
        for start in range(BLOCK_K, K, BLOCK_K):
            if EVEN:
                w = tl.load(w_ptrs + start)
            else:
                w = tl.load(w_ptrs + start, mask=(rows < N)[:, None] & ((start + cols) < K)[None, :], other=0.0)
            acc, sum1, sum2 = _gemv_chunk(x_ptr, w, start, cols, shift, acc, sum1, sum2, K, EVEN, NORM)
        y = tl.sum(acc, axis=1)
        if NORM:
            mean = tl.sum(sum1, axis=0) / K  # of x - shift
            var = tl.maximum(tl.sum(sum2, axis=0) / K - mean * mean, 0.0)
            row_sums = tl.load(sums_ptr + rows, mask=rows < N, other=0.0)
            y = (y - mean * row_sums) / tl.sqrt(var + eps)
        if HAS_BIAS:
            y += tl.load(b_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
        if GELU:
            y = 0.5 * y * (1.0 + tl.erf(y * 0.7071067811865476))
        if HALF > 0:
            if pid * 2 < ROTATED:
                first = tl.arange(0, BLOCK_N) == 0
                y_first = tl.sum(tl.where(first, y, 0.0), axis=0)
                y_second = tl.sum(tl.where(first, 0.0, y), axis=0)
                angle = tl.load(pos_ptr).to(tl.float64) * tl.load(freq_ptr + pair).to(tl.float64)
                c = tl.cos(angle).to(tl.float32)
                s = tl.sin(angle).to(tl.float32)
                y = tl.where(first, y_first * c - y_second * s, y_first * s + y_second * c)
        if HAS_RESIDUAL:
            y += tl.load(res_ptr + rows, mask=rows < N, other=0.0).to(tl.float32)
        tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=rows < N)

    @triton.jit
    def _rows_product(x, w, acc, LOW: tl.constexpr):
        """acc + x w^T on tensor cores: x (16, BLOCK_K) float32, w (BLOCK_N, BLOCK_K) in the weight's dtype; LOW: x
        as the sum of two values of that dtype (its float32 value to about 16 bits), else x in float32 exactly."""
        if LOW:
            high = x.to(w.dtype)
            low = (x - high.to(tl.float32)).to(w.dtype)
            acc = tl.dot(high, tl.trans(w), acc)
            acc = tl.dot(low, tl.trans(w), acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        return acc

    @triton.jit
    def _gemv_rows_kernel(x_ptr, w_ptr, b_ptr, y_ptr, sums_ptr, pos_ptr, freq_ptr, res_ptr, M, N, stride_w, eps,
                          K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GELU: tl.constexpr, NORM: tl.constexpr, HALF: tl.constexpr, ROTATED: tl.constexpr,
                          HAS_RESIDUAL: tl.constexpr, LOW: tl.constexpr):
        """`_gemv_kernel` for M (<= 16) rows of x at once, the products on tensor cores (x in the 16 rows of an MMA
        tile): each chunk of the program's weight rows is read once for every row of x; the rows' norms, rotary
        positions (M,) and residuals are their own. With HALF > 0 a program holds BLOCK_N rotary pairs
        (rows j and j + HALF of a head, `first` and `second`), else BLOCK_N consecutive rows (`first`)."""
        pid = tl.program_id(0)
        lane = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        if HALF > 0:
            first = (lane // HALF) * (2 * HALF) + lane % HALF
        else:
            first = lane
        in_n = first < N
        m = tl.arange(0, 16)
        in_m = m < M
        cols = tl.arange(0, BLOCK_K)
        acc1 = tl.zeros((16, BLOCK_N), dtype=tl.float32)
        acc2 = tl.zeros((16, BLOCK_N), dtype=tl.float32)
        sum1 = tl.zeros((16, BLOCK_K), dtype=tl.float32)
        sum2 = tl.zeros((16, BLOCK_K), dtype=tl.float32)
        shift = tl.zeros((16,), dtype=tl.float32)
        if NORM:
            shift = tl.load(x_ptr + m * K, mask=in_m, other=0.0).to(tl.float32)
        w1_ptrs = w_ptr + first[:, None].to(tl.int64) * stride_w + cols[None, :]
        for start in range(0, K, BLOCK_K):
            inside = (start + cols) < K
            x_mask = in_m[:, None] & inside[None, :]
            x = tl.load(x_ptr + m[:, None] * K + start + cols[None, :], mask=x_mask, other=0.0).to(tl.float32)
            if NORM:
                x = tl.where(x_mask, x - shift[:, None], 0.0)
                sum1 += x
                sum2 += x * x
            w_mask = in_n[:, None] & inside[None, :]
            acc1 = _rows_product(x, tl.load(w1_ptrs + start, mask=w_mask, other=0.0), acc1, LOW)
            if HALF > 0:
                acc2 = _rows_product(x, tl.load(w1_ptrs + HALF * stride_w + start, mask=w_mask, other=0.0), acc2,
                                     LOW)
        second = first + HALF
        if NORM:
            mean = tl.sum(sum1, axis=1) / K  # of x - shift, per row
            rstd = 1.0 / tl.sqrt(tl.maximum(tl.sum(sum2, axis=1) / K - mean * mean, 0.0) + eps)
            acc1 = (acc1 - mean[:, None] * tl.load(sums_ptr + first, mask=in_n, other=0.0)[None, :]) * rstd[:, None]
            if HALF > 0:
                acc2 = (acc2 - mean[:, None] * tl.load(sums_ptr + second, mask=in_n, other=0.0)[None, :]) \
                    * rstd[:, None]
        if HAS_BIAS:
            acc1 += tl.load(b_ptr + first, mask=in_n, other=0.0).to(tl.float32)[None, :]
            if HALF > 0:
                acc2 += tl.load(b_ptr + second, mask=in_n, other=0.0).to(tl.float32)[None, :]
        if GELU:
            acc1 = 0.5 * acc1 * (1.0 + tl.erf(acc1 * 0.7071067811865476))
            acc2 = 0.5 * acc2 * (1.0 + tl.erf(acc2 * 0.7071067811865476))
        out_mask = in_m[:, None] & in_n[None, :]
        if HALF > 0:
            position = tl.load(pos_ptr + m, mask=in_m, other=0).to(tl.float64)
            angle = position[:, None] * tl.load(freq_ptr + lane % HALF).to(tl.float64)[None, :]
            c = tl.where(out_mask, tl.cos(angle).to(tl.float32), 1.0)
            s = tl.where(out_mask, tl.sin(angle).to(tl.float32), 0.0)
            turn = (first < ROTATED)[None, :]
            c = tl.where(turn, c, 1.0)
            s = tl.where(turn, s, 0.0)
            acc1, acc2 = acc1 * c - acc2 * s, acc1 * s + acc2 * c
        if HAS_RESIDUAL:
            acc1 += tl.load(res_ptr + m[:, None] * N + first[None, :], mask=out_mask, other=0.0).to(tl.float32)
            if HALF > 0:
                acc2 += tl.load(res_ptr + m[:, None] * N + second[None, :], mask=out_mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + m[:, None] * N + first[None, :], acc1.to(y_ptr.dtype.element_ty), mask=out_mask)
        if HALF > 0:
            tl.store(y_ptr + m[:, None] * N + second[None, :], acc2.to(y_ptr.dtype.element_ty), mask=out_mask)


MAX_ROWS = 8  # rows of x one launch takes (a batched decoding step); more go to F.linear
SMALL_WEIGHT = 1 << 20  # values of a weight whose rows of x each get their own programs (latency, not bandwidth)


def tuning(n: int, k: int, normalize: bool = False, rows: int = 1, rotation: bool = False) -> tuple[int, int, int]:
    """(block_n, block_k, num_warps) of `gemv` for a weight (n, k) and `rows` rows of x, the fastest found for a
    1B-class step's weights on an H200 (benchmarks/bench_decode_gemv.py, each weight with the work a step fuses
    into its GEMV). One row: one weight row per program, 512 columns at a time (within 7% of each plain weight's
    fastest); with the rotary pairs (and the norm folded in: q, k, v), a pair per program, 2048 columns, 2 warps;
    with the norm folded in and no rotation (the MLP's first weight), four rows per program, 256 columns, 2 warps
    (a program's reductions of x's mean and variance shared by its rows). Several rows: a weight of at most
    SMALL_WEIGHT values as one row (each row of x its own programs, side by side; with the norm or the rotation,
    two rows or a pair per program, 1024 columns, 2 warps); a larger one on tensor cores
    (block_n 16 or more: `_gemv_rows_kernel`), 16 weight rows (or rotary pairs) per program, 256 columns at a time,
    4 warps."""
    if rows > 1:
        if n * k > SMALL_WEIGHT:
            return 16, max(16, min(256, triton.next_power_of_2(k))), 4
        if normalize or rotation:
            return 2, min(1024, triton.next_power_of_2(k)), 2
    elif rotation:
        return 2, min(2048, triton.next_power_of_2(k)), 2
    elif normalize:
        return 4, min(256, triton.next_power_of_2(k)), 2
    return 1, min(512, triton.next_power_of_2(k)), 4


ACTIVATIONS = (None, "gelu")


def fold_layer_norm(weight: torch.Tensor, bias: torch.Tensor | None, norm_weight: torch.Tensor | None,
                    norm_bias: torch.Tensor | None, dtype: torch.dtype | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A layer norm's affine (norm_weight gamma (K,), norm_bias beta (K,), None: 1 and 0) folded into the linear
    layer after it: (weight * gamma (N, K), bias + weight beta (N,), the folded weight's row sums (N,) float32), in
    `dtype` (default weight's; the sums from the weight as stored), so that linear(layer_norm(x)) is
    gemv(x, weight', bias', normalize=(row_sums, eps)). Computed in float64, detached."""
    dtype = weight.dtype if dtype is None else dtype
    wide = weight.detach().double()
    folded_bias = torch.zeros(wide.shape[0], dtype=torch.float64, device=weight.device) if bias is None \
        else bias.detach().double()
    if norm_bias is not None:
        folded_bias = folded_bias + wide @ norm_bias.detach().double()
    if norm_weight is not None:
        wide = wide * norm_weight.detach().double()
    folded = wide.to(dtype).contiguous()
    return folded, folded_bias.to(dtype), folded.double().sum(1).float()


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None, *,
         normalize: tuple[torch.Tensor, float] | None = None,
         rotation: tuple[torch.Tensor, torch.Tensor, int] | None = None, residual: torch.Tensor | None = None,
         block_n: int | None = None, block_k: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """x (..., K) of M rows in all (1 <= M <= MAX_ROWS), weight (N, K) (rows contiguous), bias (N,) or None ->
    activation(x W^T + b) (..., N); activation None or "gelu" (exact, erf); normalize (row_sums (N,) float32, eps):
    layer-normalise each row of x first (the norm's affine folded into weight and bias: fold_layer_norm); rotation
    (positions, frequencies, rows): rotary pairs over the first `rows` outputs (a multiple of D; N a multiple of
    D) at angles position * frequency in float64, frequencies (D/2,) floats (models.rotary.inverse_frequencies),
    positions integers, one for every row of x or M of them (any shape), one per row; residual (..., N): added
    last."""
    require_triton("gemv")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    n, k = weight.shape
    m = x.numel() // k if k and x.shape[-1] == k else 0
    if x.shape[-1] != k or not 1 <= m <= MAX_ROWS:
        raise ValueError(f"x must hold 1 to {MAX_ROWS} rows of {k} values (weight {tuple(weight.shape)}), got "
                         f"{tuple(x.shape)}")
    if weight.stride(1) != 1:
        raise ValueError("weight must have contiguous rows (stride 1 along K)")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias must have shape ({n},), got {tuple(bias.shape)}")
    out_shape = x.shape[:-1] + (n,)
    row_sums, eps = (None, 0.0) if normalize is None else normalize
    if row_sums is not None and (tuple(row_sums.shape) != (n,) or row_sums.dtype != torch.float32):
        raise ValueError(f"normalize's row sums must be a float32 tensor of shape ({n},), got "
                         f"{row_sums.dtype} {tuple(row_sums.shape)}")
    positions = frequencies = None
    half = rotated = 0
    if rotation is not None:
        positions, frequencies, rotated = rotation
        half = frequencies.numel() if frequencies.dim() == 1 else 0
        if positions.is_floating_point() or positions.is_complex() or positions.numel() not in (1, m) \
                or not frequencies.is_floating_point() or half < 1 or n % (2 * half) or rotated % (2 * half) \
                or not 0 <= rotated <= n:
            raise ValueError(f"rotation must be (positions, frequencies, rows): integer positions, one for every row "
                             f"of x or one per row ({m} rows), D/2 float frequencies (D,), N={n} and rows multiples "
                             f"of D and rows <= N, got positions {positions.dtype} {tuple(positions.shape)}, "
                             f"frequencies {frequencies.dtype} {tuple(frequencies.shape)}, rows {rotated}")
        positions = positions.reshape(-1).expand(m).contiguous()
        frequencies = frequencies.contiguous()
    if residual is not None and tuple(residual.shape) != tuple(out_shape):
        raise ValueError(f"residual must have the output's shape {tuple(out_shape)}, got {tuple(residual.shape)}")
    devices = {t.device for t in (x, weight, bias, row_sums, positions, frequencies, residual) if t is not None}
    if len(devices) > 1:
        raise ValueError(f"x, weight, bias, normalize, rotation and residual must be on one device, got "
                         f"{sorted(map(str, devices))}")
    default = tuning(n, k, row_sums is not None, m, rotation is not None)
    block_n, block_k = block_n or default[0], block_k or default[1]
    if half and (m == 1 or block_n < 16):  # one program per rotary pair
        block_n = 2
    if m > 1 and block_n >= 16 and block_k < 16:
        raise ValueError(f"block_k must be at least 16 where block_n >= 16 takes {m} rows in a tensor-core tile, got "
                         f"{block_k}")
    flat = x.reshape(m, k).contiguous()
    bias = None if bias is None else bias.contiguous()
    residual = None if residual is None else residual.reshape(m, n).contiguous()
    return gemv_op(flat, weight, bias, row_sums, positions, frequencies, residual, float(eps), rotated,
                   activation == "gelu",
                   block_n, block_k, num_warps or default[2]).reshape(out_shape)


def _gemv_launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, row_sums: torch.Tensor | None,
                 positions: torch.Tensor | None, frequencies: torch.Tensor | None, residual: torch.Tensor | None,
                 eps: float, rotated: int, gelu: bool, block_n: int, block_k: int, num_warps: int) -> torch.Tensor:
    """The launch of `gemv` on checked arguments: x (M, K), residual (M, N) -> (M, N); positions (M,) and
    frequencies (D/2,) given: rotary pairs."""
    n, k = weight.shape
    m = x.shape[0]
    half = 0 if frequencies is None else frequencies.shape[-1]
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    per_row = m == 1 or block_n < 16  # else the rows in one tensor-core tile
    blocks = n // 2 if half and block_n == 2 else triton.cdiv(n // 2 if half else n, block_n)
    grid = (blocks * m,) if per_row else (blocks,)
    placeholders = (weight if bias is None else bias, out, weight if row_sums is None else row_sums,
                    weight if positions is None else positions, weight if frequencies is None else frequencies,
                    weight if residual is None else residual)
    if per_row:
        _gemv_kernel[grid](
            x, weight, *placeholders, n, weight.stride(0), eps, K=k, HAS_BIAS=bias is not None, BLOCK_N=block_n,
            BLOCK_K=block_k, EVEN=n % block_n == 0 and k % block_k == 0, GELU=gelu, NORM=row_sums is not None,
            HALF=half, ROTATED=rotated, HAS_RESIDUAL=residual is not None, ROWS=m, num_warps=num_warps)
    else:
        _gemv_rows_kernel[grid](
            x, weight, *placeholders, m, n, weight.stride(0), eps, K=k, HAS_BIAS=bias is not None, BLOCK_N=block_n,
            BLOCK_K=block_k, GELU=gelu, NORM=row_sums is not None, HALF=half, ROTATED=rotated,
            HAS_RESIDUAL=residual is not None, LOW=weight.dtype != torch.float32, num_warps=num_warps)
    return out


def _gemv_fake(x, weight, bias, row_sums, positions, frequencies, residual, eps, rotated, gelu, block_n, block_k,
               num_warps):
    return x.new_empty((x.shape[0], weight.shape[0]))


# One op to torch.compile (its graph holds the launch as one call, launched as `_gemv_launch` launches it).
gemv_op = define_op("gemv(Tensor x, Tensor weight, Tensor? bias, Tensor? row_sums, Tensor? positions, "
                    "Tensor? frequencies, Tensor? residual, float eps, int rotated, bool gelu, int block_n, "
                    "int block_k, int num_warps) "
                    "-> Tensor", _gemv_launch, _gemv_fake)
