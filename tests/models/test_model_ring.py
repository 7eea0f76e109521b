"""The ring switch: the same LongNetLM on sequence shards over 2 gloo ranks (CPU) gives the
single-process logits, gradients and training curve (float64)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gloo_world import NO_GLOO, run_world  # tests/models is on sys.path (pytest prepend import mode)

WORLD_SIZE = 2


def _rank_checks(rank: int, world_size: int, folder: str) -> None:
    from hilbert_lab.distributed import shard_positions
    from hilbert_lab.models import LongNetLM
    from hilbert_lab.models.ring import use_local_attention, use_ring_attention
    from hilbert_lab.models.train import TrainConfig, train

    # segments 8 and 16 fit in a 32-token shard (local), 64 spans both ranks (ring), dilation 2 and 4
    torch.manual_seed(0)
    model = LongNetLM(20, 32, 2, 4, [8, 16, 64], [1, 2, 4], max_seq_len=64, backend="manual").double().train()
    tokens = torch.randint(0, 20, (2, 64), generator=torch.Generator().manual_seed(1))
    upstream = torch.randn(2, 64, 20, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    full = model(tokens)
    (full * upstream).sum().backward()
    full_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    for layout in ("contiguous", "zigzag"):
        model.zero_grad(set_to_none=True)
        use_ring_attention(model, layout=layout)
        positions = shard_positions(rank, world_size, 64, layout)
        local = model(tokens[:, positions], positions)
        torch.testing.assert_close(local, full[:, positions], atol=1e-10, rtol=0)
        (local * upstream[:, positions]).sum().backward()
        for name, p in model.named_parameters():
            dist.all_reduce(p.grad)
            torch.testing.assert_close(p.grad, full_grads[name], atol=1e-10, rtol=0, msg=f"{layout} {name}")
        use_local_attention(model)
        torch.testing.assert_close(model(tokens), full, atol=1e-12, rtol=0)  # switched back, same weights

    # a length curriculum too: steps 0-1 on 32-token sequences (16 per rank), then 64
    config = dict(seq_len=64, segment_lengths=[8, 16, 64], dilation_rates=[1, 2, 4], dim=32, depth=2, num_heads=4,
                  steps=4, batch_size=4, dtype="float64", backend="manual", log_every=1, eval_every=2,
                  eval_batches=1, progress=False, curriculum=[[32, 2]])
    single = train(TrainConfig(**config))
    sharded = train(TrainConfig(ring=True, **config))
    assert [r.get("seq_len") for r in single.history if r["kind"] == "train"] == [32, 32, 64, 64]
    for a, b in zip(single.history, sharded.history):
        assert (a["kind"], a["step"], a.get("seq_len")) == (b["kind"], b["step"], b.get("seq_len"))
        assert abs(a["loss"] - b["loss"]) < 1e-10, (a, b)
    # the answers counted once over the ranks, in the same distance buckets
    assert sharded.final_eval["count"] == single.final_eval["count"] == 4
    assert sharded.final_eval["by_distance"] == single.final_eval["by_distance"]
    for (name, p), q in zip(single.model.named_parameters(), sharded.model.parameters()):
        torch.testing.assert_close(q, p, atol=1e-10, rtol=0, msg=name)


@pytest.mark.skipif(NO_GLOO, reason="torch.distributed with the gloo backend is not available in this build")
@pytest.mark.slow  # a gloo world (make test keeps one: tests/distributed/test_ring.py, two ranks)
def test_ring_sharded_model_matches_single_process(tmp_path):
    run_world(_rank_checks, WORLD_SIZE, tmp_path)
