"""A block's decoding step on prepared projections (models.decoding_layer): the fused path (norms folded into the
GEMVs, rotary pairs and residual adds inside them), for one row and for a batch of left-padded rows at their own
positions, under Triton's interpreter against the modules in float64; the prepared layers refused for blocks they
would not reproduce; the fallbacks off the GPU; on the GPU, bf16 steps through the fused GEMVs (one row and a
batch) against the float64 modules."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from hilbert_lab.models import LongNetLM
from hilbert_lab.models.decoding_layer import decoding_projections
from hilbert_lab.models.generate import new_static_caches

HERE = Path(__file__).resolve()
HAVE_TRITON = importlib.util.find_spec("triton") is not None
VOCAB = 40


def _model(kv_heads=None, rotary=True, dtype=torch.float64, dim=32, heads=4, depth=2, device="cpu"):
    torch.manual_seed(0)
    model = LongNetLM(VOCAB, dim, depth, heads, [8, 16, 32], [1, 2, 4], max_seq_len=96, backend="sdpa",
                      num_kv_heads=kv_heads, rotary=rotary)
    for block in model.encoder.blocks:
        for norm in (block.attention_norm, block.mlp_norm):
            nn.init.normal_(norm.weight, 1.0, 0.3)
            nn.init.normal_(norm.bias, 0.0, 0.3)
    return model.to(device=device, dtype=dtype).eval()


def _decode(model, tokens, prepared: bool, steps: int = 10, prompt_lengths=None) -> torch.Tensor:
    """Logits of the prompt (all but the last `steps` tokens; its rows left-padded to prompt_lengths) and of
    `steps` one-token steps on static caches."""
    caches = new_static_caches(model, tokens.shape[0], tokens.shape[1] + 4, prompt_lengths)
    if not prepared:
        for cache in caches:
            cache.projections = None
    cut = tokens.shape[1] - steps
    with torch.no_grad():
        parts = [model(tokens[:, :cut], caches=caches)]
        parts += [model(tokens[:, p:p + 1], caches=caches) for p in range(cut, tokens.shape[1])]
    return torch.cat(parts, 1)


def _interpreted() -> None:
    """Under the interpreter, steps of up to 8 rows treated as on a GPU: per case (one row, or 3 left-padded rows),
    the largest error of the float32 steps through the fused GEMVs against the float64 modules, over the largest
    logit, and the GEMV calls counted."""
    from hilbert_lab.kernels import gemv_linear
    from hilbert_lab.models import decoding_layer, projection

    def few_rows(x, weight, bias=None):
        return x.numel() <= 8 * x.shape[-1] and x.dtype == weight.dtype and x.dtype in gemv_linear.GEMV_DTYPES \
            and not torch.is_grad_enabled()

    calls = []
    gemv = projection.gemv
    projection.gemv = gemv_linear.gemv = \
        lambda *a, **kw: calls.append(sorted(k for k, v in kw.items() if v is not None)) or gemv(*a, **kw)
    gemv_linear.few_rows_gemv = projection.few_rows_gemv = decoding_layer.few_rows_gemv = few_rows
    for kv_heads, rotary, lengths in ((None, True, None), (2, True, None), (1, False, None), (2, True, [21, 9, 15])):
        reference = _model(kv_heads, rotary)
        model = _model(kv_heads, rotary, torch.float32)
        rows = 1 if lengths is None else len(lengths)
        tokens = torch.randint(0, VOCAB, (rows, 24), generator=torch.Generator().manual_seed(1))
        prompt = None if lengths is None else [n - 3 for n in lengths]
        want = _decode(reference, tokens, prepared=False, steps=3, prompt_lengths=prompt)
        calls.clear()
        got = _decode(model, tokens, prepared=True, steps=3, prompt_lengths=prompt)
        if lengths is not None:  # the padding's logits are no row's
            keep = torch.arange(24)[None, :] >= 24 - torch.tensor(lengths)[:, None]
            got, want = got[keep], want[keep]
        print(json.dumps({"case": [kv_heads, rotary, lengths], "error": ((got.double() - want).abs().max()
                                                                         / want.abs().max()).item(), "calls": calls}))


@pytest.mark.slow  # the interpreter runs whole decoding steps (about a minute): make test-all
@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed (pip install triton); its CPU interpreter runs these checks")
def test_fused_steps_give_the_modules_logits(run_interpreted):
    """Each one-token step of each layer is four GEMVs (q, k, v normalised and rotated; the output projection with
    the residual; the MLP's first layer normalised, with its GELU; its second with the residual), and the float32
    logits are the float64 modules' within float32 sums: MHA, GQA, no rotary, and a batch of 3 left-padded rows
    (each rotated at its own position)."""
    results = run_interpreted(HERE)
    assert [r["case"] for r in results] == [[None, True, None], [2, True, None], [1, False, None],
                                            [2, True, [21, 9, 15]]]
    for result in results:
        assert result["error"] <= 2e-5, result
        first = ["normalize", "rotation"] if result["case"][1] else ["normalize"]
        per_step = [first, ["residual"], ["normalize"], ["residual"]]
        assert result["calls"] == (per_step * 2 + [[]]) * 3, result  # 2 layers and the head, 3 steps (prompt: F.linear)


def test_prepared_projections_refuse_blocks_they_would_not_reproduce():
    """A norm with a hook or of another kind, a tanh GELU, an MLP of other layers, or a projection with a hook: None
    (the modules run)."""
    assert decoding_projections(_model().encoder.blocks[0]) is not None
    for change in (lambda b: b.attention_norm.register_forward_hook(lambda m, a, o: o * 2),
                   lambda b: setattr(b, "mlp_norm", nn.RMSNorm(32)),
                   lambda b: setattr(b.mlp[1], "approximate", "tanh"),
                   lambda b: b.mlp.append(nn.Identity()),
                   lambda b: b.attention.out_proj.register_forward_pre_hook(lambda m, a: None),
                   lambda b: b.attention.k_proj.register_forward_hook(lambda m, a, o: o * 2)):
        block = _model().encoder.blocks[0]
        change(block)
        assert decoding_projections(block) is None


def test_a_training_block_with_dropout_keeps_its_modules(monkeypatch):
    """A static cache's prepared layers skip dropout: a block in training mode with dropout runs its own forward."""
    from hilbert_lab.models import blocks

    model = _model()
    model.encoder.blocks[0].dropout.p = 0.5
    called = []
    monkeypatch.setattr(blocks, "decoding_layer", lambda *a: called.append(a) or a[1])
    caches = new_static_caches(model, 1, 20)
    model.train()
    with torch.no_grad():
        model(torch.zeros(1, 4, dtype=torch.int64), caches=caches)
    assert len(called) == 1  # the second block only (dropout 0)


def test_linear_adds_the_residual_and_normed_linear_normalises_off_the_gpu():
    from hilbert_lab.kernels.gemv_linear import linear
    from hilbert_lab.models.projection import fold_norm, normed_linear

    gen = torch.Generator().manual_seed(0)
    x, residual = torch.randn(2, 3, 8, generator=gen, dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64)
    layer, norm = nn.Linear(8, 4).double(), nn.LayerNorm(8).double()
    nn.init.normal_(norm.weight, generator=gen)
    nn.init.normal_(norm.bias, generator=gen)
    torch.testing.assert_close(linear(x, layer.weight, layer.bias, residual=residual), residual + layer(x))
    folded = fold_norm(norm, layer.weight, layer.bias)
    torch.testing.assert_close(normed_linear(x, folded, "gelu"), nn.functional.gelu(layer(norm(x))))
    with pytest.raises(ValueError, match="rotation runs inside the GEMV only"):
        normed_linear(x, folded, rotation=(torch.ones(2, dtype=torch.long), torch.zeros(2), 4))
    with pytest.raises(ValueError, match="norm must be a plain nn.LayerNorm"):
        fold_norm(nn.RMSNorm(8), layer.weight, layer.bias)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the fused GEMVs)")
@pytest.mark.parametrize("kv_heads, lengths", [(None, None), (4, None), (4, [40, 23, 31, 12, 40, 17, 29, 35])])
def test_gpu_fused_bf16_steps_match_the_float64_modules(kv_heads, lengths, monkeypatch):
    """bf16 on the GPU at head dim 128, one row and a batch of 8 left-padded rows: the steps run the fused GEMVs
    (counted) and their logits are the float64 modules' within bf16 rounding; the float64 steps through the
    prepared layers equal the modules'."""
    from hilbert_lab.models import projection

    calls = []
    gemv = projection.gemv
    monkeypatch.setattr(projection, "gemv", lambda *a, **kw: calls.append(kw.get("normalize")) or gemv(*a, **kw))
    reference = _model(kv_heads, dim=1024, heads=8, device="cuda")
    model = _model(kv_heads, dtype=torch.bfloat16, dim=1024, heads=8, device="cuda")
    rows = 1 if lengths is None else len(lengths)
    tokens = torch.randint(0, VOCAB, (rows, 40), generator=torch.Generator().manual_seed(2)).cuda()
    prompt = None if lengths is None else [n - 10 for n in lengths]
    want = _decode(reference, tokens, prepared=False, prompt_lengths=prompt)
    got = _decode(model, tokens, prepared=True, prompt_lengths=prompt)
    assert sum(c is not None for c in calls) == 2 * 2 * 10
    keep = torch.ones(rows, 40, dtype=torch.bool) if lengths is None else \
        torch.arange(40)[None, :] >= 40 - torch.tensor(lengths)[:, None]  # the padding's logits are no row's
    got, want = got[keep.cuda()], want[keep.cuda()]
    assert ((got.double() - want).abs().max() / want.abs().max()).item() <= 3e-2
    torch.testing.assert_close(_decode(reference, tokens, prepared=True, prompt_lengths=prompt)[keep.cuda()], want,
                               rtol=0, atol=1e-10)


if __name__ == "__main__":
    _interpreted()
