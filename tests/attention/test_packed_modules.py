"""The modules with grouped-query heads and packed documents: projections to H_kv heads, a packed row
equal to its documents run one by one, serialized attention with per-document serializations."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention import (
    DilatedAttention, DilatedPattern, MultiheadDilatedAttention, SerializedDilatedAttention, reference_attention,
    serialized_attention,
)
from hilbert_lab.curves import serialize

from ._oracle import max_diff, random_qkv

KW = dict(segment_lengths=[4, 8], dilation_rates=[1, 2])
LENGTHS = (5, 1, 11)
CU = torch.tensor([0, 5, 6, 17])


def test_multihead_grouped_query_projections_and_packed_rows_equal_each_document_alone():
    """k_proj / v_proj map to num_kv_heads * head_dim features; a packed row's output equals each
    document's output alone, gradients included."""
    torch.manual_seed(0)
    mha = MultiheadDilatedAttention(16, 4, num_kv_heads=2, causal=True, dtype=torch.float64, **KW)
    assert mha.k_proj.out_features == mha.v_proj.out_features == 8 and mha.q_proj.out_features == 16
    x = torch.randn(1, sum(LENGTHS), 16, dtype=torch.float64, requires_grad=True)
    packed = mha(x, cu_seqlens=CU)
    alone = torch.cat([mha(x[:, a:b]) for a, b in zip(CU[:-1].tolist(), CU[1:].tolist())], 1)
    assert max_diff(packed, alone) < 1e-12
    g = torch.randn_like(packed)
    assert max_diff(torch.autograd.grad(packed, x, g)[0], torch.autograd.grad(alone, x, g)[0]) < 1e-12


@pytest.mark.parametrize("kwargs, needle", [
    (dict(num_kv_heads=3), "num_kv_heads \\(3\\) must divide num_heads \\(4\\)"),
    (dict(num_kv_heads=0), "num_kv_heads must be None or a positive integer"),
    (dict(num_kv_heads=True), "num_kv_heads must be None or a positive integer"),
])
def test_multihead_bad_num_kv_heads_is_named(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        MultiheadDilatedAttention(16, 4, **KW, **kwargs)


def test_dilated_attention_module_checks_its_key_value_heads():
    module = DilatedAttention(**KW, num_kv_heads=2)
    q, k, v = random_qkv(1, 8, 4, 4, requires_grad=False)
    # query heads 0, 1 read key/value head 0 and heads 2, 3 head 1
    expected, _ = reference_attention(q, k[:, :, :2].repeat_interleave(2, 2), v[:, :, :2].repeat_interleave(2, 2),
                                      DilatedPattern.create(**KW))
    assert max_diff(module(q, k[:, :, :2], v[:, :, :2]), expected) < 1e-12
    with pytest.raises(ValueError, match="k must have num_kv_heads=2 heads"):
        module(q, q[:, :, :1], q[:, :, :1])


def _per_document_perm(points, ordering):
    perms = [torch.as_tensor(serialize(points[a:b], ordering)[0]) + a for a, b in zip(CU[:-1].tolist(), CU[1:].tolist())]
    perm = torch.cat(perms).long()
    return perm, torch.argsort(perm)


def test_serialized_packed_point_clouds_equal_each_cloud_alone():
    """Each document's points serialized on their own: the packed row equals each cloud alone, through
    the function (grouped-query heads too) and the module."""
    gen = torch.Generator().manual_seed(1)
    points = torch.rand(sum(LENGTHS), 2, generator=gen, dtype=torch.float64)
    q = torch.randn(1, sum(LENGTHS), 4, 4, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(1, sum(LENGTHS), 2, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    pair = _per_document_perm(points, "hilbert")
    packed = serialized_attention(q, k, v, pair, **KW, cu_seqlens=CU)
    module = SerializedDilatedAttention(**KW, ordering="hilbert")
    assert max_diff(module(q, k, v, points=points, cu_seqlens=CU), packed) < 1e-12
    for a, b in zip(CU[:-1].tolist(), CU[1:].tolist()):
        alone = serialized_attention(q[:, a:b], k[:, a:b], v[:, a:b], serialize(points[a:b], "hilbert"), **KW)
        assert max_diff(packed[:, a:b], alone) < 1e-12


def test_serialized_refuses_serializations_that_cross_documents_and_grid_modules():
    q = torch.randn(1, sum(LENGTHS), 2, 4)
    perm = torch.arange(sum(LENGTHS)).flip(0)
    with pytest.raises(ValueError, match="moves tokens between the documents"):
        serialized_attention(q, q, q, (perm, torch.argsort(perm)), **KW, cu_seqlens=CU)
    grid = SerializedDilatedAttention(**KW, grid_shape=(1, 17))
    with pytest.raises(ValueError, match="cu_seqlens needs points"):
        grid(q, q, q, cu_seqlens=CU)
