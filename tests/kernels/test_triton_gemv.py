"""The one-row linear layer (kernels.triton_gemv.gemv) in interpreter mode (TRITON_INTERPRET=1, CPU) against a
float64 product: ragged N and K, with and without bias, the block shapes the tunings use, large values; its
argument checks; and models.projection sending only one row on a GPU to it."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
HAVE_TRITON = importlib.util.find_spec("triton") is not None

SCRIPT = r'''
import torch
from hilbert_lab.kernels.triton_gemv import gemv, tuning

gen = torch.Generator().manual_seed(0)
cases = [(64, 128, 4, 32), (70, 100, 8, 32), (33, 512, 1, 256), (96, 300, 16, 64), (40, 96, None, None)]
for n, k, block_n, block_k in cases:
    for dtype in (torch.float32, torch.float16):
        for scale in (1.0, 1e3):
            x = (torch.randn(1, 1, k, generator=gen) * scale).to(dtype)
            w = torch.randn(n, k, generator=gen).to(dtype)
            b = torch.randn(n, generator=gen).to(dtype)
            for bias in (b, None):
                want = x.double() @ w.double().T + (0 if bias is None else bias.double())
                got = gemv(x, w, bias, block_n=block_n, block_k=block_k)
                assert got.shape == (1, 1, n) and got.dtype == dtype
                tol = (1e-5 if dtype == torch.float32 else 2e-3) * want.abs().max().item()
                assert (got.double() - want).abs().max().item() <= tol, (n, k, block_n, block_k, dtype, scale)
w = torch.randn(48, 64, generator=gen)
view = torch.randn(48, 80, generator=gen)[:, :64]  # rows contiguous, stride 80 between them
x = torch.randn(64, generator=gen)
assert torch.allclose(gemv(x, view).double(), view.double() @ x.double(), atol=1e-4)
strided_bias = torch.randn(96, generator=gen)[::2]
assert torch.allclose(gemv(x, view, strided_bias).double(), view.double() @ x.double() + strided_bias.double(),
                      atol=1e-4)
assert tuning(2048, 2048)[0] >= 1
print("ok")
'''


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed (pip install triton); its CPU interpreter runs these checks")
def test_gemv_matches_the_float64_product():
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=str(HERE.parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]


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
    monkeypatch.setattr(projection, "gemv", lambda *a: called.append(a) or torch.zeros(()))
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
