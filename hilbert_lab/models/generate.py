"""Generation for LongNetLM: the prompt once, then one decoding step per token on per-layer dilated KV caches
(attention.DilatedKVCache), or the exact recompute of the whole prefix per token; greedy or top-k sampling."""
from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from hilbert_lab.attention.kv_cache import DilatedKVCache
from hilbert_lab.attention.modules import MultiheadDilatedAttention, check_device


def new_caches(model, max_length: int | None = None) -> list[DilatedKVCache] | None:
    """One empty DilatedKVCache per block of a LongNetLM (its pattern, backend and scale; storage allocated
    once for max_length tokens, default the model's max_seq_len), or None when some layer is not a local
    MultiheadDilatedAttention (ring layers)."""
    blocks = model.encoder.blocks
    if not all(type(block.attention) is MultiheadDilatedAttention for block in blocks):
        return None
    length = model.max_seq_len if max_length is None else max_length
    return [DilatedKVCache.for_module(block.attention, max_length=length) for block in blocks]


def next_token(logits: torch.Tensor, top_k: int | None, temperature: float,
               generator: torch.Generator | None) -> torch.Tensor:
    """(B, 1) ids from last-position logits (B, V): argmax, or a sample among the top_k at temperature."""
    logits = logits.float()
    if top_k is None or top_k == 1:
        return logits.argmax(dim=-1, keepdim=True)
    top_logits, top_ids = (logits / temperature).topk(top_k, dim=-1)
    choice = torch.multinomial(F.softmax(top_logits, dim=-1), 1, generator=generator)
    return top_ids.gather(-1, choice)


def check_generation(model, prompt: torch.Tensor, max_new_tokens: int, top_k: int | None, temperature: float,
                     generator: torch.Generator | None = None,
                     use_cache: bool | None = None) -> tuple[int, int | None, float]:
    """ValueError naming the argument and its allowed values for a bad generation request; returns
    (max_new_tokens, top_k, temperature) as Python numbers."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2:
        what = f"shape {tuple(prompt.shape)}" if isinstance(prompt, torch.Tensor) else type(prompt).__name__
        raise ValueError(f"prompt must be an integer tensor (B, N0) of token ids, got {what}")
    if prompt.shape[0] < 1 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must hold at least one token per row: (B, N0) with B >= 1 and N0 >= 1, got shape "
                         f"{tuple(prompt.shape)}")
    if prompt.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"prompt must be an integer tensor (int32 or int64) of token ids, got {prompt.dtype}")
    check_device("prompt", prompt, model.embedding.weight, "model")
    if prompt.shape[1] + max_new_tokens > model.max_seq_len:
        raise ValueError(f"prompt length + max_new_tokens must be <= max_seq_len={model.max_seq_len}, got "
                         f"{prompt.shape[1]} + {max_new_tokens}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral)
                              or not 1 <= top_k <= model.vocab_size):
        raise ValueError(f"top_k must be None or an integer in [1, vocab_size={model.vocab_size}], got {top_k!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not math.isfinite(temperature) \
            or not temperature > 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be None or a torch.Generator, got {type(generator).__name__}")
    if generator is not None and generator.device.type != prompt.device.type:
        raise ValueError(f"generator must be on the prompt's device '{prompt.device}' (sampling draws there), got a "
                         f"generator on '{generator.device}'")
    if use_cache is not None and not isinstance(use_cache, bool):
        raise ValueError(f"use_cache must be None, True or False, got {use_cache!r}")
    return int(max_new_tokens), None if top_k is None else int(top_k), float(temperature)


@torch.no_grad()
def generate(model, prompt: torch.Tensor, max_new_tokens: int, *, top_k: int | None = None,
             temperature: float = 1.0, generator: torch.Generator | None = None,
             use_cache: bool | None = None) -> torch.Tensor:
    """prompt (B, N0) -> (B, N0 + max_new_tokens); see LongNetLM.generate. The steps run in inference mode (less
    work per small op); the result is an ordinary tensor."""
    max_new_tokens, top_k, temperature = check_generation(model, prompt, max_new_tokens, top_k, temperature,
                                                          generator, use_cache)
    try:
        model.check_tokens(prompt)
    except ValueError as error:
        raise ValueError(f"prompt: {error}") from None
    caches = new_caches(model, prompt.shape[1] + max_new_tokens) if use_cache is not False else None
    if use_cache and caches is None:
        raise ValueError("use_cache=True needs every layer to be a local MultiheadDilatedAttention (ring layers "
                         "decode by recompute: use_cache=False, or models.use_local_attention first)")
    was_training = model.training
    model.eval()
    tokens = prompt
    try:
        with torch.inference_mode():
            step_input = prompt
            for _ in range(max_new_tokens):
                logits = model(step_input, caches=caches)[:, -1] if caches is not None else model(tokens)[:, -1]
                chosen = next_token(logits, top_k, temperature, generator).to(tokens.dtype)
                tokens = torch.cat((tokens, chosen), dim=1)
                step_input = chosen
    finally:
        model.train(was_training)
    return tokens.clone() if tokens.is_inference() else tokens
