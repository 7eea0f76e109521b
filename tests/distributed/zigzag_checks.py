"""Per-rank checks of the zigzag layout's branches whose segments are whole chunks (float64, gloo)."""
from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.distributed import comm
from hilbert_lab.distributed.sharding import shard_positions
from ring_checks import compare
from ring_worlds import check


def _sent(prefix: str) -> list[int]:
    """[messages, bytes] sent by every rank together under labels `prefix` exactly (no span suffix)."""
    found = [sum(m for label, (m, _) in comm.STATS.by_label.items() if label == prefix),
             sum(b for label, (_, b) in comm.STATS.by_label.items() if label == prefix)]
    counts = torch.tensor(found, dtype=torch.int64)
    dist.all_reduce(counts)
    return counts.tolist()


@check
def check_zigzag_chunk_segments(rank, world):
    """Segments of m whole zigzag chunks (m dividing 2P) run around the ranks holding them: exact against the
    engine (both modes, causal or not), and a w = 2c branch sends each member's packet once to its partner
    (forward), K/V again and the dK/dV sum home (backward), nothing to other ranks."""
    chunk, heads, dim, batch = 4, 4, 3, 2
    seq_len = 2 * world * chunk
    cases = [([2, 2 * chunk, seq_len], [1, 2, 4])]
    cases += [([chunk, 4 * chunk], [1, 2])] if (2 * world) % 4 == 0 else []
    cases += [([3 * chunk], [2])] if (2 * world) % 3 == 0 else []
    for (segments, rates), mode, causal in itertools.product(cases, ("longnet", "head_groups"), (False, True)):
        compare(rank, world, seq_len, segments, rates, mode, causal, layout="zigzag")
    w, r = 2 * chunk, 2
    offsets = DilatedPattern.create([2, w, seq_len], [1, r, 4]).head_offsets(heads)[1]

    def packet_bytes(member):  # K and V of the member's selected tokens for each head, float64
        pos = shard_positions(member, world, seq_len, "zigzag")
        return sum(2 * batch * dim * 8 * int(((pos % w) % r == offsets[h]).sum()) for h in range(heads))

    # chunks (2s, 2s + 1) form a segment: ranks pair up (0, 1), (2, 3), ...; an odd world's middle rank holds
    # its segment alone (local)
    pairs = [(a, a + 1) for a in range(0, world - 1, 2)]
    expected = [2 * len(pairs), sum(packet_bytes(a) + packet_bytes(b) for a, b in pairs)]
    for causal in (False, True):
        comm.reset_stats()
        compare(rank, world, seq_len, [2, w, seq_len], [1, r, 4], "longnet", causal, heads=heads, dim=dim,
                batch=batch, layout="zigzag")
        assert _sent("forward/branch1") == expected, f"causal={causal}: {_sent('forward/branch1')} != {expected}"
        assert _sent("backward/branch1") == [2 * x for x in expected], f"causal={causal}: backward"
        assert not any("[" in label for label in comm.STATS.by_label), f"split per segment: {comm.STATS.by_label}"
