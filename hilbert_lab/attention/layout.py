"""The memory layout q, k, v may be stored in: tokens permuted inside blocks along an ordering
(hilbert_lab.curves.layouts), read back into original positions through the layout's index map.

Executors address tokens by their original positions, so a layout changes no value, only the memory traffic
of reading the inputs (the engine's `ordering=`, and the memory estimate's dry run of it).
"""
from __future__ import annotations

import torch

from hilbert_lab.attention.validation import concrete
from hilbert_lab.curves.layouts import layout_permutation, permute_sequence


def read_through_layout(x: torch.Tensor, ordering: str, block: int) -> torch.Tensor:
    """x (B, N, H, D) stored in the `ordering` layout (tokens permuted inside blocks of `block`, clipped to N)
    and read back into original positions through the layout's index map: the same values (and gradients),
    with the layout's memory traffic. Two permute_sequence calls (each one gather, differentiable)."""
    seq_len = concrete(x.shape[1])  # a compiled graph holds the permutation of this length as a constant
    perm, inverse = layout_permutation(seq_len, min(block, seq_len), ordering, device=x.device)
    return permute_sequence(permute_sequence(x, perm), inverse)
