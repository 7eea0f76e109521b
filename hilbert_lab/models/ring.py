"""Switch a LongNet model's attention layers between the local engine and ring attention.

The ring (hilbert_lab.distributed, a peer package) is imported lazily, only when the switch is used.
After ``use_ring_attention(model, ...)`` every rank runs the same model on its shard of the sequence:
``model(tokens_shard, positions=shard_positions(rank, world_size, seq_len, layout))`` returns that
shard's logits, equal to the matching rows of the single-process model's logits on the whole sequence.
"""
from __future__ import annotations

from torch import nn

from hilbert_lab.attention.modules import MultiheadDilatedAttention

from .blocks import DilatedTransformerBlock


def _blocks(model: nn.Module) -> list[DilatedTransformerBlock]:
    blocks = [m for m in model.modules() if isinstance(m, DilatedTransformerBlock)]
    if not blocks:
        raise ValueError("model must contain DilatedTransformerBlocks (a LongNetLM or LongNetEncoder)")
    return blocks


def use_ring_attention(model: nn.Module, *, group=None, ring_size: int | None = None,
                       layout: str = "contiguous") -> nn.Module:
    """Replace each block's MultiheadDilatedAttention by a RingMultiheadDilatedAttention holding the
    same parameters (in place; returns ``model``). ``group``/``ring_size``/``layout`` as in
    ``hilbert_lab.distributed.ring_dilated_attention``; grouped-query key/value heads carry over. The ring has no
    attention dropout and no ``ordering`` (ValueError if the model uses them)."""
    from hilbert_lab.distributed import RingMultiheadDilatedAttention

    for block in _blocks(model):
        local = block.attention
        if isinstance(local, RingMultiheadDilatedAttention):
            continue  # already a ring layer
        inner = local.attention
        if inner.dropout > 0:
            raise ValueError(f"attention_dropout must be 0 for ring attention, got {inner.dropout}")
        if inner.ordering not in (None, "identity") or inner.hilbert_pattern:
            raise ValueError(f"ordering must be None for ring attention, got {inner.ordering!r}")
        pattern = inner.pattern
        weight = local.q_proj.weight
        ring = RingMultiheadDilatedAttention(
            local.embed_dim, local.num_heads, list(pattern.segment_lengths), list(pattern.dilation_rates),
            bias=local.q_proj.bias is not None, causal=pattern.causal, mode=pattern.mode, backend=inner.backend,
            num_kv_heads=local.num_kv_heads, group=group, ring_size=ring_size, layout=layout, device=weight.device,
            dtype=weight.dtype,
        )
        ring.load_state_dict(local.state_dict())
        ring.train(local.training)
        block.attention = ring
    return model


def use_local_attention(model: nn.Module) -> nn.Module:
    """Undo ``use_ring_attention``: local MultiheadDilatedAttention layers with the ring layers'
    current parameters (in place; returns ``model``)."""
    from hilbert_lab.distributed import RingMultiheadDilatedAttention

    for block in _blocks(model):
        ring = block.attention
        if not isinstance(ring, RingMultiheadDilatedAttention):
            continue
        inner = ring.attention
        weight = ring.q_proj.weight
        local = MultiheadDilatedAttention(
            ring.embed_dim, ring.num_heads, list(inner.pattern.segment_lengths), list(inner.pattern.dilation_rates),
            bias=ring.q_proj.bias is not None, causal=inner.pattern.causal, mode=inner.pattern.mode,
            backend=inner.backend, num_kv_heads=ring.num_kv_heads, device=weight.device, dtype=weight.dtype,
        )
        local.load_state_dict(ring.state_dict())
        local.train(ring.training)
        block.attention = local
    return model
