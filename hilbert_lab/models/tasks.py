"""Synthetic long-range retrieval task: key-value pairs scattered over a sequence, queries at the end.

Layout of one sample of length ``seq_len`` (nothing is downloaded, every batch is a pure function of
``(seed, split, step)``):

    [filler ... k_a v_a ... filler ... k_b v_b ... filler | filler ... | q_1 a_1 q_2 a_2 ... q_Q a_Q]
     <------------- context: positions [0, context_length) ----------->           <- 2*Q tokens ->

* vocabulary: ``num_filler`` filler ids, then ``num_keys`` key ids, then ``num_values`` value ids;
* ``num_pairs`` pairs (distinct keys, values uniform with replacement) sit in non-overlapping
  two-token slots ``(2j, 2j+1)`` inside ``[0, context_length)``;
* the last ``2 * num_queries`` tokens ask ``num_queries`` distinct stored keys, each followed by its
  value (teacher forcing); the target at a query-key position is the value (the next token), every
  other target is ``IGNORE_INDEX``.

With ``num_pairs == 1`` this is needle retrieval; with more pairs it is multi-query associative recall
(MQAR). The chance level of the answer is ``1 / num_values`` (loss ``log(num_values)``): a model that
cannot see the context positions can do no better, because the values are independent of all tokens
outside the pair slots.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch

IGNORE_INDEX = -100
SPLITS = ("train", "eval")


@dataclass(frozen=True)
class RetrievalTask:
    """Parameters of the retrieval task (validated on construction; see the module docstring)."""

    seq_len: int
    num_pairs: int = 1
    num_queries: int = 1
    num_keys: int = 16
    num_values: int = 16
    num_filler: int = 4
    context_length: int | None = None

    def __post_init__(self) -> None:
        for name in ("seq_len", "num_pairs", "num_queries", "num_keys", "num_values", "num_filler"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_pairs > self.num_keys:
            raise ValueError(
                f"num_pairs must be <= num_keys (keys are distinct), got num_pairs={self.num_pairs}, "
                f"num_keys={self.num_keys}"
            )
        if self.num_queries > self.num_pairs:
            raise ValueError(
                f"num_queries must be <= num_pairs, got num_queries={self.num_queries}, "
                f"num_pairs={self.num_pairs}"
            )
        limit = self.seq_len - 2 * self.num_queries
        context = self.resolved_context_length
        if isinstance(context, bool) or not isinstance(context, int) or not 2 * self.num_pairs <= context <= limit:
            raise ValueError(
                f"context_length must be an integer in [2*num_pairs, seq_len - 2*num_queries] = "
                f"[{2 * self.num_pairs}, {limit}], got {context!r}"
            )

    @property
    def resolved_context_length(self) -> int:
        """Positions ``[0, context_length)`` hold the pairs (default: everything before the queries)."""
        return self.seq_len - 2 * self.num_queries if self.context_length is None else self.context_length

    @property
    def vocab_size(self) -> int:
        return self.num_filler + self.num_keys + self.num_values

    @property
    def key_offset(self) -> int:
        return self.num_filler

    @property
    def value_offset(self) -> int:
        return self.num_filler + self.num_keys

    @property
    def chance_loss(self) -> float:
        """Cross-entropy of the uniform guess over the values: ``log(num_values)``."""
        return math.log(self.num_values)

    @property
    def chance_accuracy(self) -> float:
        return 1.0 / self.num_values

    @property
    def first_query_position(self) -> int:
        return self.seq_len - 2 * self.num_queries

    @property
    def min_key_query_distance(self) -> int:
        """Smallest distance from any context position to any query position."""
        return self.first_query_position - (self.resolved_context_length - 1)


def _generator(seed: int, split: str, step: int) -> torch.Generator:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    salt = zlib.crc32(f"{int(seed)}/{split}/{int(step)}".encode())
    return torch.Generator().manual_seed(salt)


def _random_subset(batch_size: int, population: int, count: int, generator: torch.Generator) -> torch.Tensor:
    """(batch_size, count) distinct integers from [0, population) per row, in random order."""
    return torch.rand(batch_size, population, generator=generator).argsort(dim=1)[:, :count]


def make_batch(
    task: RetrievalTask, batch_size: int, *, seed: int = 0, split: str = "train", step: int = 0,
    with_needles: bool = False,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One batch: ``tokens`` (B, N) int64 and ``targets`` (B, N) int64 (``IGNORE_INDEX`` off-answer).

    Deterministic in ``(task, batch_size, seed, split, step)``; "train" and "eval" streams differ.
    ``with_needles=True`` also returns ``needles`` (B, Q) int64: the position of the key of the pair
    that query q asks (its value sits one later; query q sits at ``answer_positions(task)[q]``).
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    generator = _generator(seed, split, step)
    n, b = task.seq_len, batch_size
    tokens = torch.randint(0, task.num_filler, (b, n), generator=generator)
    slots = _random_subset(b, task.resolved_context_length // 2, task.num_pairs, generator)  # (B, P)
    keys = _random_subset(b, task.num_keys, task.num_pairs, generator) + task.key_offset  # (B, P)
    values = torch.randint(0, task.num_values, (b, task.num_pairs), generator=generator) + task.value_offset
    rows = torch.arange(b).unsqueeze(1)
    tokens[rows, 2 * slots] = keys
    tokens[rows, 2 * slots + 1] = values
    asked = _random_subset(b, task.num_pairs, task.num_queries, generator)  # (B, Q) pair indices
    query_positions = task.first_query_position + 2 * torch.arange(task.num_queries)
    tokens[:, query_positions] = keys.gather(1, asked)
    tokens[:, query_positions + 1] = values.gather(1, asked)
    targets = torch.full((b, n), IGNORE_INDEX, dtype=torch.long)
    targets[:, query_positions] = values.gather(1, asked)
    if with_needles:  # same draws as without: the tokens of a (seed, split, step) do not change
        return tokens, targets, 2 * slots.gather(1, asked)
    return tokens, targets


def answer_positions(task: RetrievalTask) -> torch.Tensor:
    """(num_queries,) int64 positions whose target is a value (the query-key positions)."""
    return task.first_query_position + 2 * torch.arange(task.num_queries)
