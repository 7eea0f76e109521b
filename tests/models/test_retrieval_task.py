"""The synthetic retrieval task: layout, determinism, independence of answers from the tail, bad input."""
from __future__ import annotations

import math

import pytest
import torch

from hilbert_lab.models.tasks import IGNORE_INDEX, RetrievalTask, answer_positions, make_batch


def _pairs(tokens_row: torch.Tensor, task: RetrievalTask) -> dict[int, int]:
    """key -> value for the pairs stored in the context of one sample."""
    context = tokens_row[: task.resolved_context_length]
    found = {}
    for position in range(0, task.resolved_context_length - 1, 2):
        key, value = int(context[position]), int(context[position + 1])
        if task.key_offset <= key < task.value_offset:
            assert task.value_offset <= value < task.vocab_size
            found[key] = value
    return found


@pytest.mark.parametrize("num_pairs,num_queries", [(1, 1), (6, 3), (8, 8)])
def test_layout_answers_are_the_stored_values(num_pairs, num_queries):
    task = RetrievalTask(seq_len=96, num_pairs=num_pairs, num_queries=num_queries, num_keys=8, num_values=5,
                         context_length=60)
    tokens, targets = make_batch(task, 32, seed=3, step=7)
    assert tokens.shape == targets.shape == (32, 96) and tokens.dtype == torch.int64
    positions = answer_positions(task)
    assert positions.tolist() == [96 - 2 * num_queries + 2 * i for i in range(num_queries)]
    mask = targets != IGNORE_INDEX
    assert mask.sum(dim=1).eq(num_queries).all()
    assert mask[:, positions].all()
    for row in range(32):
        stored = _pairs(tokens[row], task)
        assert len(stored) == num_pairs  # distinct keys, all inside the context
        asked = tokens[row, positions].tolist()
        assert len(set(asked)) == num_queries
        for position, key in zip(positions.tolist(), asked):
            assert targets[row, position] == stored[key] == tokens[row, position + 1]
        # between the context and the queries: only filler
        assert tokens[row, 60 : 96 - 2 * num_queries].lt(task.num_filler).all()
        # the context holds no key/value tokens outside the pair slots
        kv_positions = (tokens[row, :60] >= task.num_filler).nonzero().flatten().tolist()
        assert len(kv_positions) == 2 * num_pairs


def test_deterministic_per_step_and_split():
    task = RetrievalTask(seq_len=64, num_pairs=3, num_queries=2)
    a = make_batch(task, 8, seed=1, step=5)
    b = make_batch(task, 8, seed=1, step=5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], make_batch(task, 8, seed=1, step=6)[0])
    assert not torch.equal(a[0], make_batch(task, 8, seed=2, step=5)[0])
    assert not torch.equal(a[0], make_batch(task, 8, seed=1, split="eval", step=5)[0])


def test_values_are_uniform_and_independent_of_the_query_key():
    """The premise of the blindness test: the answer is uniform given everything after the context."""
    task = RetrievalTask(seq_len=32, num_pairs=1, num_queries=1, num_keys=4, num_values=4)
    tokens, targets = make_batch(task, 8000, seed=0)
    answers = targets[:, -2] - task.value_offset
    query_keys = tokens[:, -2] - task.key_offset
    joint = torch.zeros(4, 4)
    joint.index_put_((query_keys, answers), torch.ones(8000), accumulate=True)
    expected = 8000 / 16
    chi_square = float(((joint - expected) ** 2 / expected).sum())
    assert chi_square < 40.0  # 15 degrees of freedom: p < 1e-3 for an independent uniform table
    assert task.chance_loss == pytest.approx(math.log(4))


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(seq_len=0), "seq_len"),
        (dict(seq_len=16, num_pairs=5, num_keys=4), "num_pairs"),
        (dict(seq_len=16, num_pairs=2, num_queries=3), "num_queries"),
        (dict(seq_len=16, num_pairs=2, context_length=20), "context_length"),
        (dict(seq_len=16, num_pairs=4, context_length=6), "context_length"),
        (dict(seq_len=16, num_values=0), "num_values"),
    ],
)
def test_bad_task_parameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        RetrievalTask(**kwargs)


def test_bad_batch_arguments():
    task = RetrievalTask(seq_len=16)
    with pytest.raises(ValueError, match="batch_size"):
        make_batch(task, 0)
    with pytest.raises(ValueError, match="split"):
        make_batch(task, 2, split="test")
    with pytest.raises(ValueError, match="step"):
        make_batch(task, 2, step=-1)
