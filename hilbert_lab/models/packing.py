"""Packed batches of the retrieval task: documents of random lengths concatenated into one row.

A packed batch holds the tokens of an unpacked one (batch_size x seq_len) in one row (1, T),
T = batch_size * seq_len: documents of lengths drawn uniformly from [min_length, seq_len], each one
retrieval sample of its own length (pairs in the same fraction of it as in the task, questions at its
end; see tasks), the last one cut to fill the row (a filler-only document without targets when the
rest is shorter than min_length). `cu_seqlens` marks the documents (the model attends each as its
own sequence), `positions` restart at 0 at each, and targets lie only at each document's questions;
the last token of every document has none, so no target crosses a boundary. Deterministic in
(task, batch_size, seed, split, step), like `tasks.make_batch`.
"""
from __future__ import annotations

import zlib
from dataclasses import replace
from typing import NamedTuple

import torch

from .positions import document_positions
from .tasks import IGNORE_INDEX, SPLITS, RetrievalTask, make_batch


class PackedBatch(NamedTuple):
    """tokens, targets (1, T) int64; cu_seqlens (documents + 1,) int64 [0, n1, ..., T]; positions (T,) int64
    (each token's position in its document); documents: how many hold questions (the last may not)."""

    tokens: torch.Tensor
    targets: torch.Tensor
    cu_seqlens: torch.Tensor
    positions: torch.Tensor
    documents: int


def min_document_length(task: RetrievalTask) -> int:
    """The shortest document of a packed row: a quarter of seq_len, and room for the pairs and questions."""
    return max(task.seq_len // 4, 2 * (task.num_pairs + task.num_queries))


def document_task(task: RetrievalTask, length: int) -> RetrievalTask:
    """The task of one document of `length` tokens: the context keeps its fraction of the sequence."""
    context = max(2 * task.num_pairs,
                  min(length - 2 * task.num_queries, task.resolved_context_length * length // task.seq_len))
    return replace(task, seq_len=length, context_length=context)


def document_lengths(task: RetrievalTask, total: int, generator: torch.Generator) -> list[int]:
    """Lengths in [min_length, seq_len] summing to `total`; the last one cut to fit (it may be shorter)."""
    low = min_document_length(task)
    lengths: list[int] = []
    while sum(lengths) < total:
        length = int(torch.randint(low, task.seq_len + 1, (), generator=generator))
        lengths.append(min(length, total - sum(lengths)))
    return lengths


def make_packed_batch(task: RetrievalTask, batch_size: int, *, seed: int = 0, split: str = "train",
                      step: int = 0) -> PackedBatch:
    """One packed row of batch_size * task.seq_len tokens (see the module docstring)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    generator = torch.Generator().manual_seed(zlib.crc32(f"pack/{int(seed)}/{split}/{int(step)}".encode()))
    lengths = document_lengths(task, batch_size * task.seq_len, generator)
    tokens, targets = [], []
    documents = 0
    for index, length in enumerate(lengths):
        if length < min_document_length(task):  # the cut last one: filler, no question
            tokens.append(torch.randint(0, task.num_filler, (length,), generator=generator))
            targets.append(torch.full((length,), IGNORE_INDEX, dtype=torch.long))
            continue
        doc_seed = zlib.crc32(f"{int(seed)}/{int(step)}/{index}".encode())
        doc_tokens, doc_targets = make_batch(document_task(task, length), 1, seed=doc_seed, split=split)
        doc_targets[0, -1] = IGNORE_INDEX
        tokens.append(doc_tokens[0])
        targets.append(doc_targets[0])
        documents += 1
    cu = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0)
    return PackedBatch(torch.cat(tokens)[None], torch.cat(targets)[None], cu, document_positions(cu), documents)
