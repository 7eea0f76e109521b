"""The memory model of ring attention per rank (hilbert_lab.distributed); the public API is
attention.memory (estimate_memory with world_size > 1)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hilbert_lab.attention.executors import get_executor
from hilbert_lab.attention.executors.manual import MAX_SCORE_ELEMENTS
from hilbert_lab.attention.plan import cached_plan

if TYPE_CHECKING:
    from hilbert_lab.attention.memory import MemoryConfig


def ring_peaks(config: MemoryConfig, backend: str) -> tuple[int, int, dict[str, dict[str, int]]]:
    """(forward, forward+backward, breakdown) of ring attention per rank (contiguous layout), shard n = N / P.

    Forward, as the ring runs it: (1) the branches whose segments fit in a shard run on the shard's plan
    (their peak is a dry run of the executor, attention.memory.dry_run); (2) each branch spanning ranks
    packs this rank's selected K/V (B * ceil(n/r) * H_branch * D each), holds its own packet and one in
    flight, and attends the shard's selected queries to each packet in one call with all of the
    branch's heads stacked, keeping a running (out, lse) in the LSE dtype; (3) the LSE merge of the
    slots. Backward (the one attention function, every part's backward with the merged out and LSE):
    the merged (out, lse), the q/k/v gradient accumulators, and per ring branch its gathered rows, K/V
    packets, dK/dV shares and sums and one call's gradient shares.
    """
    from hilbert_lab.attention.memory import DTYPE_BYTES, dry_run

    pattern = config.pattern
    element = DTYPE_BYTES[config.dtype]
    lse = accumulate = 8 if config.dtype == "float64" else 4
    n = config.seq_len // config.world_size
    tokens = config.batch_size * n * config.num_heads * config.head_dim
    rows = config.batch_size * config.num_heads * n
    local, ring = [], []
    for branch, offsets in enumerate(pattern.head_offsets(config.num_heads)):
        segment = min(pattern.segment_lengths[branch], config.seq_len)
        if n % segment == 0:
            local.append(branch)
        elif segment % n == 0:
            ring.append((branch, int((offsets >= 0).sum()), pattern.dilation_rates[branch]))
        else:
            raise ValueError(f"segment_lengths[{branch}] = {pattern.segment_lengths[branch]} must divide the shard "
                             f"length {n} (N / world_size) or be a multiple of it")
    forward_terms: dict[str, int] = {}
    backward_terms: dict[str, int] = {}
    forward = forward_backward = 0
    if local:
        plan = cached_plan(pattern, n, config.num_heads, tuple(local))
        shape = (config.batch_size, n, config.num_heads, config.head_dim)
        forward, forward_backward = dry_run(get_executor(backend), plan, shape, getattr(torch, config.dtype),
                                            config.device)
        forward_terms["local"], backward_terms["local"] = forward, forward_backward
    if not ring:  # every branch is local: the ring is exactly the engine on the shard
        return int(forward), int(forward_backward), {"forward": forward_terms, "forward_backward": backward_terms}
    eager = backend in ("manual", "reference", "sdpa_math")
    slots = (1 if local else 0) + len(ring)
    buffers = slots * (tokens * element + rows * lse)
    for branch, branch_heads, dilation in ring:
        selected = -(-n // dilation)
        rows_block = config.batch_size * selected * branch_heads
        packet = 2 * rows_block * config.head_dim * element
        gathered = rows_block * config.head_dim * element
        state = rows_block * (config.head_dim * lse + lse)
        work = min(rows_block * selected, MAX_SCORE_ELEMENTS) * 4 * 4 if eager else 0
        phase = buffers + 2 * packet + 2 * gathered + rows_block * lse + work + 3 * state
        forward = max(forward, phase)
        forward_terms[f"ring_branch{branch}"] = phase
        acc_packet = packet // element * accumulate
        ring_rows = 2 * gathered + rows_block * lse + rows_block * config.head_dim * accumulate
        backward_terms[f"ring_branch{branch}"] = ring_rows + 2 * packet + 3 * acc_packet + 3 * gathered + work
    merge = buffers + 3 * slots * rows * lse + 3 * tokens * lse
    forward = max(forward, merge)
    forward_terms["merge"] = merge
    kept = tokens * element + rows * lse
    accumulators = 3 * tokens * accumulate
    phases = [forward, forward_backward + accumulators] + [kept + accumulators + backward_terms[f"ring_branch{b}"]
                                                           for b, _, _ in ring]
    backward_terms.update(kept_out_lse=kept, grad_accumulators=accumulators)
    return int(forward), int(max(phases)), {"forward": forward_terms, "forward_backward": backward_terms}
