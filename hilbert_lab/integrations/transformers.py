"""Dilated attention inside Hugging Face transformers models (extra "hf": pip install 'hilbert-lab[hf]').

`register()` adds an attention function to transformers' `AttentionInterface` and its mask function to
`AttentionMaskInterface` (without the latter transformers drops the padding mask) under a name it returns;
a model whose config carries `dilated_segment_lengths` and `dilated_dilation_rates` (optionally
`dilated_mode`, "longnet" or "head_groups", and `dilated_backend`, a `backend=` name) then runs with
`attn_implementation=<name>` or `model.set_attn_implementation(<name>)`; `use_dilated_attention(model, ...)`
does all three (and with `gemv_linears=True` runs the model's linear layers of a decoding step as the Triton GEMV
that LongNetLM's steps use, kernels.gemv_linear).

Saving: the config records the running implementation as `attn_implementation` (written by
`use_dilated_attention` and by every forward pass), the field that transformers' `from_pretrained` reads, so a
saved model loads dilated where `register()` has run, and elsewhere transformers refuses the unknown name;
`from_pretrained(..., attn_implementation="sdpa")` loads it dense on purpose. (A model built with
`attn_implementation=<name>` in its config and saved before any forward pass has no record yet: set
`config.attn_implementation = <name>`.)

Every call runs the plan of the pattern (attention.plan) on the layer's q (B, H, Nq, D) and k, v (B, H_kv, Nk, D)
as transformers passes them (never repeating K/V for grouped heads):
- queries fewer than keys (transformers' cache, generation): the queries are the last Nq valid keys; one new
  token per row (no gradient, no padding mask) is one decoding step straight from the cache's storage, the key
  of position m at row m (dynamic and static caches), positions read on the device from position_ids
  (attention.static_cache.decode_step: Triton kernels on CUDA, no host value); with a padding mask it reads the
  keys it sees per document (attention.kv_cache.step_attention);
- packed rows: position_ids that restart (transformers' flattening collator) split a row into documents,
  each attended as its own sequence;
- padding (a 2D attention mask, e.g. left-padded prompts in `generate`): every run of real tokens and every
  run of padding is its own document, so each prompt gets exactly what it gets alone;
- a static cache: keys past the mask's length (or past the last position id) are unwritten and left out.
Documents and padding are read anew on every call (position ids may change in place between calls); the mask
that `dilated_mask` returns, a copy made for one forward pass, keeps the layout of its padding for the layers.
Under torch.compile a decoding step traces whole (transformers' compiled `generate` on a static cache, tested
with fullgraph=True); any other call reads its documents and padding on the host, so a compiled prefill or
training forward breaks its graph at each layer's attention and runs that call eagerly, exactly. What compiles
whole for training is `models.LongNetLM`, or `attention.dilated_attention` with host `cu_seqlens`.
Refused with a ValueError saying what to do: a config without the pattern, a 4D (custom) attention mask,
sliding windows, soft-capping, attention sinks, chunked attention, and overlays that transformers composes into
the mask function (`or_mask_function`, `and_mask_function`, `block_sequence_ids`, e.g. bidirectional image tokens).
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Optional, Sequence

import torch

from hilbert_lab.attention.engine import execute_plan
from hilbert_lab.attention.selection import resolve_executor
from hilbert_lab.attention.executors.manual import dropout_attention
from hilbert_lab.attention.kv_cache import dense_executor, step_attention, step_kernel
from hilbert_lab.attention.pattern import MODES, DilatedPattern
from hilbert_lab.attention.plan import cached_plan
from hilbert_lab.attention.static_cache import decode_step
from hilbert_lab.kernels.gemv_linear import use_gemv_linears

NAME = "hilbert_dilated"
MIN_VERSION = "5.17"
__all__ = ["NAME", "dilated_attention_forward", "dilated_mask", "layer_pattern", "register", "use_dilated_attention"]


def register(name: str = NAME) -> str:
    """Register the dilated attention function and its mask function under `name`; returns `name`."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as error:
        raise ImportError(f"the transformers integration needs transformers >= {MIN_VERSION} "
                          f"(pip install 'hilbert-lab[hf]'): {error}") from None
    if not isinstance(name, str) or not name or name in ("eager", "sdpa") or name.startswith(("flash", "flex", "paged")):
        raise ValueError(f"name must be a new attention implementation name such as {NAME!r}, got {name!r}")
    AttentionInterface.register(name, dilated_attention_forward)
    AttentionMaskInterface.register(name, dilated_mask)
    return name


def use_dilated_attention(model, segment_lengths: Sequence[int], dilation_rates: Sequence[int], *,
                          mode: str = "longnet", backend: str = "auto", name: str = NAME, gemv_linears: bool = False):
    """Write the pattern into `model.config`, register `name` and switch the model to it (in place; returns
    the model). The model's weights are unchanged: only which keys each query attends changes. `gemv_linears`:
    also run the model's plain nn.Linear layers of a few rows (decoding steps, up to 8 rows, no gradient, on a
    GPU) as the Triton GEMV (kernels.gemv_linear.use_gemv_linears: the same parameters, the sums rounded once)."""
    if not isinstance(gemv_linears, bool):
        raise ValueError(f"gemv_linears must be True or False, got {gemv_linears!r}")
    pattern = DilatedPattern.create(segment_lengths, dilation_rates, mode=mode)
    config = model.config
    config.dilated_segment_lengths = list(pattern.segment_lengths)
    config.dilated_dilation_rates = list(pattern.dilation_rates)
    config.dilated_mode, config.dilated_backend = pattern.mode, backend
    model.set_attn_implementation(register(name))
    config.attn_implementation = name  # saved with the config: from_pretrained loads the model dilated
    if gemv_linears:
        use_gemv_linears(model)
    return model


def layer_pattern(config: Any, causal: bool) -> tuple[DilatedPattern, str]:
    """(pattern, backend) from a model config's dilated_* fields (ValueError naming the field)."""
    lengths = getattr(config, "dilated_segment_lengths", None)
    rates = getattr(config, "dilated_dilation_rates", None)
    if lengths is None or rates is None:
        raise ValueError("the model config must carry dilated_segment_lengths and dilated_dilation_rates (lists of "
                         "positive integers, e.g. config.dilated_segment_lengths = [2048, 8192] and "
                         "config.dilated_dilation_rates = [1, 4]) to run the dilated attention implementation; "
                         "hilbert_lab.integrations.transformers.use_dilated_attention(model, ...) sets them")
    mode = getattr(config, "dilated_mode", None) or "longnet"
    backend = getattr(config, "dilated_backend", None) or "auto"
    try:
        return DilatedPattern.create(list(lengths), list(rates), mode=mode, causal=bool(causal)), backend
    except (TypeError, ValueError) as error:
        raise ValueError(f"config.dilated_segment_lengths / dilated_dilation_rates / dilated_mode (one of {MODES}): "
                         f"{error}") from None


def dilated_mask(batch_size: int, q_length: int, kv_length: int, *args, attention_mask=None, mask_function=None,
                 config=None, **kwargs):
    """The mask function registered beside the attention function: the 2D padding mask (B, kv_length) as
    bool (a copy for this forward pass, which keeps the layout of its padding for the layers), or None when no
    token is padding. The attention function reads documents and padding from it and from position_ids; the
    pattern itself is never a dense (N, N) mask. Overlays composed into `mask_function` are refused (ValueError);
    `config` records the running implementation as `config.attn_implementation` (saved with the model)."""
    if not _plain_mask_function(mask_function):
        refusal = _mask_function_refusal(mask_function)
        if refusal:
            raise ValueError(refusal)
    if config is not None:
        _record_implementation(config)
    if attention_mask is None or attention_mask.dim() != 2:
        return attention_mask
    mask = attention_mask[:, -kv_length:]
    if bool(mask.all()):  # no padding; keys past a shorter mask are a static cache's unwritten rows (position ids)
        return None
    mask = mask.to(torch.bool, copy=True)  # this forward pass's own: nothing else holds it to change it
    setattr(mask, _LAYOUTS, {})
    return mask


_LAYOUTS = "_dilated_layouts"  # attribute of a mask made by dilated_mask: {(batch, keys): layouts of its padding}
_MASKING = "transformers.masking_utils"
_BASES = ("causal_mask_function", "bidirectional_mask_function",
          "packed_sequence_mask_function.<locals>.inner_mask",  # documents: the layer reads them from position_ids
          "padding_mask_function.<locals>.inner_mask")  # padding: the layer reads it from the 2D mask
_WRAPPERS = {"remap_positions_for_packed_sequence.<locals>.inner_mask": "mask_function",
             "add_offsets_to_mask_function.<locals>.inner_mask": "mask_function",
             "and_masks.<locals>.and_mask": "mask_functions", "or_masks.<locals>.or_mask": "mask_functions"}


def _plain_mask_function(function) -> bool:
    """Whether `function` is None or transformers' plain causal or bidirectional mask function (nothing to check;
    an identity test that a compiled forward pass decides at tracing time, as in a decoding step)."""
    masking = sys.modules.get(_MASKING)
    return function is None or (masking is not None and (function is masking.causal_mask_function
                                                          or function is masking.bidirectional_mask_function))


@torch.compiler.disable  # composed functions (closures, one holding the packed-sequence tensor): checked eagerly
def _mask_function_refusal(function) -> str:
    """The message of _check_mask_function's ValueError for `function`, or "" where the layer reproduces it."""
    try:
        _check_mask_function(function)
    except ValueError as error:
        return str(error)
    return ""


def _check_mask_function(function, overlay: Optional[str] = None) -> None:
    """Accept only the mask functions the layer reproduces (causal or bidirectional, packed documents, padding);
    a ValueError names any overlay that transformers composed into it (or_mask_function, and_mask_function,
    block_sequence_ids, a sliding window, chunks)."""
    if function is None:
        return
    name = getattr(function, "__qualname__", type(function).__name__)
    ours = getattr(function, "__module__", None) == _MASKING
    if ours and name in _BASES:
        return
    if ours and name in _WRAPPERS:
        cells = dict(zip(function.__code__.co_freevars, (c.cell_contents for c in function.__closure__ or ())))
        inner = cells.get(_WRAPPERS[name])
        if inner is not None:
            where = {"and_masks.<locals>.and_mask": "and_mask_function",
                     "or_masks.<locals>.or_mask": "or_mask_function"}.get(name, overlay)
            for part in inner if isinstance(inner, (tuple, list)) else (inner,):
                _check_mask_function(part, where)
            return
    if ours and name.startswith("sliding_window"):
        raise ValueError("the mask has a sliding window; the dilated pattern replaces the attention pattern: set "
                         "config.sliding_window = None (or use_sliding_window = False)")
    if ours and name.startswith("chunked"):
        raise ValueError("the mask has chunked attention; the dilated pattern replaces the attention pattern: set "
                         "config.attention_chunk_size = None")
    what = "block_sequence_ids (bidirectional blocks)" if ours and name.startswith("blockwise_overlay") else \
        f"{overlay or 'mask_function'} ({getattr(function, '__module__', '?')}.{name})"
    raise ValueError(f"the attention mask carries an overlay, {what}, that the dilated pattern cannot express "
                     "(e.g. bidirectional image tokens); dilated attention supports causal or bidirectional "
                     "attention, padding and packed documents (position_ids restarting) only")


def _record_implementation(config: Any) -> None:
    """Keep config.attn_implementation (a field that save_pretrained writes and from_pretrained reads) equal to
    the implementation running, so that a saved model loads with it."""
    name = getattr(config, "_attn_implementation", None)
    if isinstance(name, str) and config.__dict__.get("attn_implementation") != name:
        config.attn_implementation = name


def _refuse(kwargs: dict) -> None:
    if kwargs.get("sliding_window") is not None:
        raise ValueError(f"this layer has a sliding window ({kwargs['sliding_window']}); the dilated pattern replaces "
                         "the attention pattern: set config.sliding_window = None (or use_sliding_window = False)")
    if kwargs.get("softcap") is not None:
        raise ValueError("attention logit soft-capping (softcap) is not supported by dilated attention; use a model "
                         "without it")
    if kwargs.get("s_aux") is not None or kwargs.get("sinks") is not None:
        raise ValueError("attention sinks are not supported by dilated attention; use a model without them")


def dilated_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attention_mask: Optional[torch.Tensor], dropout: float = 0.0,
                              scaling: Optional[float] = None, is_causal: Optional[bool] = None, **kwargs):
    """transformers' attention-function convention: query (B, H, Nq, D), key, value (B, H_kv, Nk, D) ->
    (out (B, Nq, H, D), None). See the module docstring for masks, documents and caches."""
    _refuse(kwargs)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    pattern, backend = layer_pattern(getattr(module, "config", None), causal)
    if attention_mask is not None and attention_mask.dim() != 2:
        raise ValueError(f"a {attention_mask.dim()}D attention mask cannot be combined with the dilated pattern: pass "
                         "a 2D padding mask (B, N) or position_ids that restart at document starts")
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # (B, N, heads, D) views
    device = q.device.type
    if device in ("cpu", "cuda") and torch.is_autocast_enabled(device):  # run in the autocast dtype, like sdpa
        low = torch.get_autocast_dtype(device)
        q, k, v = q.to(low), k.to(low), v.to(low)
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(f"query, key and value must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    batch, queries, heads, dim = q.shape
    if k.shape[2] == 0 or heads % k.shape[2]:
        raise ValueError(f"query heads ({heads}) must be a multiple of key/value heads ({k.shape[2]})")
    positions = kwargs.get("position_ids")
    positions = positions if isinstance(positions, torch.Tensor) and positions.dim() == 2 else None
    scale = q.shape[-1] ** -0.5 if scaling is None else float(scaling)
    if queries == 1 and causal and attention_mask is None and positions is not None and k.shape[1] > 1 \
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))) \
            and not (dropout > 0.0 and module.training):
        # one new token per row, the key of position m at row m (transformers' caches, no padding): one step read
        # straight from the cache's storage, its positions on the device (no plan, no host value)
        at = positions[:, -1].to(torch.int64).expand(batch).contiguous()
        with torch.autocast(device, enabled=False) if device in ("cpu", "cuda") else contextlib.nullcontext():
            out, _ = decode_step(pattern, q[:, 0], k, v, at, scale, span=1 << (k.shape[1] - 1).bit_length(),
                                 advance=False)
        return out.unsqueeze(1), None
    return _attend_by_documents(module, q, k, v, attention_mask, positions, pattern, backend, scale, dropout, causal)


@torch.compiler.disable  # documents and padding read on the host: a compiled caller runs this eagerly
def _attend_by_documents(module, q, k, v, attention_mask, positions, pattern, backend, scale, dropout, causal):
    """dilated_attention_forward's general case: q (B, Nq, H, D), k, v (B, Nk, H_kv, D) -> (out (B, Nq, H, D), None),
    the rows grouped by the documents their padding mask and position ids make."""
    device = q.device.type
    batch, queries, heads, _ = q.shape
    keys = _valid_keys(attention_mask, positions, k.shape[1], queries)
    k, v = k[:, :keys], v[:, :keys]
    mask = None if attention_mask is None else attention_mask[:, :keys]
    layouts = _layouts(mask, positions, batch, keys, queries, getattr(attention_mask, _LAYOUTS, None))
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    with torch.autocast(device, enabled=False) if device in ("cpu", "cuda") else contextlib.nullcontext():
        for rows, documents in layouts:
            sub = (q, k, v) if rows is None else (q[rows], k[rows], v[rows])
            training = torch.is_grad_enabled() and any(t.requires_grad for t in sub)
            dropping = dropout > 0.0 and module.training
            if queries == 1 and causal and not training and not dropping:  # a decoding step: no plan
                start, length = (0, keys) if documents is None else documents[-1]
                executor = dense_executor(backend, sub[0], pattern)
                result, _, _ = step_attention(pattern, sub[0], sub[1][:, start:], sub[2][:, start:], length - 1,
                                              kernel=step_kernel(executor, sub[0]), scale=scale)
            else:
                plan = cached_plan(pattern, keys, heads, num_kv_heads=None if k.shape[2] == heads else k.shape[2],
                                   documents=documents, query_len=None if queries == keys else queries)
                if dropping:
                    result, _ = dropout_attention(plan, *sub, scale=scale, dropout_p=float(dropout))
                else:
                    plain = documents is None and queries == keys and k.shape[2] == heads
                    executor = resolve_executor(backend, sub[0], pattern, training=training, whole_pattern=plain)
                    result, _ = execute_plan(plan, executor, *sub, scale, need_lse=False)
            if rows is None:
                out = result
            else:
                out = out.index_copy(0, rows, result)
    return out.contiguous(), None


def _valid_keys(mask: Optional[torch.Tensor], positions: Optional[torch.Tensor], keys: int, queries: int) -> int:
    """Keys actually written: a static cache holds more rows than tokens seen (the mask is then shorter, or
    the last position id tells); a dynamic cache or no cache: all of them."""
    if mask is not None:
        if mask.shape[1] > keys:
            raise ValueError(f"the attention mask ({mask.shape[1]} tokens) is longer than the keys ({keys})")
        return mask.shape[1]
    if positions is not None and queries < keys:
        last = positions[:, -1]
        written = int(last.max()) + 1
        if int(last.min()) + 1 != written:
            raise ValueError("rows of a batch with a cache must share their positions without an attention mask; "
                             "pass the attention mask (left padding) to generate")
        if queries <= written < keys:
            return written
    return keys


def _layouts(mask: Optional[torch.Tensor], positions: Optional[torch.Tensor], batch: int, keys: int, queries: int,
             memo: Optional[dict] = None) -> list[tuple[Optional[torch.Tensor], Optional[tuple[tuple[int, int], ...]]]]:
    """[(rows (None: all), documents (None: one)), ...]: rows of the batch grouped by their documents, from the
    padding mask (B, keys) and position ids (B or 1, keys), read on this call. `memo`, the dict of a mask made by
    dilated_mask for one forward pass, keeps the layout of that mask alone (position ids not involved)."""
    if positions is not None and queries == keys and keys > 1:
        return _compute_layouts(mask, positions, batch, keys, queries)
    if mask is None:
        return [(None, None)]
    if memo is None:
        return _compute_layouts(mask, None, batch, keys, queries)
    if (batch, keys) not in memo:
        memo[batch, keys] = _compute_layouts(mask, None, batch, keys, queries)
    return memo[batch, keys]


def _compute_layouts(mask, positions, batch, keys, queries):
    """_layouts without the memo: the document starts are found on the tensors' device, and only their indices
    come to the host (one transfer)."""
    device = mask.device if mask is not None else positions.device
    starts = torch.zeros(batch, keys, dtype=torch.bool, device=device)
    real = None if mask is None else mask.to(torch.bool).expand(batch, keys)
    if real is not None:
        starts[:, 1:] |= real[:, 1:] != real[:, :-1]
    if positions is not None and queries == keys and keys > 1:
        pos = positions.to(device).expand(batch, keys)
        restart = pos[:, 1:] != pos[:, :-1] + 1
        if real is not None:
            restart &= real[:, 1:]
        starts[:, 1:] |= restart
    bounds: list[list[int]] = [[0] for _ in range(batch)]
    for row, column in starts.nonzero().tolist():
        bounds[row].append(column)
    if all(len(cuts) == 1 for cuts in bounds):
        return [(None, None)]
    groups: dict[tuple, list[int]] = {}
    for row, cuts in enumerate(bounds):
        cuts.append(keys)
        documents = tuple((a, b - a) for a, b in zip(cuts, cuts[1:]))
        groups.setdefault(documents if len(documents) > 1 else None, []).append(row)
    if len(groups) == 1:
        return [(None, next(iter(groups)))]
    return [(torch.tensor(rows, device=device), documents) for documents, rows in groups.items()]
