"""Head-parallel (Ulysses-style) dilated attention: this rank's shard of exactly the single-process result.

q, k, v are this rank's (B, N/P, H, D) shard of a length-N sequence over the P ranks of `group`, in a layout
of sharding.py ("contiguous", or "zigzag" for causal load balance in a ring). One all-to-all per tensor
(exchange.py) gives rank r the heads [r H/P, (r + 1) H/P) of the whole sequence in token order; the engine
runs them with the global heads' offsets (`global_heads`), so every pattern, whatever its segments span,
runs with no ring step; one all-to-all returns the output (and LSE) to the sequence layout. The backward
is the transposed all-to-alls around the engine's exact backward. Key/value heads: shards of H_kv / P heads
where P divides H_kv, else each rank gets (replicated) the key/value heads its query heads read
(exchange.kv_heads_per_rank), their gradients added back. Per-rank memory: O(N H / P) for q, k, v.

Safety as in the ring: the inputs are checked, then one configuration agreement over the group
(agreement.py) makes every rank raise the same ValueError before any data moves; every wait is bounded.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from hilbert_lab.attention.engine import dilated_attention
from hilbert_lab.attention.executors import Executor
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.validation import validate_attention_inputs, validate_cu_seqlens
from hilbert_lab.distributed.agreement import agree_on_configuration, configuration_fields
from hilbert_lab.distributed.comm import DEFAULT_TIMEOUT_S, resolve_timeout
from hilbert_lab.distributed.exchange import HeadExchange, heads_to_sequence, kv_heads_per_rank, sequence_to_heads
from hilbert_lab.distributed.sharding import LAYOUTS, check_divisible


def check_head_degree(num_heads: int, degree: int) -> None:
    """ValueError unless the query heads split evenly over the head-parallel ranks (H % P == 0)."""
    if num_heads % degree:
        raise ValueError(f"num_heads (H = {num_heads}, q's heads) must be divisible by the head-parallel degree "
                         f"{degree} (the ranks of the group), got remainder {num_heads % degree}")


def heads_of_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup | None,
                      degree: int, index: int, layout: str, timeout_s: float, label: str):
    """(q, k, v) as this rank's heads of the whole sequence of the group (B, N, H/P, D), (B, N, h_kv, D), and the
    HeadExchange that returns results (`back_to_sequence`); index: this rank's place in the group."""
    heads, kv = q.shape[2], k.shape[2]
    common = dict(group=group, world_size=degree, rank=index, layout=layout, timeout_s=timeout_s, label=label)
    exchange = HeadExchange(num_heads=heads, **common)
    kv_exchange = HeadExchange(num_heads=kv, heads=kv_heads_per_rank(heads, kv, degree), **common)
    return (sequence_to_heads(q, exchange), sequence_to_heads(k, kv_exchange), sequence_to_heads(v, kv_exchange),
            exchange)


def back_to_sequence(local, exchange: HeadExchange, return_lse: bool):
    """out (B, N, H/P, D) [and lse (B, H/P, N)] of this rank's heads -> its shard out (B, N/P, H, D) [, lse
    (B, H, N/P)]."""
    if not return_lse:
        return heads_to_sequence(local, exchange)
    out, lse = local
    lse = heads_to_sequence(lse.transpose(1, 2).unsqueeze(-1), exchange).squeeze(-1).transpose(1, 2)
    return heads_to_sequence(out, exchange), lse


def ulysses_dilated_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    segment_lengths: Sequence[int],
    dilation_rates: Sequence[int],
    causal: bool = False,
    mode: str = "longnet",
    group: dist.ProcessGroup | None = None,
    layout: str = "contiguous",
    backend: str | Executor = "auto",
    scale: float | None = None,
    return_lse: bool = False,
    check_config: bool = True,
    timeout_s: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
):
    """This rank's shard of the single-process engine's dilated attention, computed head-parallel.

    q: (B, N/P, H, D), k, v: (B, N/P, H_kv, D) shards (layout "contiguous" or "zigzag") of a length-N sequence
    over the P ranks of `group` (default: the world); H must be divisible by P. Returns out (B, N/P, H, D)
    (and lse (B, H, N/P) if return_lse), differentiable with exact gradients. Any pattern works: each rank
    attends whole segments of its H/P heads. Every rank of the group must call it with the same arguments
    and equal shards; check_config, timeout_s and cu_seqlens (the whole row's packed documents, the same on
    every rank) as in ring_dilated_attention.
    """
    if not dist.is_initialized():
        raise RuntimeError("ulysses_dilated_attention needs torch.distributed to be initialised "
                           "(dist.init_process_group)")
    error: Exception | None = None
    pattern = documents = None
    resolved_scale, timeout = scale, DEFAULT_TIMEOUT_S
    world = dist.get_world_size(group)
    try:
        timeout = resolve_timeout(timeout_s)
        if not isinstance(check_config, bool):
            raise ValueError(f"check_config must be True or False, got {check_config!r}")
        if not isinstance(return_lse, bool):
            raise ValueError(f"return_lse must be True or False, got {return_lse!r}")
        pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=causal)
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        resolved_scale = validate_attention_inputs(q, k, v, scale=scale, shape="(B, N/P, H, D)", grouped_heads=True)
        check_head_degree(q.shape[2], world)
        seq_len = q.shape[1] * world
        check_divisible(seq_len, world, layout)
        documents = validate_cu_seqlens(cu_seqlens, q, seq_len=seq_len)
    except (ValueError, TypeError) as exc:
        error = exc
    if check_config and world > 1:
        fields = configuration_fields(
            q, k, pattern, segment_lengths=segment_lengths, dilation_rates=dilation_rates, mode=mode, causal=causal,
            scale=resolved_scale, layout=layout, backend=backend, cu_seqlens=cu_seqlens, documents=documents,
            error=error, return_lse=return_lse)
        agree_on_configuration(fields, error, group, timeout, caller="ulysses_dilated_attention", members="group")
    if error is not None:
        raise error
    boundaries = None
    if documents is not None:
        boundaries = [0] + [start + length for start, length in documents]
    arguments = dict(segment_lengths=pattern.segment_lengths, dilation_rates=pattern.dilation_rates,
                     causal=pattern.causal, mode=pattern.mode, backend=backend, scale=resolved_scale,
                     return_lse=return_lse, cu_seqlens=boundaries)
    if world == 1:
        return dilated_attention(q, k, v, **arguments)
    rank, heads = dist.get_rank(group), q.shape[2]
    *local, exchange = heads_of_sequence(q, k, v, group, world, rank, layout, timeout, "ulysses")
    return back_to_sequence(dilated_attention(*local, global_heads=(rank * heads // world, heads), **arguments),
                            exchange, return_lse)
