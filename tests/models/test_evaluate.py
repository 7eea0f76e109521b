"""Evaluation statistics: Wilson interval, needle positions, per-distance buckets, the end-of-run eval."""
from __future__ import annotations

import math

import pytest
import torch

from hilbert_lab.models.evaluate import (
    bucket_rows, distance_bucket, num_distance_buckets, pooled_accuracy, wilson_interval,
)
from hilbert_lab.models.tasks import RetrievalTask, answer_positions, make_batch
from hilbert_lab.models.train import TrainConfig, evaluate, train


@pytest.mark.parametrize("successes,total,expected", [
    (0, 10, (0.0, 0.2775)), (5, 10, (0.2366, 0.7634)), (17, 20, (0.6396, 0.9476)), (10, 10, (0.7225, 1.0)),
    (480, 512, (0.9131, 0.9554)),
])
def test_wilson_interval_known_values(successes, total, expected):
    low, high = wilson_interval(successes, total)
    assert low == pytest.approx(expected[0], abs=1e-4) and high == pytest.approx(expected[1], abs=1e-4)


def test_wilson_interval_edges_and_bad_input():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(3, 7)
    assert low < 3 / 7 < high
    narrow = wilson_interval(300, 700)
    assert narrow[0] > low and narrow[1] < high  # more samples, narrower
    for args in ((5, 4), (-1, 4), (1, -1)):
        with pytest.raises(ValueError, match="successes and total"):
            wilson_interval(*args)


def test_pooled_accuracy_sums_counts():
    pooled = pooled_accuracy([{"correct": 10, "count": 20, "accuracy": 0.5}, {"correct": 30, "count": 40, "accuracy": 0.75}])
    assert pooled["count"] == 60 and pooled["correct"] == 40 and pooled["accuracy"] == pytest.approx(40 / 60)
    assert (pooled["accuracy_low"], pooled["accuracy_high"]) == wilson_interval(40, 60)


def test_distance_buckets():
    d = torch.tensor([1, 2, 3, 4, 7, 8, 1023, 1024])
    assert distance_bucket(d).tolist() == [0, 1, 1, 2, 2, 3, 9, 10]
    assert num_distance_buckets(1024) == 10 and num_distance_buckets(1025) == 11
    with pytest.raises(ValueError, match="distance"):
        distance_bucket(torch.tensor([0]))
    rows = bucket_rows([0, 3, 0], [0, 4, 2])
    assert [(r["distance_low"], r["distance_high"], r["count"], r["accuracy"]) for r in rows] == [(2, 4, 4, 0.75), (4, 8, 2, 0.0)]


@pytest.mark.parametrize("num_pairs,num_queries", [(1, 1), (5, 3)])
def test_needles_leave_the_tokens_unchanged_and_point_at_the_asked_pair(num_pairs, num_queries):
    task = RetrievalTask(seq_len=128, num_pairs=num_pairs, num_queries=num_queries, num_keys=8, context_length=96)
    tokens, targets = make_batch(task, 16, seed=4, split="eval", step=3)
    again, again_targets, needles = make_batch(task, 16, seed=4, split="eval", step=3, with_needles=True)
    assert torch.equal(tokens, again) and torch.equal(targets, again_targets)
    assert needles.shape == (16, num_queries) and needles.lt(96).all() and needles.remainder(2).eq(0).all()
    queries = answer_positions(task)
    rows = torch.arange(16)[:, None]
    assert torch.equal(tokens[rows, needles], tokens[:, queries])  # the key the query asks
    assert torch.equal(tokens[rows, needles + 1], targets[:, queries])  # followed by its value


class _ReachLimited(torch.nn.Module):
    """Answers a query right when the asked key lies less than ``reach`` tokens before it, else wrongly."""

    def __init__(self, task: RetrievalTask, reach: int):
        super().__init__()
        self.task, self.reach = task, reach

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, n = tokens.shape
        logits = torch.zeros(b, n, self.task.vocab_size)
        for q in answer_positions(self.task).tolist():
            for row in range(b):
                key = int(tokens[row, q])
                position = int((tokens[row, :q] == key).nonzero()[0])
                value = int(tokens[row, position + 1])
                wrong = self.task.value_offset + (value - self.task.value_offset + 1) % self.task.num_values
                logits[row, q, value if q - position < self.reach else wrong] = 10.0
        return logits


def test_evaluate_by_distance_against_a_known_reach():
    config = TrainConfig(seq_len=256, context_length=250, num_keys=8, num_values=8, batch_size=16, eval_batches=4,
                         segment_lengths=[16, 256], dilation_rates=[1, 1])
    task = config.task()
    result = evaluate(_ReachLimited(task, 64), config, by_distance=True)
    assert result["count"] == 64
    rows = result["by_distance"]
    assert sum(r["count"] for r in rows) == 64
    for row in rows:  # reach 64 is a bucket edge: buckets below it all right, above it all wrong
        assert row["accuracy"] == (1.0 if row["distance_high"] <= 64 else 0.0)
        assert (row["accuracy_low"], row["accuracy_high"]) == wilson_interval(row["correct"], row["count"])
    near = sum(r["correct"] for r in rows)
    assert result["correct"] == near and result["accuracy"] == pytest.approx(near / 64)
    assert (result["accuracy_low"], result["accuracy_high"]) == wilson_interval(near, 64)
    # logit 10 on one token of the vocabulary, 0 on the others: log(e^10 + V - 1) nats, less 10 when it is right
    spread = math.log(math.exp(10.0) + task.vocab_size - 1)
    assert result["loss"] == pytest.approx(spread - 10.0 * near / 64, rel=1e-6)


def test_final_eval_uses_final_eval_batches_and_buckets():
    config = TrainConfig(seq_len=32, context_length=24, segment_lengths=[8, 32], dilation_rates=[1, 2], dim=16,
                         num_heads=2, steps=4, batch_size=4, eval_every=2, eval_batches=1, final_eval_batches=3,
                         progress=False)
    result = train(config)
    evals = [r for r in result.history if r["kind"] == "eval"]
    assert [r["count"] for r in evals] == [4, 12]
    assert "by_distance" not in evals[0] and sum(r["count"] for r in evals[1]["by_distance"]) == 12
    assert result.final_eval["count"] == 12
    with pytest.raises(ValueError, match="final_eval_batches"):
        TrainConfig(final_eval_batches=0)
