"""The fused Triton executor: every branch of a plan in one pass over the original (B, N, H, D) layout.

The kernel (kernels/triton_dilated.py) merges the branches by one online softmax, so the executor
writes the merged (out, LSE) of the plan's branches into one slot, in place; its backward computes
dq, dk, dv for the merged out and LSE in one pass (exact, also through the LSE's gradient). Tokens are
addressed by original position, so a layout ordering changes nothing here. The TRITON_INTERPRET=1
interpreter runs it (slowly) on the CPU.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch

from hilbert_lab.attention.executors.base import Capabilities, Executor, Grads, Merged, Slots
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import Plan, local_offsets
from hilbert_lab.kernels import triton_dilated

CAPABILITIES = Capabilities(dtypes=(torch.float16, torch.bfloat16, torch.float32), head_dims=(256, 1),
                            whole_pattern=True, grad_lse=True, package="triton", install="hilbert-lab[gpu]")


def unavailable(device: Optional[torch.device] = None, dtype: Optional[torch.dtype] = None) -> Optional[str]:
    """None when the fused kernel can run on `device`, else why not."""
    if not triton_dilated.HAVE_TRITON:
        return "the 'triton' package is not installed (pip install triton)"
    interpreting = triton_dilated.interpreting()
    if device is not None and device.type != "cuda" and not interpreting:
        return f"it needs a CUDA device (got {device}); TRITON_INTERPRET=1 runs it slowly on the CPU"
    if device is None and not torch.cuda.is_available() and not interpreting:
        return "no CUDA device is available"
    return None


@functools.lru_cache(maxsize=128)
def _head_offsets(pattern: DilatedPattern, num_heads: int, device: torch.device,
                  branches: Optional[tuple[int, ...]], global_heads: Optional[tuple[int, int]] = None) -> torch.Tensor:
    """int32 (num_branches, H): each head's offset per branch (a run of a layer's heads: the global heads'),
    -1 where the head is not in it or the branch is not planned (cached per device)."""
    rows = []
    for branch, offsets in enumerate(local_offsets(pattern, num_heads, global_heads)):
        row = torch.as_tensor(offsets, dtype=torch.int32)
        if branches is not None and branch not in branches:
            row = torch.full_like(row, -1)
        rows.append(row)
    return torch.stack(rows).to(device)


def kernel_arguments(plan: Plan, q: torch.Tensor) -> dict:
    """The kernel's plain arguments for the plan's pattern and branches. A segment longer than the
    sequence (such as 1 << 40, "the whole sequence") is passed as one of max(N, r) tokens, which selects
    the same tokens inside the kernel's int32 arithmetic."""
    pattern = plan.pattern
    seq_len = q.shape[1]
    segments = tuple(w if w <= seq_len else max(seq_len, r) for w, r in zip(pattern.segment_lengths,
                                                                           pattern.dilation_rates))
    return dict(segment_lengths=segments, dilation_rates=pattern.dilation_rates,
                head_offsets=_head_offsets(pattern, q.shape[2], q.device, plan.branches, plan.global_heads),
                causal=pattern.causal)


def _check(plan: Plan, q: torch.Tensor, k: torch.Tensor) -> None:
    if plan.queries != plan.seq_len or k.shape[2] != q.shape[2]:
        raise ValueError("backend 'triton' runs queries and keys of one length and one key/value head per query "
                         "head; use backend 'sdpa' or 'manual' for fewer queries or key/value heads")


def forward(plan: Plan, q, k, v, slots: Slots, *, scale: float):
    _check(plan, q, k)
    branch = plan.blocks[0].branch if plan.blocks else 0
    triton_dilated.dilated_attention_forward(q, k, v, scale=scale, out=slots.out(branch),
                                             lse=slots.lse(branch).transpose(1, 2), **kernel_arguments(plan, q))
    return None


def backward(plan: Plan, state, q, k, v, merged: Merged, grads: Grads, *, scale: float) -> None:
    grad_out = merged.grad_out if merged.grad_out is not None else torch.zeros_like(merged.out)
    shares = triton_dilated.dilated_attention_backward(grad_out, q, k, v, merged.out, merged.lse,
                                                       grad_lse=merged.grad_lse, scale=scale,
                                                       **kernel_arguments(plan, q))
    for index, share in enumerate(shares):
        grads.add_whole(index, share)


def executor() -> Executor:
    """The "triton" executor."""
    return Executor("triton", CAPABILITIES, forward, backward, unavailable,
                    description="the fused Triton kernel over the whole pattern (one pass, no partials)")
