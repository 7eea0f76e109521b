"""Useful work of a dilated-attention call, counted from the plan (not from what a kernel happens to do)."""
from __future__ import annotations

from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import cached_plan


def useful_pairs(pattern: DilatedPattern, seq_len: int, num_heads: int) -> int:
    """Query-key pairs the pattern asks for, over all heads and branches, per batch element."""
    return cached_plan(pattern, seq_len, num_heads).pairs(pattern.causal)


def attention_flops(pattern: DilatedPattern, batch: int, seq_len: int, num_heads: int, head_dim: int, *,
                    backward: bool = False) -> int:
    """Matrix-product FLOPs of the useful pairs: 4*D per pair forward (QK^T and PV); the backward's five
    products add 10*D, so forward + backward counts 3.5x the forward (FlashAttention's convention)."""
    forward = 4 * head_dim * batch * useful_pairs(pattern, seq_len, num_heads)
    return int(forward * 3.5) if backward else forward
