"""Executors and the kernel-call protocol against a naive float64 softmax: dense calls, the backward with a
foreign (merged) out and LSE, bottom-right causal, grouped-query heads, fallbacks, the table."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention import dilated_attention
from hilbert_lab.attention.executors import (
    BACKENDS, EXECUTORS, BackendUnavailableError, available_backends, get_executor,
)
from hilbert_lab.attention.executors.kernel import DenseKernel, call_backward, call_forward
from hilbert_lab.attention.executors.manual import MANUAL_KERNEL, REFERENCE_KERNEL, dense_backward, dense_forward
from hilbert_lab.attention.executors.sdpa import CPU_FLASH

from ._oracle import max_diff, random_qkv

CPU_BACKENDS = ["reference", "manual", "sdpa", "sdpa_flash", "sdpa_math"]


def naive(q, k, v, causal, scale):
    """Dense softmax in float64, queries at the last Lq key positions, kv heads repeated per group."""
    groups = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(groups, 2), v.repeat_interleave(groups, 2)
    scores = torch.einsum("blhd,bmhd->bhlm", q.double(), k.double()) * scale
    lq, lk = q.shape[1], k.shape[1]
    allowed = torch.ones(lq, lk, dtype=torch.bool)
    if causal:
        allowed = torch.arange(lk)[None, :] <= torch.arange(lk - lq, lk)[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("bhlm,bmhd->blhd", torch.softmax(scores, -1), v.double()), torch.logsumexp(scores, -1)


@pytest.mark.parametrize("name", CPU_BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_cpu_executor_on_one_dense_block_matches_naive_softmax(name, causal):
    q, k, v = random_qkv(2, 7, 3, 4)
    out, lse = dilated_attention(q, k, v, segment_lengths=[7], dilation_rates=[1], causal=causal, backend=name,
                                 scale=0.37, return_lse=True)
    expected_out, expected_lse = naive(q, k, v, causal, 0.37)
    assert max_diff(out, expected_out) < 1e-12 and max_diff(lse, expected_lse) < 1e-12
    gen = torch.Generator().manual_seed(1)
    upstream = (torch.randn(out.shape, generator=gen, dtype=torch.float64),
                torch.randn(lse.shape, generator=gen, dtype=torch.float64))
    got = torch.autograd.grad((out, lse), (q, k, v), upstream)
    expected = torch.autograd.grad((expected_out, expected_lse), (q, k, v), upstream)
    assert max(max_diff(a, b) for a, b in zip(got, expected)) < 1e-11


def test_flex_forward_matches_naive_on_cpu():
    q, k, v = random_qkv(2, 9, 2, 4, requires_grad=False)
    for causal in (False, True):
        out, lse = dilated_attention(q, k, v, segment_lengths=[9], dilation_rates=[1], causal=causal, backend="flex",
                                     scale=0.5, return_lse=True)
        expected_out, expected_lse = naive(q, k, v, causal, 0.5)
        assert max_diff(out, expected_out) < 1e-12 and max_diff(lse, expected_lse) < 1e-12


@pytest.mark.parametrize("kernel", [MANUAL_KERNEL, REFERENCE_KERNEL, CPU_FLASH], ids=lambda k: k.name)
def test_backward_with_foreign_out_and_lse_gives_the_share_of_a_union_softmax(kernel):
    """The engine's trick: a call's backward, fed the merged (out, lse) of A u B, is A's exact share
    (the LSE gradient through the kernel's own or the identity's path)."""
    q, k, v = random_qkv(1, 6, 2, 4)
    full_out, full_lse = naive(q, k, v, False, 0.5)
    g_out, g_lse = torch.randn_like(full_out), torch.randn_like(full_lse)
    expected = torch.autograd.grad((full_out, full_lse), (q, k, v), (g_out, g_lse))
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for keys in ([0, 1, 2], [3, 4, 5]):
        kb, vb = k[:, keys].detach(), v[:, keys].detach()
        _, _, state = call_forward(kernel, q.detach(), kb, vb, causal=False, scale=0.5)
        sq, sk, sv = call_backward(state, g_out, q.detach(), kb, vb, full_out.detach(), full_lse.detach(),
                                   causal=False, scale=0.5, grad_lse=g_lse)
        dq += sq
        dk[:, keys] += sk
        dv[:, keys] += sv
    assert max(max_diff(a, b) for a, b in zip((dq, dk, dv), expected)) < 1e-12


@pytest.mark.parametrize("kernel", [MANUAL_KERNEL, CPU_FLASH], ids=lambda k: k.name)
@pytest.mark.parametrize("queries, kv_heads", [(9, 4), (3, 4), (1, 2), (9, 1), (4, 2)])
@pytest.mark.parametrize("causal", [False, True])
def test_calls_with_fewer_queries_or_kv_heads_match_naive(kernel, queries, kv_heads, causal):
    """Bottom-right causal (queries at the last positions) and grouped-query heads: native in the manual
    kernel, by splitting and repeating around the CPU flash kernel; gradients with both upstreams."""
    gen = torch.Generator().manual_seed(queries + kv_heads)
    q = torch.randn(2, queries, 4, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    k, v = (torch.randn(2, 9, kv_heads, 8, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(2))
    out, lse, state = call_forward(kernel, q.detach(), k.detach(), v.detach(), causal=causal, scale=0.4)
    expected_out, expected_lse = naive(q, k, v, causal, 0.4)
    assert max_diff(out, expected_out) < 1e-12 and max_diff(lse, expected_lse) < 1e-12
    g_out, g_lse = torch.randn_like(expected_out), torch.randn_like(expected_lse)
    expected = torch.autograd.grad((expected_out, expected_lse), (q, k, v), (g_out, g_lse))
    got = call_backward(state, g_out, q.detach(), k.detach(), v.detach(), out, lse, causal=causal, scale=0.4,
                        grad_lse=g_lse)
    assert max(max_diff(a, b) for a, b in zip(got, expected)) < 1e-11


def test_calls_shorter_than_a_kernel_takes_run_on_its_fallback():
    """A kernel declaring min_length (cuDNN: no call with one query and one key) hands such calls to its
    fallback; longer calls stay with it."""
    seen = []

    def forward(q, k, v, **kwargs):
        seen.append(k.shape[1])
        return dense_forward(q, k, v, causal=kwargs["causal"], scale=kwargs["scale"])

    picky = DenseKernel("picky", forward, dense_backward, min_length=2, gqa=True, bottom_right=True, grad_lse=True,
                        fallback=MANUAL_KERNEL)
    q, k, v = random_qkv(1, 1, 2, 4, requires_grad=False)
    out, lse, state = call_forward(picky, q, k, v, causal=True, scale=0.5)
    assert seen == [] and state.kernel is MANUAL_KERNEL and max_diff(out, v) < 1e-15
    q, k, v = random_qkv(1, 3, 2, 4, requires_grad=False)
    call_forward(picky, q, k, v, causal=True, scale=0.5)
    assert seen == [3]


def test_table_declares_capabilities_and_auto_candidates_derive_from_them():
    from hilbert_lab.attention.selection import candidate_backends

    assert BACKENDS == tuple(EXECUTORS)
    assert {"reference", "manual", "sdpa", "flex"} <= set(available_backends("cpu"))
    assert {"triton", "flash", "xformers"} <= set(BACKENDS)
    assert EXECUTORS["triton"].capabilities.whole_pattern and not EXECUTORS["sdpa"].capabilities.whole_pattern
    assert EXECUTORS["reference"].capabilities.oracle
    assert "reference" not in candidate_backends("cpu", torch.float32)
    assert set(candidate_backends("cpu", torch.float32)) == {
        n for n in available_backends("cpu", torch.float32) if not EXECUTORS[n].capabilities.oracle}
    with pytest.raises(ValueError, match="backend must be one of"):
        get_executor("fastest")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where CUDA/packages are missing")
@pytest.mark.parametrize("name, words", [("flash", "flash-attn"), ("xformers", "xformers"), ("sdpa_cudnn", "runs on cuda"),
                                         ("sdpa_efficient", "runs on cuda"), ("triton", "CUDA")])
def test_unavailable_executors_raise_a_clear_error(name, words):
    q, k, v = random_qkv(1, 4, 1, 8, requires_grad=False)
    with pytest.raises(BackendUnavailableError, match=words):
        dilated_attention(q, k, v, segment_lengths=[4], dilation_rates=[1], backend=name)


def test_manual_chunking_does_not_change_results():
    q, k, v = random_qkv(3, 10, 2, 4, requires_grad=False)
    whole = dense_forward(q, k, v, causal=True, scale=0.5)
    tiny = dense_forward(q, k, v, causal=True, scale=0.5, max_elements=7)  # one row per chunk
    assert max_diff(whole[0], tiny[0]) < 1e-14 and max_diff(whole[1], tiny[1]) < 1e-14
    g = torch.randn_like(q)
    a = dense_backward(g, q, k, v, whole[0], whole[1], causal=True, scale=0.5)
    b = dense_backward(g, q, k, v, whole[0], whole[1], causal=True, scale=0.5, max_elements=7)
    assert max(max_diff(x, y) for x, y in zip(a, b)) < 1e-13
