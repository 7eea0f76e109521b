"""The decoding step's linear layer (kernels.triton_gemv.gemv) in interpreter mode (TRITON_INTERPRET=1, CPU) against
a float64 product: one row and several, ragged N and K, with and without bias and GELU, the block shapes the
tunings use, large values; the layer norm folded in (fold_layer_norm), the rotary pairs (each row at its own
position) and the residual against float64 LayerNorm, linear, models.rotary.apply_rotary and add; its argument
checks; and models.projection sending only a few rows on a GPU to it, with a Sequential's GELU."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

HERE = Path(__file__).resolve()
HAVE_TRITON = importlib.util.find_spec("triton") is not None
CASES = [(64, 128, 4, 32), (70, 100, 8, 32), (33, 512, 1, 256), (96, 300, 16, 64), (40, 96, None, None)]


def _errors() -> None:
    """Under the interpreter: per case, dtype, scale and bias, gemv's largest error over the float64 product's
    largest value, one JSON line each; then a weight view with row stride 80 and a strided bias."""
    from hilbert_lab.kernels.triton_gemv import gemv

    gen = torch.Generator().manual_seed(0)
    for n, k, block_n, block_k in CASES:
        for dtype in (torch.float32, torch.float16):
            for scale in (1.0, 1e3):
                x = (torch.randn(1, 1, k, generator=gen) * scale).to(dtype)
                w = torch.randn(n, k, generator=gen).to(dtype)
                b = torch.randn(n, generator=gen).to(dtype)
                for bias in (b, None):
                    want = x.double() @ w.double().T + (0 if bias is None else bias.double())
                    got = gemv(x, w, bias, block_n=block_n, block_k=block_k)
                    error = ((got.double() - want).abs().max() / want.abs().max()).item()
                    print(json.dumps({"case": [n, k, block_n, block_k, str(dtype), scale, bias is not None],
                                      "shape": list(got.shape), "dtype": str(got.dtype), "error": error}))
    for n, k, block_n, block_k in CASES[:3]:
        x, b = torch.randn(1, k, generator=gen), torch.randn(n, generator=gen)
        w = torch.randn(n, k, generator=gen) * k ** -0.5
        want = torch.nn.functional.gelu(x.double() @ w.double().T + b.double())
        got = gemv(x, w, b, "gelu", block_n=block_n, block_k=block_k)
        print(json.dumps({"gelu_error": ((got.double() - want).abs().max() / want.abs().max()).item()}))
    view = torch.randn(48, 80, generator=gen)[:, :64]
    x, bias = torch.randn(64, generator=gen), torch.randn(96, generator=gen)[::2]
    want = view.double() @ x.double() + bias.double()
    print(json.dumps({"view_error": ((gemv(x, view, bias).double() - want).abs().max() / want.abs().max()).item()}))


FUSED = [(96, 16, 3, 1, 32), (100, 8, 4, 2, 64), (64, 32, 2, 2, None)]  # K, head dim, heads, kv heads, block_k


def _fused_errors(gen) -> None:
    """Per (K, D, H, H_kv, block_k), dtype and offset of x's mean: the largest error of the folded norm, GELU,
    rotation of the q and k rows and the residual against float64, over the reference's largest value."""
    from hilbert_lab.kernels.triton_gemv import fold_layer_norm, gemv
    from hilbert_lab.models.rotary import apply_rotary, inverse_frequencies

    for k, head_dim, heads, kv_heads, block_k in FUSED:
        rows = (heads + 2 * kv_heads) * head_dim
        w, b = torch.randn(rows, k, generator=gen) * k ** -0.5, torch.randn(rows, generator=gen)
        gamma, beta = torch.rand(k, generator=gen) + 0.5, torch.randn(k, generator=gen)
        position = torch.tensor([1234])
        frequencies = inverse_frequencies(head_dim, 10000.0, position.device)
        for dtype in (torch.float32, torch.float16):
            for offset in (0.0, 1e3):
                x = (torch.randn(1, 1, k, generator=gen) * 3 + offset).to(dtype)
                residual = torch.randn(1, 1, rows, generator=gen).to(dtype)
                normed = torch.nn.functional.layer_norm(x.double(), (k,), gamma.double(), beta.double(), 1e-5)
                want = normed @ w.double().T + b.double()
                q, kk, v = want.split((heads * head_dim, kv_heads * head_dim, kv_heads * head_dim), -1)
                rotate = lambda t: apply_rotary(t.unflatten(-1, (-1, head_dim)), position).flatten(-2)  # noqa: E731
                rotated = torch.cat((rotate(q), rotate(kk), v), -1) + residual.double()
                weight, bias, sums = fold_layer_norm(w, b, gamma, beta, dtype)
                got = gemv(x, weight, bias, normalize=(sums, 1e-5), block_k=block_k)
                fused = gemv(x, weight, bias, normalize=(sums, 1e-5), rotation=(position, frequencies,
                                                                          (heads + kv_heads) * head_dim),
                             residual=residual, block_k=block_k)
                gelu = gemv(x, weight, bias, "gelu", normalize=(sums, 1e-5), block_k=block_k)
                scale = want.abs().max()
                print(json.dumps({"fused_case": [k, head_dim, heads, kv_heads, block_k, str(dtype), offset],
                                  "dtype": str(fused.dtype), "norm": ((got.double() - want).abs().max() / scale).item(),
                                  "rotated": ((fused.double() - rotated).abs().max() / scale).item(),
                                  "gelu": ((gelu.double() - torch.nn.functional.gelu(want)).abs().max()
                                           / scale).item()}))


# M, N, K, block_n, block_k: each row its own programs (block_n None: the default for small weights), or the rows
# in one tensor-core tile (block_n >= 16)
ROWS = [(2, 70, 100, None, None), (3, 64, 300, 16, 64), (8, 40, 96, None, None), (5, 33, 512, 16, 128),
        (8, 64, 96, 32, None), (4, 48, 200, 1, 64)]


def _rows_errors(gen) -> None:
    """Per (M, N, K, block_n, block_k), dtype and offset of x's mean: the largest error of M rows at once, plain (with bias),
    with the GELU, and with the folded norm, each row's own rotation (positions far apart) and the residual, against
    float64, over the reference's largest value."""
    from hilbert_lab.kernels.triton_gemv import fold_layer_norm, gemv
    from hilbert_lab.models.rotary import apply_rotary, inverse_frequencies

    head_dim = 8
    frequencies = inverse_frequencies(head_dim, 10000.0, torch.device("cpu"))
    for m, n, k, block_n, block_k in ROWS:
        n = n - n % (2 * head_dim)  # whole heads: the rotated rows
        w, b = torch.randn(n, k, generator=gen) * k ** -0.5, torch.randn(n, generator=gen)
        gamma, beta = torch.rand(k, generator=gen) + 0.5, torch.randn(k, generator=gen)
        positions = torch.randint(0, 100_000, (m, 1), generator=gen)
        rotated_rows = n - 2 * head_dim if n > 2 * head_dim else n
        for dtype in (torch.float32, torch.float16):
            for offset in (0.0, 1e3):
                x = (torch.randn(m, 1, k, generator=gen) * 3 + offset).to(dtype)
                residual = torch.randn(m, 1, n, generator=gen).to(dtype)
                plain = x.double() @ w.to(dtype).double().T + b.to(dtype).double()
                got = gemv(x, w.to(dtype), b.to(dtype), block_n=block_n, block_k=block_k)
                gelu = gemv(x, w.to(dtype), b.to(dtype), "gelu", block_n=block_n, block_k=block_k)
                normed = torch.nn.functional.layer_norm(x.double(), (k,), gamma.double(), beta.double(), 1e-5)
                want = normed @ w.double().T + b.double()
                head, tail = want.split((rotated_rows, n - rotated_rows), -1)
                rotated = apply_rotary(head.unflatten(-1, (-1, head_dim)), positions).flatten(-2)
                fused_want = torch.cat((rotated, tail), -1) + residual.double()
                weight, bias, sums = fold_layer_norm(w, b, gamma, beta, dtype)
                fused = gemv(x, weight, bias, normalize=(sums, 1e-5), rotation=(positions, frequencies, rotated_rows),
                             residual=residual, block_n=block_n, block_k=block_k)
                print(json.dumps({"rows_case": [m, n, k, block_n, block_k, str(dtype), offset],
                                  "shapes": [list(got.shape), list(fused.shape)], "dtype": str(fused.dtype),
                                  "plain": ((got.double() - plain).abs().max() / plain.abs().max()).item(),
                                  "gelu": ((gelu.double() - torch.nn.functional.gelu(plain)).abs().max()
                                           / plain.abs().max()).item(),
                                  "fused": ((fused.double() - fused_want).abs().max()
                                            / fused_want.abs().max()).item()}))


NO_TRITON = "triton not installed (pip install triton); its CPU interpreter runs these checks"


@pytest.mark.skipif(not HAVE_TRITON, reason=NO_TRITON)
def test_gemv_matches_the_float64_product(run_interpreted):
    """Ragged N and K, the tunings' block shapes and the default, float32 and float16, with and without bias, large
    values: within float32 sums (float16 outputs: one rounding)."""
    results = run_interpreted(HERE, "plain")
    cases = [r for r in results if "case" in r]
    assert len(cases) == len(CASES) * 2 * 2 * 2
    for result in cases:
        n, dtype = result["case"][0], result["case"][4]
        assert result["shape"] == [1, 1, n] and result["dtype"] == dtype, result
        assert result["error"] <= (1e-5 if dtype == "torch.float32" else 2e-3), result
    assert next(r["view_error"] for r in results if "view_error" in r) <= 1e-5
    gelu = [r["gelu_error"] for r in results if "gelu_error" in r]
    assert len(gelu) == 3 and max(gelu) <= 1e-5, gelu


@pytest.mark.slow  # the interpreter in a fresh process (about 25 s): make test-all; make test keeps the plain product
@pytest.mark.skipif(not HAVE_TRITON, reason=NO_TRITON)
def test_the_fused_gemv_matches_the_float64_modules(run_interpreted):
    """The folded layer norm, GELU, rotary pairs and residual against float64 LayerNorm, linear, rotary and add."""
    fused = [r for r in run_interpreted(HERE, "fused") if "fused_case" in r]
    assert len(fused) == len(FUSED) * 2 * 2
    for result in fused:  # float16: x itself, the folded weight and the output each rounded once
        bound = 1e-5 if result["fused_case"][5] == "torch.float32" else 4e-3
        assert result["dtype"] == result["fused_case"][5], result
        assert max(result["norm"], result["rotated"], result["gelu"]) <= bound, result


@pytest.mark.slow  # the interpreter in a fresh process (about a minute): make test-all; make test keeps the plain product
@pytest.mark.skipif(not HAVE_TRITON, reason=NO_TRITON)
def test_several_rows_each_match_the_row_alone(run_interpreted):
    """Several rows of x in one launch, both launch shapes: each row as the float64 product of that row alone."""
    rows = [r for r in run_interpreted(HERE, "rows") if "rows_case" in r]
    assert len(rows) == len(ROWS) * 2 * 2
    for result in rows:  # several rows at once: each row as one row alone
        m, n, dtype = result["rows_case"][0], result["rows_case"][1], result["rows_case"][5]
        n -= n % 16
        bound = 1e-5 if dtype == "torch.float32" else 4e-3
        assert result["shapes"] == [[m, 1, n]] * 2 and result["dtype"] == dtype, result
        assert max(result["plain"], result["gelu"], result["fused"]) <= bound, result


def test_a_folded_layer_norm_gives_the_norm_then_the_linear_layer():
    """fold_layer_norm: F.linear(layer_norm(x) with gamma, beta) == F.linear(layer_norm(x) without them, weight',
    bias') in float64, and the row sums are the folded weight's; None affine parts fold to nothing."""
    from hilbert_lab.kernels.triton_gemv import fold_layer_norm

    gen = torch.Generator().manual_seed(1)
    x, w, b = (torch.randn(3, 24, generator=gen, dtype=torch.float64), torch.randn(10, 24, generator=gen,
               dtype=torch.float64), torch.randn(10, generator=gen, dtype=torch.float64))
    gamma, beta = torch.randn(24, generator=gen, dtype=torch.float64), torch.randn(24, generator=gen, dtype=torch.float64)
    want = torch.nn.functional.linear(torch.nn.functional.layer_norm(x, (24,), gamma, beta), w, b)
    weight, bias, sums = fold_layer_norm(w, b, gamma, beta)
    got = torch.nn.functional.linear(torch.nn.functional.layer_norm(x, (24,)), weight, bias)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(sums, weight.sum(1).float())
    plain = fold_layer_norm(w, None, None, None, torch.float32)
    assert torch.equal(plain[0], w.float()) and torch.equal(plain[1], torch.zeros(10)) and plain[0].dtype == torch.float32


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
@pytest.mark.parametrize("keywords, match", [
    (dict(normalize=(torch.zeros(3), 1e-5)), "row sums must be a float32 tensor of shape"),
    (dict(normalize=(torch.zeros(4, dtype=torch.float16), 1e-5)), "row sums must be a float32 tensor of shape"),
    (dict(rotation=(torch.zeros(1), torch.zeros(1), 4)), "rotation must be"),  # float positions
    (dict(rotation=(torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), 4)), "rotation must be"),
    (dict(rotation=(torch.zeros(1, dtype=torch.long), torch.zeros(3), 4)), "rotation must be"),  # D 6, N 4
    (dict(rotation=(torch.zeros(1, dtype=torch.long), torch.zeros(1), 3)), "rotation must be"),
    (dict(rotation=(torch.zeros(1, dtype=torch.long), torch.zeros(1), 6)), "rotation must be"),
    (dict(rotation=(torch.zeros(2, dtype=torch.long), torch.zeros(1), 4)), "rotation must be"),  # 2 positions, 1 row
    (dict(rotation=(torch.zeros(1, dtype=torch.long), torch.zeros(1, 1), 4)), "rotation must be"),  # 2-d frequencies
    (dict(residual=torch.zeros(1, 5)), "residual must have the output's shape"),
])
def test_gemv_rejects_bad_fused_parts(keywords, match):
    from hilbert_lab.kernels.triton_gemv import gemv

    with pytest.raises(ValueError, match=match):
        gemv(torch.zeros(1, 8), torch.zeros(4, 8), **keywords)


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
def test_gemv_rejects_an_unknown_activation():
    from hilbert_lab.kernels.triton_gemv import gemv

    with pytest.raises(ValueError, match="activation must be one of"):
        gemv(torch.zeros(1, 8), torch.zeros(4, 8), None, "relu")


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
@pytest.mark.parametrize("x_shape, w_shape, bias_shape, match", [
    ((9, 8), (4, 8), None, "x must hold 1 to 8 rows"),
    ((1, 6), (4, 8), None, "x must hold 1 to 8 rows"),
    ((0, 8), (4, 8), None, "x must hold 1 to 8 rows"),
    ((1, 8), (4, 8), (5,), "bias must have shape"),
])
def test_gemv_rejects_bad_shapes(x_shape, w_shape, bias_shape, match):
    from hilbert_lab.kernels.triton_gemv import gemv

    bias = None if bias_shape is None else torch.zeros(bias_shape)
    with pytest.raises(ValueError, match=match):
        gemv(torch.zeros(x_shape), torch.zeros(w_shape), bias)


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
def test_gemv_of_several_rows_refuses_blocks_smaller_than_a_tensor_core_tile():
    from hilbert_lab.kernels.triton_gemv import gemv

    with pytest.raises(ValueError, match="block_k must be at least 16 where block_n >= 16 takes 2 rows"):
        gemv(torch.zeros(2, 64), torch.zeros(32, 64), block_n=16, block_k=8)


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
def test_gemv_rejects_tensors_on_different_devices():
    from hilbert_lab.kernels.triton_gemv import gemv

    with pytest.raises(ValueError, match="one device"):
        gemv(torch.zeros(1, 8), torch.zeros(4, 8), torch.zeros(4, device="meta"))


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
def test_gemv_rejects_a_weight_without_contiguous_rows():
    from hilbert_lab.kernels.triton_gemv import gemv

    with pytest.raises(ValueError, match="contiguous rows"):
        gemv(torch.zeros(1, 4), torch.zeros(4, 8).T)


def test_projection_runs_the_layer_itself_off_the_gpu_and_for_wrapped_layers(monkeypatch):
    from hilbert_lab.kernels import gemv_linear
    from hilbert_lab.models import projection

    called = []
    monkeypatch.setattr(gemv_linear, "gemv", lambda *a, **kw: called.append(a) or torch.zeros(()))
    layer = nn.Linear(8, 4)
    x = torch.randn(1, 1, 8)
    torch.testing.assert_close(projection.project(x, layer), layer(x))  # CPU: nn.Linear's own product
    stack = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    torch.testing.assert_close(projection.project(x, stack), stack(x))
    assert not called
    monkeypatch.setattr(gemv_linear, "few_rows_gemv", lambda x, w, b=None: True)  # as on a GPU
    hooked = nn.Linear(8, 4)
    hooked.register_forward_hook(lambda module, args, out: out * 2)
    torch.testing.assert_close(projection.project(x, hooked), 2 * nn.functional.linear(x, hooked.weight, hooked.bias))
    projection.project(x, layer)
    assert len(called) == 1 and called[0][1] is layer.weight


def test_projection_gives_a_sequentials_exact_gelu_to_the_linear_before_it(monkeypatch):
    """On a GPU (one row) Linear -> GELU runs as one GEMV with the GELU on its sums; a tanh GELU, or a GELU with a
    hook, stays a module of its own; off the GPU the activation is F.gelu after F.linear."""
    from hilbert_lab.kernels import gemv_linear
    from hilbert_lab.models import projection

    calls = []
    def gemv(x, w, b, activation, residual=None):
        calls.append((w, activation))
        y = torch.nn.functional.linear(x, w, b)
        return torch.nn.functional.gelu(y) if activation else y

    monkeypatch.setattr(gemv_linear, "gemv", gemv)
    x = torch.randn(1, 1, 8)
    stack = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    torch.testing.assert_close(gemv_linear.linear(x, stack[0].weight, stack[0].bias, "gelu"), stack[1](stack[0](x)))
    assert not calls
    with pytest.raises(ValueError, match="activation must be one of"):
        gemv_linear.linear(x, stack[0].weight, None, "relu")
    monkeypatch.setattr(gemv_linear, "few_rows_gemv", lambda x, w, b=None: True)
    torch.testing.assert_close(projection.project(x, stack), stack(x))
    assert calls == [(stack[0].weight, "gelu"), (stack[2].weight, None)]
    calls.clear()
    tanh = nn.Sequential(nn.Linear(8, 16), nn.GELU(approximate="tanh"), nn.Linear(16, 4))
    torch.testing.assert_close(projection.project(x, tanh), tanh(x))
    assert calls == [(tanh[0].weight, None), (tanh[2].weight, None)]
    calls.clear()
    stack[1].register_forward_hook(lambda module, args, out: out * 3)
    torch.testing.assert_close(projection.project(x, stack), stack(x))
    assert calls == [(stack[0].weight, None), (stack[2].weight, None)]


def test_one_row_asks_for_one_row_on_a_gpu_without_gradient(monkeypatch):
    from hilbert_lab.kernels import gemv_linear

    monkeypatch.setattr(gemv_linear, "runs_on", lambda device: True)
    weight = torch.zeros(4, 8)
    assert not gemv_linear.few_rows_gemv(torch.zeros(1, 8), weight)  # a CPU tensor
    assert not gemv_linear.few_rows_gemv(torch.zeros(1, 1, 8).to("meta"), weight)  # a meta tensor is no GPU's


def test_only_plain_tensors_go_to_the_kernel():
    """The kernel reads a tensor's storage: a subclass (DTensor, a quantized weight) keeps F.linear."""
    from hilbert_lab.kernels.gemv_linear import plain_tensor

    class Wrapped(torch.Tensor):
        pass

    weight = torch.zeros(4, 8)
    assert plain_tensor(weight) and plain_tensor(nn.Parameter(weight))
    assert not plain_tensor(weight.as_subclass(Wrapped)) and not plain_tensor(nn.Parameter(weight.as_subclass(Wrapped)))


if __name__ == "__main__":  # one part per process, so that the parts run side by side
    {"plain": _errors, "fused": lambda: _fused_errors(torch.Generator().manual_seed(1)),
     "rows": lambda: _rows_errors(torch.Generator().manual_seed(2))}[sys.argv[1]]()
