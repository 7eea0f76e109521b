"""GPU description and backend selection: documented rules, optional timing with a JSON cache.

Rules of `select_backend` (first match wins):
0. CUDA, fp16/bf16, a whole pattern of known shape, on a GPU kind with a table in the package (attention.auto_table,
   by `benchmarks/bench_auto_table.py`): the fastest executor that runs the call in the table's nearest cell
   (auto_table.table_choice; the rules' pick where within 3% of it), unless the in-place buffers do not fit (then
   the fused kernel, rule 3). The pick within 3% of the fastest in all 160 cells, `auto` in 140 (H200,
   check_h200_7692652.json) and 151 (H100, check_h100_107fe7c.json; fa4 the fastest in every cell).
1. CPU: "sdpa" (PyTorch's CPU flash kernel; exact LSE) for float32/float64/bfloat16/float16,
   "manual" for anything else. Recommended CPU dtype: float32.
2. CUDA, float32/float64 or compute capability < 8.0 (Pascal, Volta, Turing): "sdpa" (the
   efficient kernel; flash needs fp16/bf16) and no flash-attn. Pascal: use float32.
3. CUDA, fp16/bf16 on Hopper or newer with Triton, for a whole pattern, where no table applies: "sdpa" (cuDNN
   reading the plan's blocks in place, exact backward with the merged output and LSE) for N >= 32768, and for
   training with head dim > 64 at any N; else the fused kernel "triton" (H100, reports/results/gpu_attention.json,
   measured with older code (rev 0ceb35e + uncommitted changes): at 8K its one launch beats 4-7 cuDNN calls' host
   time; from 32K at D 64 cuDNN in place wins or ties; at D 128 the fused backward is 2.6-3.8x slower). With
   FlashAttention-4 ("fa4") installed, "fa4" instead, both modes, forward and training, any N (H200: fastest in
   159 of the 160 cells of the rev 9eabb13 table, the last within 0.3%).
   Where the in-place buffers (per-branch outputs) would not fit in free GPU memory, the fused kernel runs
   instead. Dense-block callers (the ring's steps, whole_pattern=False) skip this rule and
   rule 0; in training from 32K tokens (the shard) with FlashAttention-4 they take "fa4" (dense causal 131072 on
   2 H200s: ring steps on fa4 91.4 ms fwd+bwd, on sdpa 109.0: ring_throughput/ring_2gpu_h200_fa4_run*.json).
4. CUDA, fp16/bf16 on Ampere/Ada: "flash" when flash-attn is installed, else "sdpa" (flash kernel); "triton" and
   "flex" are opt-in there or chosen by timing.
Head dims (with the shape known): a choice that does not declare the call's head dim D on the device
(executors.base.Capabilities.head_dims / cuda_head_dims; e.g. the CUDA SDPA kernels take D multiple of 8 up
to 256, the fused kernel D up to 256) gives way to the first that does of the fused kernel (where rule 3
applies), "sdpa" and "manual" (any D): `auto` never picks an executor that cannot run the call.
Timing is measured in `hilbert_lab.bench.selection` (`measure_selection`, or the CLI
`hilbert-lab select`): it times the candidates that can run once per (device name, dtype, shape,
segment_lengths, dilation_rates, mode, causal) key and stores the fastest in a JSON file
($HILBERT_LAB_CACHE_DIR or ~/.cache/hilbert_lab, file backend_selection.json). This module only reads
that file: `select_backend(..., timed=True)` returns the stored winner for the key when there is one
that runs here, else the rule. `backend="auto"` always applies the rules (rule 0 included; not the timing file).
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Optional, Sequence

import torch

from hilbert_lab.attention.auto_table import device_kind, is_ragged, load_table, table_choice
from hilbert_lab.attention.dry_run import dry_run
from hilbert_lab.attention.executors import (
    BACKENDS, EXECUTORS, BackendUnavailableError, Executor, get_executor, unavailable_reason,
)
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import cached_plan

# Compute-capability major (and minor for Ada) -> architecture.
_ARCHITECTURES = {3: "Kepler", 5: "Maxwell", 6: "Pascal", 7: "Volta", 8: "Ampere", 9: "Hopper", 10: "Blackwell",
                  12: "Blackwell"}


def architecture_name(major: int, minor: int) -> str:
    """Architecture for compute capability (major, minor): 7.5 Turing, 8.9 Ada, 10.x/12.x Blackwell."""
    named = {(7, 5): "Turing", (8, 9): "Ada"}.get((major, minor))
    return named or _ARCHITECTURES.get(major, "Blackwell" if major > 12 else "unknown")


def get_gpu_info(device: int | str | torch.device | None = None) -> dict:
    """Describe a CUDA device: name, architecture, compute_capability, memory_gb, bf16 / fp16 support.
    Without CUDA: {"available": False, "architecture": None, ...}."""
    if not torch.cuda.is_available():
        return {"available": False, "name": None, "architecture": None, "compute_capability": None,
                "memory_gb": None, "supports_bf16": False, "supports_fp16": False, "device_count": 0}
    index = torch.device(device).index if isinstance(device, (str, torch.device)) else device
    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    major, minor = props.major, props.minor
    return {"available": True, "name": props.name, "architecture": architecture_name(major, minor),
            "compute_capability": (major, minor), "memory_gb": props.total_memory / 2**30,
            "supports_bf16": major >= 8, "supports_fp16": (major, minor) >= (5, 3),
            "device_count": torch.cuda.device_count()}


def recommended_dtype(device: torch.device | str) -> torch.dtype:
    """float32 on CPU and on Pascal or older; float16 on Volta/Turing; bfloat16 on Ampere and newer."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.float32
    major = torch.cuda.get_device_capability(device)[0]
    return torch.bfloat16 if major >= 8 else torch.float16 if major >= 7 else torch.float32


def cache_path() -> Path:
    """JSON file of timed selections ($HILBERT_LAB_CACHE_DIR or ~/.cache/hilbert_lab)."""
    root = os.environ.get("HILBERT_LAB_CACHE_DIR") or Path.home() / ".cache" / "hilbert_lab"
    return Path(root) / "backend_selection.json"


def rule_backend(device: torch.device | str, dtype: torch.dtype, *, whole_pattern: bool = True,
                 shape: Optional[Sequence[int]] = None, segment_lengths: Sequence[int] = (),
                 dilation_rates: Optional[Sequence[int]] = None, mode: str = "longnet", causal: bool = False,
                 training: bool = False) -> str:
    """The backend the documented rules pick for (device, dtype) without timing.

    shape: (B, N, H, D) when known (rule 3 reads N, D and whether the in-place buffers fit, which the
    memory estimate of the pattern segment_lengths / dilation_rates / mode / causal decides);
    whole_pattern=False: the caller runs dense blocks (the ring's local steps), so rule 3 does not apply."""
    device = torch.device(device)
    if device.type != "cuda":
        return rule_for(device.type, None, dtype)
    capability, triton_ok, flash_ok, fa4_ok = _cuda_facts(device, dtype)
    seq_len = head_dim = None
    fits = True
    if shape is not None and len(shape) == 4:
        seq_len, head_dim = int(shape[1]), int(shape[3])
        if whole_pattern and triton_ok and capability[0] >= 9 and dtype in (torch.float16, torch.bfloat16):
            fits = _inplace_fits(device, shape, dtype, segment_lengths, dilation_rates, mode, causal, training)
    if head_dim is not None and unavailable_reason("fa4", device, dtype, head_dim) is not None:
        fa4_ok = False
    rules = functools.partial(rule_for, "cuda", capability, dtype, triton_ok=whole_pattern and triton_ok,
                              flash_ok=flash_ok, fa4_ok=fa4_ok, mode=mode, seq_len=seq_len, head_dim=head_dim,
                              training=training, inplace_fits=fits, dense_blocks=not whole_pattern)
    measured = None
    if whole_pattern and seq_len is not None and segment_lengths and dtype in (torch.float16, torch.bfloat16):
        rates = tuple(int(r) for r in dilation_rates) if dilation_rates is not None else (1,) * len(segment_lengths)
        rows = int(shape[0]) * seq_len * int(shape[2])
        measured = _measured_choice(device, dtype, seq_len, rows, head_dim, tuple(int(w) for w in segment_lengths),
                                    rates, mode, bool(causal), bool(training), prefer=rules())
    return rules(measured=measured)


def _device_kind(device: torch.device) -> Optional[str]:
    """The table name of the CUDA device (auto_table.device_kind), None where CUDA is not there to name it."""
    return device_kind(torch.cuda.get_device_name(device)) if torch.cuda.is_available() else None


@functools.lru_cache(maxsize=512)
def _measured_choice(device: torch.device, dtype: torch.dtype, seq_len: int, rows: int, head_dim: int,
                     segment_lengths: tuple[int, ...], dilation_rates: tuple[int, ...], mode: str, causal: bool,
                     training: bool, prefer: Optional[str] = None) -> Optional[str]:
    """The packaged table's choice for the call (attention.auto_table): the fastest executor of its nearest cell
    that runs here (`prefer` where it ties with it); None without a table for this GPU kind or a cell of this
    kind."""
    kind = _device_kind(device)
    cells = load_table(kind) if kind is not None else ()
    if not cells:
        return None
    return table_choice(cells, mode=mode, causal=causal, seq_len=seq_len, rows=rows, head_dim=head_dim,
                        training=training,
                        ragged=is_ragged(seq_len, segment_lengths, dilation_rates),
                        runs=lambda name: name in EXECUTORS and not EXECUTORS[name].capabilities.oracle
                        and unavailable_reason(name, device, dtype, head_dim) is None, prefer=prefer)


INPLACE_QUERY_BYTES = 1 << 30  # below this estimate the buffers are taken to fit without asking the device


def _inplace_fits(device: torch.device, shape: Sequence[int], dtype: torch.dtype, segment_lengths: Sequence[int],
                  dilation_rates: Optional[Sequence[int]], mode: str, causal: bool, training: bool) -> bool:
    """Whether the peak memory of "sdpa" (the in-place executor where it applies) fits in free GPU memory
    (90% of `_free_bytes`): attention.memory's estimate; the device is asked only when the estimate reaches
    INPLACE_QUERY_BYTES. The first answer per device, shape and pattern holds for the process
    (`clear_fit_decisions` forgets them): a forward recomputed under gradient checkpointing, when other
    memory is free, must take the path the forward took."""
    key = (str(device), tuple(int(extent) for extent in shape), str(dtype).removeprefix("torch."),
           tuple(int(w) for w in segment_lengths), None if dilation_rates is None else tuple(int(r) for r in dilation_rates),
           mode, bool(causal), bool(training))
    if key not in _FIT_DECISIONS:
        extra = _inplace_peak_bytes(*key)
        _FIT_DECISIONS[key] = extra < INPLACE_QUERY_BYTES or extra < 0.9 * _free_bytes(device)
    return _FIT_DECISIONS[key]


def _free_bytes(device: torch.device) -> int:
    """Bytes a new allocation can take on `device`: free device memory plus the blocks PyTorch's caching allocator
    holds unused (reserved, not allocated), which it hands out before asking the device."""
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return torch.cuda.mem_get_info(device)[0] + max(0, cached)


_FIT_DECISIONS: dict[tuple, bool] = {}


def clear_fit_decisions() -> None:
    """Forget the in-place fit decisions and the executors `auto` resolved on CUDA from them: the next call per
    shape asks the device's free memory again."""
    _FIT_DECISIONS.clear()
    _RESOLVED.clear()


# (backend name, device, dtype, shape, pattern, training, whole_pattern, packed) -> executor, on CUDA: a call's
# choice is a function of these and of the fit decision kept per shape, so it is made once (tens of microseconds
# of host time per call otherwise, which small calls feel)
_RESOLVED: dict[tuple, Executor] = {}


@functools.lru_cache(maxsize=256)
def _inplace_peak_bytes(device: str, shape: tuple[int, ...], dtype: str, segment_lengths: tuple[int, ...],
                        dilation_rates: Optional[tuple[int, ...]], mode: str, causal: bool, training: bool) -> int:
    """Peak bytes above the inputs of backend "sdpa" on (B, N, H, D) `shape` (attention.dry_run, as
    attention.memory estimates it; in place where the kernel applies); no segment_lengths: one dense segment of N
    tokens, no dilation_rates: all 1 (an upper bound of the dilated pattern's per-call buffers)."""
    seq_len, heads = shape[1], shape[2]
    lengths = segment_lengths or (seq_len,)
    rates = dilation_rates if dilation_rates is not None else (1,) * len(lengths)
    plan = cached_plan(DilatedPattern.create(lengths, rates, mode=mode, causal=causal), seq_len, heads)
    forward, forward_backward = dry_run(EXECUTORS["sdpa"], plan, shape, getattr(torch, dtype), device)
    return forward_backward if training else forward


@functools.lru_cache(maxsize=64)
def _cuda_facts(device: torch.device, dtype: torch.dtype) -> tuple[tuple[int, int], bool, bool, bool]:
    """(compute capability, triton runnable, flash runnable, FlashAttention-4 runnable): cached, since a
    failed import of an optional package costs a file-system search on every call."""
    return (torch.cuda.get_device_capability(device), unavailable_reason("triton", device, dtype) is None,
            unavailable_reason("flash", device, dtype) is None, unavailable_reason("fa4", device, dtype) is None)


INPLACE_MIN_SEQ_LEN = 32768  # rule 3: from here on in-place cuDNN beats the fused kernel (H100 sweep)


def rule_for(device_type: str, capability: Optional[tuple[int, int]], dtype: torch.dtype, *, triton_ok: bool = False,
             flash_ok: bool = False, fa4_ok: bool = False, mode: str = "longnet", seq_len: Optional[int] = None,
             head_dim: Optional[int] = None, training: bool = False, inplace_fits: bool = True,
             measured: Optional[str] = None, dense_blocks: bool = False) -> str:
    """The module's rules as a pure function of the facts they read (testable without a GPU), then the head-dim
    rule: with head_dim known, a choice that does not declare that head dim on the device gives way to the first
    of `head_dim_fallbacks` that does. measured: the packaged table's choice for the call (rule 0), taken
    unless the in-place buffers do not fit. dense_blocks: the caller runs dense blocks of its own (rule 3)."""
    if measured is not None and device_type == "cuda" and inplace_fits:
        choice = measured
    else:
        choice = _rule_choice(device_type, capability, dtype, triton_ok=triton_ok, flash_ok=flash_ok, fa4_ok=fa4_ok,
                              mode=mode, seq_len=seq_len, head_dim=head_dim, training=training,
                              inplace_fits=inplace_fits, dense_blocks=dense_blocks)
    if head_dim is None:
        return choice
    fused = device_type == "cuda" and capability is not None and capability[0] >= 9 and triton_ok and \
        dtype in (torch.float16, torch.bfloat16)
    for name in (choice, *head_dim_fallbacks(fused)):
        if EXECUTORS[name].capabilities.takes_head_dim(head_dim, device_type):
            return name
    return "manual"


def head_dim_fallbacks(fused: bool) -> tuple[str, ...]:
    """Where auto goes, in order, when its choice does not take the head dim: the fused kernel (fused: where rule 3
    applies; any D up to 256), "sdpa" (D multiple of 8 up to 256 on CUDA, any on the CPU), "manual" (any D)."""
    return ("triton", "sdpa", "manual") if fused else ("sdpa", "manual")


def _rule_choice(device_type: str, capability: Optional[tuple[int, int]], dtype: torch.dtype, *, triton_ok: bool,
                 flash_ok: bool, fa4_ok: bool, mode: str, seq_len: Optional[int], head_dim: Optional[int],
                 training: bool, inplace_fits: bool, dense_blocks: bool = False) -> str:
    """Rules 1-4 (the module docstring)."""
    if device_type == "cpu":
        return "sdpa" if dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16) else "manual"
    if device_type != "cuda" or capability is None:
        return "manual"
    half = dtype in (torch.float16, torch.bfloat16)
    if dense_blocks and half and capability[0] >= 9 and fa4_ok and training and (seq_len or 0) >= INPLACE_MIN_SEQ_LEN:
        return "fa4"
    in_place = "fa4" if fa4_ok and capability[0] >= 9 else "sdpa"
    if half and capability[0] >= 9 and triton_ok:
        if not inplace_fits:
            return "triton"
        if in_place == "fa4":
            return in_place
        if training and head_dim is not None and head_dim > 64:
            return in_place
        if seq_len is not None and seq_len >= INPLACE_MIN_SEQ_LEN:
            return in_place
        return "triton"
    if half and capability[0] >= 8:
        return "flash" if flash_ok else "sdpa"
    return "sdpa"


def candidate_backends(device: torch.device | str, dtype: torch.dtype) -> list[str]:
    """Executors worth timing on (device, dtype): every one in the table that runs there, except the
    float64 oracle (capability `oracle`)."""
    device = torch.device(device)
    return [name for name, executor in EXECUTORS.items()
            if not executor.capabilities.oracle and unavailable_reason(name, device, dtype) is None]


def selection_key(device: torch.device | str, dtype: torch.dtype, shape: Sequence[int],
                  segment_lengths: Sequence[int], dilation_rates: Optional[Sequence[int]] = None, *,
                  mode: str = "longnet", causal: bool = False) -> str:
    """The key of one timed selection in `cache_path()`: device name, dtype, shape (B, N, H, D),
    segment_lengths, dilation_rates (default all 1), mode and causal."""
    device = torch.device(device)
    if len(shape) != 4 or not segment_lengths:
        raise ValueError(f"a timed selection needs shape=(B, N, H, D) and segment_lengths, got shape={shape!r} "
                         f"and segment_lengths={segment_lengths!r}")
    rates = tuple(dilation_rates) if dilation_rates is not None else tuple(1 for _ in segment_lengths)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return (f"{name}|{dtype}|{tuple(int(x) for x in shape)}|{tuple(segment_lengths)}|{rates}|{mode}|"
            f"{bool(causal)}")


def read_selection_cache() -> dict[str, str]:
    """The timed selections stored in `cache_path()` (key -> backend name); {} when there is no readable
    file. Parsed once per file version (path, inode, modification time, size)."""
    path = cache_path()
    try:
        stat = path.stat()
    except OSError:
        return {}
    return dict(_parsed_cache(str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=4)
def _parsed_cache(path: str, inode: int, mtime_ns: int, size: int) -> tuple[tuple[str, str], ...]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return ()
    if not isinstance(data, dict):
        return ()
    return tuple((str(key), value) for key, value in data.items() if isinstance(value, str))


def select_backend(
    device: torch.device | str,
    dtype: torch.dtype,
    shape: Optional[Sequence[int]] = None,
    segment_lengths: Sequence[int] = (),
    *,
    dilation_rates: Optional[Sequence[int]] = None,
    mode: str = "longnet",
    causal: bool = False,
    training: bool = False,
    whole_pattern: bool = True,
    timed: bool = False,
) -> str:
    """Backend name for (device, dtype[, shape (B, N, H, D)]) by the rules, or by a stored timing.

    Rules: shape (B, N, H, D), training and the pattern (segment_lengths, dilation_rates, mode, causal:
    the memory estimate of the in-place buffers) feed rule 3.

    timed=True (needs shape and segment_lengths): the winner that `hilbert_lab.bench.selection` stored
    for (device, dtype, shape, segment_lengths, dilation_rates, mode, causal) in `cache_path()` when
    there is one that runs here, otherwise the rule. Nothing is timed here. whole_pattern=False always
    takes the rule (the timings ran whole patterns).
    """
    device = torch.device(device)
    if timed and whole_pattern:
        key = selection_key(device, dtype, shape if shape is not None else (), segment_lengths, dilation_rates,
                            mode=mode, causal=causal)
        stored = read_selection_cache().get(key)
        head_dim = int(shape[3]) if shape is not None and len(shape) == 4 else None
        if stored in BACKENDS and unavailable_reason(stored, device, dtype, head_dim) is None:
            return stored
    return rule_backend(device, dtype, whole_pattern=whole_pattern, shape=shape, segment_lengths=segment_lengths,
                        dilation_rates=dilation_rates, mode=mode, causal=causal, training=training)


def resolve_executor(backend: str | Executor, q: torch.Tensor, pattern: Optional[DilatedPattern] = None, *,
                     training: bool = False, whole_pattern: bool = True, packed: bool = False) -> Executor:
    """The executor for `backend` ("auto": selection.select_backend), checked to run on q.
    whole_pattern=False: the caller runs dense calls of its own, or the plan has geometry a whole-pattern
    executor does not take (auto then never picks one). packed: the plan holds several documents; auto
    then takes the first executor that runs here and declares `varlen` (one kernel call for the blocks
    of many documents), else the rule's."""
    key = None
    if not isinstance(backend, Executor) and q.device.type == "cuda":
        key = (backend, q.device, q.dtype, tuple(q.shape), pattern, training, whole_pattern, packed)
        hit = _RESOLVED.get(key)
        if hit is not None:
            return hit
    if isinstance(backend, Executor):
        chosen = backend
    elif backend == "auto" and packed and _varlen_executor(q, training) is not None:
        chosen = _varlen_executor(q, training)
    elif backend == "auto":
        segments = () if pattern is None else pattern.segment_lengths
        chosen = get_executor(select_backend(
            q.device, q.dtype, shape=tuple(q.shape), segment_lengths=segments,
            dilation_rates=None if pattern is None else pattern.dilation_rates,
            mode="longnet" if pattern is None else pattern.mode, causal=bool(pattern is not None and pattern.causal),
            training=training, whole_pattern=whole_pattern))
    else:
        chosen = get_executor(backend)
    reason = chosen.unavailable_reason(q.device, q.dtype, q.shape[-1])
    if reason is not None:
        raise BackendUnavailableError(f"backend {chosen.name!r} cannot run on {q.device} / {q.dtype}: {reason}")
    if key is not None:
        if len(_RESOLVED) > 4096:
            _RESOLVED.clear()
        _RESOLVED[key] = chosen
    return chosen


def _varlen_executor(q: torch.Tensor, training: bool) -> Optional[Executor]:
    """The first executor of the table that runs on q and declares `varlen` (and a backward when training)."""
    for executor in EXECUTORS.values():
        caps = executor.capabilities
        if caps.varlen and (caps.backward or not training) and \
                executor.unavailable_reason(q.device, q.dtype, q.shape[-1]) is None:
            return executor
    return None
