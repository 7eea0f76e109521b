"""Modules (functional equivalence, aliases, checkpointing, autocast, compile), the grid helper."""
from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from hilbert_lab.attention import (
    DilatedAttention,
    MultiheadDilatedAttention,
    deserialize_grid,
    dilated_attention,
    serialize_grid,
)

from ._oracle import max_diff, random_qkv


def _mha(**kwargs):
    torch.manual_seed(0)
    return MultiheadDilatedAttention(16, 4, [4, 8], [1, 2], dtype=torch.float64, **kwargs)


def test_multihead_module_equals_projections_plus_functional():
    module = _mha(causal=True, backend="manual")
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    split = lambda t: t.unflatten(-1, (4, 4))  # noqa: E731
    attended = dilated_attention(split(module.q_proj(x)), split(module.k_proj(x)), split(module.v_proj(x)),
                                 segment_lengths=[4, 8], dilation_rates=[1, 2], causal=True, backend="manual")
    assert max_diff(module(x), module.out_proj(attended.flatten(-2))) < 1e-13


def test_dim_and_heads_aliases_and_validation():
    a = MultiheadDilatedAttention(dim=32, heads=8, segment_lengths=[4], dilation_rates=[1])
    assert (a.embed_dim, a.num_heads, a.head_dim) == (32, 8, 4)
    with pytest.raises(ValueError, match="divisible"):
        MultiheadDilatedAttention(30, 4, [4], [1])
    with pytest.raises(ValueError, match="alias"):
        MultiheadDilatedAttention(32, 4, [4], [1], dim=16)
    with pytest.raises(ValueError, match="num_heads"):
        MultiheadDilatedAttention(32, 0, [4], [1])
    with pytest.raises(ValueError, match="dilation_rates"):
        MultiheadDilatedAttention(32, 4, [4, 8], [1])
    with pytest.raises(ValueError, match="dropout"):
        DilatedAttention([4], [1], dropout=1.5)


def test_dropout_only_in_training():
    module = _mha(dropout=0.5, backend="manual")
    x = torch.randn(1, 8, 16, dtype=torch.float64)
    module.eval()
    assert torch.equal(module(x), module(x))
    module.train()
    assert (module(x) - module(x)).abs().max() > 1e-6


def test_gradient_checkpointing_gives_identical_gradients():
    module = _mha(backend="sdpa")
    x = torch.randn(2, 12, 16, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(2, 12, 16, dtype=torch.float64)
    plain = torch.autograd.grad(module(x), [x, *module.parameters()], upstream)
    ckpt = torch.autograd.grad(checkpoint(module, x, use_reentrant=False), [x, *module.parameters()], upstream)
    assert max(max_diff(a, b) for a, b in zip(plain, ckpt)) < 1e-13


def test_autocast_runs_in_bfloat16_close_to_float32():
    torch.manual_seed(0)
    module = MultiheadDilatedAttention(32, 4, [8, 16], [1, 2], backend="sdpa")
    x = torch.randn(2, 32, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = module(x)
    full = module(x)
    assert low.dtype == torch.bfloat16
    assert (low.float() - full).abs().max() < 0.05 * full.abs().max()
    low.float().pow(2).sum().backward()
    low_grad = module.q_proj.weight.grad.clone()
    module.zero_grad()
    full.pow(2).sum().backward()
    full_grad = module.q_proj.weight.grad
    assert (low_grad - full_grad).abs().max() < 0.03 * full_grad.abs().max()


def test_torch_compile_matches_eager_with_gradients():
    module = DilatedAttention([4, 8], [1, 2], backend="manual", causal=True)
    compiled = torch.compile(module, backend="aot_eager", fullgraph=False)
    q, k, v = random_qkv(1, 16, 2, 4)
    upstream = torch.randn(1, 16, 2, 4, dtype=torch.float64)
    eager = torch.autograd.grad(module(q, k, v), (q, k, v), upstream)
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v), upstream)
    assert max(max_diff(a, b) for a, b in zip(got, eager)) < 1e-13


def test_grid_round_trip_and_hilbert_segments_are_compact():
    x = torch.arange(8 * 8, dtype=torch.float64).reshape(1, 8, 8, 1, 1)
    seq = serialize_grid(x, "hilbert")
    assert seq.shape == (1, 64, 1, 1)
    assert torch.equal(deserialize_grid(seq, (8, 8), "hilbert"), x)
    cells = seq.flatten().long()
    rows, cols = cells // 8, cells % 8
    # Every Hilbert segment of 16 tokens is a 4x4 square; a row-major segment of 16 spans 2 rows x 8 cols.
    for s in range(4):
        part = slice(16 * s, 16 * s + 16)
        assert rows[part].max() - rows[part].min() == 3 and cols[part].max() - cols[part].min() == 3
    rowmajor = serialize_grid(x, "rowmajor").flatten()
    assert torch.equal(rowmajor, x.flatten())
    with pytest.raises(ValueError, match="x must be"):
        serialize_grid(x[0])


@pytest.mark.parametrize("kwargs,name", [
    ({"backend": "fastest"}, "backend"), ({"backend": None}, "backend"),
    ({"ordering": "zorder"}, "ordering"), ({"ordering": 3}, "ordering"),
    ({"hilbert_pattern": "yes"}, "hilbert_pattern"), ({"hilbert_pattern": 1}, "hilbert_pattern"),
    ({"scale": 0.0}, "scale"), ({"scale": -1.0}, "scale"), ({"scale": float("nan")}, "scale"),
    ({"scale": float("inf")}, "scale"), ({"scale": "0.5"}, "scale"), ({"scale": True}, "scale"),
])
def test_modules_check_every_option_in_init(kwargs, name):
    with pytest.raises(ValueError, match=name):
        MultiheadDilatedAttention(16, 4, [4, 8], [1, 2], **kwargs)
    with pytest.raises(ValueError, match=name):
        DilatedAttention([4, 8], [1, 2], **kwargs)


def test_multihead_scale_reaches_the_attention():
    module = _mha(backend="manual", scale=0.125)
    x = torch.randn(1, 8, 16, dtype=torch.float64)
    split = lambda t: t.unflatten(-1, (4, 4))  # noqa: E731
    attended = dilated_attention(split(module.q_proj(x)), split(module.k_proj(x)), split(module.v_proj(x)),
                                 segment_lengths=[4, 8], dilation_rates=[1, 2], backend="manual", scale=0.125)
    assert max_diff(module(x), module.out_proj(attended.flatten(-2))) < 1e-13
    for ordering in (None, "identity", "hilbert", "morton", "snake"):
        DilatedAttention([4], [1], ordering=ordering, backend="sdpa", scale=2, hilbert_pattern=True)


def test_multihead_module_refuses_mismatched_inputs_with_the_argument_named():
    module = MultiheadDilatedAttention(16, 2, [4, 8], [1, 2])
    x = torch.randn(1, 8, 16)
    with pytest.raises(ValueError, match="key must be a \\(B, N, 16\\)"):
        module(x, torch.randn(1, 8, 12))
    with pytest.raises(ValueError, match="value must be torch.float32"):
        module(x, x, x.double())
    with pytest.raises(ValueError, match="query, key and value must share"):
        module(x, torch.randn(1, 4, 16))
    with pytest.raises(ValueError, match="bias must be True or False"):
        MultiheadDilatedAttention(16, 2, [4, 8], [1, 2], bias="no")
