"""The one-row linear layer (kernels.triton_gemv.gemv) in interpreter mode (TRITON_INTERPRET=1, CPU) against a
float64 product: ragged N and K, with and without bias and GELU, the block shapes the tunings use, large values, a
layer norm of x inside (with and without its weight and bias) and a residual added;
its argument checks; and models.projection sending only one row on a GPU to it, with a Sequential's GELU."""
from __future__ import annotations

import importlib.util
import json
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
    for n, k in ((64, 128), (70, 100), (33, 512)):  # a layer norm of x inside, a residual added
        for dtype in (torch.float32, torch.float16):
            for affine in ("weight and bias", "weight", "none"):
                x = torch.randn(1, 1, k, generator=gen) * 3 + 1
                g = torch.randn(k, generator=gen) if affine != "none" else None
                beta = torch.randn(k, generator=gen) if affine == "weight and bias" else None
                w, b = torch.randn(n, k, generator=gen) * k ** -0.5, torch.randn(n, generator=gen)
                r = torch.randn(1, 1, n, generator=gen)
                cast = [None if t is None else t.to(dtype) for t in (x, w, b, r, g, beta)]
                normed = torch.nn.functional.layer_norm(
                    cast[0].double(), (k,), *(None if t is None else t.double() for t in cast[4:]), 1e-5)
                want = cast[3].double() + torch.nn.functional.gelu(
                    normed.to(dtype).double() @ cast[1].double().T + cast[2].double())
                got = gemv(cast[0], cast[1], cast[2], "gelu", norm=(cast[4], cast[5], 1e-5), residual=cast[3])
                print(json.dumps({"norm_case": [n, k, str(dtype), affine], "dtype": str(got.dtype),
                                  "error": ((got.double() - want).abs().max() / want.abs().max()).item()}))
    for head_dim, heads, k, normed in ((8, 6, 40, True), (16, 3, 96, False)):  # RoPE on the q and k rows
        n, rows = heads * head_dim, 2 * heads * head_dim // 3
        for dtype in (torch.float32, torch.float16):
            x = torch.randn(1, 1, k, generator=gen).to(dtype)
            w = (torch.randn(n, k, generator=gen) * k ** -0.5).to(dtype)
            b = torch.randn(n, generator=gen).to(dtype)
            angles = torch.rand(head_dim // 2, generator=gen, dtype=torch.float64) * 6.3
            cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
            h = x.double()
            if normed:
                h = torch.nn.functional.layer_norm(h, (k,)).to(dtype).double()
            y = h @ w.double().T + b.double()
            first, second = y[..., :rows].unflatten(-1, (-1, head_dim)).chunk(2, dim=-1)
            c, s = cos.double(), sin.double()
            want = torch.cat((torch.cat((first * c - second * s, first * s + second * c), -1).flatten(-2),
                              y[..., rows:]), -1)
            got = gemv(x, w, b, norm=(None, None, 1e-5) if normed else None, rotation=(cos, sin, rows),
                       block_k=16 if not normed else None)
            print(json.dumps({"rotation_case": [head_dim, heads, k, normed, str(dtype)], "dtype": str(got.dtype),
                              "error": ((got.double() - want).abs().max() / want.abs().max()).item()}))
    view = torch.randn(48, 80, generator=gen)[:, :64]
    x, bias = torch.randn(64, generator=gen), torch.randn(96, generator=gen)[::2]
    want = view.double() @ x.double() + bias.double()
    print(json.dumps({"view_error": ((gemv(x, view, bias).double() - want).abs().max() / want.abs().max()).item()}))


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed (pip install triton); its CPU interpreter runs these checks")
def test_gemv_matches_the_float64_product(run_interpreted):
    """Ragged N and K, the tunings' block shapes and the default, float32 and float16, with and without bias, large
    values: within float32 sums (float16 outputs: one rounding)."""
    results = run_interpreted(HERE)
    cases = [r for r in results if "case" in r]
    assert len(cases) == len(CASES) * 2 * 2 * 2
    for result in cases:
        n, dtype = result["case"][0], result["case"][4]
        assert result["shape"] == [1, 1, n] and result["dtype"] == dtype, result
        assert result["error"] <= (1e-5 if dtype == "torch.float32" else 2e-3), result
    assert next(r["view_error"] for r in results if "view_error" in r) <= 1e-5
    gelu = [r["gelu_error"] for r in results if "gelu_error" in r]
    assert len(gelu) == 3 and max(gelu) <= 1e-5, gelu
    rotated = [r for r in results if "rotation_case" in r]
    assert len(rotated) == 4
    for result in rotated:
        assert result["dtype"] == result["rotation_case"][4], result
        assert result["error"] <= (1e-5 if result["dtype"] == "torch.float32" else 2e-3), result
    normed = [r for r in results if "norm_case" in r]
    assert len(normed) == 3 * 2 * 3
    for result in normed:
        assert result["dtype"] == result["norm_case"][2], result
        assert result["error"] <= (1e-5 if result["dtype"] == "torch.float32" else 2e-3), result


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
def test_gemv_rejects_an_unknown_activation():
    from hilbert_lab.kernels.triton_gemv import gemv

    with pytest.raises(ValueError, match="activation must be one of"):
        gemv(torch.zeros(1, 8), torch.zeros(4, 8), None, "relu")


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
@pytest.mark.parametrize("x_shape, w_shape, bias_shape, match", [
    ((2, 8), (4, 8), None, "x must hold one row"),
    ((1, 6), (4, 8), None, "x must hold one row"),
    ((1, 8), (4, 8), (5,), "bias must have shape"),
])
def test_gemv_rejects_bad_shapes(x_shape, w_shape, bias_shape, match):
    from hilbert_lab.kernels.triton_gemv import gemv

    bias = None if bias_shape is None else torch.zeros(bias_shape)
    with pytest.raises(ValueError, match=match):
        gemv(torch.zeros(x_shape), torch.zeros(w_shape), bias)


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
@pytest.mark.parametrize("k, norm, residual, match", [
    (8, (torch.zeros(7), None, 1e-5), None, r"norm needs K <= 4096 and its weight and bias of shape \(8,\)"),
    (8, (None, torch.zeros(8, 1), 1e-5), None, "norm needs"),
    (8192, (None, None, 1e-5), None, "norm needs K <= 4096"),
    (8, None, torch.zeros(1, 5), r"residual must have the output's shape \(1, 4\)"),
])
def test_gemv_rejects_a_bad_norm_or_residual(k, norm, residual, match):
    from hilbert_lab.kernels.triton_gemv import gemv

    with pytest.raises(ValueError, match=match):
        gemv(torch.zeros(1, k), torch.zeros(4, k), None, norm=norm, residual=residual)


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
@pytest.mark.parametrize("rotation", [(torch.zeros(2), torch.zeros(3), 4), (torch.zeros(2), torch.zeros(2), 6),
                                      (torch.zeros(4), torch.zeros(4), 8), (torch.zeros(1), torch.zeros(1), 10)])
def test_gemv_rejects_a_bad_rotation(rotation):
    """sin's size not cos's, rows not whole heads, N (12) not whole heads of 8, rows past N."""
    from hilbert_lab.kernels.triton_gemv import gemv

    with pytest.raises(ValueError, match=r"rotation must be \(cos \(D/2,\), sin \(D/2,\), rows\)"):
        gemv(torch.zeros(1, 8), torch.zeros(12 if rotation[0].numel() == 4 else 8, 8), None, rotation=rotation)


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
    from hilbert_lab.models import projection

    called = []
    monkeypatch.setattr(projection, "gemv", lambda *a, **kw: called.append(a) or torch.zeros(()))
    layer = nn.Linear(8, 4)
    x = torch.randn(1, 1, 8)
    torch.testing.assert_close(projection.project(x, layer), layer(x))  # CPU: nn.Linear's own product
    stack = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    torch.testing.assert_close(projection.project(x, stack), stack(x))
    assert not called
    monkeypatch.setattr(projection, "_one_row", lambda x, w, b=None: True)  # as on a GPU
    hooked = nn.Linear(8, 4)
    hooked.register_forward_hook(lambda module, args, out: out * 2)
    torch.testing.assert_close(projection.project(x, hooked), 2 * nn.functional.linear(x, hooked.weight, hooked.bias))
    projection.project(x, layer)
    assert len(called) == 1 and called[0][1] is layer.weight


def test_projection_gives_a_sequentials_exact_gelu_to_the_linear_before_it(monkeypatch):
    """On a GPU (one row) Linear -> GELU runs as one GEMV with the GELU on its sums; a tanh GELU, or a GELU with a
    hook, stays a module of its own; off the GPU the activation is F.gelu after F.linear."""
    from hilbert_lab.models import projection

    calls = []
    def gemv(x, w, b, activation, norm=None, residual=None, rotation=None):
        calls.append((w, activation))
        y = torch.nn.functional.linear(x, w, b)
        return torch.nn.functional.gelu(y) if activation else y

    monkeypatch.setattr(projection, "gemv", gemv)
    x = torch.randn(1, 1, 8)
    stack = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    torch.testing.assert_close(projection.linear(x, stack[0].weight, stack[0].bias, "gelu"), stack[1](stack[0](x)))
    assert not calls
    with pytest.raises(ValueError, match="activation must be one of"):
        projection.linear(x, stack[0].weight, None, "relu")
    monkeypatch.setattr(projection, "_one_row", lambda x, w, b=None: True)
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


def _reference_gemv(calls):
    """A stand-in for the GEMV in float64 that notes (weight, the norm's parameters or None, residual or None)."""
    def gemv(x, w, b, activation, norm=None, residual=None, rotation=None):
        calls.append((w, norm, residual, rotation))
        h = x.double()
        if norm is not None:
            h = nn.functional.layer_norm(h, h.shape[-1:], *(None if t is None else t.double() for t in norm[:2]),
                                         norm[2]).to(x.dtype).double()
        y = nn.functional.linear(h, w.double(), None if b is None else b.double())
        y = nn.functional.gelu(y) if activation else y
        if rotation is not None:
            cos, sin, rows = rotation
            heads = y[..., :rows].unflatten(-1, (-1, 2 * cos.numel()))
            first, second = heads.chunk(2, dim=-1)
            c, s = cos.double().flatten(), sin.double().flatten()
            y = torch.cat((torch.cat((first * c - second * s, first * s + second * c), -1).flatten(-2),
                           y[..., rows:]), -1)
        return (y if residual is None else y + residual.double()).to(x.dtype)
    return gemv


def test_projection_gives_a_plain_layer_norm_and_the_residual_to_the_gemv(monkeypatch):
    """residual + layer(norm(x)): off the GPU the modules themselves; on a GPU (one row) a plain nn.LayerNorm goes
    into the first GEMV and the residual into the last, other norms (hooked, RMSNorm) run as modules first, and a
    residual of another dtype is added after."""
    from hilbert_lab.models import projection

    calls = []
    monkeypatch.setattr(projection, "gemv", _reference_gemv(calls))
    torch.manual_seed(0)
    x, residual = torch.randn(1, 1, 8), torch.randn(1, 1, 8)
    norm = nn.LayerNorm(8)
    nn.init.normal_(norm.weight), nn.init.normal_(norm.bias)
    stack = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    want = residual + stack(norm(x))
    torch.testing.assert_close(projection.project(x, stack, norm=norm, residual=residual), want)
    assert not calls
    monkeypatch.setattr(projection, "_one_row", lambda x, w, b=None: True)  # as on a GPU
    with torch.no_grad():  # a decoding step's
        torch.testing.assert_close(projection.project(x, stack, norm=norm, residual=residual), want)
    assert [(w is stack[0].weight, n is not None and n[0] is norm.weight, r is residual) for w, n, r, _ in calls] == \
        [(True, True, False), (False, False, True)]
    calls.clear()
    rms = nn.RMSNorm(8)
    torch.testing.assert_close(projection.project(x, stack[0], norm=rms, residual=None), stack[0](rms(x)))
    hooked = nn.LayerNorm(8)
    hooked.register_forward_hook(lambda module, args, out: out * 2)
    torch.testing.assert_close(projection.project(x, stack[0], norm=hooked), stack[0](hooked(x)))
    assert [n for _, n, _, _ in calls] == [None, None]
    calls.clear()
    wide = residual.double()
    linear = nn.Linear(8, 8)
    with torch.no_grad():
        torch.testing.assert_close(projection.project(x, linear, residual=wide), wide + linear(x).double())
    assert len(calls) == 1 and calls[0][2] is None  # a float64 residual of a float32 row: added after, in float64


def test_projection_rotates_the_q_and_k_rows_of_a_stacked_projection_as_apply_rotary_does(monkeypatch):
    """linear(..., rotation=(cos, sin, rows)): off the GPU, and on it through the GEMV, the first `rows` outputs
    equal models.rotary.apply_rotary of the q and k heads, the rest (v) unrotated; tables of several positions
    (not one row) or rows that are not whole heads are not the GEMV's."""
    from hilbert_lab.models import projection
    from hilbert_lab.models.rotary import apply_rotary, rotary_tables

    calls = []
    monkeypatch.setattr(projection, "gemv", _reference_gemv(calls))
    torch.manual_seed(1)
    heads, head_dim = 3, 8
    stacked = nn.Linear(16, 3 * heads * head_dim)
    x, positions = torch.randn(1, 1, 16), torch.tensor([12345])
    cos, sin = rotary_tables(positions, head_dim, 10000.0, torch.float32)
    q, k, v = stacked(x).detach().unflatten(-1, (-1, head_dim)).split(heads, dim=-2)
    want = torch.cat([apply_rotary(q, positions).flatten(-2), apply_rotary(k, positions).flatten(-2),
                      v.flatten(-2)], -1)
    rotation = (cos, sin, 2 * heads * head_dim)
    with torch.no_grad():
        torch.testing.assert_close(projection.linear(x, stacked.weight, stacked.bias, rotation=rotation), want)
        assert not calls
        monkeypatch.setattr(projection, "_one_row", lambda x, w, b=None: True)  # as on a GPU
        torch.testing.assert_close(projection.linear(x, stacked.weight, stacked.bias, rotation=rotation), want)
        assert len(calls) == 1 and calls[0][3] is rotation
    wider = rotary_tables(torch.tensor([3, 4]), head_dim, 10000.0, torch.float32)  # two positions' tables
    n = 3 * heads * head_dim
    assert projection._turnable(rotation, x, n) and not projection._turnable((*wider, 16), x, n)
    assert not projection._turnable((cos, sin, 12), x, n) and not projection._turnable((cos, sin, 16), x, n + 4)


def test_one_row_asks_for_one_row_on_a_gpu_without_gradient(monkeypatch):
    from hilbert_lab.models import projection

    monkeypatch.setattr(projection, "runs_on", lambda device: True)
    weight = torch.zeros(4, 8)
    assert not projection._one_row(torch.zeros(1, 8), weight)  # a CPU tensor
    assert not projection._one_row(torch.zeros(1, 1, 8).to("meta"), weight)  # a meta tensor is no GPU's


def test_only_plain_tensors_go_to_the_kernel():
    """The kernel reads a tensor's storage: a subclass (DTensor, a quantized weight) keeps F.linear."""
    from hilbert_lab.models.projection import plain_tensor

    class Wrapped(torch.Tensor):
        pass

    weight = torch.zeros(4, 8)
    assert plain_tensor(weight) and plain_tensor(nn.Parameter(weight))
    assert not plain_tensor(weight.as_subclass(Wrapped)) and not plain_tensor(nn.Parameter(weight.as_subclass(Wrapped)))


if __name__ == "__main__":
    _errors()
