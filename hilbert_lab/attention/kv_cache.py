"""A key/value cache for causal dilated attention: decoding steps that read only the keys a new query sees.

In branch i (segment w, dilation r) a query at position p sees the keys of its own segment
[p - p % w, p] whose dilation residue (q % w) % r equals the offset of the query's head, and only the
heads whose offset is p's own residue see anything at all. So a decoding step costs, per branch, one
dense kernel call over at most min(w, N) / r keys for the heads of one offset group, and no future
query ever sees a key before the start of its branch's current segment: the cache keeps the keys and
values of positions [start, N) with start = min over branches of the current segment's start, so it
never holds more than the longest segment (for a pattern without a whole-sequence branch).

`DilatedKVCache.attend(q, k, v)` appends k, v (B, T, H_kv, D) at positions [N, N + T) and returns the
causal dilated attention of the new queries q (B, T, H, D) over every key so far: exactly the last T
rows of `dilated_attention` on the whole sequence. Paths: the first call (empty cache) is the engine
on the prompt; one new token is `step_attention`: one strided view of the stored keys per branch and one kernel
call per head group (executors.kernel.call_forward), merged by LSE (merge_step); several new tokens after a
prompt run each branch's plan over its current segments (queries fewer than keys). No gradients.
`step_attention` also serves callers that hold the keys themselves (transformers' cache).
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

import torch

from hilbert_lab.attention.engine import dilated_attention, execute_plan
from hilbert_lab.attention.selection import resolve_executor
from hilbert_lab.attention.executors.base import lse_dtype
from hilbert_lab.attention.executors.kernel import call_forward
from hilbert_lab.attention.merge import fused_merge_applies, merge_lse, merge_slots
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import cached_plan, kv_split
from hilbert_lab.attention.validation import validate_attention_inputs

__all__ = ["DilatedKVCache", "chunk_attention", "dense_executor", "merge_step", "step_attention", "step_calls",
           "step_kernel"]


class DilatedKVCache:
    """Keys and values of one causal dilated-attention layer for incremental decoding (see the module docstring).

    segment_lengths / dilation_rates / mode: the layer's pattern (always causal). backend: the executor
    (as in `dilated_attention`; a whole-pattern executor runs only the prompt, the steps then take
    `auto`'s dense kernel). scale: None (D**-0.5) or the layer's scale. max_length: the longest sequence
    the cache will hold, if known (segments longer than it are whole-sequence segments; storage is then
    allocated once). Attributes after a call: `length` (tokens so far, the next query's position),
    `start` (the first position still stored), `keys_read` (key rows x query heads the last call's
    kernels read), `capacity` (rows allocated per key/value tensor).
    """

    def __init__(self, segment_lengths: Sequence[int], dilation_rates: Sequence[int], *, mode: str = "longnet",
                 backend: str = "auto", scale: Optional[float] = None, max_length: Optional[int] = None) -> None:
        self.pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=True)
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length < 1):
            raise ValueError(f"max_length must be None or a positive integer, got {max_length!r}")
        self.backend, self.scale, self.max_length = backend, scale, max_length
        self.reset()

    @classmethod
    def for_module(cls, module, *, max_length: Optional[int] = None) -> "DilatedKVCache":
        """A cache with the pattern, backend and scale of a DilatedAttention or MultiheadDilatedAttention."""
        inner = getattr(module, "attention", module)
        pattern = getattr(inner, "pattern", None)
        if not isinstance(pattern, DilatedPattern) or getattr(inner, "hilbert_pattern", False):
            raise ValueError(f"module must be a DilatedAttention or MultiheadDilatedAttention without hilbert_pattern, "
                             f"got {type(module).__name__}")
        return cls(pattern.segment_lengths, pattern.dilation_rates, mode=pattern.mode, backend=inner.backend,
                   scale=inner.scale, max_length=max_length)

    def reset(self) -> None:
        """Forget every token (the next call is a prompt again)."""
        self.length, self.start, self.keys_read, self.capacity = 0, 0, 0, 0
        self.keys: Optional[torch.Tensor] = None
        self.values: Optional[torch.Tensor] = None
        self._executor: Optional[tuple] = None
        self._finite = True  # every key, value and query so far is finite (CPU steps then skip call_forward's check)

    # -- geometry ---------------------------------------------------------------------------------------
    def segment_start(self, branch: int, position: int) -> int:
        """First position of the segment of `branch` that holds `position`."""
        w = self.pattern.segment_lengths[branch]
        return position - position % w

    def keep_from(self, position: int) -> int:
        """The first position a query at `position` or later can still see (in any branch)."""
        return min(self.segment_start(i, position) for i in range(self.pattern.num_branches))

    def target_capacity(self) -> int:
        """Rows a cache needs at most for one-token steps: the longest segment (nested segment lengths), or
        twice it (compactions then move at most half of it); unbounded for a whole-sequence branch."""
        lengths = [w if self.max_length is None else min(w, self.max_length) for w in self.pattern.segment_lengths]
        longest = max(lengths)
        nested = all(longest % w == 0 for w in lengths)
        return longest if nested else 2 * longest

    # -- storage ----------------------------------------------------------------------------------------
    def _append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v (B, T, H_kv, D) at positions [length, length + T), evicting what no query from
        position `length` on can see when room is needed."""
        steps = k.shape[1]
        if self.keys is not None:
            expected = (self.keys.shape[0], self.keys.shape[2], self.keys.shape[3], self.keys.dtype, self.keys.device)
            got = (k.shape[0], k.shape[2], k.shape[3], k.dtype, k.device)
            if got != expected:
                raise ValueError(f"k, v must match the cached (batch, kv heads, head dim, dtype, device) {expected}, "
                                 f"got {got}; call reset() to start a new sequence")
        if self.keys is None:
            capacity = self.target_capacity() if self.max_length is not None else min(64, self.target_capacity())
            self._allocate(k, v, max(steps, capacity), 0)
            self.start = self.length
        elif self.length + steps > self.start + self.capacity:
            keep = max(self.keep_from(self.length), self.start)
            kept = self.length - keep
            needed = kept + steps
            offset = keep - self.start
            if needed <= self.capacity:  # compact: drop closed segments
                if kept:
                    for buffer in (self.keys, self.values):
                        buffer[:, :kept] = buffer[:, offset:offset + kept].clone()
            else:  # grow (doubling up to the target, beyond it only for whole-sequence branches or long chunks)
                self._allocate(k, v, max(needed, min(2 * self.capacity, self.target_capacity())), offset, kept)
            self.start = keep
        row = self.length - self.start
        self.keys[:, row:row + steps] = k
        self.values[:, row:row + steps] = v
        self.length += steps

    def _check_room(self, k: torch.Tensor, capacity: int) -> None:
        """ValueError naming max_length (or the sequence length) when keys and values of `capacity` rows shaped
        like k (B, T, H_kv, D) would not fit the memory of k's device (available_bytes)."""
        needed = 2 * k.shape[0] * capacity * k.shape[2] * k.shape[3] * k.element_size()
        limit = available_bytes(k.device)
        if limit is None or needed <= limit:
            return
        what = (f"max_length={self.max_length}" if self.max_length is not None else
                f"a sequence of {self.length + k.shape[1]} tokens (a whole-sequence branch keeps every key)")
        raise ValueError(f"{what} needs a cache of {needed} bytes ({needed / 2**30:.3g} GiB: keys and values, 2 x "
                         f"B={k.shape[0]} x {capacity} rows x H_kv={k.shape[2]} x D={k.shape[3]} x {k.element_size()} "
                         f"bytes), more than the {limit} bytes ({limit / 2**30:.3g} GiB) available on {k.device}: "
                         f"max_length must be at most the longest sequence the cache will hold, and its keys and "
                         f"values must fit the device")

    def _allocate(self, k: torch.Tensor, v: torch.Tensor, capacity: int, offset: int = 0, kept: int = 0) -> None:
        """New buffers of `capacity` rows holding the `kept` stored rows from row `offset` on."""
        self._check_room(k, capacity)
        shape = (k.shape[0], capacity, k.shape[2], k.shape[3])
        keys = torch.empty(shape, dtype=k.dtype, device=k.device)
        values = torch.empty(shape, dtype=v.dtype, device=v.device)
        if kept:
            keys[:, :kept] = self.keys[:, offset:offset + kept]
            values[:, :kept] = self.values[:, offset:offset + kept]
        self.keys, self.values, self.capacity = keys, values, capacity

    def _prompt_tail(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """After a prompt of T tokens: store only the rows later queries can see."""
        keep = self.keep_from(k.shape[1])
        if k.device.type == "cpu":
            self._finite = bool(torch.isfinite(k[:, keep:]).all() & torch.isfinite(v[:, keep:]).all())
        self.length, self.keys = keep, None
        self._append(k[:, keep:], v[:, keep:])

    # -- the protocol of a decoding cache (models.blocks) ------------------------------------------------
    def token_positions(self, steps: int, device=None) -> torch.Tensor:
        """Positions (steps,) of the next `steps` tokens, on `device`."""
        return torch.arange(self.length, self.length + steps, device=device)

    # -- attention --------------------------------------------------------------------------------------
    @torch.no_grad()
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, return_lse: bool = False):
        """Append k, v (B, T, H_kv, D) and attend the new queries q (B, T, H, D) causally over every key so far
        -> out (B, T, H, D) [, lse (B, H, T)]: the last T rows of dilated attention on the whole sequence."""
        if q.dim() != 4 or k.shape[1:2] != q.shape[1:2] or v.shape != k.shape or q.shape[1] == 0 \
                or q.shape[2] % max(k.shape[2], 1) or (q.shape[0], q.shape[3]) != (k.shape[0], k.shape[3]):
            raise ValueError(f"q must be (B, T, H, D) and k, v (B, T, H_kv, D), T >= 1, H a multiple of H_kv, got "
                             f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
        device = q.device.type
        if device in ("cpu", "cuda") and torch.is_autocast_enabled(device):  # run in the autocast dtype
            low = torch.get_autocast_dtype(device)
            with torch.autocast(device, enabled=False):
                return self.attend(q.to(low), k.to(low), v.to(low), return_lse=return_lse)
        if self.length == 0:  # the prompt; later calls must match what is stored (checked when appending)
            validate_attention_inputs(k, k, v)
            self._scale = validate_attention_inputs(q, q, q, scale=self.scale)
            if self.max_length is not None:  # the storage is allocated once: refuse it before any work
                self._check_room(k, max(k.shape[1], self.target_capacity()))
        if (k.dtype, k.device) != (q.dtype, q.device):
            raise ValueError(f"q, k, v must share a dtype and device, got {q.dtype} on {q.device} and {k.dtype} on "
                             f"{k.device}")
        scale = self._scale
        if self.length == 0:
            out, lse = self._prompt(q, k, v, scale)
        elif q.shape[1] == 1:
            if q.device.type == "cpu" and self._finite:  # one reduction over the new token's q, k, v
                self._finite = bool(torch.isfinite(torch.cat([q.reshape(-1), k.reshape(-1), v.reshape(-1)])).all())
            self._append(k, v)
            out, lse = self._step(q, scale)
        else:
            self._finite = False  # chunks run the plan (call_forward checks every call)
            self._append(k, v)
            out, lse = self._chunk(q, scale)
        return (out, lse) if return_lse else out

    def _dense_executor(self, q: torch.Tensor):
        """The executor of the steps (dense_executor), per device, dtype and head dim."""
        key = (q.device, q.dtype, q.shape[-1])
        if self._executor is None or self._executor[0] != key:
            executor = dense_executor(self.backend, q, self.pattern)
            self._executor = (key, executor, step_kernel(executor, q))
        return self._executor[1]

    def _prompt(self, q, k, v, scale):
        p = self.pattern
        if k.shape[2] == q.shape[2]:
            out, lse = dilated_attention(q, k, v, segment_lengths=p.segment_lengths, dilation_rates=p.dilation_rates,
                                         mode=p.mode, causal=True, backend=self.backend, scale=scale, return_lse=True)
        else:  # grouped key/value heads: the plan reads them without repeating
            plan = cached_plan(p, q.shape[1], q.shape[2], num_kv_heads=k.shape[2])
            out, lse = execute_plan(plan, self._dense_executor(q), q, k, v, scale)
        self.keys_read = plan_keys(p, q.shape[1], q.shape[2], q.shape[1])
        self._prompt_tail(k, v)
        return out, lse

    def _step(self, q: torch.Tensor, scale: float):
        """One new token at position length - 1 over the stored keys (step_attention)."""
        self._dense_executor(q)
        out, lse, self.keys_read = step_attention(self.pattern, q, self.keys, self.values, self.length - 1,
                                                  start=self.start, kernel=self._executor[2], scale=scale,
                                                  finite=self._finite and q.device.type == "cpu")
        return out, lse

    def _chunk(self, q: torch.Tensor, scale: float):
        """T > 1 new tokens after a prompt (chunk_attention over the stored rows)."""
        def stored(begin: int):
            rows = slice(begin - self.start, self.length - self.start)
            return self.keys[:, rows], self.values[:, rows]

        out, lse, self.keys_read = chunk_attention(self.pattern, q, stored, self.length - q.shape[1],
                                                   self._dense_executor(q), scale)
        return out, lse

    def memory_bytes(self) -> int:
        """Bytes of the stored keys and values."""
        return 0 if self.keys is None else 2 * self.keys.numel() * self.keys.element_size()

    def __repr__(self) -> str:
        p = self.pattern
        return (f"DilatedKVCache(segment_lengths={list(p.segment_lengths)}, dilation_rates={list(p.dilation_rates)}, "
                f"mode={p.mode!r}, length={self.length}, start={self.start}, capacity={self.capacity})")


def available_bytes(device: torch.device) -> Optional[int]:
    """Bytes a new allocation on `device` can take: the CPU's available memory (psutil), a CUDA device's free
    memory plus what PyTorch's caching allocator holds unused there; None (no limit) on other devices."""
    if device.type == "cpu":
        import psutil

        return int(psutil.virtual_memory().available)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    return None


def chunk_attention(pattern: DilatedPattern, q: torch.Tensor, window, first: int, executor,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor, int]:
    """T > 1 new tokens (q (B, T, H, D) at positions first .. first + T - 1, their keys and values stored) ->
    (out (B, T, H, D), lse (B, H, T), key rows x heads read): each branch's plan over its segments from the one
    holding `first` (a multiple of its segment length, so its geometry is the whole sequence's), queries last,
    merged by LSE. window(begin) -> keys, values (B, first + T - begin, H_kv, D) of positions begin .. first + T - 1."""
    steps, heads = q.shape[1], q.shape[2]
    outs, lses, read = [], [], 0
    for branch, w in enumerate(pattern.segment_lengths):
        keys, values = window(first - first % w)
        kv_heads = keys.shape[2]
        plan = cached_plan(pattern, keys.shape[1], heads, (branch,),
                           num_kv_heads=None if kv_heads == heads else kv_heads, query_len=steps)
        out, lse = execute_plan(plan, executor, q, keys, values, scale)
        outs.append(out)
        lses.append(lse)
        read += sum(b.count * b.length * b.num_heads for b in plan.blocks)
    out, lse = merge_lse(outs, lses)
    return out.to(q.dtype), lse, read


def dense_executor(backend, q: torch.Tensor, pattern: DilatedPattern):
    """The executor `backend` names, or auto's dense one where it is a whole-pattern executor (which has no dense
    kernel for single calls): the executor of decoding steps."""
    executor = resolve_executor(backend, q, pattern, whole_pattern=False)
    if executor.kernel_for is None:
        executor = resolve_executor("auto", q, pattern, whole_pattern=False)
    return executor


def step_kernel(executor, q: torch.Tensor):
    """The dense kernel of decoding steps with `executor` on q: its kernel, or the one that kernel declares for
    calls whose key count changes from call to call (each step sees one key more)."""
    kernel = executor.kernel_for(q)
    return kernel.varying_lengths or kernel


@functools.lru_cache(maxsize=64)
def step_calls(pattern: DilatedPattern, num_heads: int, num_kv_heads: int) -> tuple:
    """Per branch (w, r, {offset: ((query heads, first kv head, kv heads, kv head step), ...)}): the kernel calls of
    a decoding step by the residue of its position (call head j reads kv head j // (h / h_kv), plan.kv_split)."""
    per_branch = []
    for branch, offsets in enumerate(pattern.head_offsets(num_heads)):
        calls = {}
        for offset in sorted(set(int(o) for o in offsets if o >= 0)):
            heads = tuple(int(h) for h in (offsets == offset).nonzero()[0])
            calls[offset] = tuple((q_heads, kv.start, len(range(kv.start, kv.stop, kv.step)), kv.step)
                                  for q_heads, kv in kv_split(heads, num_heads, num_kv_heads))
        per_branch.append((pattern.segment_lengths[branch], pattern.dilation_rates[branch], calls))
    return tuple(per_branch)


def step_attention(pattern: DilatedPattern, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, position: int,
                   *, start: int = 0, kernel, scale: float, finite: bool = False):
    """Causal dilated attention of one query per row at `position` -> (out (B, 1, H, D), lse (B, H, 1), key rows
    x query heads read). q (B, 1, H, D); keys, values (B, M, H_kv, D), any strides, row i holding position
    start + i and every position the query sees (its segment in each branch) among them. Per branch: the
    residue of `position` picks the heads that see anything, and one strided view of the keys of that residue
    in the current segment (no copy) goes to `kernel` (executors.kernel.DenseKernel) through call_forward, or
    straight to the kernel when `finite` says the caller knows every input is finite (CPU: the check is all
    call_forward would add); the branches merge by LSE (merge_step). No autograd."""
    batch, _, heads, dim = q.shape
    branches = step_calls(pattern, heads, keys.shape[2])
    outs = torch.zeros((len(branches), batch, 1, heads, dim), dtype=q.dtype, device=q.device)
    lses = torch.full((len(branches), batch, 1, heads), float("-inf"), dtype=lse_dtype(q.dtype), device=q.device)
    k_b, k_n, k_h, k_d = keys.stride()
    v_b, v_n, v_h, v_d = values.stride()
    read = 0
    for branch, (w, r, calls) in enumerate(branches):
        residue = (position % w) % r
        if residue not in calls:
            continue
        first = position - position % w + residue
        count = (position - first) // r + 1
        row = first - start
        for q_heads, kv_first, kv_count, kv_step in calls[residue]:
            size = (batch, count, kv_count, dim)
            kv = keys.as_strided(size, (k_b, r * k_n, kv_step * k_h, k_d),
                                 keys.storage_offset() + row * k_n + kv_first * k_h)
            vv = values.as_strided(size, (v_b, r * v_n, kv_step * v_h, v_d),
                                   values.storage_offset() + row * v_n + kv_first * v_h)
            qv = q[:, :, q_heads]
            if finite and count >= kernel.min_length and (kernel.gqa or qv.shape[2] == kv_count):
                out, lse, _ = kernel.forward(qv, kv, vv, causal=False, scale=scale, need_lse=True)
            else:
                out, lse, _ = call_forward(kernel, qv, kv, vv, causal=False, scale=scale)
            outs[branch, :, :, q_heads] = out
            lses[branch, :, :, q_heads] = lse.transpose(1, 2)
            read += count * out.shape[2]
    out, lse = merge_step(outs, lses, q.dtype)
    return out, lse, read


def plan_keys(pattern: DilatedPattern, seq_len: int, num_heads: int, queries: int) -> int:
    """Key rows x query heads the kernels of the plan for the last `queries` of seq_len positions read."""
    plan = cached_plan(pattern, seq_len, num_heads, query_len=None if queries == seq_len else queries)
    return sum(b.count * b.length * b.num_heads for b in plan.blocks)


def merge_step(outs: torch.Tensor, lses: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A step's branch slots outs (P, B, 1, H, D) (zero where a branch wrote nothing) and lses (P, B, 1, H) merged
    by LSE -> (out (B, 1, H, D), lse (B, H, 1)): merge_slots (its fused pass on CUDA), elsewhere merge_lse's
    arithmetic in one stacked pass without autograd: max-subtracted and sum-normalised, -inf slots weigh 0, a
    NaN LSE makes its row NaN, rows without keys give 0 and -inf."""
    if outs.shape[0] == 1 or fused_merge_applies(outs, lses):
        return merge_slots(outs, lses, dtype)
    peak = lses.amax(0).clamp_min(torch.finfo(lses.dtype).min)  # rows without keys: a finite peak, weights 0
    weights = (lses - peak).exp()
    total = weights.sum(0)
    out = (weights.unsqueeze(-1) * outs.to(weights.dtype)).sum(0) / total.clamp_min(1.0).unsqueeze(-1)
    return out.to(dtype), (peak + total.log()).transpose(1, 2)
