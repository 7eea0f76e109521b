"""Ring dilated attention over torch.distributed: sharding, ring communicator, autograd, modules."""
from __future__ import annotations

from hilbert_lab.distributed import comm
from hilbert_lab.distributed.comm import STATS, CommStats, RingComm, RingCommError, RingTimeoutError, reset_stats
from hilbert_lab.distributed.modules import RingDilatedAttention, RingMultiheadDilatedAttention
from hilbert_lab.distributed.ring import plan_branches, ring_dilated_attention
from hilbert_lab.distributed.sharding import (
    LAYOUTS, all_gather_sequence, check_divisible, shard, shard_positions, unshard, zigzag_shard, zigzag_unshard,
)

__all__ = [
    "CommStats", "LAYOUTS", "RingComm", "RingCommError", "RingDilatedAttention", "RingMultiheadDilatedAttention",
    "RingTimeoutError", "STATS",
    "all_gather_sequence", "check_divisible", "comm", "plan_branches", "reset_stats", "ring_dilated_attention",
    "shard", "shard_positions", "unshard", "zigzag_shard", "zigzag_unshard",
]
