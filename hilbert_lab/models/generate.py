"""Generation for LongNetLM: the prompt once, then one decoding step per token on per-layer dilated KV caches
(attention.DilatedKVCache), or the exact recompute of the whole prefix per token; greedy or top-k sampling."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hilbert_lab.attention.kv_cache import DilatedKVCache
from hilbert_lab.attention.modules import MultiheadDilatedAttention


def new_caches(model) -> list[DilatedKVCache] | None:
    """One empty DilatedKVCache per block of a LongNetLM (its pattern, backend and scale; storage allocated
    once for max_seq_len), or None when some layer is not a local MultiheadDilatedAttention (ring layers)."""
    blocks = model.encoder.blocks
    if not all(type(block.attention) is MultiheadDilatedAttention for block in blocks):
        return None
    return [DilatedKVCache.for_module(block.attention, max_length=model.max_seq_len) for block in blocks]


def next_token(logits: torch.Tensor, top_k: int | None, temperature: float,
               generator: torch.Generator | None) -> torch.Tensor:
    """(B, 1) ids from last-position logits (B, V): argmax, or a sample among the top_k at temperature."""
    logits = logits.float()
    if top_k is None or top_k == 1:
        return logits.argmax(dim=-1, keepdim=True)
    top_logits, top_ids = (logits / temperature).topk(top_k, dim=-1)
    choice = torch.multinomial(F.softmax(top_logits, dim=-1), 1, generator=generator)
    return top_ids.gather(-1, choice)


def check_generation(model, prompt: torch.Tensor, max_new_tokens: int, top_k: int | None, temperature: float) -> None:
    """ValueError naming the argument for a bad generation request."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must be (B, N0) with N0 >= 1, got {tuple(getattr(prompt, 'shape', ()))}")
    if prompt.shape[1] + max_new_tokens > model.max_seq_len:
        raise ValueError(f"prompt length + max_new_tokens must be <= max_seq_len={model.max_seq_len}, got "
                         f"{prompt.shape[1]} + {max_new_tokens}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)
                              or not 1 <= top_k <= model.vocab_size):
        raise ValueError(f"top_k must be None or in [1, vocab_size={model.vocab_size}], got {top_k}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


@torch.no_grad()
def generate(model, prompt: torch.Tensor, max_new_tokens: int, *, top_k: int | None = None,
             temperature: float = 1.0, generator: torch.Generator | None = None,
             use_cache: bool | None = None) -> torch.Tensor:
    """prompt (B, N0) -> (B, N0 + max_new_tokens); see LongNetLM.generate. The steps run in inference mode (less
    work per small op); the result is an ordinary tensor."""
    check_generation(model, prompt, max_new_tokens, top_k, temperature)
    model.check_tokens(prompt)
    caches = new_caches(model) if use_cache is not False else None
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
