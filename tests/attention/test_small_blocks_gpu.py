"""The small-block pass on CUDA (its Triton kernels: one launch forward, three backward) against the float64 dense
oracle: ragged tails, both modes, grouped key/value heads, fewer queries, an LSE gradient, float32 and bf16."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention.executors import small_blocks, unavailable_reason

from ._small_cases import CASES, oracle_errors

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the pass's Triton kernels)"),
]


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
    errors = oracle_errors(case, backend=backend, device="cuda", dtype=dtype, head_dim=64)
    assert launches, "the pass did not run on its kernels"
    bound = 1e-5 if dtype == torch.float32 else 1e-2  # bf16 inputs and outputs: a few of its 2^-8 roundings
    assert max(errors.values()) < bound, errors
