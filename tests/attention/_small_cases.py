"""Cases of the small-block pass (executors.small_blocks) and their check against the float64 dense oracle, shared
by the CPU tests, the interpreted kernels and the GPU tests."""
from __future__ import annotations

import torch

from hilbert_lab.attention import DilatedPattern, dilated_attention, reference_attention

SEGMENTS, RATES = [8, 16, 32], [1, 2, 4]
CASES = [  # (mode, causal, N, H, H_kv, queries): ragged tails, grouped key/value heads, fewer queries than keys
    ("longnet", True, 37, 6, 6, 37), ("longnet", False, 133, 6, 3, 133), ("longnet", True, 70, 6, 1, 70),
    ("head_groups", True, 37, 6, 6, 37), ("head_groups", False, 133, 6, 6, 133), ("longnet", True, 45, 6, 2, 3),
]


def finite(x: torch.Tensor) -> torch.Tensor:
    """x with its infinities (the LSE of rows without keys) as 0."""
    return torch.where(torch.isinf(x), torch.zeros((), dtype=x.dtype, device=x.device), x)


def oracle_errors(case, *, backend: str, device: str = "cpu", dtype: torch.dtype = torch.float64,
                  head_dim: int = 8) -> dict:
    """Relative errors (norms) of out, LSE, dq, dk, dv of `dilated_attention` on `backend` against the float64 dense
    oracle, for random upstream gradients of the output and the LSE."""
    mode, causal, seq_len, heads, kv_heads, queries = case
    gen = torch.Generator().manual_seed(seq_len + heads + kv_heads)
    full_q = torch.randn(2, seq_len, heads, head_dim, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, seq_len, kv_heads, head_dim, generator=gen, dtype=torch.float64) for _ in range(2))
    inputs = [t.to(device, dtype).requires_grad_(True) for t in (full_q[:, seq_len - queries:], k, v)]
    out, lse = dilated_attention(*inputs, segment_lengths=SEGMENTS, dilation_rates=RATES, mode=mode, causal=causal,
                                 backend=backend, return_lse=True)
    grad_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    grad_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((out * grad_out.to(device, dtype)).sum()
                                + (finite(lse) * grad_lse.to(device, lse.dtype)).sum(), inputs)
    leaves = [t.clone().requires_grad_(True) for t in (full_q, k, v)]
    groups = heads // kv_heads
    ref_out, ref_lse = reference_attention(leaves[0], leaves[1].repeat_interleave(groups, 2),
                                           leaves[2].repeat_interleave(groups, 2),
                                           DilatedPattern.create(SEGMENTS, RATES, mode=mode, causal=causal))
    ref_out, ref_lse = ref_out[:, seq_len - queries:], ref_lse[..., seq_len - queries:]
    ref_grads = list(torch.autograd.grad((ref_out * grad_out).sum() + (finite(ref_lse) * grad_lse).sum(), leaves))
    ref_grads[0] = ref_grads[0][:, seq_len - queries:]
    relative = lambda got, want: ((got.detach().cpu().double() - want).norm() / want.norm()).item()  # noqa: E731
    errors = {"out": relative(out, ref_out), "lse": relative(finite(lse), finite(ref_lse))}
    errors.update({name: relative(got, want) for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads)})
    return errors
