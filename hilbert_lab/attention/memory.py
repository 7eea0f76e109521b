"""estimate_memory: peak bytes of the engine's forward and forward+backward, derived from its algorithm.

The model replays what hilbert_lab.attention.engine allocates (sizes in bytes):
- per-branch partial outputs (B, N, H, D) and LSEs (B, H, N) (one of each when no merge is needed);
- for each (branch, offset, segment-run) block: the block read (a strided view; a copy when B > 1
  and the last segment is ragged, or with an ordering), the backend's block output/LSE and its
  working set ("manual": score chunks of at most MAX_SCORE_ELEMENTS elements, several alive at once,
  plus the contiguous copies matmul makes; fused kernels: O(L) per block);
- the LSE merge (stacked LSEs, weights, a running sum in the LSE dtype), during which the last
  block's output is still referenced;
- backward: gradient accumulators (B, N, H, D) x 3 in float32/float64, per-block gradient shares,
  the backend's backward working set, and the final cast to the input dtype.
All figures are bytes *above the inputs* q, k, v (and above the caller's upstream gradient); the
inputs are reported separately as inputs_bytes. Ring attention per rank: see `_ring_estimate`.
Measured on the CPU (benchmarks/validate_memory.py, reports/results/memory_estimate_*cpu.json):
engine 0.94-1.11x of the measured peak over 13 cases; ring (2 gloo ranks, 6 cases) 0.94-1.08x.
GPU numbers come from the same script with --device cuda (H100, bf16, sdpa/flash: reports/results/
memory_estimate_gpu_h100.json); the CUDA backward terms are in _cuda_fused_backward_work.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from hilbert_lab.dtypes import DTYPES

DTYPE_BYTES = dict(zip(DTYPES, (4, 8, 2, 2)))
FUSED_BACKENDS = ("sdpa", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex", "flash", "xformers", "triton")
EAGER_BACKENDS = ("manual", "reference", "sdpa_math")
# Sizes no device or host holds are refused at once (the estimate walks heads one by one, so a
# head count in the billions would exhaust memory before any answer).
MAX_INPUT_BYTES = 1 << 50  # q, k, v together: 1 PiB
MAX_NUM_HEADS = 1 << 16


@dataclass(frozen=True)
class MemoryConfig:
    """One attention call to estimate: shapes (B, N, H, D), pattern, backend, dtype and device.

    world_size > 1 estimates ring attention per rank (N is the global length).
    """

    seq_len: int
    batch_size: int = 1
    num_heads: int = 8
    head_dim: int = 64
    segment_lengths: tuple[int, ...] = (2048,)
    dilation_rates: tuple[int, ...] = (1,)
    mode: str = "longnet"
    causal: bool = False
    backend: str = "auto"
    dtype: str = "float32"
    device: str = "cpu"
    ordering: str | None = None
    world_size: int = 1

    def __post_init__(self) -> None:
        for name in ("seq_len", "batch_size", "num_heads", "head_dim", "world_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.num_heads > MAX_NUM_HEADS:
            raise ValueError(f"num_heads must be <= {MAX_NUM_HEADS}, got {self.num_heads}")
        object.__setattr__(self, "segment_lengths", tuple(self.segment_lengths))
        object.__setattr__(self, "dilation_rates", tuple(self.dilation_rates))
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        from hilbert_lab.attention.pattern import MODES  # torch: imported on use

        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        if not isinstance(self.device, str) or not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:<index>', got {self.device!r}")
        known = ("auto",) + EAGER_BACKENDS + FUSED_BACKENDS
        if self.backend not in known:
            raise ValueError(f"backend must be one of {', '.join(known)}; got {self.backend!r}")
        inputs = 3 * self.batch_size * self.seq_len * self.num_heads * self.head_dim * DTYPE_BYTES[self.dtype]
        if inputs > MAX_INPUT_BYTES:
            raise ValueError(
                f"q, k, v of batch_size={self.batch_size}, seq_len={self.seq_len}, num_heads={self.num_heads}, "
                f"head_dim={self.head_dim} ({self.dtype}) would take {inputs} bytes, more than any device holds "
                f"(limit {MAX_INPUT_BYTES}); lower one of them")
        if self.world_size > 1 and self.seq_len % self.world_size:
            raise ValueError(f"seq_len must be divisible by world_size ({self.world_size}) for ring attention, "
                             f"got {self.seq_len}")

    @classmethod
    def from_case(cls, case: dict[str, Any]) -> "MemoryConfig":
        """From a benchmark case dict (hilbert_lab.bench.cases); unknown keys are ignored."""
        names = set(cls.__dataclass_fields__)
        return cls(**{key: (tuple(value) if isinstance(value, list) else value)
                      for key, value in case.items() if key in names})


@dataclass
class MemoryEstimate:
    """Estimated peaks in bytes above the inputs: forward (inference, no grad) and forward+backward.

    inputs_bytes: q, k, v themselves. breakdown: the terms of each peak (name -> bytes).
    """

    forward_bytes: int
    forward_backward_bytes: int
    inputs_bytes: int
    backend: str
    per_rank: bool = False
    breakdown: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def total_forward_bytes(self) -> int:
        return self.inputs_bytes + self.forward_bytes

    @property
    def total_forward_backward_bytes(self) -> int:
        return self.inputs_bytes + self.forward_backward_bytes

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(total_forward_bytes=self.total_forward_bytes,
                    total_forward_backward_bytes=self.total_forward_backward_bytes)
        return data


@dataclass(frozen=True)
class _Block:
    batch: int  # B * segments in the block
    length: int  # selected tokens per segment (L)
    heads: int
    copied: bool  # whether reading the block copies it


def _resolve_backend(config: MemoryConfig) -> str:
    if config.backend != "auto":
        return config.backend
    import torch

    if config.device == "cpu" or torch.cuda.is_available():
        from hilbert_lab.attention.selection import rule_backend

        return rule_backend(config.device, getattr(torch, config.dtype), whole_pattern=config.world_size == 1)
    # a CUDA estimate on a machine without CUDA: the rule for Ampere and newer without flash-attn
    return "sdpa"


def _blocks(config: MemoryConfig, seq_len: int, branches: set[int] | None = None) -> tuple[list[_Block], int]:
    """The engine's blocks (hilbert_lab.attention.cached_plan) for a (local) sequence of seq_len tokens
    (only `branches` when given) and the number of partial results (every branch counts, as in the
    engine). Planning needs no O(N) tensors, so 2^30 tokens estimate in O(H) memory.

    A block copies when it is read through a layout (ordering) or, as Block.read does on contiguous
    (B, N, H, D) inputs, when the batch and segment strides do not fold: B > 1, several segments and
    the run does not cover all N tokens (a ragged last segment follows it).
    """
    from hilbert_lab.attention.pattern import DilatedPattern  # torch: imported on use
    from hilbert_lab.attention.plan import IDENTITY_ORDERINGS, cached_plan

    pattern = DilatedPattern.create(config.segment_lengths, config.dilation_rates, mode=config.mode,
                                    causal=config.causal)
    plan = cached_plan(pattern, seq_len, config.num_heads)  # the identity layout: no index maps
    ordered = config.ordering not in IDENTITY_ORDERINGS
    blocks = [
        _Block(config.batch_size * b.count, b.length, b.num_heads,
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


def _eager_block(block: _Block, config: MemoryConfig, backend: str, backward: bool) -> int:
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


def _fused_block(block: _Block, config: MemoryConfig, backend: str, backward: bool, grad_lse: bool = False) -> int:
    """Working bytes of a fused kernel (flash-style) beyond its outputs: O(L) per row on the CPU.

    With an LSE gradient (ring attention merges LSEs under autograd) the SDPA adapter runs a second
    fused backward on (e_0, -grad_lse * e_0, 0): three block-sized inputs, three more outputs and
    one sum alive at once (7 blocks, measured). On CUDA see _cuda_fused_backward_work.
    """
    if not backward:
        return 0
    size = block.batch * block.heads * block.length * config.head_dim
    extra = 7 * size * DTYPE_BYTES[config.dtype] if grad_lse else 0
    if config.device == "cpu":
        return extra
    return extra + _cuda_fused_backward_work(block, config, backend)


def _cuda_fused_backward_work(block: _Block, config: MemoryConfig, backend: str) -> int:
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
    rounded = -(-block.length // 128) * 128
    accumulator = block.batch * block.heads * rounded * config.head_dim * 4
    softmax_d = block.batch * block.heads * rounded * 4
    adapter_copies = 5 * size * element
    aten_copies = 2 * size * element if backend in ("sdpa", "sdpa_flash") else 0
    return adapter_copies + aten_copies + accumulator + softmax_d


def _ring_estimate(config: MemoryConfig, backend: str) -> MemoryEstimate:
    """Ring attention per rank (hilbert_lab.distributed.ring, contiguous layout), shard n = N / P.

    Forward, as the ring runs it: (1) the branches whose segments fit in a shard run through the
    engine on the shard (every branch still gets a partial result); (2) each branch spanning ranks
    packs this rank's selected K/V (B * ceil(n/r) * H_branch * D each), holds its own packet and
    one in flight, and attends the shard's selected queries to each packet in one block with all
    of the branch's heads stacked, keeping a running (out, lse) in the LSE dtype; (3) the LSE merge
    of the local result and the ring branches. Backward: the merge makes one gradient per part; each
    ring branch then holds dQ/dK/dV accumulators, K/V packets with their dK/dV packets and a block's
    shares; the local engine runs last while the ring's q/k/v gradients wait to be summed. LSEs are
    differentiated too (the merge uses them), so the SDPA adapter's extra LSE-gradient pass counts.
    Checked against measured per-rank peaks: benchmarks/validate_memory.py --ring 2.
    """
    from hilbert_lab.attention.pattern import DilatedPattern

    pattern = DilatedPattern.create(config.segment_lengths, config.dilation_rates, mode=config.mode,
                                    causal=config.causal)
    element = DTYPE_BYTES[config.dtype]
    lse = 8 if config.dtype == "float64" else 4
    accumulate = 8 if config.dtype == "float64" else 4
    n = config.seq_len // config.world_size
    tokens = _tokens(config, n)
    rows = config.batch_size * config.num_heads * n
    part = tokens * element + rows * lse  # one (out, lse) pair on the shard
    local, ring = set(), []
    for branch, offsets in enumerate(pattern.head_offsets(config.num_heads)):
        segment = min(pattern.segment_lengths[branch], config.seq_len)
        if n % segment == 0:
            local.add(branch)
        elif segment % n == 0:
            ring.append((branch, int((offsets >= 0).sum()), pattern.dilation_rates[branch]))
        else:
            raise ValueError(f"segment_lengths[{branch}] = {pattern.segment_lengths[branch]} must divide the shard "
                             f"length {n} (N / world_size) or be a multiple of it")
    forward_terms: dict[str, int] = {}
    backward_terms: dict[str, int] = {}
    forward = forward_backward = 0
    live = 0
    if local:
        blocks, partials = _blocks(config, n, local)
        local_forward, local_training, terms = _engine_peaks(config, backend, n, blocks, partials,
                                                             grad_lse=bool(ring))
        forward, forward_backward = local_forward, local_training
        forward_terms["local_engine"], backward_terms["local_engine"] = local_forward, local_training
        live = part
    eager = backend in EAGER_BACKENDS
    parts = (1 if local else 0) + len(ring)
    # After the forward: the merged (out, lse) and every part's (out, lse), saved for backward. The
    # merge's backward then makes one output gradient per part.
    after_forward = part + parts * part
    merge_grads = parts * tokens * element
    for branch, branch_heads, dilation in ring:
        selected = -(-n // dilation)
        block = _Block(config.batch_size, selected, branch_heads, False)
        rows_block = config.batch_size * selected * branch_heads
        packet = 2 * rows_block * config.head_dim * element
        gathered = rows_block * config.head_dim * element
        state = rows_block * (config.head_dim * lse + lse)
        work = _eager_block(block, config, backend, False) if eager else _fused_block(block, config, backend, False)
        phase = live + max(2 * packet + 2 * gathered + rows_block * lse + work + 3 * state, state + part)
        forward = max(forward, phase)
        forward_terms[f"ring_branch{branch}"] = phase
        # backward: dQ (accumulate dtype) and the final dK/dV, own/received/sent K/V packets with
        # their dK/dV accumulators, the gathered dO/q/out and a block's three gradient shares
        work_bw = (_eager_block(block, config, backend, True) if eager
                   else _fused_block(block, config, backend, True, grad_lse=True))
        acc_packet = packet // element * accumulate
        internal = (3 * tokens * accumulate + 3 * (packet + acc_packet) + 3 * gathered
                    + 3 * rows_block * config.head_dim * element + work_bw)
        backward_terms[f"ring_branch{branch}"] = after_forward + merge_grads + internal
        live += part
    if parts > 1:
        cast = tokens * lse if element != lse else 0
        merge = parts * part + 3 * parts * rows * lse + 3 * tokens * lse + cast
        forward = max(forward, merge)
        forward_terms["merge"] = merge
    if not ring:  # every branch is local: the ring is exactly the engine on the shard
        return MemoryEstimate(int(forward), int(forward_backward), 3 * tokens * element, backend, True,
                              {"forward": forward_terms, "forward_backward": backward_terms})
    phases = [forward] + [backward_terms[f"ring_branch{b}"] for b, _, _ in ring]
    if local:
        # the local engine's backward runs last: its part's gradient and the ring's finished q/k/v
        # gradients (waiting to be summed) are alive; the ring parts are already freed.
        local_phase = (part + tokens * element + 3 * tokens * element + terms["forward_backward"]["backward_phase"])
        backward_terms["local_phase"] = local_phase
        phases.append(local_phase)
    forward_backward = max(phases)
    backward_terms.update(after_forward=after_forward, merge_gradients=merge_grads)
    return MemoryEstimate(int(forward), int(forward_backward), 3 * tokens * element, backend, True,
                          {"forward": forward_terms, "forward_backward": backward_terms})


def estimate_memory(config: MemoryConfig | dict[str, Any]) -> MemoryEstimate:
    """Peak bytes above the inputs of one engine call: forward (no grad) and forward+backward.

    config: a MemoryConfig or a dict of its fields. ValueError for invalid settings (the engine's
    own pattern validator checks segment_lengths/dilation_rates/mode). world_size > 1: ring
    attention, per rank.
    """
    if isinstance(config, dict):
        config = MemoryConfig(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in config.items()})
    backend = _resolve_backend(config)
    if config.world_size > 1:
        return _ring_estimate(config, backend)
    if backend == "triton" and config.device != "cpu":
        return _whole_pattern_estimate(config)
    blocks, partials = _blocks(config, config.seq_len)
    forward, forward_backward, breakdown = _engine_peaks(config, backend, config.seq_len, blocks, partials)
    return MemoryEstimate(forward, forward_backward, 3 * _tokens(config, config.seq_len) * DTYPE_BYTES[config.dtype],
                          backend, False, breakdown)


def _whole_pattern_estimate(config: MemoryConfig) -> MemoryEstimate:
    """The fused Triton kernel (kernels/triton_dilated.py) reads the whole pattern in place: no block
    copies, no partial results, no merge, and orderings need no permutation. Forward: out (input
    dtype) and lse (float32). Backward: out and lse kept, the float32 row correction delta (B, H, N)
    and dq, dk, dv in the input dtype."""
    element = DTYPE_BYTES[config.dtype]
    tokens = _tokens(config, config.seq_len)
    rows = config.batch_size * config.num_heads * config.seq_len
    forward = tokens * element + rows * 4
    forward_backward = forward + rows * 4 + 3 * tokens * element
    return MemoryEstimate(forward, forward_backward, 3 * tokens * element, "triton", False,
                          {"forward": {"out_lse": forward},
                           "forward_backward": {"kept_out_lse": forward, "delta": rows * 4, "gradients": 3 * tokens * element}})


def _tokens(config: MemoryConfig, seq_len: int) -> int:
    return config.batch_size * seq_len * config.num_heads * config.head_dim


def _engine_peaks(config: MemoryConfig, backend: str, seq_len: int, blocks: list[_Block], partials: int,
                  grad_lse: bool = False) -> tuple[int, int, dict[str, dict[str, int]]]:
    """(forward, forward+backward, breakdown) of the engine on seq_len tokens with these blocks.

    grad_lse: the caller differentiates through the LSE too (ring attention's merge does).
    """
    element = DTYPE_BYTES[config.dtype]
    lse = 8 if config.dtype == "float64" else 4
    accumulate = 8 if config.dtype == "float64" else 4
    batch, heads, dim = config.batch_size, config.num_heads, config.head_dim
    tokens = _tokens(config, seq_len)  # elements of one (B, N, H, D) tensor
    rows = batch * heads * seq_len  # elements of one (B, H, N) tensor
    eager = backend in EAGER_BACKENDS

    def block_io(block: _Block, reads: int, outputs: int, out_bytes: int) -> int:
        size = block.batch * block.length * block.heads * dim
        copies = reads * size * element if block.copied else 0
        return copies + outputs * size * out_bytes + block.batch * block.heads * block.length * lse

    ordering_copies = 3 * tokens * element if config.ordering not in (None, "identity") else 0
    base = partials * (tokens * element + rows * lse) + ordering_copies
    def block_work(block: _Block, backward: bool) -> int:
        if eager:
            return _eager_block(block, config, backend, backward)
        return _fused_block(block, config, backend, backward, grad_lse)

    def block_output(block: _Block, count: int) -> int:  # count outputs (B*S, L, h, D) in the input dtype
        return block.batch * block.length * block.heads * dim * element * count

    # The engine's loop variable still holds the previous block's output (forward) or gradient
    # shares (backward) while the next block runs, so block i costs its own I/O + work + block i-1's.
    block_forward = max((block_io(b, 3, 1, element) + block_work(b, False)
                         + (block_output(blocks[i - 1], 1) + blocks[i - 1].batch * blocks[i - 1].heads
                            * blocks[i - 1].length * lse if i else 0)
                         for i, b in enumerate(blocks)), default=0)
    merge = 0
    if partials > 1 and blocks:
        cast = tokens * lse if element != lse else 0
        last = blocks[-1]  # the loop variable keeps the last block's output alive through the merge
        last_output = last.batch * last.length * last.heads * (dim * element + lse)
        merge = 3 * partials * rows * lse + 3 * tokens * lse + cast + last_output
    reorder_out = tokens * element + rows * lse if ordering_copies else 0
    forward = base + max(block_forward, merge, reorder_out)
    forward_terms = {"partials": partials * (tokens * element + rows * lse), "ordering_copies": ordering_copies,
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
