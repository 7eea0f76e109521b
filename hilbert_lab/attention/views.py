"""Kernel-call views of a plan: its blocks grouped into units, each unit as strided views of the tensors.

A unit is what one set of kernel calls reads: one block (its heads on the kernel's head axis), or G
blocks of one branch with consecutive offsets o0 + g whose heads shift by a constant, read as one view
whose "head" axis walks the G offsets together (address step: one position plus the head shift), one
call per head of a block. Each call's views are (b, L, h, D) (the kernels' (B, L, H, D) convention)
of the caller's (B, N, H, D) tensors in their own memory: queries, outputs, their gradients and the
LSE (viewed as (B, Nq, H)) by the block's query geometry, keys, values and their gradients by its key
geometry. The batch folds with the segments into the call's batch axis where every tensor's strides
allow it; otherwise each batch element is its own call. Nothing here copies.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hilbert_lab.attention.plan import Block, Plan

QUERY, KEY = "query", "key"


@dataclass(frozen=True)
class Unit:
    """Blocks run by one set of kernel calls: one block, or G blocks of one branch with consecutive
    offsets and query heads h0 + g * head_shift + i * step (key heads likewise with kv_shift)."""

    blocks: tuple[Block, ...]
    head_shift: int = 0
    kv_shift: int = 0

    @property
    def branch(self) -> int:
        return self.blocks[0].branch

    @property
    def first(self) -> Block:
        return self.blocks[0]

    @property
    def calls_per_piece(self) -> int:
        """Kernel calls per batch piece: one for a single block, one per head of a block when folded."""
        return 1 if len(self.blocks) == 1 else self.first.num_heads

    def heads_per_call(self, role: str) -> int:
        """Heads on the kernel's head axis in one call."""
        if len(self.blocks) > 1:
            return len(self.blocks)
        return self.first.num_heads if role == QUERY else self.first.num_kv_heads


_CACHE: dict[tuple, tuple] = {}  # (id(plan), ...) -> (plan, value): the plan is kept so its id stays its own


def plan_cached(key: tuple, plan: Plan, compute):
    """compute() for `plan`, remembered under key ((id(plan), what, ...)) while that plan object lives in the
    cache: per-plan call geometry that the executors derive once and reuse on every call."""
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is plan:
        return hit[1]
    if len(_CACHE) > 512:
        _CACHE.clear()
    value = compute()
    _CACHE[key] = (plan, value)
    return value


def plan_cached_values(*plans: Plan) -> list:
    """Every value `plan_cached` holds for these plan objects: the device metadata a CUDA graph of their calls reads
    must live as long as that graph, whatever the cache drops."""
    return [value for owner, value in list(_CACHE.values()) if any(owner is plan for plan in plans)]


def plan_units(plan: Plan) -> tuple[Unit, ...]:
    """The plan's blocks grouped into units (fewer kernel calls where offsets fold into one view)."""
    return plan_cached((id(plan), "units"), plan, lambda: _units(plan))


def _units(plan: Plan) -> tuple[Unit, ...]:
    groups: dict[tuple, list[Block]] = {}
    for blk in plan.blocks:
        key = (blk.branch, blk.start, blk.count, blk.seg, blk.step, blk.length, blk.num_queries, blk.num_heads,
               blk.num_kv_heads, blk.heads.step or 1, blk.key_heads.step or 1)
        groups.setdefault(key, []).append(blk)
    units = []
    for members in groups.values():
        members.sort(key=lambda b: b.offset)
        shifts = {b.heads.start - a.heads.start for a, b in zip(members, members[1:])}
        kv_shifts = {b.key_heads.start - a.key_heads.start for a, b in zip(members, members[1:])}
        consecutive = all(b.offset == a.offset + 1 for a, b in zip(members, members[1:]))
        one_kv_per_head = members[0].num_kv_heads == members[0].num_heads
        if len(members) > 1 and consecutive and len(shifts) == 1 and len(kv_shifts) == 1 and one_kv_per_head \
                and members[0].num_heads < len(members):
            units.append(Unit(tuple(members), shifts.pop(), kv_shifts.pop()))
        else:
            units.extend(Unit((b,)) for b in members)
    return tuple(units)


def _calls(unit: Unit, role: str, stride: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """Per call of a batch piece: (heads, head stride, storage shift) of the unit's head axis."""
    first = unit.first
    s_n, s_h = stride[1], stride[2]
    heads = first.heads if role == QUERY else first.key_heads
    head_step = (heads.step or 1) * s_h
    if len(unit.blocks) == 1:
        return [(unit.heads_per_call(role), head_step, 0)]
    shift = unit.head_shift if role == QUERY else unit.kv_shift
    return [(len(unit.blocks), s_n + shift * s_h, i * head_step) for i in range(first.num_heads)]


def _base(unit: Unit, role: str, stride: tuple[int, ...], query_start: int) -> int:
    first = unit.first
    s_n, s_h = stride[1], stride[2]
    if role == QUERY:
        position = first.start + first.offset + (first.length - first.num_queries) * first.step - query_start
        return position * s_n + first.heads.start * s_h
    return (first.start + first.offset) * s_n + first.key_heads.start * s_h


def folds(unit: Unit, tensors: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> bool:
    """Whether the batch folds with the unit's segments in every (shape, stride) of `tensors`."""
    first = unit.first
    if first.count == 1:
        return True
    return all(shape[0] == 1 or stride[0] == first.count * first.seg * stride[1] for shape, stride in tensors)


def unit_pieces(unit: Unit, role: str, shape: tuple[int, ...], stride: tuple[int, ...], fold: bool,
                query_start: int = 0) -> tuple[tuple[tuple[int, ...], tuple[int, ...], int], ...]:
    """((size, stride, storage offset delta), ...): the unit's kernel-call views (b, L, h, *rest) of a
    tensor of `shape` / `stride` (B, N, H, *rest), batch pieces outer, calls inner."""
    first = unit.first
    s_b, s_n = stride[0], stride[1]
    rest_size, rest_stride = tuple(shape[3:]), tuple(stride[3:])
    length = first.num_queries if role == QUERY else first.length
    base = _base(unit, role, stride, query_start)
    batches = [(shape[0] * first.count, first.seg * s_n if first.count > 1 else s_b, 0)] if fold else \
        [(first.count, first.seg * s_n, b * s_b) for b in range(shape[0])]
    pieces = []
    for batch, batch_stride, batch_shift in batches:
        for heads, head_stride, shift in _calls(unit, role, stride):
            pieces.append(((batch, length, heads) + rest_size, (batch_stride, first.step * s_n, head_stride) + rest_stride,
                           base + batch_shift + shift))
    return tuple(pieces)


def plan_views(plan: Plan, tensors: list[tuple[torch.Tensor, str]],
               folds_given: tuple[bool, ...] | None = None) -> tuple[tuple[bool, ...], list[list[tuple[torch.Tensor, ...]]]]:
    """(per unit whether its batch folds, per unit per kernel call one (b, L, h, *rest) view of each
    (tensor, role)). A unit's batch folds with its segments where it folds for every tensor, unless
    `folds_given` says (a backward repeats its forward's calls; a tensor that does not fold must then be
    contiguous like one that does). The geometry is cached per plan and tensor shapes and strides, so
    each call costs its as_strided views alone."""
    geometry = tuple((tuple(t.shape), t.stride(), role) for t, role in tensors)
    key = (id(plan), "views", geometry, folds_given)
    layout = plan_cached(key, plan, lambda: _plan_layout(plan, geometry, folds_given))
    fold_flags, per_unit = layout
    views = []
    for specs in per_unit:
        unit_calls = []
        for call in specs:
            unit_calls.append(tuple(t.as_strided(size, stride, t.storage_offset() + delta)
                                    for (t, _), (size, stride, delta) in zip(tensors, call)))
        views.append(unit_calls)
    return fold_flags, views


def _plan_layout(plan: Plan, geometry, folds_given):
    fold_flags, per_unit = [], []
    for index, unit in enumerate(plan_units(plan)):
        fold = folds(unit, [(shape, stride) for shape, stride, _ in geometry]) if folds_given is None \
            else folds_given[index]
        pieces = [unit_pieces(unit, role, shape, stride, fold, plan.query_start) for shape, stride, role in geometry]
        fold_flags.append(fold)
        per_unit.append(list(zip(*pieces)))
    return tuple(fold_flags), per_unit


def unit_views(unit: Unit, tensors: list[tuple[torch.Tensor, str]], query_start: int = 0,
               fold: bool | None = None) -> tuple[bool, list[tuple[torch.Tensor, ...]]]:
    """(fold, per kernel call of the unit one (b, L, h, *rest) view of each (tensor, role)): one unit's
    views, uncached (see `plan_views`)."""
    if fold is None:
        fold = folds(unit, [(tuple(t.shape), t.stride()) for t, _ in tensors])
    per_tensor = []
    for t, role in tensors:
        offset = t.storage_offset()
        pieces = unit_pieces(unit, role, tuple(t.shape), t.stride(), fold, query_start)
        per_tensor.append([t.as_strided(size, stride, offset + delta) for size, stride, delta in pieces])
    return fold, list(zip(*per_tensor))


def call_shapes(plan: Plan, batch: int, fold_all: bool) -> list[tuple[int, int, int, int]]:
    """(batch, query length, key length, query heads) of every kernel call of the plan, in order, for
    contiguous (B, N, H, D) inputs (fold_all: the batch folds wherever one segment run covers all N)."""
    shapes = []
    for unit in plan_units(plan):
        first = unit.first
        fold = batch == 1 or first.count == 1 or (fold_all and first.count * first.seg == plan.seq_len
                                                  and plan.queries == plan.seq_len)
        pieces = 1 if fold else batch
        call = (batch * first.count if fold else first.count, first.num_queries, first.length,
                unit.heads_per_call(QUERY))
        shapes.extend([call] * (pieces * unit.calls_per_piece))
    return shapes
