"""The small-block pass on CUDA (its Triton kernels: one launch forward, three backward) against the float64 dense
oracle: ragged tails, both modes, grouped key/value heads, fewer queries, an LSE gradient, float32 and bf16."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention import DilatedPattern, dilated_attention, reference_attention
from hilbert_lab.attention.executors import small_blocks, unavailable_reason

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the pass's Triton kernels)"),
]
CASES = [  # (mode, causal, N, H, H_kv, queries)
    ("longnet", True, 37, 6, 6, 37), ("longnet", False, 133, 6, 3, 133), ("longnet", True, 70, 6, 1, 70),
    ("head_groups", True, 37, 6, 6, 37), ("head_groups", False, 133, 6, 6, 133), ("longnet", True, 45, 6, 2, 3),
]


def _finite(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isinf(x), torch.zeros((), dtype=x.dtype, device=x.device), x)


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double().cpu() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("backend,dtype", [("sdpa", torch.float32), ("sdpa", torch.bfloat16),
                                           ("fa4", torch.bfloat16)])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_the_pass_on_cuda_equals_the_float64_oracle(backend, dtype, case, monkeypatch):
    reason = unavailable_reason(backend, "cuda", dtype)
    if reason is not None:
        pytest.skip(f"backend unavailable on this machine: {backend}: {reason}")
    launches = []
    forward = small_blocks.small_attention_forward
    monkeypatch.setattr(small_blocks, "small_attention_forward",
                        lambda *a, **k: (launches.append(1), forward(*a, **k))[1])
    mode, causal, seq_len, heads, kv_heads, queries = case
    segments, rates = [8, 16, 32], [1, 2, 4]
    gen = torch.Generator().manual_seed(seq_len + heads + kv_heads)
    full_q = torch.randn(2, seq_len, heads, 64, generator=gen)
    k, v = (torch.randn(2, seq_len, kv_heads, 64, generator=gen) for _ in range(2))
    leaves = [t[:, seq_len - queries:] if i == 0 else t for i, t in enumerate((full_q, k, v))]
    leaves = [t.to("cuda", dtype).requires_grad_(True) for t in leaves]
    out, lse = dilated_attention(*leaves, segment_lengths=segments, dilation_rates=rates, mode=mode, causal=causal,
                                 backend=backend, return_lse=True)
    grad_out, grad_lse = torch.randn_like(out), torch.randn_like(lse)
    grads = torch.autograd.grad((out * grad_out).sum() + (_finite(lse) * grad_lse).sum(), leaves)
    pattern = DilatedPattern.create(segments, rates, mode=mode, causal=causal)
    refs = [t.double().requires_grad_(True) for t in (full_q, k, v)]
    groups = heads // kv_heads
    ref_out, ref_lse = reference_attention(refs[0], refs[1].repeat_interleave(groups, 2),
                                           refs[2].repeat_interleave(groups, 2), pattern)
    ref_out, ref_lse = ref_out[:, seq_len - queries:], ref_lse[..., seq_len - queries:]
    ref_grads = list(torch.autograd.grad((ref_out * grad_out.double().cpu()).sum()
                                         + (_finite(ref_lse) * grad_lse.double().cpu()).sum(), refs))
    ref_grads[0] = ref_grads[0][:, seq_len - queries:]
    bound = 1e-5 if dtype == torch.float32 else 1e-2  # bf16 inputs and outputs: a few of its 2^-8 roundings
    assert launches, "the pass did not run on its kernels"
    assert _relative(out, ref_out) < bound
    assert _relative(_finite(lse), _finite(ref_lse)) < bound
    for got, want in zip(grads, ref_grads):
        assert _relative(got, want) < bound
