"""estimate_memory: peak bytes of the engine's forward and forward+backward, derived from the plan.

Block sizes come from the public plan (attention.plan.cached_plan: Plan.blocks, Block.count / length /
num_heads); the executor that runs it decides what is allocated around them. The block executor
(engine._DilatedFunction, every backend; sizes in bytes):
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
The in-place executor (attention.inplace, "sdpa" backends on CUDA with fp16/bf16): see `_inplace_estimate`;
its buffer list equals the executor's own allocations on the CPU with stand-ins for the CUDA kernels
(tests/attention/test_memory.py); the kernels' own buffers follow cudnn-frontend and flash-attention.
All figures are bytes *above the inputs* q, k, v (and above the caller's upstream gradient); the
inputs are reported separately as inputs_bytes. Ring attention per rank: see `_ring_estimate`.
Measured on the CPU (benchmarks/validate_memory.py, reports/results/memory_estimate_*cpu.json):
engine 0.94-1.11x of the measured peak over 13 cases; ring (2 gloo ranks, 6 cases) 0.94-1.08x.
GPU numbers come from the same script with --device cuda (H100, bf16, sdpa/flash: reports/results/
memory_estimate_gpu_h100.json, block executor: measured before "sdpa" ran in place); the CUDA backward
terms are in _cuda_fused_backward_work.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import torch

from hilbert_lab.attention.inplace import kernel_for, plan_units
from hilbert_lab.attention.pattern import MODES, DilatedPattern
from hilbert_lab.attention.plan import IDENTITY_ORDERINGS, Plan, cached_plan
from hilbert_lab.dtypes import DTYPES

DTYPE_BYTES = dict(zip(DTYPES, (4, 8, 2, 2)))
FUSED_BACKENDS = ("sdpa", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex", "flash", "xformers", "triton")
EAGER_BACKENDS = ("manual", "reference", "sdpa_math")
# How the engine runs a plan: "blocks" (engine._DilatedFunction: block reads, per-block results, merge),
# "inplace" (attention.inplace: cuDNN / flash kernels on the plan's strided views), "whole_pattern"
# (a fused kernel over the whole pattern: backend "triton" on CUDA). "auto": the one the engine picks.
EXECUTORS = ("auto", "blocks", "inplace", "whole_pattern")
# A CUDA estimate on a machine without CUDA assumes the device the selection rules were measured on.
ASSUMED_CAPABILITY = (9, 0)
# Sizes no device or host holds are refused at once (the estimate walks heads one by one, so a
# head count in the billions would exhaust memory before any answer).
MAX_INPUT_BYTES = 1 << 50  # q, k, v together: 1 PiB
MAX_NUM_HEADS = 1 << 16


@dataclass(frozen=True)
class MemoryConfig:
    """One attention call to estimate: shapes (B, N, H, D), pattern, backend, dtype and device.

    world_size > 1 estimates ring attention per rank (N is the global length). executor: one of
    EXECUTORS; "auto" is the one the engine runs for this backend, device, dtype and ordering.
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
    executor: str = "auto"

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
        if self.executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {', '.join(EXECUTORS)}; got {self.executor!r}")
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
    executor: str = "blocks"

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
    if config.device == "cpu" or torch.cuda.is_available():
        from hilbert_lab.attention.selection import rule_backend

        return rule_backend(config.device, getattr(torch, config.dtype), whole_pattern=config.world_size == 1)
    # a CUDA estimate on a machine without CUDA: the rule for Ampere and newer without flash-attn
    return "sdpa"


def _plan(config: MemoryConfig, seq_len: int) -> Plan:
    """The engine's plan of the config's pattern for seq_len tokens, in the identity layout (block sizes
    do not depend on the layout; no index maps, so planning 2^30 tokens needs no O(N) tensors)."""
    pattern = DilatedPattern.create(config.segment_lengths, config.dilation_rates, mode=config.mode,
                                    causal=config.causal)
    return cached_plan(pattern, seq_len, config.num_heads)


def _blocks(config: MemoryConfig, seq_len: int, branches: set[int] | None = None) -> tuple[list[_Block], int]:
    """The engine's blocks (hilbert_lab.attention.cached_plan) for a (local) sequence of seq_len tokens
    (only `branches` when given) and the number of partial results (every branch counts, as in the
    engine). Planning needs no O(N) tensors, so 2^30 tokens estimate in O(H) memory.

    A block copies when it is read through a layout (ordering) or, as Block.read does on contiguous
    (B, N, H, D) inputs, when the batch and segment strides do not fold: B > 1, several segments and
    the run does not cover all N tokens (a ragged last segment follows it).
    """
    plan = _plan(config, seq_len)
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
    adapter_copies = 5 * size * element
    aten_copies = 2 * size * element if backend in ("sdpa", "sdpa_flash") else 0
    return adapter_copies + aten_copies + _flash_backward_buffers(block.batch, block.heads, block.length, config.head_dim)


def _flash_backward_buffers(batch: int, heads: int, length: int, dim: int) -> int:
    """The flash backward's float32 dQ accumulator (B, L_rounded, h, D) and softmax_d (B, h, L_rounded),
    L_rounded = L rounded up to 128."""
    rounded = -(-length // 128) * 128
    return batch * heads * rounded * (dim + 1) * 4


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
    attention, per rank (block executor). The estimate's `executor` says which executor was modelled.
    """
    if isinstance(config, dict):
        config = MemoryConfig(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in config.items()})
    backend = _resolve_backend(config)
    if config.world_size > 1:
        if config.executor not in ("auto", "blocks"):
            raise ValueError(f"executor must be 'auto' or 'blocks' for ring attention (world_size > 1), "
                             f"got {config.executor!r}")
        return _ring_estimate(config, backend)
    executor, kernel = _resolve_executor(config, backend)
    if executor == "whole_pattern":
        return _whole_pattern_estimate(config)
    if executor == "inplace":
        return _inplace_estimate(config, backend, kernel)
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
                           "forward_backward": {"kept_out_lse": forward, "delta": rows * 4, "gradients": 3 * tokens * element}},
                          "whole_pattern")


def _inplace_kernel(config: MemoryConfig, backend: str) -> str | None:
    """The kernel the in-place executor would use (attention.inplace.kernel_for), or None where the engine
    runs the block executor (CPU, fp32/fp64, other backends, a layout ordering: index maps)."""
    if config.device == "cpu" or config.ordering not in IDENTITY_ORDERINGS:
        return None
    if torch.cuda.is_available():
        capability, cudnn = torch.cuda.get_device_capability(config.device), torch.backends.cudnn.is_available()
    else:
        capability, cudnn = ASSUMED_CAPABILITY, True
    return kernel_for(backend, getattr(torch, config.dtype), config.head_dim, capability, cudnn)


def _resolve_executor(config: MemoryConfig, backend: str) -> tuple[str, str | None]:
    """(executor, in-place kernel or None): the engine's choice for "auto", else the requested one when
    the engine can run it for this backend, device, dtype, head_dim and ordering."""
    if backend == "triton" and config.device != "cpu":
        possible = {"whole_pattern": None}
    else:
        kernel = _inplace_kernel(config, backend)
        possible = {"inplace": kernel, "blocks": None} if kernel else {"blocks": None}
    executor = next(iter(possible)) if config.executor == "auto" else config.executor
    if executor not in possible:
        raise ValueError(f"executor must be one of auto, {', '.join(possible)} for backend {backend!r} on "
                         f"{config.device} with {config.dtype}, head_dim {config.head_dim} and ordering "
                         f"{config.ordering!r}; got {config.executor!r}")
    return executor, possible[executor]


def _inplace_calls(config: MemoryConfig, plan: Plan) -> tuple[list[tuple[int, int, int]], int]:
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


def _inplace_estimate(config: MemoryConfig, backend: str, kernel: str) -> MemoryEstimate:
    """The in-place executor (attention.inplace) with the cuDNN or flash kernel, buffers as its code makes them.

    No gather copies of q, k, v: every kernel reads the plan's strided views. Forward: per-branch outputs
    (P, B, N, H, D) in the input dtype and LSEs (P, B, N, H) float32, P = branches when they merge, else 1
    (without merge and with no LSE wanted, one broadcast row, copied to a (B, N, H) buffer for each unit
    whose batch does not fold); per call the kernel's output (Bc, h, L, D) and, unless cuDNN is told to
    skip it, its LSE (Bc, h, L) float32, while the previous call's are still referenced; merged branches:
    the fused merge's output (input dtype) and LSE (float32) while the partials and the last call's output
    are alive. Training keeps out and LSE. Backward: dq, dk, dv accumulators (float32 when branches merge
    (plan.merge), else the input dtype); per call the packed dO and out (input dtype) and LSE (float32),
    the three gradient shares and the previous call's, and the kernel's own buffers: cuDNN's per-call
    workspace, the float32 dQ accumulator (Bc, h, L, D) that cudnn-frontend reserves; flash: the packed
    (B, L, h, D) copies of dO and out, its float32 dQ accumulator and softmax_d. Merged: the final cast of
    the accumulators to the input dtype while they are alive.
    """
    plan = _plan(config, config.seq_len)
    element, lse = DTYPE_BYTES[config.dtype], 4
    tokens = _tokens(config, config.seq_len)
    rows = config.batch_size * config.num_heads * config.seq_len
    parts = plan.num_branches if plan.merge else 1
    calls, split_units = _inplace_calls(config, plan)
    sizes = [b * h * length * config.head_dim for b, h, length in calls]
    call_rows = [b * h * length for b, h, length in calls]

    def forward(need_lse: bool) -> tuple[int, dict[str, int]]:
        wanted = need_lse or plan.merge
        kernel_lse = wanted or kernel == "flash"  # the flash kernel always returns its LSE
        outputs = [n * element + (r * lse if kernel_lse else 0) for n, r in zip(sizes, call_rows)]
        partials = parts * tokens * element
        lse_buffers = parts * rows * lse if wanted else parts * lse + split_units * rows * lse
        largest_call = max((o + (outputs[i - 1] if i else 0) for i, o in enumerate(outputs)), default=0)
        merge = outputs[-1] + tokens * element + rows * lse if plan.merge and outputs else 0
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
        return 2 * size * element + _flash_backward_buffers(*call, config.head_dim)

    largest_call = max(((shares[i - 1] if i else 0) + 2 * n * element + r * lse + shares[i] + workspace(c, n)
                        for i, (c, n, r) in enumerate(zip(calls, sizes, call_rows))), default=0)
    final_cast = 3 * tokens * element if accumulate != element else 0
    backward = kept + accumulators + max(largest_call, (shares[-1] if shares else 0) + final_cast)
    breakdown = {"forward": forward_terms,
                 "forward_backward": {"training_forward": training_forward, "kept_out_lse": kept,
                                      "grad_accumulators": accumulators, "largest_call": largest_call,
                                      "final_cast": final_cast, "backward_phase": backward}}
    return MemoryEstimate(forward_bytes, max(training_forward, backward), 3 * tokens * element, backend, False,
                          breakdown, "inplace")


def _tokens(config: MemoryConfig, seq_len: int) -> int:
    return config.batch_size * seq_len * config.num_heads * config.head_dim


def _engine_peaks(config: MemoryConfig, backend: str, seq_len: int, blocks: list[_Block], partials: int,
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
    tokens = _tokens(config, seq_len)  # elements of one (B, N, H, D) tensor
    rows = batch * heads * seq_len  # elements of one (B, H, N) tensor
    eager = backend in EAGER_BACKENDS

    def block_io(block: _Block, reads: int, outputs: int, out_bytes: int) -> int:
        size = block.batch * block.length * block.heads * dim
        copies = reads * size * element if block.copied else 0
        return copies + outputs * size * out_bytes + block.batch * block.heads * block.length * lse

    ordering_copies = 3 * tokens * element if config.ordering not in (None, "identity") else 0
    base = partials * (tokens * partial_element + rows * lse) + ordering_copies

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
