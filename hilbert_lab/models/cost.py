"""Attention cost of a model configuration, counted from the public plan of its dilated pattern.

Forward attention FLOPs per token of one layer = 4 * head_dim * pairs / N, where pairs =
``cached_plan(pattern, N, H).pairs(causal=True)`` (query-key pairs over all heads and branches of one
sequence) and 4 * head_dim counts the two matrix products (QK^T and PV, 2 FLOPs per multiply-add).
The model's is depth times the layer's (every layer has the same pattern). Projections, the MLP,
softmax and the branch merge are not counted.
"""
from __future__ import annotations

from typing import Any

from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import cached_plan


def attention_cost(segment_lengths: list[int], dilation_rates: list[int], *, seq_len: int, num_heads: int,
                   head_dim: int, depth: int = 1, mode: str = "longnet") -> dict[str, Any]:
    """Causal forward attention cost of a (segment_lengths, dilation_rates) model at ``seq_len`` tokens.

    Returns pairs_per_layer (per sequence, all heads), flops_per_token_layer, flops_per_token (all
    ``depth`` layers), dense_flops_per_token (full causal attention, same heads and depth), and per
    branch: segment_length (clipped to seq_len), dilation_rate, keys_per_query (w / r: keys a selected
    query sees at the segment's end), spans_sequence (w >= seq_len), heads_per_offset and
    offsets_covered (the number of residues mod r that some head's offset covers; < r leaves queries
    of the other residues out of the branch).
    """
    pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=True)
    for name, value in (("seq_len", seq_len), ("num_heads", num_heads), ("head_dim", head_dim), ("depth", depth)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    pairs = cached_plan(pattern, seq_len, num_heads).pairs(causal=True)
    per_layer = 4 * head_dim * pairs / seq_len
    dense = 4 * head_dim * num_heads * (seq_len + 1) / 2 * depth
    offsets = pattern.head_offsets(num_heads)
    branches = []
    for index, (w, r) in enumerate(zip(pattern.segment_lengths, pattern.dilation_rates)):
        covered = sorted({int(o) for o in offsets[index] if o >= 0})
        branches.append({
            "segment_length": min(w, seq_len), "dilation_rate": r, "keys_per_query": -(-min(w, seq_len) // r),
            "spans_sequence": w >= seq_len, "offsets_covered": len(covered),
            "heads_per_offset": int((offsets[index] >= 0).sum()) / max(1, len(covered)),
        })
    return {"seq_len": seq_len, "num_heads": num_heads, "head_dim": head_dim, "depth": depth,
            "pairs_per_layer": pairs, "flops_per_token_layer": per_layer, "flops_per_token": per_layer * depth,
            "dense_flops_per_token": dense, "max_keys_per_query": max(b["keys_per_query"] for b in branches),
            "branches": branches}


def config_attention_cost(config) -> dict[str, Any]:
    """`attention_cost` of a TrainConfig (at its full seq_len)."""
    return attention_cost(list(config.segment_lengths), list(config.dilation_rates), seq_len=config.seq_len,
                          num_heads=config.num_heads, head_dim=config.dim // config.num_heads, depth=config.depth,
                          mode=config.mode)
