"""Generation for LongNetLM: the prompt once, then one decoding step per token on per-layer dilated KV caches
(attention.DilatedStaticCache on a GPU, its steps replayed as one CUDA graph per token; attention.DilatedKVCache on
the CPU), or the exact recompute of the whole prefix per token; greedy or top-k sampling; left-padded rows."""
from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from hilbert_lab.attention.kv_cache import DilatedKVCache
from hilbert_lab.attention.modules import MultiheadDilatedAttention, check_device
from hilbert_lab.attention.static_cache import DilatedStaticCache

from .decoding_layer import decoding_projections


def _local_layers(model) -> bool:
    return all(type(block.attention) is MultiheadDilatedAttention for block in model.encoder.blocks)


def new_caches(model, max_length: int | None = None) -> list[DilatedKVCache] | None:
    """One empty DilatedKVCache per block of a LongNetLM (its pattern, backend and scale; storage allocated
    once for max_length tokens, default the model's max_seq_len), or None when some layer is not a local
    MultiheadDilatedAttention (ring layers)."""
    if not _local_layers(model):
        return None
    length = model.max_seq_len if max_length is None else max_length
    return [DilatedKVCache.for_module(block.attention, max_length=length) for block in model.encoder.blocks]


def new_static_caches(model, batch_size: int, max_length: int,
                      prompt_lengths: list[int] | None = None) -> list[DilatedStaticCache]:
    """One DilatedStaticCache per block of a LongNetLM with local attention layers: batch_size rows of up to
    max_length tokens, in the model's dtype (under torch.autocast, its dtype) and on its device, each holding its
    layer's linear layers prepared for decoding (`projections`, models.decoding_layer.decoding_projections: the
    norms folded into the q, k, v projections stacked and into the MLP's first layer; copies of those weights, so
    caches made before the weights change decode with the old ones); prompt_lengths: the rows' lengths in a
    left-padded prompt (None: no padding)."""
    if not _local_layers(model):
        raise ValueError("a static cache needs every layer to be a local MultiheadDilatedAttention (ring layers "
                         "decode by recompute: models.use_local_attention first)")
    weight = model.embedding.weight
    kind = weight.device.type
    dtype = torch.get_autocast_dtype(kind) if kind in ("cpu", "cuda") and torch.is_autocast_enabled(kind) \
        else weight.dtype
    caches = []
    for block in model.encoder.blocks:
        mha = block.attention
        p = mha.attention.pattern
        cache = DilatedStaticCache(
            p.segment_lengths, p.dilation_rates, mode=p.mode, batch_size=batch_size, max_length=max_length,
            num_heads=mha.num_heads, num_kv_heads=mha.num_kv_heads, head_dim=mha.head_dim, dtype=dtype,
            device=weight.device, backend=mha.attention.backend, scale=mha.attention.scale,
            prompt_lengths=prompt_lengths)
        cache.projections = decoding_projections(block, dtype)
        caches.append(cache)
    return caches


def prompt_lengths_of(attention_mask: torch.Tensor | None, prompt: torch.Tensor) -> list[int] | None:
    """Each row's prompt length from a left-padding attention_mask (B, N0) of 0/1 (zeros, then ones), or None
    where no row is padded; ValueError for any other mask."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != prompt.shape \
            or attention_mask.is_floating_point() or attention_mask.is_complex():
        what = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask)
        raise ValueError(f"attention_mask must be None or an integer or bool tensor of the prompt's shape "
                         f"{tuple(prompt.shape)}, got {what}")
    mask = attention_mask.to(torch.int64).cpu()
    lengths = mask.sum(1)
    left_padded = (mask == (torch.arange(mask.shape[1]) >= mask.shape[1] - lengths[:, None]).to(torch.int64)).all()
    if not bool(left_padded) or bool((lengths < 1).any()):
        raise ValueError("attention_mask must mark left padding: per row 0s, then at least one 1, nothing else")
    lengths = [int(n) for n in lengths]
    return None if min(lengths) == prompt.shape[1] else lengths


SPLIT_GREEDY_VOCAB = 4096  # vocabularies from this size on are reduced in two stages by greedy_ids


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """(B, 1) int64 argmax ids of logits (B, V): the first of equal maxima, a NaN counting as the largest (as
    torch.argmax). Under torch.compile and from SPLIT_GREEDY_VOCAB values on, in two reductions: each block of about
    sqrt(V) values its maximum and where it is (the last block padded with -inf), then the first block holding the
    largest; compiled, that is two launches whose first runs one program per block, where a compiled argmax is one
    program looping over V (an eager argmax already spreads over a block of threads, in one launch)."""
    batch, vocab = logits.shape
    if vocab < SPLIT_GREEDY_VOCAB or not torch.compiler.is_compiling():
        return logits.argmax(dim=-1, keepdim=True)
    size = math.isqrt(vocab - 1) + 1  # values per block: ceil(sqrt(V))
    blocks = -(-vocab // size)
    padded = F.pad(logits, (0, blocks * size - vocab), value=-math.inf) if blocks * size != vocab else logits
    block_max, block_ids = padded.reshape(batch, blocks, size).max(dim=-1)
    best = block_max.argmax(dim=-1, keepdim=True)
    return block_ids.gather(-1, best) + best * size


def next_token(logits: torch.Tensor, top_k: int | None, temperature: float,
               generator: torch.Generator | None) -> torch.Tensor:
    """(B, 1) ids from last-position logits (B, V): argmax (greedy_ids), or a sample among the top_k at
    temperature."""
    if top_k is None or top_k == 1:
        return greedy_ids(logits)
    logits = logits.float()
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
             use_cache: bool | None = None, attention_mask: torch.Tensor | None = None,
             cuda_graph: bool | None = None, compile_step: bool = False) -> torch.Tensor:
    """prompt (B, N0) -> (B, N0 + max_new_tokens); see LongNetLM.generate. The steps run in inference mode (less
    work per small op); the result is an ordinary tensor."""
    max_new_tokens, top_k, temperature = check_generation(model, prompt, max_new_tokens, top_k, temperature,
                                                          generator, use_cache)
    try:
        model.check_tokens(prompt)
    except ValueError as error:
        raise ValueError(f"prompt: {error}") from None
    lengths = prompt_lengths_of(attention_mask, prompt)
    if cuda_graph is not None and not isinstance(cuda_graph, bool):
        raise ValueError(f"cuda_graph must be None, True or False, got {cuda_graph!r}")
    local = _local_layers(model)
    if use_cache and not local:
        raise ValueError("use_cache=True needs every layer to be a local MultiheadDilatedAttention (ring layers "
                         "decode by recompute: use_cache=False, or models.use_local_attention first)")
    if lengths is not None and not (local and use_cache is not False):
        raise ValueError("attention_mask with padded rows needs the cache (use_cache None or True, local attention "
                         "layers)")
    static = local and use_cache is not False and (prompt.is_cuda or lengths is not None)
    if cuda_graph and not (static and prompt.is_cuda):
        raise ValueError("cuda_graph=True needs the model on a CUDA device and the cache (use_cache None or True)")
    if not isinstance(compile_step, bool):
        raise ValueError(f"compile_step must be True or False, got {compile_step!r}")
    if compile_step and not static:
        raise ValueError("compile_step=True compiles the steps on static caches: it needs the cache (use_cache None "
                         "or True, local attention layers) and the model on a CUDA device or a left-padded "
                         "attention_mask")
    graphed = static and prompt.is_cuda and cuda_graph is not False
    was_training = model.training
    model.eval()

    dtype = prompt.dtype

    def pick(logits: torch.Tensor) -> torch.Tensor:
        return next_token(logits, top_k, temperature, generator).to(dtype)

    try:
        with torch.inference_mode():
            if static:
                caches = new_static_caches(model, prompt.shape[0], prompt.shape[1] + max_new_tokens, lengths)
                new = decode_static(model, prompt, caches, max_new_tokens, pick, graphed, compile_step=compile_step,
                                    pick_in_step=top_k is None or top_k == 1)
            else:
                caches = new_caches(model, prompt.shape[1] + max_new_tokens) if use_cache is not False else None
                new = decode(model, prompt, caches, max_new_tokens, pick)
            tokens = torch.cat([prompt, *new], dim=1)
    finally:
        model.train(was_training)
    return tokens.clone() if tokens.is_inference() else tokens


def decode(model, prompt: torch.Tensor, caches: list[DilatedKVCache] | None, max_new_tokens: int, pick) -> list:
    """New tokens (B, 1) each: on the growing caches, or by recomputing the whole prefix (caches None)."""
    new, step_input, tokens = [], prompt, prompt
    for _ in range(max_new_tokens):
        if caches is not None:
            logits = model(step_input, caches=caches, logits_to_keep=1)[:, -1]
        else:
            logits = model(tokens, logits_to_keep=1)[:, -1]
        step_input = pick(logits)
        new.append(step_input)
        if caches is None:
            tokens = torch.cat((tokens, step_input), dim=1)
    return new


def _step(model, caches: list[DilatedStaticCache], pick, step_input: torch.Tensor, tokens: torch.Tensor,
          slot: torch.Tensor) -> torch.Tensor | None:
    """One decoding step on static caches from step_input (B, 1): with a pick, the ids it picks written to
    step_input (the next step's input) and to column `slot` (1,) of tokens (B, T), slot advanced, nothing returned;
    without one (pick None), the logits (B, V)."""
    logits = model(step_input, caches=caches, logits_to_keep=1)[:, -1]
    if pick is None:
        return logits
    ids = pick(logits).to(tokens.dtype)
    step_input.copy_(ids)
    tokens.index_copy_(1, slot, ids)
    slot.add_(1)
    return None


def decode_static(model, prompt: torch.Tensor, caches: list[DilatedStaticCache], max_new_tokens: int, pick,
                  graphed: bool, on_token=None, compile_step: bool = False, pick_in_step: bool = True) -> list:
    """New tokens (B, 1) each on static caches: the prompt, one eager step (kernels compiled, libraries
    initialised), then with `graphed` the steps of every layer captured once as a CUDA graph and replayed per
    token (the caches' device positions advance inside it). pick(logits (B, V)) -> ids (B, 1). pick_in_step: the
    pick runs inside the step (in its graph: a replay is the whole token, its ids written on the device to the
    next step's input and to a (B, max_new_tokens) tensor whose columns are the new tokens); where the pick must
    stay outside (sampling from a generator), False. compile_step: the step (with the pick inside, that too) runs
    through torch.compile, its small ops fused, then is captured like an eager one. on_token(tokens (B, 1)):
    called after each new token (a benchmark's clock)."""
    new = []
    if max_new_tokens == 0:
        return new
    rows, device = prompt.shape[0], prompt.device
    tokens = torch.empty(rows, max_new_tokens, dtype=prompt.dtype, device=device)
    slot = torch.ones(1, dtype=torch.int64, device=device)
    step_input = torch.empty(rows, 1, dtype=prompt.dtype, device=device)
    inside = pick if pick_in_step else None
    step = torch.compile(_step, dynamic=False) if compile_step else _step
    chosen = pick(model(prompt, caches=caches, logits_to_keep=1)[:, -1]).to(prompt.dtype)
    step_input.copy_(chosen)
    tokens[:, :1].copy_(chosen)
    new.append(tokens[:, :1])
    if on_token is not None:
        on_token(new[-1])
    graph = logits = None
    for index in range(1, max_new_tokens):
        if graphed and graph is None and index >= 2:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                graph_logits = step(model, caches, inside, step_input, tokens, slot)
        if graph is not None:
            graph.replay()
            for cache in caches:  # host lengths: a replay advances the device positions only
                cache.length = max(cache.lengths) + index
            logits = graph_logits
        else:
            logits = step(model, caches, inside, step_input, tokens, slot)
        if inside is None:
            chosen = pick(logits).to(prompt.dtype)
            step_input.copy_(chosen)
            new.append(chosen)
        else:
            new.append(tokens[:, index:index + 1])
        if on_token is not None:
            on_token(new[-1])
    return new
