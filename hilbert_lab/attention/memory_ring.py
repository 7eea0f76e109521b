"""The memory model of ring attention per rank (hilbert_lab.distributed.ring); the public API is
attention.memory (estimate_memory with world_size > 1)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from hilbert_lab.attention.memory_blocks import (
    DTYPE_BYTES, EAGER_BACKENDS, Block, eager_block_work, engine_blocks, engine_peaks, fused_block_work,
    tensor_elements,
)
from hilbert_lab.attention.pattern import DilatedPattern

if TYPE_CHECKING:
    from hilbert_lab.attention.memory import MemoryConfig


def ring_peaks(config: MemoryConfig, backend: str) -> tuple[int, int, dict[str, dict[str, int]]]:
    """(forward, forward+backward, breakdown) of ring attention per rank (hilbert_lab.distributed.ring, contiguous layout), shard n = N / P.

    Forward, as the ring runs it: (1) the branches whose segments fit in a shard run through the
    engine on the shard (every branch still gets a partial result); (2) each branch spanning ranks
    packs this rank's selected K/V (B * ceil(n/r) * H_branch * D each), holds its own packet and
    one in flight, and attends the shard's selected queries to each packet in one block with all
    of the branch's heads stacked, keeping a running (out, lse) in the LSE dtype; (3) the LSE merge
    of the local result and the ring branches. Backward (one autograd function, every part's backward
    with the merged out and LSE): the merged (out, lse), the q/k/v gradient accumulators, and per ring
    branch its gathered rows, K/V packets, dK/dV shares and sums and one call's gradient shares; the
    local blocks' backward adds into the same accumulators.
    Checked against measured per-rank peaks: benchmarks/validate_memory.py --ring 2.
    """
    pattern = DilatedPattern.create(config.segment_lengths, config.dilation_rates, mode=config.mode,
                                    causal=config.causal)
    element = DTYPE_BYTES[config.dtype]
    lse = 8 if config.dtype == "float64" else 4
    accumulate = 8 if config.dtype == "float64" else 4
    n = config.seq_len // config.world_size
    tokens = tensor_elements(config, n)
    rows = config.batch_size * config.num_heads * n
    part = tokens * element + rows * lse  # one (out, lse) pair on the shard
    local, ring = set(), []
    for branch, offsets in enumerate(pattern.head_offsets(config.num_heads)):
        segment = min(pattern.segment_lengths[branch], config.seq_len)
        if n % segment == 0:
            local.add(branch)
        elif segment % n == 0:
            ring.append((branch, int((offsets >= 0).sum()), pattern.dilation_rates[branch]))
        else:
            raise ValueError(f"segment_lengths[{branch}] = {pattern.segment_lengths[branch]} must divide the shard "
                             f"length {n} (N / world_size) or be a multiple of it")
    forward_terms: dict[str, int] = {}
    backward_terms: dict[str, int] = {}
    forward = forward_backward = 0
    live = 0
    if local:
        blocks, partials = engine_blocks(config, n, local)
        local_forward, local_training, terms = engine_peaks(config, backend, n, blocks, partials,
                                                             grad_lse=bool(ring))
        forward, forward_backward = local_forward, local_training
        forward_terms["local_engine"], backward_terms["local_engine"] = local_forward, local_training
        live = part
    eager = backend in EAGER_BACKENDS
    parts = (1 if local else 0) + len(ring)
    # After the forward: the merged (out, lse) and every part's (out, lse), saved for backward. The
    # merge's backward then makes one output gradient per part.
    after_forward = part + parts * part
    for branch, branch_heads, dilation in ring:
        selected = -(-n // dilation)
        block = Block(config.batch_size, selected, branch_heads, False)
        rows_block = config.batch_size * selected * branch_heads
        packet = 2 * rows_block * config.head_dim * element
        gathered = rows_block * config.head_dim * element
        state = rows_block * (config.head_dim * lse + lse)
        work = eager_block_work(block, config, backend, False) if eager else fused_block_work(block, config, backend, False)
        phase = live + max(2 * packet + 2 * gathered + rows_block * lse + work + 3 * state, state + part)
        forward = max(forward, phase)
        forward_terms[f"ring_branch{branch}"] = phase
        # backward: dQ (accumulate dtype) and the final dK/dV, own/received/sent K/V packets with
        # their dK/dV accumulators, the gathered dO/q/out and a block's three gradient shares
        work_bw = (eager_block_work(block, config, backend, True) if eager
                   else fused_block_work(block, config, backend, True, grad_lse=False))
        acc_packet = packet // element * accumulate
        # backward: this rank's rows gathered once (out and dO dense, lse, a dQ accumulator), the own and
        # the incoming K/V packet, the dK/dV share being computed, the arriving and the pending sums, and
        # one call's three gradient shares
        ring_rows = 2 * gathered + rows_block * lse + rows_block * config.head_dim * accumulate
        internal = ring_rows + 2 * packet + 3 * acc_packet + 3 * gathered + work_bw
        backward_terms[f"ring_branch{branch}"] = internal
        live += part
    if parts > 1:
        cast = tokens * lse if element != lse else 0
        merge = parts * part + 3 * parts * rows * lse + 3 * tokens * lse + cast
        forward = max(forward, merge)
        forward_terms["merge"] = merge
    if not ring:  # every branch is local: the ring is exactly the engine on the shard
        return int(forward), int(forward_backward), {"forward": forward_terms, "forward_backward": backward_terms}
    # One autograd function: after the forward only the merged (out, lse) is kept; the backward holds
    # the q/k/v gradient accumulators, and each part's backward runs with the merged out and LSE.
    after_forward = part
    accumulators = 3 * tokens * accumulate
    phases = [forward] + [after_forward + accumulators + backward_terms[f"ring_branch{b}"] for b, _, _ in ring]
    if local:
        local_phase = after_forward + accumulators + terms["forward_backward"]["largest_block"]
        backward_terms["local_phase"] = local_phase
        phases.append(local_phase)
    forward_backward = max(phases)
    backward_terms.update(after_forward=after_forward, grad_accumulators=accumulators)
    return int(forward), int(forward_backward), {"forward": forward_terms, "forward_backward": backward_terms}
