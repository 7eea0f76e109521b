"""A model's linear layers on the decoding GEMV (kernels.gemv_linear): use_gemv_linears turns exactly the plain
nn.Linear modules into GemvLinear (parameters, state dict and hooks kept), whose few-row calls run the GEMV and
equal a float64 model's outputs (Triton's interpreter, CPU), and whose other calls are nn.Linear's own."""
from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from hilbert_lab.kernels.gemv_linear import GemvLinear, use_gemv_linears

HERE = Path(__file__).resolve()
HAVE_TRITON = importlib.util.find_spec("triton") is not None


class Scaled(nn.Linear):
    """A subclass with its own forward (as a quantized or LoRA layer): kept as it is."""

    def forward(self, x):
        return 2 * super().forward(x)


def _model(dtype=torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(48, 96), nn.SiLU(), Scaled(96, 64), nn.Sequential(nn.Linear(64, 40, bias=False))
                         ).to(dtype)


def _interpreted() -> None:
    """Under the interpreter, with few_rows_gemv's GPU checks left out: per count of rows, the float32 model on
    GemvLinear against the float64 model, its largest error over the largest output and the GEMV calls counted."""
    from hilbert_lab.kernels import gemv_linear

    gemv = gemv_linear.gemv
    calls = []
    gemv_linear.gemv = lambda *a, **kw: calls.append(a[1].shape) or gemv(*a, **kw)
    gemv_linear.few_rows_gemv = lambda x, w, b=None: x.numel() <= 8 * x.shape[-1] and not torch.is_grad_enabled()
    reference = _model(torch.float64)
    model = copy.deepcopy(reference).float()
    assert use_gemv_linears(model) == 2
    gen = torch.Generator().manual_seed(1)
    for rows in (1, 3, 8, 9):
        x = torch.randn(rows, 1, 48, generator=gen, dtype=torch.float64) * 4 + 1
        calls.clear()
        with torch.no_grad():
            got, want = model(x.float()), reference(x)
        print(json.dumps({"rows": rows, "error": ((got.double() - want).abs().max() / want.abs().max()).item(),
                          "calls": [list(shape) for shape in calls]}))


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed (pip install triton); its CPU interpreter runs these checks")
def test_few_rows_run_the_gemv_and_give_the_float64_outputs(run_interpreted):
    """1, 3 and 8 rows: both plain linear layers through the GEMV (the subclass's own product), the float64 model's
    outputs within float32 sums; 9 rows: nn.Linear's product."""
    results = run_interpreted(HERE)
    assert [r["rows"] for r in results] == [1, 3, 8, 9]
    for result in results:
        assert result["error"] <= 1e-5, result
        assert result["calls"] == ([] if result["rows"] > 8 else [[96, 48], [40, 64]]), result


def test_use_gemv_linears_turns_exactly_the_plain_linears_and_keeps_the_rest():
    model = _model()
    hooked = model[3][0]
    hooked.register_forward_hook(lambda module, args, out: out * 3)
    x = torch.randn(5, 48)
    want, state = model(x), {k: v.clone() for k, v in model.state_dict().items()}
    assert use_gemv_linears(model) == 2
    assert [type(m) for m in (model[0], model[2], model[3][0])] == [GemvLinear, Scaled, GemvLinear]
    assert isinstance(model[0], nn.Linear) and model[3][0] is hooked
    assert model.state_dict().keys() == state.keys()
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key
    torch.testing.assert_close(model(x), want, rtol=0, atol=0)  # CPU: nn.Linear's product, the hook applied
    assert use_gemv_linears(model) == 0  # already turned
    layer = nn.Linear(4, 2)
    assert use_gemv_linears(layer) == 1 and type(layer) is GemvLinear
    with pytest.raises(ValueError, match="model must be a torch.nn.Module"):
        use_gemv_linears(torch.zeros(2))


def test_gradients_flow_through_gemv_linears_as_through_nn_linear():
    """Training keeps nn.Linear's product (a gradient asked): the same gradients."""
    model = _model()
    turned = copy.deepcopy(model)
    use_gemv_linears(turned)
    x = torch.randn(1, 48)
    model(x).square().sum().backward()
    turned(x).square().sum().backward()
    for (name, a), b in zip(model.named_parameters(), turned.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=0, msg=name)


if __name__ == "__main__":
    _interpreted()
