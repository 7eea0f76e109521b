"""The memory model of the in-place executor (attention.inplace: cuDNN or flash kernels on the plan's
strided views). Its buffer list equals the executor's own allocations on the CPU with stand-ins for the
CUDA kernels (tests/attention/test_memory.py); the kernels' own buffers follow cudnn-frontend and
flash-attention. The public API is attention.memory (executor "inplace")."""
from __future__ import annotations

from typing import TYPE_CHECKING

from hilbert_lab.attention.inplace import plan_units
from hilbert_lab.attention.memory_blocks import DTYPE_BYTES, engine_plan, flash_backward_buffers, tensor_elements
from hilbert_lab.attention.plan import Plan

if TYPE_CHECKING:
    from hilbert_lab.attention.memory import MemoryConfig


def inplace_calls(config: MemoryConfig, plan: Plan) -> tuple[list[tuple[int, int, int]], int]:
    """(batch, heads, length) of every kernel call of the in-place executor in its order, and the number
    of units whose batch does not fold with the segments, on contiguous (B, N, H, D) inputs.

    A unit (attention.inplace.plan_units) is one block, one call with its heads on the head axis, or G
    blocks of consecutive offsets, one call per head with the G offsets on the head axis. Its batch folds
    with the segments when B = 1, one segment, or the run covers all N tokens; otherwise it is one call
    per batch element."""
    batch, seq_len = config.batch_size, config.seq_len
    calls: list[tuple[int, int, int]] = []
    split_units = 0
    for unit in plan_units(plan):
        first = unit.blocks[0]
        grouped = len(unit.blocks) > 1
        heads = len(unit.blocks) if grouped else first.num_heads
        fold = batch == 1 or first.count == 1 or first.count * first.seg == seq_len
        split_units += not fold
        call = (batch * first.count if fold else first.count, heads, first.length)
        calls.extend([call] * ((first.num_heads if grouped else 1) * (1 if fold else batch)))
    return calls, split_units


def inplace_peaks(config: MemoryConfig, kernel: str) -> tuple[int, int, dict[str, dict[str, int]]]:
    """(forward, forward+backward, breakdown) of the in-place executor (attention.inplace) with the cuDNN or
    flash kernel, buffers as its code makes them.

    No gather copies of q, k, v: every kernel reads the plan's strided views. Forward: per-branch outputs
    (P, B, N, H, D) in the input dtype and LSEs (P, B, N, H) float32, P = branches when they merge, else 1
    (without merge and with no LSE wanted, one broadcast row, copied to a (B, N, H) buffer for each unit
    whose batch does not fold); per call the kernel's output (Bc, h, L, D) and, unless cuDNN is told to
    skip it, its LSE (Bc, h, L) float32, while the previous call's are still referenced; merged branches:
    the fused merge's output (input dtype) and LSE (float32) while the partials are alive (the calls'
    outputs are gone by then). Training keeps out and LSE. Backward: dq, dk, dv accumulators (float32 when branches merge
    (plan.merge), else the input dtype); per call the packed dO and out (input dtype) and LSE (float32),
    the three gradient shares and the previous call's, and the kernel's own buffers: cuDNN's per-call
    workspace, the float32 dQ accumulator (Bc, h, L, D) that cudnn-frontend reserves; flash: the packed
    (B, L, h, D) copies of dO and out, its float32 dQ accumulator and softmax_d. Merged: the final cast of
    the accumulators to the input dtype while they are alive.
    """
    plan = engine_plan(config, config.seq_len)
    element, lse = DTYPE_BYTES[config.dtype], 4
    tokens = tensor_elements(config, config.seq_len)
    rows = config.batch_size * config.num_heads * config.seq_len
    parts = plan.num_branches if plan.merge else 1
    calls, split_units = inplace_calls(config, plan)
    sizes = [b * h * length * config.head_dim for b, h, length in calls]
    call_rows = [b * h * length for b, h, length in calls]

    def forward(need_lse: bool) -> tuple[int, dict[str, int]]:
        wanted = need_lse or plan.merge
        kernel_lse = wanted or kernel == "flash"  # the flash kernel always returns its LSE
        outputs = [n * element + (r * lse if kernel_lse else 0) for n, r in zip(sizes, call_rows)]
        partials = parts * tokens * element
        lse_buffers = parts * rows * lse if wanted else parts * lse + split_units * rows * lse
        largest_call = max((o + (outputs[i - 1] if i else 0) for i, o in enumerate(outputs)), default=0)
        merge = tokens * element + rows * lse if plan.merge and outputs else 0
        terms = {"partials": partials, "lse_buffers": lse_buffers, "largest_call": largest_call, "merge": merge}
        return partials + lse_buffers + max(largest_call, merge), terms

    forward_bytes, forward_terms = forward(False)
    training_forward, _ = forward(True)
    accumulate = 4 if plan.merge else element
    kept = tokens * element + rows * lse
    accumulators = 3 * tokens * accumulate
    shares = [3 * n * element for n in sizes]

    def workspace(call: tuple[int, int, int], size: int) -> int:
        if kernel == "cudnn":
            return size * 4
        return 2 * size * element + flash_backward_buffers(*call, config.head_dim)

    largest_call = max(((shares[i - 1] if i else 0) + 2 * n * element + r * lse + shares[i] + workspace(c, n)
                        for i, (c, n, r) in enumerate(zip(calls, sizes, call_rows))), default=0)
    final_cast = 3 * tokens * element if accumulate != element else 0
    backward = kept + accumulators + max(largest_call, (shares[-1] if shares else 0) + final_cast)
    breakdown = {"forward": forward_terms,
                 "forward_backward": {"training_forward": training_forward, "kept_out_lse": kept,
                                      "grad_accumulators": accumulators, "largest_call": largest_call,
                                      "final_cast": final_cast, "backward_phase": backward}}
    return forward_bytes, max(training_forward, backward), breakdown
