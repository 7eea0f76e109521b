"""Packed documents and grouped-query heads on the GPU executors (FlashAttention-4's varlen packs, SDPA,
the fused kernel's refusal) against the float64 oracle run document by document."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention import DilatedPattern, dilated_attention, reference_attention
from hilbert_lab.attention.executors import unavailable_reason
from hilbert_lab.attention.executors.varlen import packs_for
from hilbert_lab.attention.plan import cached_plan

from ._oracle import assert_low_precision_matches, relative_error

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (GPU executors)"),
]
KW = dict(segment_lengths=[16, 32, 1 << 40], dilation_rates=[1, 2, 4])
LENGTHS = (1, 9, 40, 77, 3, 130, 20)  # length 1, shorter than one segment, several segments, ragged


def _skip_unless(backend, dtype):
    reason = None if backend == "auto" else unavailable_reason(backend, "cuda", dtype)
    if reason is not None:
        pytest.skip(f"backend unavailable on this machine: {backend}: {reason}")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
@pytest.mark.parametrize("backend", ["fa4", "sdpa", "auto"])
def test_packed_grouped_rows_match_the_oracle_per_document_in_bf16(backend, mode, causal):
    dtype = torch.bfloat16
    _skip_unless(backend, dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    total = sum(LENGTHS)
    q = torch.randn(1, total, 8, 64, device="cuda", dtype=dtype, generator=gen).requires_grad_(True)
    k, v = (torch.randn(1, total, 2, 64, device="cuda", dtype=dtype, generator=gen).requires_grad_(True)
            for _ in range(2))
    cu = torch.tensor([0, *LENGTHS], device="cuda").cumsum(0)
    pattern = DilatedPattern.create(**KW, mode=mode, causal=causal)
    if backend == "fa4":
        documents = tuple((int(a), int(b - a)) for a, b in zip(cu[:-1], cu[1:]))
        assert packs_for(cached_plan(pattern, total, 8, num_kv_heads=2, documents=documents), q) is not None
    out, lse = dilated_attention(q, k, v, **KW, mode=mode, causal=causal, backend=backend, return_lse=True,
                                 cu_seqlens=cu)
    bounds = cu.tolist()
    parts = [reference_attention(q[:, a:b], k[:, a:b].repeat_interleave(4, 2), v[:, a:b].repeat_interleave(4, 2),
                                 pattern) for a, b in zip(bounds, bounds[1:])]
    expected_out, expected_lse = torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 2)
    assert_low_precision_matches(out, lse, expected_out, expected_lse, (q, k, v), gen)


@pytest.mark.parametrize("backend", ["sdpa", "manual"])
def test_packed_grouped_rows_in_float32(backend):
    _skip_unless(backend, torch.float32)
    gen = torch.Generator(device="cuda").manual_seed(1)
    total = sum(LENGTHS)
    q = torch.randn(1, total, 4, 32, device="cuda", generator=gen)
    k, v = (torch.randn(1, total, 2, 32, device="cuda", generator=gen) for _ in range(2))
    cu = torch.tensor([0, *LENGTHS], device="cuda").cumsum(0)
    pattern = DilatedPattern.create(**KW, causal=True)
    out = dilated_attention(q, k, v, **KW, causal=True, backend=backend, cu_seqlens=cu)
    bounds = cu.tolist()
    expected = torch.cat([reference_attention(q[:, a:b], k[:, a:b].repeat_interleave(2, 2),
                                              v[:, a:b].repeat_interleave(2, 2), pattern)[0]
                          for a, b in zip(bounds, bounds[1:])], 1)
    assert relative_error(out, expected) < 1e-4


def test_the_fused_kernel_refuses_documents_and_grouped_heads():
    _skip_unless("triton", torch.bfloat16)
    q = torch.randn(1, 64, 4, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="does not take cu_seqlens"):
        dilated_attention(q, q, q, **KW, backend="triton", cu_seqlens=torch.tensor([0, 20, 64], device="cuda"))
    with pytest.raises(ValueError, match="key/value heads"):
        dilated_attention(q, q[:, :, :2], q[:, :, :2], **KW, backend="triton")


@pytest.mark.parametrize("head_dim", [4, 12, 64, 100, 128, 256])
def test_packed_auto_runs_every_head_dim_in_bf16(head_dim):
    """auto on packed documents with grouped heads at head dims FlashAttention-4's varlen packs take (multiples of 8
    up to 256) and do not: the oracle per document, outputs, LSE and gradients."""
    dtype = torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(head_dim)
    total = sum(LENGTHS)
    q = torch.randn(1, total, 4, head_dim, device="cuda", dtype=dtype, generator=gen).requires_grad_(True)
    k, v = (torch.randn(1, total, 2, head_dim, device="cuda", dtype=dtype, generator=gen).requires_grad_(True)
            for _ in range(2))
    cu = torch.tensor([0, *LENGTHS], device="cuda").cumsum(0)
    pattern = DilatedPattern.create(**KW, causal=True)
    out, lse = dilated_attention(q, k, v, **KW, causal=True, backend="auto", return_lse=True, cu_seqlens=cu)
    bounds = cu.tolist()
    parts = [reference_attention(q[:, a:b], k[:, a:b].repeat_interleave(2, 2), v[:, a:b].repeat_interleave(2, 2),
                                 pattern) for a, b in zip(bounds, bounds[1:])]
    expected_out, expected_lse = torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 2)
    assert_low_precision_matches(out, lse, expected_out, expected_lse, (q, k, v), gen)

