"""The per-rank memory of ring attention (contiguous layout): `estimate_memory_per_rank(config)`.

A rank's buffers are those of the ring's pipelines (distributed.steps), placed here term by term, while
everything that runs attention code is a dry run on meta tensors (attention.dry_run): the shard's local part, one
kernel call of a ring step (forward and backward: its outputs and work), the running merge of a step's result and
the merge of the slots. World size 1 is attention.memory.estimate_memory itself.

Per rank (shard n = N / P), a ring branch of m members selects rows = B * ceil(n / r) * h rows of its h heads
on each member: its packet holds K and V (2 g, g = rows * D * element), the running result S = rows * (D + 1)
* lse bytes. Forward, per ring branch: the packet being computed and the one in flight (one alone when m = 1;
the own packet is released once sent, so with m = 2 the second call holds one), this rank's query rows
(none gathered when they form one strided view), the call, the running result and its merge. Backward (every
part with the merged out and LSE, into shared gradient totals, which add up in the LSE dtype, in the input
dtype for half-precision CUDA inputs): the kept out and LSE, the totals, and per
ring branch its query rows, out and upstream gradient in kernel layout, the dq sum, the K/V packets (one
step ahead), the dK/dV sums (own share, this step's, the one passing on, the one arriving) and one call.
On the CPU the slots' outputs are allocated empty, so a slot's pages count once written (a ring branch's at
the end of its steps).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from hilbert_lab.attention.dry_run import Allocations, dry_run, estimate_target
from hilbert_lab.attention.executors import get_executor
from hilbert_lab.attention.executors.base import lse_dtype
from hilbert_lab.attention.executors.kernel import call_backward, call_forward
from hilbert_lab.attention.memory import MemoryEstimate, estimate_memory, resolve_backend
from hilbert_lab.attention.memory_config import DTYPE_BYTES, MemoryConfig
from hilbert_lab.attention.merge import merge_into, merge_slots
from hilbert_lab.attention.plan import cached_plan
from hilbert_lab.attention.target import estimating

__all__ = ["estimate_memory_per_rank", "ring_peaks"]


def estimate_memory_per_rank(config: MemoryConfig | dict[str, Any]) -> MemoryEstimate:
    """Peak bytes above the inputs per rank of ring attention over config.world_size ranks (the shard's q, k, v as
    inputs_bytes), forward and forward+backward; at world_size 1, attention.memory.estimate_memory.

    config: a MemoryConfig or a dict of its fields (ValueError naming a bad field)."""
    config = MemoryConfig.of(config)
    return estimate_memory(config) if config.world_size == 1 else _per_rank(config)


@functools.lru_cache(maxsize=256)
def _per_rank(config: MemoryConfig) -> MemoryEstimate:
    backend = resolve_backend(config)
    forward, forward_backward, breakdown = ring_peaks(config, backend)
    inputs = 3 * config.batch_size * (config.seq_len // config.world_size) * config.num_heads * config.head_dim
    return MemoryEstimate(forward, forward_backward, inputs * DTYPE_BYTES[config.dtype], backend, True, breakdown,
                          backend)


def _peak(device: str, run: Callable[[], object], *exclude: torch.Tensor) -> int:
    """Peak bytes that run() allocates above `exclude` (meta tensors standing for `device`)."""
    tracker = Allocations()
    tracker.exclude(*exclude)
    with estimating(*estimate_target(device), tracker.workspace), tracker:
        result = run()
        del result
    return tracker.peak


def _meta(shape, dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def _call_peaks(backend: str, shape: tuple[int, int, int, int], dtype: torch.dtype, device: str,
                causal: bool) -> tuple[int, int]:
    """(forward, backward) peak bytes of one ring-step kernel call on (b, L, h, D) rows: its outputs and work."""
    q, k, v, grad = (_meta(shape, dtype) for _ in range(4))
    with estimating(*estimate_target(device), lambda nbytes: None):
        kernel = get_executor(backend).kernel_for(q)
    forward = backward = 0
    for masked in {causal, False}:
        calls = {}
        forward = max(forward, _peak(device, lambda: calls.setdefault(
            "result", call_forward(kernel, q, k, v, causal=masked, scale=1.0)), q, k, v))
        out, lse, state = calls["result"]
        backward = max(backward, _peak(device, lambda: call_backward(state, grad, q, k, v, out, lse, causal=masked,
                                                                     scale=1.0), q, k, v, grad, out, lse))
    return forward, backward


def _merge_into_peak(rows: int, dim: int, dtype: torch.dtype, device: str) -> int:
    """Peak bytes of merging one call's (out, lse) of `rows` (b * L * h) rows into a running result."""
    acc_dtype = lse_dtype(dtype)
    acc = _meta((1, rows, 1, dim), acc_dtype)
    acc_lse, lse = _meta((1, 1, rows), acc_dtype), _meta((1, 1, rows), acc_dtype)
    out = _meta((1, rows, 1, dim), dtype)
    return _peak(device, lambda: merge_into(acc, acc_lse, out, lse), acc, acc_lse, out, lse)


def _crossing_segments(segment: int, seq_len: int, shard: int) -> list[tuple[int, int]]:
    """The segments [a, b) of length `segment` (the last one shorter) that cross a border of shards of `shard`
    tokens (contiguous layout), each once."""
    found = []
    for border in range(shard, seq_len, shard):
        start = border // segment * segment
        if start < border and (not found or found[-1][0] != start):
            found.append((start, min(start + segment, seq_len)))
    return found


def _branches(config: MemoryConfig) -> tuple[list[int], list[tuple[int, int, int, int, bool, int, int]]]:
    """(branches with a local share, ring parts as (branch, heads, dilation, members, query rows are one view,
    this rank's selected rows per head and batch row, a member's largest)). A branch whose segments cross shard
    borders off whole-shard sub-rings (the ring splits it per segment) has both: its segments inside a shard
    (where w < n) are local, and each shape of crossing segment (members, rows per member) is a part; the
    rows of a member are counted as ceil(positions / r), which no head offset exceeds: an upper bound."""
    pattern = config.pattern
    n = config.seq_len // config.world_size
    local, ring = [], []
    for branch, offsets in enumerate(pattern.head_offsets(config.num_heads)):
        segment = min(pattern.segment_lengths[branch], config.seq_len)
        rate = pattern.dilation_rates[branch]
        if n % segment == 0:
            local.append(branch)
            continue
        groups = [int((offsets == o).sum()) for o in sorted(set(offsets[offsets >= 0].tolist()))]
        view = len(groups) == 1 or max(groups) == 1
        heads = int((offsets >= 0).sum())
        if segment % n == 0:
            rows = -(-n // rate)
            ring.append((branch, heads, rate, min(segment // n, config.world_size), view, rows, rows))
            continue
        tail = config.seq_len % segment  # the last, shorter segment may lie inside the last shard
        if segment < n or (tail and tail <= n and (config.seq_len - tail) % n + tail <= n):
            local.append(branch)
        shapes = set()
        for start, end in _crossing_segments(segment, config.seq_len, n):
            held = [min(end, (m + 1) * n) - max(start, m * n) for m in range(start // n, -(-end // n))]
            largest = -(-max(held) // rate)
            shapes.update((len(held), -(-own // rate), largest) for own in held)
        ring += [(branch, heads, rate, members, view, own, largest) for members, own, largest in sorted(shapes)]
    return local, ring


def ring_peaks(config: MemoryConfig, backend: str) -> tuple[int, int, dict[str, dict[str, int]]]:
    """(forward, forward+backward, breakdown) of ring attention per rank (contiguous layout); see the module
    docstring."""
    pattern, dtype, device = config.pattern, getattr(torch, config.dtype), config.device
    element, accumulate = DTYPE_BYTES[config.dtype], lse_dtype(dtype).itemsize
    # Gradient totals of half-precision CUDA inputs add up in the input dtype (attention.function.run_backward).
    low = device.startswith("cuda") and config.dtype in ("float16", "bfloat16")
    total_bytes = element if low else accumulate
    batch, heads, dim = config.batch_size, config.num_heads, config.head_dim
    n = config.seq_len // config.world_size
    tokens, rows = batch * n * heads * dim, batch * n * heads
    local, ring = _branches(config)
    executor = get_executor(backend)
    terms: dict[str, dict[str, int]] = {"forward": {}, "forward_backward": {}}
    local_forward = local_backward = 0
    if local:
        local_plan = cached_plan(pattern, n, heads, tuple(local))
        local_forward, local_backward = dry_run(executor, local_plan, (batch, n, heads, dim), dtype, device)
        terms["forward"]["local"], terms["forward_backward"]["local"] = local_forward, local_backward
    if not ring:  # every branch is local: the ring is exactly the engine on the shard
        return int(local_forward), int(local_backward), terms
    if executor.kernel_for is None:
        raise ValueError(f"backend {backend!r} runs whole patterns only; the ring's steps need an executor with a "
                         f"dense kernel (e.g. 'sdpa', 'manual')")
    whole = executor.capabilities.whole_pattern
    slot = tokens * element + rows * accumulate
    local_slots = (1 if whole else len(local)) if local else 0
    ring_only = {entry[0] for entry in ring} - set(local)  # one slot a branch: its parts write disjoint rows
    num_slots = local_slots + len(ring_only) if local or len(ring) > 1 else 1

    def slots(written: int) -> int:
        """The job's slots when `written` of them hold outputs (on the CPU, empty pages do not count yet)."""
        if device == "cpu" and num_slots > 1:  # one slot is the zeroed result itself
            return num_slots * rows * accumulate + written * tokens * element
        return num_slots * slot

    kept = slot  # the merged out and LSE, kept for the backward
    totals = 3 * tokens * (element if whole or (not local and len(ring) == 1) else total_bytes)
    forward_phases, backward_phases = [], []
    if local:  # the local part alone holds its own slots and gradient totals; here it uses the job's
        merges = local_plan.merge and not whole
        alone, alone_totals = (len(local) if merges else 1) * slot, 3 * tokens * (total_bytes if merges else element)
        forward_phases.append(local_forward - alone + slots(local_slots))
        backward_phases.append(kept + totals + max(0, local_backward - slot - alone_totals))
    written, with_slot = local_slots, set(local)
    for index, (branch, branch_heads, dilation, members, view, own, largest) in enumerate(ring):
        block = batch * own * branch_heads  # this rank's selected rows of the branch (b * L * h)
        g = block * dim * element
        arriving = batch * largest * branch_heads  # the rows of a member's packet, at most
        packet, sums = 2 * arriving * dim * element, 2 * arriving * dim * accumulate
        state = block * (dim + 1) * accumulate
        call_f, call_b = _call_peaks(backend, (batch, max(own, largest), branch_heads, dim), dtype, device,
                                     pattern.causal)
        outputs, merge = g + block * accumulate, _merge_into_peak(block, dim, dtype, device)
        q_rows = 0 if view else g
        first = max(q_rows + call_f, outputs + state)  # a call, then its result copied into the running one
        later = state + max(q_rows + call_f, outputs + merge)  # a call, then its result merged into it
        steps = {1: packet + first, 2: max(2 * packet + first, packet + later)}.get(members, 2 * packet + later)
        phase = max(slots(written) + steps, slots(written + (branch not in with_slot)) + state)
        written += branch not in with_slot
        with_slot.add(branch)
        name = f"ring_branch{branch}" if branch not in local else f"crossing_segments_branch{branch}"
        terms["forward"][name] = max(phase, terms["forward"].get(name, 0))
        forward_phases.append(phase)
        query_rows = q_rows + 2 * g + block * accumulate + block * dim * accumulate  # q, out, dO, lse, dq sum
        # K/V held and in flight, dK/dV sums: own share, this step's, the one passing on, the one arriving
        held = {1: packet + sums, 2: max(2 * packet + sums, packet + 2 * sums),
                3: max(2 * packet + 2 * sums, packet + 4 * sums)}.get(members, 2 * packet + 4 * sums)
        terms["forward_backward"][name] = max(query_rows + held + call_b, terms["forward_backward"].get(name, 0))
        earlier = totals if local or index else 0  # the totals exist once a part before has written into them
        backward_phases += [kept + earlier + query_rows + max(held + call_b, 3 * sums),
                            kept + totals + query_rows + sums]  # this branch's shares stored into the totals
    if num_slots > 1:
        outs = _meta((num_slots, batch, n, heads, dim), dtype)
        lses = _meta((num_slots, batch, n, heads), lse_dtype(dtype))
        # a forward without a backward merges over its first slot where the fused merge runs (merge_slots)
        merged = slots(num_slots) + _peak(device, lambda: merge_slots(outs, lses, dtype, over_first=True), outs, lses)
        terms["forward"]["merge"] = merged
        forward_phases.append(merged)
    if totals != 3 * tokens * element:  # the totals returned in the inputs' dtype
        backward_phases.append(kept + totals + 3 * tokens * element)
    terms["forward_backward"].update(kept_out_lse=kept, grad_totals=totals)
    forward = max(forward_phases)
    return int(forward), int(max([forward] + backward_phases)), terms
