"""The block executor's memory model (engine._DilatedFunction, every backend), and the block sizes and
per-block working sets that the in-place and ring models share. Sizes in bytes:
- per-branch partial outputs (B, N, H, D) and LSEs (B, H, N) in the LSE dtype (one of each, the output
  in the input dtype, when no merge is needed);
- for each (branch, offset, segment-run) block: the block read (a strided view; a copy when B > 1
  and the last segment is ragged, or with an ordering), the backend's block output/LSE and its
  working set ("manual": score chunks of at most MAX_SCORE_ELEMENTS elements, several alive at once,
  plus the contiguous copies matmul makes; fused kernels: O(L) per block);
- the LSE merge (stacked LSEs, weights, a running sum in the LSE dtype), during which the last
  block's output is still referenced;
- backward: gradient accumulators (B, N, H, D) x 3 (in the LSE dtype when branches merge, else in the
  input dtype), per-block gradient shares, the backend's backward working set, and the final cast to
  the input dtype.
The CUDA backward terms are in cuda_fused_backward_work. The public API is attention.memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import IDENTITY_ORDERINGS, Plan, cached_plan
from hilbert_lab.dtypes import DTYPES

if TYPE_CHECKING:
    from hilbert_lab.attention.memory import MemoryConfig

DTYPE_BYTES = dict(zip(DTYPES, (4, 8, 2, 2)))
FUSED_BACKENDS = ("sdpa", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex", "flash", "xformers", "triton")
EAGER_BACKENDS = ("manual", "reference", "sdpa_math")


@dataclass(frozen=True)
class Block:
    """One block's sizes as a kernel sees them: (batch, length, heads) and whether reading it copies."""

    batch: int  # B * segments in the block
    length: int  # selected tokens per segment (L)
    heads: int
    copied: bool  # whether reading the block copies it


def engine_plan(config: MemoryConfig, seq_len: int) -> Plan:
    """The engine's plan of the config's pattern for seq_len tokens, in the identity layout (block sizes
    do not depend on the layout; no index maps, so planning 2^30 tokens needs no O(N) tensors)."""
    pattern = DilatedPattern.create(config.segment_lengths, config.dilation_rates, mode=config.mode,
                                    causal=config.causal)
    return cached_plan(pattern, seq_len, config.num_heads)


def engine_blocks(config: MemoryConfig, seq_len: int, branches: set[int] | None = None) -> tuple[list[Block], int]:
    """The engine's blocks (hilbert_lab.attention.cached_plan) for a (local) sequence of seq_len tokens
    (only `branches` when given) and the number of partial results (every branch counts, as in the
    engine). Planning needs no O(N) tensors, so 2^30 tokens estimate in O(H) memory.

    A block copies when it is read through a layout (ordering) or, as Block.read does on contiguous
    (B, N, H, D) inputs, when the batch and segment strides do not fold: B > 1, several segments and
    the run does not cover all N tokens (a ragged last segment follows it).
    """
    plan = engine_plan(config, seq_len)
    ordered = config.ordering not in IDENTITY_ORDERINGS
    blocks = [
        Block(config.batch_size * b.count, b.length, b.num_heads,
               ordered or (config.batch_size > 1 and b.count > 1 and b.count * b.seg != seq_len))
        for b in plan.blocks if branches is None or b.branch in branches
    ]
    return blocks, (plan.num_branches if plan.merge else 1)


def _chunk_sizes(batch: int, heads: int, rows: int, keys: int, max_elements: int) -> tuple[int, int, int]:
    """(batch per chunk, rows per chunk, number of chunks) exactly as backends.manual._chunks."""
    per_row = heads * keys
    rows_per_chunk = max(1, min(rows, max_elements // max(per_row, 1)))
    batch_per_chunk = max(1, min(batch, max_elements // max(per_row * rows, 1)))
    count = -(-batch // batch_per_chunk) * -(-rows // rows_per_chunk)
    return batch_per_chunk, rows_per_chunk, count


def _max_score_elements(backend: str) -> int:
    if backend == "reference":
        return 1 << 62
    from hilbert_lab.attention.backends.manual import MAX_SCORE_ELEMENTS

    return MAX_SCORE_ELEMENTS


def eager_block_work(block: Block, config: MemoryConfig, backend: str, backward: bool) -> int:
    """Working bytes of the eager (manual/reference) block forward or backward beyond its in/outputs."""
    compute = 8 if (config.dtype == "float64" or backend == "reference") else 4
    batch, rows, heads, dim = block.batch, block.length, block.heads, config.head_dim
    batch_chunk, rows_chunk, chunks = _chunk_sizes(batch, heads, rows, rows, _max_score_elements(backend))
    scores = batch_chunk * heads * rows_chunk * rows * compute
    query_copy = batch_chunk * heads * rows_chunk * dim * compute
    key_copy = batch_chunk * heads * rows * dim * compute
    cast = 0
    if DTYPE_BYTES[config.dtype] != compute:  # .to(compute dtype) copies of the chunk's q, k, v (and dO, out)
        cast = (query_copy + 2 * key_copy) * (2 if backward else 1)
    # score-sized tensors alive at once: forward 3 (scores, exp temp, result), backward 4 (scores,
    # probs, dO V^T, its shifted copy); one more from the previous chunk when there are several.
    alive = (4 if backward else 3) + (1 if chunks > 1 else 0)
    return alive * scores + max(query_copy + key_copy, 2 * key_copy) + cast


def fused_block_work(block: Block, config: MemoryConfig, backend: str, backward: bool, grad_lse: bool = False) -> int:
    """Working bytes of a fused kernel (flash-style) beyond its outputs: O(L) per row on the CPU.

    With an LSE gradient (ring attention merges LSEs under autograd) the SDPA adapter runs a second
    fused backward on (e_0, -grad_lse * e_0, 0): three block-sized inputs, three more outputs and
    one sum alive at once (7 blocks, measured). On CUDA see cuda_fused_backward_work.
    """
    if not backward:
        return 0
    size = block.batch * block.heads * block.length * config.head_dim
    extra = 7 * size * DTYPE_BYTES[config.dtype] if grad_lse else 0
    if config.device == "cpu":
        return extra
    return extra + cuda_fused_backward_work(block, config, backend)


def cuda_fused_backward_work(block: Block, config: MemoryConfig, backend: str) -> int:
    """CUDA working bytes of one block's fused backward beyond its three gradient outputs.

    The SDPA adapter (backends/sdpa.py, _fused_backward) calls .contiguous() on grad_out, q, k, v
    and out in (B*S, h, L, D) layout; the engine hands it strided block views, so these are 5 copies
    in the input dtype. The aten flash backward then transposes to (B, L, h, D) and copies grad_out
    and out once more (2 copies), and the flash kernel allocates a float32 dQ accumulator
    (B, L_rounded, h, D) and softmax_d (B, h, L_rounded), L_rounded = L rounded up to 128.
    Other fused backends: only the float32 dQ accumulator.
    """
    size = block.batch * block.heads * block.length * config.head_dim
    element = DTYPE_BYTES[config.dtype]
    if not backend.startswith("sdpa"):
        return size * 4
    adapter_copies = 5 * size * element
    aten_copies = 2 * size * element if backend in ("sdpa", "sdpa_flash") else 0
    return adapter_copies + aten_copies + flash_backward_buffers(block.batch, block.heads, block.length, config.head_dim)


def flash_backward_buffers(batch: int, heads: int, length: int, dim: int) -> int:
    """The flash backward's float32 dQ accumulator (B, L_rounded, h, D) and softmax_d (B, h, L_rounded),
    L_rounded = L rounded up to 128."""
    rounded = -(-length // 128) * 128
    return batch * heads * rounded * (dim + 1) * 4


def tensor_elements(config: MemoryConfig, seq_len: int) -> int:
    """Elements of one (B, seq_len, H, D) tensor."""
    return config.batch_size * seq_len * config.num_heads * config.head_dim


def engine_peaks(config: MemoryConfig, backend: str, seq_len: int, blocks: list[Block], partials: int,
                  grad_lse: bool = False) -> tuple[int, int, dict[str, dict[str, int]]]:
    """(forward, forward+backward, breakdown) of the engine on seq_len tokens with these blocks.

    grad_lse: the caller differentiates through the LSE too (ring attention's merge does).
    """
    element = DTYPE_BYTES[config.dtype]
    lse = 8 if config.dtype == "float64" else 4
    # Branch results that get merged, and the gradients that blocks accumulate, are kept in the LSE
    # dtype (engine._DilatedFunction, backward_blocks); without a merge both are in the input dtype.
    partial_element = accumulate = lse if partials > 1 else element
    batch, heads, dim = config.batch_size, config.num_heads, config.head_dim
    tokens = tensor_elements(config, seq_len)  # elements of one (B, N, H, D) tensor
    rows = batch * heads * seq_len  # elements of one (B, H, N) tensor
    eager = backend in EAGER_BACKENDS

    def block_io(block: Block, reads: int, outputs: int, out_bytes: int) -> int:
        size = block.batch * block.length * block.heads * dim
        copies = reads * size * element if block.copied else 0
        return copies + outputs * size * out_bytes + block.batch * block.heads * block.length * lse

    ordering_copies = 3 * tokens * element if config.ordering not in (None, "identity") else 0
    base = partials * (tokens * partial_element + rows * lse) + ordering_copies

    def block_work(block: Block, backward: bool) -> int:
        if eager:
            return eager_block_work(block, config, backend, backward)
        return fused_block_work(block, config, backend, backward, grad_lse)

    def block_output(block: Block, count: int) -> int:  # count outputs (B*S, L, h, D) in the input dtype
        return block.batch * block.length * block.heads * dim * element * count

    # The engine's loop variable still holds the previous block's output (forward) or gradient
    # shares (backward) while the next block runs, so block i costs its own I/O + work + block i-1's.
    block_forward = max((block_io(b, 3, 1, element) + block_work(b, False)
                         + (block_output(blocks[i - 1], 1) + blocks[i - 1].batch * blocks[i - 1].heads
                            * blocks[i - 1].length * lse if i else 0)
                         for i, b in enumerate(blocks)), default=0)
    merge = 0
    if partials > 1 and blocks:  # merge_lse on partials already in the LSE dtype: no casts inside
        last = blocks[-1]  # the loop variable keeps the last block's output alive through the merge
        last_output = last.batch * last.length * last.heads * (dim * element + lse)
        merge = 3 * partials * rows * lse + 3 * tokens * lse + last_output
    reorder_out = tokens * element + rows * lse if ordering_copies else 0
    forward = base + max(block_forward, merge, reorder_out)
    forward_terms = {"partials": partials * (tokens * partial_element + rows * lse), "ordering_copies": ordering_copies,
                     "largest_block": block_forward, "merge": merge}

    # forward+backward: the forward above, then (out, lse kept) gradient accumulators and block shares.
    kept = tokens * element + rows * lse + ordering_copies
    accumulators = 3 * tokens * accumulate
    share_bytes = 8 if (eager and (config.dtype == "float64" or backend == "reference")) else (4 if eager else element)
    block_backward = max((block_io(b, 5, 3, share_bytes) + block_work(b, True)
                          + (block_output(blocks[i - 1], 3) if i else 0)
                          for i, b in enumerate(blocks)), default=0)
    final_cast = 3 * tokens * element if element != accumulate else 0
    backward = kept + accumulators + max(block_backward, final_cast)
    if ordering_copies:  # grad of the output reorder (index_select backward) and of the input reorders
        backward += tokens * element
    forward_backward = max(forward, backward)
    breakdown = {"forward": forward_terms,
                 "forward_backward": {"kept_out_lse": kept, "grad_accumulators": accumulators,
                                      "largest_block": block_backward, "final_cast": final_cast,
                                      "backward_phase": int(backward)}}
    return int(forward), int(forward_backward), breakdown
