"""Block backends against a naive float64 softmax: outputs, LSE, gradients (incl. the LSE's), masks."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention.backends import BACKENDS, BackendUnavailableError, available_backends, get_backend

from ._oracle import max_diff, random_qkv

CPU_BACKENDS = ["reference", "manual", "sdpa", "sdpa_flash", "sdpa_math"]


def naive(q, k, v, causal, scale, key_padding_mask):
    """Plain loops-free dense softmax in float64, written independently of the backends."""
    scores = torch.einsum("blhd,bmhd->bhlm", q.double(), k.double()) * scale
    allowed = torch.ones(scores.shape[-2:], dtype=torch.bool)
    if causal:
        allowed = torch.tril(allowed)
    allowed = allowed[None, None]
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask[:, None, None, :]
    scores = scores.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    has_key = allowed.expand_as(scores).any(-1)
    probs = torch.where(has_key[..., None], torch.softmax(scores.masked_fill(~has_key[..., None], 0.0), -1), 0.0)
    return torch.einsum("bhlm,bmhd->blhd", probs, v.double()), lse


@pytest.mark.parametrize("name", CPU_BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_cpu_backend_matches_naive_softmax(name, causal, padded):
    q, k, v = random_qkv(2, 7, 3, 4)
    mask = None
    if padded:
        mask = torch.zeros(2, 7, dtype=torch.bool)
        mask[0, :2] = True  # causal: query rows 0, 1 of batch 0 have no key at all
        mask[1, 5:] = True
    out, lse = get_backend(name).attend(q, k, v, causal=causal, scale=0.37, key_padding_mask=mask)
    expected_out, expected_lse = naive(q, k, v, causal, 0.37, mask)
    assert max_diff(out, expected_out) < 1e-12 and max_diff(lse, expected_lse) < 1e-12
    assert out.dtype == torch.float64 and lse.dtype == torch.float64 and lse.shape == (2, 3, 7)
    gen = torch.Generator().manual_seed(1)
    g_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    g_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64).masked_fill(torch.isinf(expected_lse), 0.0)
    got = torch.autograd.grad((out, lse), (q, k, v), (g_out, g_lse))
    # Reference gradients from the naive formula through autograd (rows without keys excluded from lse).
    expected_lse_safe = torch.where(torch.isinf(expected_lse), torch.zeros_like(expected_lse), expected_lse)
    expected = torch.autograd.grad((expected_out, expected_lse_safe), (q, k, v), (g_out, g_lse))
    assert max(max_diff(a, b) for a, b in zip(got, expected)) < 1e-11
    assert all(torch.isfinite(g).all() for g in got)


def test_flex_forward_matches_naive_on_cpu():
    q, k, v = random_qkv(2, 9, 2, 4, requires_grad=False)
    for causal in (False, True):
        out, lse = get_backend("flex").attend(q, k, v, causal=causal, scale=0.5)
        expected_out, expected_lse = naive(q, k, v, causal, 0.5, None)
        assert max_diff(out, expected_out) < 1e-12 and max_diff(lse, expected_lse) < 1e-12


def test_backward_with_foreign_out_and_lse_gives_the_share_of_a_union_softmax():
    """The engine's trick: backward of block A, fed the merged (out, lse) of A u B, is A's exact share."""
    q, k, v = random_qkv(1, 6, 2, 4)
    for name in ["manual", "sdpa", "reference"]:
        backend = get_backend(name)
        full_out, full_lse = naive(q, k, v, False, 0.5, None)
        g_out, g_lse = torch.randn_like(full_out), torch.randn_like(full_lse)
        expected = torch.autograd.grad((full_out, full_lse), (q, k, v), (g_out, g_lse))
        dq = torch.zeros_like(q)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        for keys in ([0, 1, 2], [3, 4, 5]):
            kb, vb = k[:, keys].detach(), v[:, keys].detach()
            _, _, aux = backend.forward(q.detach(), kb, vb, causal=False, scale=0.5)
            sq, sk, sv = backend.backward(g_out, g_lse, q.detach(), kb, vb, full_out.detach(), full_lse.detach(), aux,
                                          causal=False, scale=0.5)
            dq += sq
            dk[:, keys] += sk
            dv[:, keys] += sv
        assert max(max_diff(a, b) for a, b in zip((dq, dk, dv), expected)) < 1e-12, name


def test_registry_names_and_errors():
    assert {"reference", "manual", "sdpa", "flex"} <= set(available_backends("cpu"))
    assert "triton" in BACKENDS and "flash" in BACKENDS and "xformers" in BACKENDS
    with pytest.raises(ValueError, match="backend must be one of"):
        get_backend("fastest")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised where CUDA/packages are missing")
@pytest.mark.parametrize("name", ["flash", "xformers", "sdpa_cudnn", "sdpa_efficient", "triton"])
def test_unavailable_backends_raise_a_clear_error(name):
    q, k, v = random_qkv(1, 4, 1, 8, requires_grad=False)
    with pytest.raises(BackendUnavailableError, match=name.split("_")[-1] if name != "flash" else "flash"):
        get_backend(name).attend(q, k, v, causal=False)


def test_block_input_validation():
    q, k, v = random_qkv(1, 4, 2, 8, requires_grad=False)
    backend = get_backend("manual")
    with pytest.raises(ValueError, match="dtype"):
        backend.attend(q, k.float(), v, causal=False)
    with pytest.raises(ValueError, match="shapes"):
        backend.attend(q, k[:, :, :1], v, causal=False)
    with pytest.raises(ValueError, match="key_padding_mask"):
        backend.attend(q, k, v, causal=False, key_padding_mask=torch.zeros(1, 4))


def test_manual_chunking_does_not_change_results():
    from hilbert_lab.attention.backends import manual

    q, k, v = random_qkv(3, 10, 2, 4, requires_grad=False)
    whole = manual.dense_forward(q, k, v, causal=True, scale=0.5)
    tiny = manual.dense_forward(q, k, v, causal=True, scale=0.5, max_elements=7)  # one row per chunk
    assert max_diff(whole[0], tiny[0]) < 1e-14 and max_diff(whole[1], tiny[1]) < 1e-14
    g = torch.randn_like(q)
    a = manual.dense_backward(g, None, q, k, v, whole[0], whole[1], causal=True, scale=0.5)
    b = manual.dense_backward(g, None, q, k, v, whole[0], whole[1], causal=True, scale=0.5, max_elements=7)
    assert max(max_diff(x, y) for x, y in zip(a, b)) < 1e-13
