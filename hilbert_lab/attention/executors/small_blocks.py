"""A plan's small blocks in one batched pass: the ragged tails and short sequences, gathered, not one call each.

A block of one segment with few keys (`SMALL_KEYS`: a ragged last segment, a sequence shorter than the segment)
costs a kernel call whose launch and host time dwarf its work, and a ragged length adds one such call per
(branch, offset, head group). The pass takes them together: problem p is one (block, batch element, query head)
with its queries and keys. Forward: every problem's output and LSE written into its branch's slot. Backward, from
the *merged* output and LSE like every kernel backward: dS = P (dP - rowsum(dO O) + dLSE), its shares added into
dq, dk, dv (keys shared by grouped query heads or by several branches add up; rows of a branch whose shares are
written start from zero).

Two implementations of that one pass, chosen by where it runs (`_kernels_run`):
- on CUDA (Triton; or its interpreter), kernels.triton_small_blocks: one launch forward, and backward one launch
  for the shares and two row scatters, over a `KernelPack` of int32 row indices;
- elsewhere (the CPU, float64), gathered torch operations over a `SmallPack`: one gather each of q, k, v, padded
  to the longest problem (a padded entry reads the problem's own last query or key and is masked out), one masked
  softmax in float32 (float64 for float64 inputs), indexed writes and adds.
Both packs are built once per (plan, batch size, device) and cached.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch

from hilbert_lab.attention.executors.base import Grads, Merged, Slots
from hilbert_lab.attention.plan import Block, Plan
from hilbert_lab.attention.views import plan_cached
from hilbert_lab.kernels.triton_support import runs_on
from hilbert_lab.kernels.triton_small_blocks import INPUT_DTYPES as KERNEL_DTYPES
from hilbert_lab.kernels.triton_small_blocks import (
    MAX_HEAD_DIM, scatter_rows, small_attention_backward, small_attention_forward, tile_length,
)

SMALL_KEYS = 64  # blocks of one segment with at most this many keys run in the batched pass
MIN_SMALL_BLOCKS = 2  # fewer small blocks than this keep their own kernel calls
MAX_SCORES = 1 << 24  # elements of one pass's float32 scores or gradient shares at most (64 MiB each)

__all__ = ["KernelPack", "MAX_SCORES", "SMALL_KEYS", "SmallPack", "pass_elements", "small_backward", "small_forward",
           "small_pack", "split_small"]


def _is_small(blk: Block) -> bool:
    return blk.count == 1 and blk.length <= SMALL_KEYS


def pass_elements(problems: int, queries: int, keys: int, head_dim: int) -> int:
    """A bound on the elements of a pass's largest float32 buffer (scores (P, LQ, LK), gradient shares (P * LQ, D)
    and (P * LK, D)) for P problems of up to `queries` queries and `keys` keys, padded to the kernels' tiles."""
    rows = max(tile_length(queries), tile_length(keys))
    return problems * rows * max(tile_length(keys), head_dim)


def split_small(plan: Plan, batch: int = 1, head_dim: int = 0) -> tuple[Plan, tuple[Block, ...]]:
    """(the plan without its small blocks, those blocks) when it has at least MIN_SMALL_BLOCKS of them and the
    pass's buffers for `batch` rows of head dim `head_dim` stay within MAX_SCORES elements (`pass_elements`), else
    (plan, ()). The returned plan keeps the whole plan's merge, coverage and first branch (cached per plan, batch
    and head dim)."""

    def split():
        small = tuple(blk for blk in plan.blocks if _is_small(blk))
        if len(small) < MIN_SMALL_BLOCKS:
            return plan, ()
        problems = batch * sum(blk.num_heads for blk in small)
        queries, keys = max(blk.num_queries for blk in small), max(blk.length for blk in small)
        if pass_elements(problems, queries, keys, head_dim) > MAX_SCORES:
            return plan, ()
        return replace(plan, blocks=tuple(blk for blk in plan.blocks if not _is_small(blk))), small

    return plan_cached((id(plan), "small", batch, head_dim), plan, split)


@dataclass(frozen=True)
class SmallPack:
    """The small blocks' problems as index tensors on a device. Per problem p (P of them): its branch; its query
    rows (batch, query row, head) (P, Lq) and key rows (batch, position, key/value head) (P, Lk), padded; which
    (query, key) pairs it computes (P, Lq, Lk); the flat indices of its real queries and keys in (P * Lq) and
    (P * Lk), with their rows (on the device, and on the host with each one's problem)."""

    branches: tuple[int, ...]
    query: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    key: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    allowed: torch.Tensor
    query_flat: torch.Tensor
    key_flat: torch.Tensor
    query_rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    key_rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    query_problems: torch.Tensor  # on the host: the problem of each real query, and of each real key
    key_problems: torch.Tensor
    host_query_rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # query_rows and key_rows on the host
    host_key_rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _heads(heads: slice) -> list[int]:
    return list(range(heads.start, heads.stop, heads.step or 1))


def _problems(plan: Plan, blocks: tuple[Block, ...], batch: int) -> list[tuple]:
    """Per problem: (branch, batch element, query head, kv head, query positions, key positions)."""
    problems = []
    for blk in blocks:
        heads, kv_heads = _heads(blk.heads), _heads(blk.key_heads)
        group = len(heads) // len(kv_heads)
        keys = blk.positions()[0].tolist()
        queries = keys[blk.length - blk.num_queries:]
        for b in range(batch):
            for i, head in enumerate(heads):
                problems.append((blk.branch, b, head, kv_heads[i // group], queries, keys))
    return problems


def _build(plan: Plan, blocks: tuple[Block, ...], batch: int, device: torch.device) -> SmallPack:
    problems = _problems(plan, blocks, batch)
    lq = max(len(p[4]) for p in problems)
    lk = max(len(p[5]) for p in problems)
    start = plan.query_start
    rows_q = [[(b, pos - start, h) for pos in qs] + [(b, qs[-1] - start, h)] * (lq - len(qs))
              for _, b, h, _, qs, _ in problems]
    rows_k = [[(b, pos, kv) for pos in ks] + [(b, ks[-1], kv)] * (lk - len(ks)) for _, b, _, kv, _, ks in problems]
    allowed = torch.zeros(len(problems), lq, lk, dtype=torch.bool)
    for p, (_, _, _, _, qs, ks) in enumerate(problems):
        shift = len(ks) - len(qs)  # queries are the last of the block's tokens: bottom-right causal
        allowed[p, :len(qs), :len(ks)] = True if not plan.causal else \
            torch.arange(len(ks))[None, :] <= torch.arange(shift, shift + len(qs))[:, None]
    query_flat = [p * lq + i for p, prob in enumerate(problems) for i in range(len(prob[4]))]
    key_flat = [p * lk + j for p, prob in enumerate(problems) for j in range(len(prob[5]))]

    def columns(rows, length):
        table = torch.tensor(rows, dtype=torch.int64).reshape(len(problems), length, 3)
        return tuple(table[..., c] for c in range(3))

    host_query, host_key = columns(rows_q, lq), columns(rows_k, lk)
    flat_q = torch.tensor(query_flat, dtype=torch.int64)
    flat_k = torch.tensor(key_flat, dtype=torch.int64)
    host_query_rows = tuple(c.reshape(-1)[flat_q] for c in host_query)
    host_key_rows = tuple(c.reshape(-1)[flat_k] for c in host_key)
    on = lambda tensors: tuple(t.to(device) for t in tensors)  # noqa: E731
    return SmallPack(tuple(p[0] for p in problems), on(host_query), on(host_key), allowed.to(device),
                     flat_q.to(device), flat_k.to(device), on(host_query_rows), on(host_key_rows), flat_q // lq,
                     flat_k // lk, host_query_rows, host_key_rows)


def small_pack(plan: Plan, blocks: tuple[Block, ...], q: torch.Tensor) -> SmallPack:
    """The problems of `blocks` (of `plan`) for q's batch size and device (cached per plan, batch and device)."""
    return plan_cached((id(plan), "small pack", q.shape[0], str(q.device)), plan,
                       lambda: _build(plan, blocks, q.shape[0], q.device))


def _slot_index(pack: SmallPack, slot_of: dict, device: torch.device, plan: Plan) -> torch.Tensor:
    """Per real query of the pack, the slot its branch writes (cached per plan and slot layout)."""

    def build():
        per_problem = torch.tensor([slot_of[branch] for branch in pack.branches], dtype=torch.int64)
        return per_problem[pack.query_problems].to(device)

    key = (id(plan), "small slots", len(pack.branches), tuple(sorted(slot_of.items())), str(device))
    return plan_cached(key, plan, build)


def _work_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _gathered(x: torch.Tensor, rows: tuple[torch.Tensor, ...], dtype: torch.dtype) -> torch.Tensor:
    return x[rows].to(dtype)


def _probabilities(pack: SmallPack, q_rows, k_rows, scale: float, lse: Optional[torch.Tensor] = None):
    """(softmax weights P (P, Lq, Lk), LSE (P, Lq)): the masked scores' softmax, or exp(S - lse) for a given LSE."""
    scores = torch.matmul(q_rows, k_rows.transpose(1, 2)).mul_(scale).masked_fill_(~pack.allowed, float("-inf"))
    if lse is None:
        lse = torch.logsumexp(scores, dim=-1)
    finite = torch.where(torch.isinf(lse), torch.zeros((), dtype=lse.dtype, device=lse.device), lse)
    return torch.exp(scores - finite[..., None]), lse


def _gathered_forward(plan: Plan, pack: SmallPack, q, k, v, slots: Slots, *, scale: float) -> None:
    dtype = _work_dtype(q)
    weights, lse = _probabilities(pack, _gathered(q, pack.query, dtype), _gathered(k, pack.key, dtype), scale)
    out = torch.matmul(weights, _gathered(v, pack.key, dtype))
    slot = _slot_index(pack, slots.slot_of, q.device, plan)
    rows = (slot, *pack.query_rows)
    slots.outs.index_put_(rows, out.flatten(0, 1)[pack.query_flat].to(slots.outs.dtype))
    slots.lses.index_put_(rows, lse.flatten()[pack.query_flat].to(slots.lses.dtype))


def _store(grads: Grads, index: int, rows: tuple, share: Optional[torch.Tensor], owned: Optional[tuple]) -> None:
    """Add a share into dq / dk / dv at `rows` (repeated rows add up); the rows of problems whose branch's shares
    are written (`owned`: their totals hold nothing yet) are cleared first. share None: only the clearing."""
    total = grads.total(index)
    if owned is not None:
        total.index_put_(owned, torch.zeros((), dtype=total.dtype, device=total.device))
    if share is not None:
        total.index_put_(rows, share.to(total.dtype), accumulate=True)


def _gathered_backward(plan: Plan, pack: SmallPack, q, k, v, merged: Merged, grads: Grads, *, scale: float) -> None:
    dtype = _work_dtype(q)
    q_rows, k_rows, v_rows = (_gathered(x, rows, dtype) for x, rows in ((q, pack.query), (k, pack.key),
                                                                         (v, pack.key)))
    lse = merged.lse.transpose(1, 2)[pack.query].to(dtype)  # (P, Lq) of the merged (B, Nq, H) LSE
    weights, _ = _probabilities(pack, q_rows, k_rows, scale, lse)
    ds, grad_v = None, None
    if merged.grad_out is not None:
        grad_out = _gathered(merged.grad_out, pack.query, dtype)
        grad_v = torch.matmul(weights.transpose(1, 2), grad_out).flatten(0, 1)[pack.key_flat]
        delta = (grad_out * _gathered(merged.out, pack.query, dtype)).sum(-1, keepdim=True)
        ds = weights * (torch.matmul(grad_out, v_rows.transpose(1, 2)) - delta)
    if merged.grad_lse is not None:
        lse_share = weights * merged.grad_lse.transpose(1, 2)[pack.query].to(dtype)[..., None]
        ds = lse_share if ds is None else ds + lse_share
    if ds is None:
        ds = torch.zeros_like(weights)
    grad_q = torch.matmul(ds, k_rows).mul_(scale).flatten(0, 1)[pack.query_flat]
    grad_k = torch.matmul(ds.transpose(1, 2), q_rows).mul_(scale).flatten(0, 1)[pack.key_flat]
    owned_q, owned_k = _owned_rows(pack, grads, q.device, plan)
    _store(grads, 0, pack.query_rows, grad_q, owned_q)
    _store(grads, 1, pack.key_rows, grad_k, owned_k)
    _store(grads, 2, pack.key_rows, grad_v, owned_k)


def _owned_rows(pack: SmallPack, grads: Grads, device: torch.device, plan: Plan) -> tuple[Optional[tuple], ...]:
    """The (query rows, key rows) of the problems whose branch's shares are written (Grads.owned), or None where
    there are none (cached per plan and ownership rule: whether shares add, and the first branch)."""
    if grads.accumulate and grads.first_branch not in pack.branches:
        return None, None

    def build():
        per_problem = torch.tensor([grads.owned(branch) for branch in pack.branches], dtype=torch.bool)
        return tuple(tuple(column[per_problem[problems]].to(device) for column in rows)
                     for problems, rows in ((pack.query_problems, pack.host_query_rows),
                                            (pack.key_problems, pack.host_key_rows)))

    key = (id(plan), "small owned", len(pack.branches), grads.accumulate, grads.first_branch, str(device))
    return plan_cached(key, plan, build)


@dataclass(frozen=True)
class KernelPack:
    """The small blocks' problems for the kernels (kernels.triton_small_blocks) on a device: query_rows (P, LQ, 3)
    and key_rows (P, LK, 3) int32 (batch, position, head; LQ, LK tile lengths), lengths (P, 2) int32 (queries,
    keys); on the host, each problem's branch and its real query and key rows."""

    query_rows: torch.Tensor
    key_rows: torch.Tensor
    lengths: torch.Tensor
    branches: tuple[int, ...]
    host_queries: tuple[tuple[tuple[int, int, int], ...], ...]
    host_keys: tuple[tuple[tuple[int, int, int], ...], ...]


def _kernel_pack(plan: Plan, blocks: tuple[Block, ...], q: torch.Tensor) -> KernelPack:
    """The problems of `blocks` (of `plan`) for the kernels, on q's device (cached per plan, batch and device)."""

    def build():
        problems = _problems(plan, blocks, q.shape[0])
        start = plan.query_start
        queries = tuple(tuple((b, pos - start, h) for pos in qs) for _, b, h, _, qs, _ in problems)
        keys = tuple(tuple((b, pos, kv) for pos in ks) for _, b, _, kv, _, ks in problems)

        def table(rows):
            out = torch.zeros(len(rows), tile_length(max(len(r) for r in rows)), 3, dtype=torch.int32)
            for p, r in enumerate(rows):
                out[p, :len(r)] = torch.tensor(r, dtype=torch.int32)
            return out

        lengths = torch.tensor([(len(qs), len(ks)) for qs, ks in zip(queries, keys)], dtype=torch.int32)
        return KernelPack(table(queries).to(q.device), table(keys).to(q.device), lengths.to(q.device),
                          tuple(p[0] for p in problems), queries, keys)

    return plan_cached((id(plan), "small kernel pack", q.shape[0], str(q.device)), plan, build)


def _kernel_slots(pack: KernelPack, slot_of: dict, device: torch.device, plan: Plan) -> torch.Tensor:
    """Per problem, the slot its branch writes (int32; cached per plan and slot layout)."""
    key = (id(plan), "small kernel slots", len(pack.branches), tuple(sorted(slot_of.items())), str(device))
    return plan_cached(key, plan, lambda: torch.tensor([slot_of[b] for b in pack.branches], dtype=torch.int32)
                       .to(device))


def _scatter_plan(pack: KernelPack, grads: Grads, device: torch.device, plan: Plan) -> tuple[tuple, tuple]:
    """For the query rows and the key rows: (destination rows (R, 3), starts (R + 1), members, owned (R,), the
    most members of a row) for kernels.triton_small_blocks.scatter_rows. A row is owned when a problem of a branch
    whose shares are written (Grads.owned) reaches it (cached per plan and ownership rule)."""

    def one(rows_per_problem, tile):
        members: dict[tuple[int, int, int], list[int]] = {}
        owned: dict[tuple[int, int, int], bool] = {}
        for p, (rows, branch) in enumerate(zip(rows_per_problem, pack.branches)):
            for i, row in enumerate(rows):
                members.setdefault(row, []).append(p * tile + i)
                owned[row] = owned.get(row, False) or grads.owned(branch)
        order = sorted(members)
        counts = [len(members[row]) for row in order]
        starts = torch.cumsum(torch.tensor([0] + counts), 0).to(torch.int32)
        flat = torch.tensor([m for row in order for m in members[row]], dtype=torch.int32)
        return (torch.tensor(order, dtype=torch.int32).to(device), starts.to(device), flat.to(device),
                torch.tensor([owned[row] for row in order], dtype=torch.int8).to(device), max(counts))

    key = (id(plan), "small scatter", len(pack.branches), grads.accumulate, grads.first_branch, str(device))
    return plan_cached(key, plan, lambda: (one(pack.host_queries, pack.query_rows.shape[1]),
                                           one(pack.host_keys, pack.key_rows.shape[1])))


def _kernels_run(*tensors: torch.Tensor) -> bool:
    """Whether the kernels run the pass for these inputs: Triton on a CUDA device (or its interpreter), one dtype
    the kernels take, a head dim of at most MAX_HEAD_DIM, every last dim contiguous."""
    q = tensors[0]
    return runs_on(q.device) and q.dtype in KERNEL_DTYPES and \
        q.shape[-1] <= MAX_HEAD_DIM and all(t.dtype == q.dtype and t.stride(-1) == 1 for t in tensors)


def small_forward(plan: Plan, blocks: tuple[Block, ...], q, k, v, slots: Slots, *, scale: float) -> None:
    """Every small problem's output and LSE, written into its branch's slot: one kernel launch where the kernels
    run (`_kernels_run`), else gathered torch operations."""
    if not _kernels_run(q, k, v, slots.outs):
        _gathered_forward(plan, small_pack(plan, blocks, q), q, k, v, slots, scale=scale)
        return
    pack = _kernel_pack(plan, blocks, q)
    small_attention_forward(q, k, v, pack.query_rows, pack.key_rows, pack.lengths,
                            _kernel_slots(pack, slots.slot_of, q.device, plan), slots.outs, slots.lses, scale=scale,
                            causal=plan.causal)


def small_backward(plan: Plan, blocks: tuple[Block, ...], q, k, v, merged: Merged, grads: Grads, *,
                   scale: float) -> None:
    """Every small problem's share of dq, dk, dv for the merged (out, lse), added into `grads` (owned rows
    written): three kernel launches where the kernels run, else gathered torch operations."""
    out = merged.out if merged.out.stride(-1) == 1 else merged.dense("out")
    grad_out = merged.grad_out
    if grad_out is not None and grad_out.stride(-1) != 1:
        grad_out = merged.dense("grad_out")
    if not _kernels_run(q, k, v, out, *(() if grad_out is None else (grad_out,))):
        _gathered_backward(plan, small_pack(plan, blocks, q), q, k, v, merged, grads, scale=scale)
        return
    pack = _kernel_pack(plan, blocks, q)
    lse = merged.lse if merged.lse.dtype == torch.float32 else merged.lse.float()
    grad_lse = None if merged.grad_lse is None else merged.grad_lse.float()
    dq, dk, dv = small_attention_backward(q, k, v, out, grad_out, lse, grad_lse, pack.query_rows, pack.key_rows,
                                          pack.lengths, scale=scale, causal=plan.causal)
    query_plan, key_plan = _scatter_plan(pack, grads, q.device, plan)
    rows, starts, members, owned, most = query_plan
    scatter_rows((dq,), (grads.dq,), rows, starts, members, owned, max_count=most)
    rows, starts, members, owned, most = key_plan
    scatter_rows((dk, dv), (grads.dk, grads.dv), rows, starts, members, owned, max_count=most)
