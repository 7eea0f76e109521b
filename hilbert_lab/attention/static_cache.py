"""A fixed-shape key/value cache for causal dilated attention: decoding steps a CUDA graph can hold.

`DilatedStaticCache` allocates keys and values (B, C, H_kv, D) once and stores position m of row b at row m % C,
with C = min(longest segment, max_length): a query at p sees no key older than p - C + 1, so a row is
overwritten only once nothing can read it (transformers' StaticCache keeps every position instead). Each
batch row has its own position, a device tensor: prompts of different lengths decode side by side, and a
step depends on no host value, so the steps of every layer can be captured in one CUDA graph and replayed.

A step appends the new key and value and attends over exactly the keys each head's branches see (see
attention.kv_cache for the geometry): on CUDA two Triton launches (kernels.triton_decode), elsewhere the same
arithmetic in torch over a gather bounded by the longest branch. The prompt runs once through
`dilated_attention` (one row at a time where the rows' lengths differ); a later chunk of T > 1 tokens per row
called eagerly runs each branch's plan over the keys its segments reach (attention.kv_cache.chunk_attention, as
the growing cache does); under torch.compile or a CUDA graph's capture a chunk is T steps. `DilatedKVCache` is the
growing cache of the CPU path.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import torch

from hilbert_lab.attention.engine import dilated_attention
from hilbert_lab.attention.executors.base import lse_dtype
from hilbert_lab.attention.kv_cache import chunk_attention, dense_executor, merge_step
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.validation import validate_attention_inputs
from hilbert_lab.kernels import triton_decode

__all__ = ["DilatedStaticCache", "decode_step", "keys_seen", "static_capacity", "step_tables", "triton_applies"]


def static_capacity(pattern: DilatedPattern, max_length: int) -> int:
    """Rows per key/value tensor: the longest span a query sees, min(longest segment, max_length)."""
    return min(max(pattern.segment_lengths), max_length)


def keys_seen(pattern: DilatedPattern, num_heads: int, position: int) -> int:
    """Key rows x query heads a decoding step at `position` reads: per branch and head whose offset is the
    position's residue, the keys of its segment with that residue up to the position."""
    total = 0
    for w, r, offsets in zip(pattern.segment_lengths, pattern.dilation_rates, pattern.head_offsets(num_heads)):
        within = position % w
        total += int((offsets == within % r).sum()) * ((within - within % r) // r + 1)
    return total


def step_tables(pattern: DilatedPattern, num_heads: int, span: int, device: torch.device) -> tuple:
    """(branches int32 (P, 4), offsets int32 (P, H), bounds) for steps at positions below `span` on `device`:
    per branch its segment (clipped to span: p % w is then unchanged), its dilation rate, the most query heads that
    share one offset and the most keys one head sees, ceil(min(w, span) / r); bounds: those last two as host ints,
    ((heads, keys), ...) per branch. Cached; do not modify."""
    return _tables(pattern.segment_lengths, pattern.dilation_rates, pattern.mode, pattern.causal, int(num_heads),
                   int(span), torch.device(device))


_TABLES: dict = {}  # _tables' results by their arguments


@torch.compiler.assume_constant_result  # compiled callers hold the tables as constants: no graph break, no copy
def _tables(lengths: tuple, rates: tuple, mode: str, causal: bool, num_heads: int, span: int,
            device: torch.device) -> tuple:
    key = (lengths, rates, mode, causal, num_heads, span, device)
    if key not in _TABLES:
        if len(_TABLES) >= 64:
            _TABLES.clear()
        offsets = np.stack(DilatedPattern.create(lengths, rates, mode=mode, causal=causal).head_offsets(num_heads))
        bounds = tuple((max(1, max(int((row == o).sum()) for o in range(r))), math.ceil(min(w, span) / r))
                       for w, r, row in zip(lengths, rates, offsets))
        branches = [[min(w, span), r, heads, keys] for w, r, (heads, keys) in zip(lengths, rates, bounds)]
        _TABLES[key] = (torch.tensor(branches, dtype=torch.int32, device=device),
                        torch.from_numpy(offsets).to(device=device, dtype=torch.int32).contiguous(), bounds)
    return _TABLES[key]


def triton_applies(keys: torch.Tensor) -> bool:
    """Whether a step over `keys` runs the Triton kernels: on CUDA, triton installed, float16/bfloat16/float32."""
    return keys.is_cuda and triton_decode.HAVE_TRITON and keys.dtype in (torch.float16, torch.bfloat16, torch.float32)


def decode_step(pattern: DilatedPattern, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                positions: torch.Tensor, scale: float, *, k_new: Optional[torch.Tensor] = None,
                v_new: Optional[torch.Tensor] = None, span: Optional[int] = None, advance: bool = True,
                tables: Optional[tuple] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One causal dilated decoding step per row from key/value storage -> (out (B, H, D), lse (B, H)).

    q (B, H, D) at positions (B,) int64 (a device tensor); keys, values (B, C, H_kv, D), any strides with a
    contiguous last dimension, position m at row m % C, C at least the longest span a query sees. k_new, v_new
    (B, H_kv, D): the new token's, written at row positions % C first; None where the storage holds them already.
    span: an upper bound on every position (default C). advance: add 1 to positions afterwards. tables: the
    step_tables of (pattern, H, span, device), where the caller holds them (a compiled step then traces no table
    building). No host value: the Triton kernels on CUDA (triton_applies), elsewhere the same arithmetic in torch."""
    if tables is None:
        tables = step_tables(pattern, q.shape[1], keys.shape[1] if span is None else span, keys.device)
    if triton_applies(keys):
        return triton_decode.dilated_decode(q, k_new, v_new, keys, values, positions, *tables, scale,
                                            advance=advance)
    return _step_torch(pattern, q, keys, values, positions, scale, k_new, v_new, tables[1], advance)


def _step_torch(pattern, q, keys, values, positions, scale, k_new, v_new, offsets, advance):
    """decode_step's arithmetic in torch: per branch a gather of at most ceil(min(w, C) / r) keys per head, masked."""
    batch, heads, dim = q.shape
    capacity = keys.shape[1]
    rows = torch.arange(batch, device=q.device)
    if k_new is not None:
        keys[rows, positions % capacity] = k_new
        values[rows, positions % capacity] = v_new
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    kv_head = torch.arange(heads, device=q.device) // (heads // keys.shape[2])
    p = positions[:, None]
    outs, lses = [], []
    for (w, r), offset in zip(zip(pattern.segment_lengths, pattern.dilation_rates), offsets.to(torch.int64)):
        within = p % w
        count = torch.where((offset >= 0) & (within % r == offset), (within - offset) // r + 1, 0)  # (B, H)
        j = torch.arange(math.ceil(min(w, capacity) / r), device=q.device)
        valid = j < count[..., None]  # (B, H, M)
        slots = torch.where(valid, (p - within + offset)[..., None] + j * r, 0) % capacity
        index = (rows[:, None, None], slots, kv_head[None, :, None])
        seen_keys, seen_values = keys[index].to(work), values[index].to(work)  # (B, H, M, D)
        scores = torch.einsum("bhd,bhmd->bhm", q.to(work), seen_keys) * scale
        scores = scores.masked_fill(~valid, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        weights = torch.where(valid, (scores - lse.clamp_min(torch.finfo(work).min)[..., None]).exp(), 0.0)
        outs.append(torch.einsum("bhm,bhmd->bhd", weights, seen_values))
        lses.append(lse.to(lse_dtype(q.dtype)))
    out, lse = merge_step(torch.stack(outs)[:, :, None], torch.stack(lses)[:, :, None], q.dtype)
    if advance:
        positions += 1
    return out[:, 0], lse[..., 0]


class DilatedStaticCache:
    """Keys and values of one causal dilated-attention layer in fixed storage (see the module docstring).

    segment_lengths / dilation_rates / mode: the layer's pattern (always causal). batch_size, max_length: rows
    and the longest sequence (prompt + new tokens) any row reaches. num_heads, num_kv_heads, head_dim, dtype,
    device: the layer's shapes. backend: the executor of the prompt. scale: None (D**-0.5) or the layer's.
    prompt_lengths: each row's prompt length where the prompt rows are left-padded (default: none padded).
    Attributes: `keys`, `values` (B, C, H_kv, D); `positions` (B,) int64 on the device, each row's next
    position (advanced by every step, also when a CUDA graph replays it); `lengths` (host ints, each row's
    prompt length); `length` (host: the longest row's length, counted by eager calls only: a caller replaying a
    captured step or running a compiled one sets it, as models.generate.decode_static does); `projections`: None,
    or the layer's linear layers prepared for its steps (a dict its block reads instead of its modules), set by
    whoever holds the layer (models.generate.new_static_caches: models.decoding_layer.decoding_projections in the
    cache's dtype).
    """

    def __init__(self, segment_lengths: Sequence[int], dilation_rates: Sequence[int], *, batch_size: int,
                 max_length: int, num_heads: int, head_dim: int, num_kv_heads: Optional[int] = None,
                 dtype: torch.dtype = torch.float32, device="cpu", mode: str = "longnet", backend: str = "auto",
                 scale: Optional[float] = None, prompt_lengths: Optional[Sequence[int]] = None) -> None:
        self.pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode, causal=True)
        kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        for name, value in (("batch_size", batch_size), ("max_length", max_length), ("num_heads", num_heads),
                            ("head_dim", head_dim), ("num_kv_heads", kv_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if num_heads % kv_heads:
            raise ValueError(f"num_heads must be a multiple of num_kv_heads, got {num_heads} and {kv_heads}")
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
        self.batch_size, self.max_length, self.num_heads, self.head_dim = batch_size, max_length, num_heads, head_dim
        self.backend, self.scale = backend, scale
        self.capacity = static_capacity(self.pattern, max_length)
        device = torch.device(device)
        shape = (batch_size, self.capacity, kv_heads, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.positions = torch.zeros(batch_size, dtype=torch.int64, device=device)
        self.lengths: list[int] = []
        self.length = 0
        self.prompted = False  # a bool, not the host lengths: a compiled step's guards then hold for any prompt
        self.prompt_lengths = None if prompt_lengths is None else [int(n) for n in prompt_lengths]
        self._tables = step_tables(self.pattern, num_heads, self.capacity, device)
        self.projections: Optional[dict] = None
        self._scale = validate_attention_inputs(self.keys[:1, :1], self.keys[:1, :1], self.keys[:1, :1], scale=scale)

    def reset(self, prompt_lengths: Optional[Sequence[int]] = None) -> None:
        """Forget every token (the next call is a prompt again, left-padded to prompt_lengths); the storage stays."""
        self.positions.zero_()
        self.lengths, self.length, self.prompted = [], 0, False
        self.prompt_lengths = None if prompt_lengths is None else [int(n) for n in prompt_lengths]

    def mark_filled(self, lengths: Sequence[int]) -> None:
        """Take the storage as holding each row's first lengths[b] tokens already (keys and values the caller wrote,
        e.g. random ones for a benchmark; position m at row m % capacity): the next call is a step, not a prompt."""
        lengths = [int(n) for n in lengths]
        if len(lengths) != self.batch_size or any(not 1 <= n <= self.max_length for n in lengths):
            raise ValueError(f"lengths must hold {self.batch_size} lengths in [1, {self.max_length}], got {lengths}")
        self.positions.copy_(torch.tensor(lengths, dtype=torch.int64), non_blocking=False)
        self.lengths, self.length, self.prompted = lengths, max(lengths), True

    def memory_bytes(self) -> int:
        """Bytes of the stored keys and values."""
        return 2 * self.keys.numel() * self.keys.element_size()

    @property
    def uses_triton(self) -> bool:
        """Whether steps run the Triton kernels (a CUDA device, triton installed, a float16/bfloat16/float32 cache)."""
        return triton_applies(self.keys)

    # -- the protocol of a decoding cache (models.blocks) -----------------------------------------------------
    def token_positions(self, steps: int, device=None) -> torch.Tensor:
        """Positions (B, steps) of the next `steps` tokens of each row: for a prompt, left-padded to its row's length
        (prompt_lengths; padding gets position 0); afterwards `positions` + 0 .. steps - 1 (a new tensor)."""
        if self.prompted:
            return self.positions[:, None] + torch.arange(steps, device=self.positions.device)
        lengths = self._prompt_lengths(steps, self.prompt_lengths)
        columns = torch.arange(steps, device=self.positions.device)
        pad = torch.tensor([steps - n for n in lengths], device=self.positions.device)
        return (columns[None, :] - pad[:, None]).clamp_min(0)

    def check_room(self, steps: int) -> None:
        """ValueError unless `steps` more tokens fit max_length."""
        if self.length + steps > self.max_length:
            raise ValueError(f"sequence length must be <= max_length={self.max_length} of the static cache, got "
                             f"{self.length} cached + {steps}")

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The prompt q (B, T, H, D), k, v (B, T, H_kv, D) (rows left-padded to prompt_lengths), or after it T new
        tokens per row -> out (B, T, H, D) (zeros at padding). Under torch.autocast they run in the cache's dtype."""
        device = q.device.type
        if device in ("cpu", "cuda") and torch.is_autocast_enabled(device):
            with torch.autocast(device, enabled=False):
                low = self.keys.dtype
                return self.attend(q.to(low), k.to(low), v.to(low))
        if not self.prompted:
            return self.prefill(q, k, v)
        return self.step(q, k, v)

    # -- the prompt -----------------------------------------------------------------------------------------
    def _prompt_lengths(self, steps: int, lengths: Optional[Sequence[int]]) -> list[int]:
        lengths = [steps] * self.batch_size if lengths is None else [int(n) for n in lengths]
        if len(lengths) != self.batch_size or any(not 1 <= n <= steps for n in lengths):
            raise ValueError(f"lengths must hold {self.batch_size} prompt lengths in [1, {steps}], got {lengths}")
        if max(lengths) > self.max_length:
            raise ValueError(f"prompt length must be <= max_length={self.max_length}, got {max(lengths)}")
        return lengths

    def _check_shapes(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        expected = (self.batch_size, q.shape[1], self.keys.shape[2], self.head_dim)
        if q.shape != (self.batch_size, q.shape[1], self.num_heads, self.head_dim) or k.shape != expected \
                or v.shape != expected or q.shape[1] < 1:
            raise ValueError(f"q must be (B, T, H, D) = ({self.batch_size}, T, {self.num_heads}, {self.head_dim}) and "
                             f"k, v (B, T, H_kv, D) = {expected}, got {tuple(q.shape)}, {tuple(k.shape)}, "
                             f"{tuple(v.shape)}")
        if any((t.dtype, t.device) != (self.keys.dtype, self.keys.device) for t in (q, k, v)):
            raise ValueError(f"q, k, v must be {self.keys.dtype} on {self.keys.device} (the cache's), got "
                             f"{q.dtype} on {q.device}, {k.dtype} on {k.device}, {v.dtype} on {v.device}")

    @torch.no_grad()
    def prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                lengths: Optional[Sequence[int]] = None) -> torch.Tensor:
        """The prompt: dilated_attention of each row's last lengths[b] tokens (default prompt_lengths, else every
        row full; all rows at once where they are equal), its keys and values stored; positions become the lengths."""
        self._check_shapes(q, k, v)
        steps = q.shape[1]
        lengths = self._prompt_lengths(steps, self.prompt_lengths if lengths is None else lengths)
        p = self.pattern
        call = dict(segment_lengths=p.segment_lengths, dilation_rates=p.dilation_rates, mode=p.mode, causal=True,
                    backend=self.backend, scale=self._scale)
        if all(n == steps for n in lengths):
            out = dilated_attention(q, k, v, **call)
        else:
            out = torch.zeros_like(q)
            for row, n in enumerate(lengths):
                out[row:row + 1, steps - n:] = dilated_attention(q[row:row + 1, steps - n:], k[row:row + 1, steps - n:],
                                                                 v[row:row + 1, steps - n:], **call)
        for row, n in enumerate(lengths):
            kept = min(n, self.capacity)
            slots = torch.arange(n - kept, n, device=self.keys.device) % self.capacity
            self.keys[row, slots] = k[row, steps - kept:]
            self.values[row, slots] = v[row, steps - kept:]
        self.mark_filled(lengths)
        return out

    # -- new tokens after the prompt -------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """T new tokens per row: q (B, T, H, D), k, v (B, T, H_kv, D) -> out (B, T, H, D); one step per token, each
        appending its k, v at the row's position and advancing it. No host synchronisation (CUDA-graph
        capturable)."""
        if not self.prompted:
            raise ValueError("step needs a prompt first (attend or prefill)")
        self._check_shapes(q, k, v)
        counted = not torch.compiler.is_compiling()  # a compiled step keeps no host int that changes per call
        if counted:
            self.check_room(q.shape[1])
        if q.shape[1] > 1 and counted and not (q.is_cuda and torch.cuda.is_current_stream_capturing()):
            out = self._chunk(q, k, v)
            self.length += q.shape[1]
            return out
        outs = [self.step_with_lse(q[:, t], k[:, t], v[:, t])[0] for t in range(q.shape[1])]
        if counted:
            self.length += q.shape[1]
        return outs[0].unsqueeze(1) if len(outs) == 1 else torch.stack(outs, 1)  # one token: no copy

    def _chunk(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """T > 1 new tokens per row (eager calls: host positions), per group of rows at one position:
        attention.kv_cache.chunk_attention over the stored keys each branch's segment reaches (the storage holds
        the longest segment, so every such key is there) and the chunk's own, then the chunk's keys and values
        stored and the positions advanced."""
        steps, capacity = q.shape[1], self.capacity
        shift = self.length - max(self.lengths)  # tokens every row has taken since its prompt
        groups = {}
        for row, n in enumerate(self.lengths):
            groups.setdefault(n + shift, []).append(row)
        executor = dense_executor(self.backend, q, self.pattern)
        out = torch.empty_like(q)
        for start, rows in groups.items():
            index = torch.tensor(rows, device=q.device)

            def window(begin: int):
                slots = torch.arange(begin, start, device=q.device) % capacity
                return (torch.cat([self.keys[index[:, None], slots], k[index]], 1),
                        torch.cat([self.values[index[:, None], slots], v[index]], 1))

            out[index] = chunk_attention(self.pattern, q[index], window, start, executor, self._scale)[0]
            kept = min(steps, capacity)
            slots = torch.arange(start + steps - kept, start + steps, device=q.device) % capacity
            self.keys[index[:, None], slots] = k[index, steps - kept:]
            self.values[index[:, None], slots] = v[index, steps - kept:]
        self.positions += steps
        return out

    def step_with_lse(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q (B, H, D), k, v (B, H_kv, D) -> (out (B, H, D), lse (B, H)); the kernels of `step`, unchecked."""
        return decode_step(self.pattern, q, self.keys, self.values, self.positions, self._scale, k_new=k, v_new=v,
                           tables=self._tables)

    def __repr__(self) -> str:
        p = self.pattern
        return (f"DilatedStaticCache(segment_lengths={list(p.segment_lengths)}, dilation_rates="
                f"{list(p.dilation_rates)}, mode={p.mode!r}, batch_size={self.batch_size}, max_length="
                f"{self.max_length}, capacity={self.capacity}, length={self.length})")
