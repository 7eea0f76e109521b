"""Context parallelism over torch.distributed: sharding, the communicator, branch schedules, the ring
algorithms (contiguous, zigzag), the step pipelines, head-parallel attention (all-to-all over heads) and its
hybrid with the ring on a 2-D mesh, the configuration agreement, modules; the ring's per-rank memory estimate
(distributed.memory)."""
from __future__ import annotations

from hilbert_lab.distributed import comm
from hilbert_lab.distributed.branches import plan_branches
from hilbert_lab.distributed.comm import (
    STATS, CommStats, RingComm, RingCommError, RingTimeoutError, reset_stats, settle_transfers,
)
from hilbert_lab.distributed.hybrid import MESH_DIMS, hybrid_dilated_attention, hybrid_positions
from hilbert_lab.distributed.modules import PARALLEL_MODES, RingDilatedAttention, RingMultiheadDilatedAttention
from hilbert_lab.distributed.ring import ring_dilated_attention
from hilbert_lab.distributed.sharding import (
    LAYOUTS, all_gather_sequence, check_divisible, shard, shard_positions, unshard, zigzag_shard, zigzag_unshard,
)
from hilbert_lab.distributed.ulysses import ulysses_dilated_attention

__all__ = [
    "CommStats", "LAYOUTS", "MESH_DIMS", "PARALLEL_MODES", "RingComm", "RingCommError", "RingDilatedAttention",
    "RingMultiheadDilatedAttention", "RingTimeoutError", "STATS", "all_gather_sequence", "check_divisible", "comm",
    "hybrid_dilated_attention", "hybrid_positions", "plan_branches", "reset_stats", "ring_dilated_attention",
    "settle_transfers", "shard", "shard_positions", "ulysses_dilated_attention", "unshard", "zigzag_shard",
    "zigzag_unshard",
]
