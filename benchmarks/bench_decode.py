"""Per-token decoding latency of LongNetLM on the dilated KV cache, beside today's recompute of the whole prefix,
beside a dense transformers Llama of the same width and depth with sdpa and its static cache, and beside that
Llama running dilated attention through hilbert_lab.integrations.transformers (transformers' static cache, read in
place by the dilated step).

GPU (H100, bf16; the LongNet pattern [2048, 8192, 32768, 131072] / [1, 2, 4, 8], dim 256, depth 4, 8 heads):
    python benchmarks/bench_decode.py --out reports/results/bench_decode_h100.json
CPU smoke check, with the CPU target (64 new tokens after a 1024-token prompt against one forward pass over
1088 tokens, a tiny model):
    python benchmarks/bench_decode.py --quick --out /tmp/bench_decode.json

Per method and context N (prompt length; for "longnet_static_graph" the position where its steps end), "ms_per_token"
is the median time of one new token after 4 warm-up tokens (--warm-tokens for the static and the filled methods,
whose entries list the timed gaps as "ahead_ms"), greedy; on a GPU the time between CUDA events
recorded after each token while the host runs ahead, as generate's own loop does (the GPU's idle time counts where
the host falls behind), and for the static and the filled methods also "ms_per_token_synced", the same steps each
waited for by the host before the next (a device sync per token, as a caller that needs each token at once sees
it): LongNetLM.generate's GPU path (static caches, one CUDA graph per token,
its steps compiled with --compile-step; with the bytes a step must read and, over the measured HBM copy bandwidth,
the memory-bandwidth limit "limit_ms"); 8 left-padded rows against each alone ("longnet_static_batch8"); a chunk
of tokens after the context against its one-token steps ("longnet_static_chunk", --chunk); the loop of
LongNetLM.generate on the growing cache (with "prefill_s", the executor's dense kernel of the steps, the cache's
bytes and the key rows x heads the last step read); the gap between consecutive tokens of transformers' generate
(a stopping criterion notes the time); for "llama_sdpa_static_cache_filled" (--dense-filled), the dense model's
steps on a static cache filled with random keys and values instead of a prefill, compiled as generate compiles
them, and the same for that Llama on dilated attention ("llama_dilated_static_cache_filled", --hf-dilated-filled),
also with its linear layers on the decoding GEMV ("llama_dilated_gemv_static_cache_filled", --hf-gemv-filled:
use_dilated_attention(..., gemv_linears=True));
for the recompute, one forward pass over N + 1 tokens (what LongNetLM.generate(use_cache=False) does per token).
--profile-tokens P (GPU) runs torch.profiler over P tokens before the timed ones and adds "profile" to each
"longnet_static_graph" and filled entry (and to the batch entry, over one more run of the batch and of its longest
row): per token, the wall time, the kernels' time per kind (the dilated step, the GEMVs, cuBLAS, torch.compile's
fused ops, other) and the GPU's time without a kernel. Each entry
records "compiled_graphs", the graphs torch.compile compiled for it (a step compiled again per run would show here;
past torch.compile's limit it would run eagerly). Between measurements torch.compile's caches are reset and the
allocator's cache emptied (release); still, on an H200 every context after the first in one process times 3.5%
slower than alone (docs/models.md). Every finished measurement is written at
once (a run that stops keeps what it measured); an existing --out is refused.
transformers is optional (extra "hf"): without it the dense and hf methods are recorded as skipped.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch._dynamo.utils import counters as dynamo_counters

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hilbert_lab.arguments import int_list, prepare_output  # noqa: E402
from hilbert_lab.bench.env import collect_environment  # noqa: E402
from hilbert_lab.bench.timing import free_cell_memory  # noqa: E402
from hilbert_lab.io import atomic_write, strip_paths  # noqa: E402
from hilbert_lab.models import LongNetLM  # noqa: E402
from hilbert_lab.attention.static_cache import keys_seen  # noqa: E402
from hilbert_lab.models.generate import decode_static, greedy_ids, new_caches, new_static_caches  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
GPU = dict(contexts=[32768, 131072, 524288], cache_backends=["auto"], static=[32768, 131072, 524288, 1048576],
           batch=[32768], recompute=[8192, 32768],
           dense=[32768, 131072], hf_dilated=[32768], dense_filled=[], hf_dilated_filled=[], hf_gemv_filled=[],
           chunk=[],
           segment_lengths=[2048, 8192, 32768, 131072], dilation_rates=[1, 2, 4, 8], dim=256, depth=4, heads=8,
           vocab=256, dtype="bf16", steps=32)
QUICK = dict(contexts=[1024, 4096], cache_backends=["auto"], static=[1024], batch=[1024], recompute=[1024],
             dense=[1024, 4096], hf_dilated=[1024], dense_filled=[], hf_dilated_filled=[], hf_gemv_filled=[],
             chunk=[],
             segment_lengths=[32, 128, 512], dilation_rates=[1, 4, 8], dim=64, depth=3, heads=8, vocab=64,
             dtype="fp32", steps=16)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device) -> float:
    """Seconds of one call of fn, device work included."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def longnet(args, context: int, device, backend: str | None = None) -> LongNetLM:
    torch.manual_seed(0)
    model = LongNetLM(args.vocab, args.dim, args.depth, args.heads, args.segment_lengths, args.dilation_rates,
                      max_seq_len=context + args.steps + 8, backend=backend or args.backend)
    return model.to(device=device, dtype=DTYPES[args.dtype]).eval()


def prompt_of(args, context: int, device) -> torch.Tensor:
    return torch.randint(0, args.vocab, (1, context), generator=torch.Generator().manual_seed(1)).to(device)


@torch.no_grad()
def measure_cache(args, context: int, device, backend: str) -> dict:
    """The prompt once (timed), then greedy steps of one token, each timed with a device sync (the loop of
    LongNetLM.generate); the median of the steps after 4 warm-up steps."""
    model = longnet(args, context, device, backend)
    prompt = prompt_of(args, context, device)
    model.generate(prompt[:, :64], 2)  # warm-up (kernel selection, autotuning)
    caches = new_caches(model)
    logits = None

    def prefill():
        nonlocal logits
        logits = model(prompt, caches=caches)

    prefill_s = timed(prefill, device)
    token = greedy_ids(logits[:, -1])
    steps = []
    for _ in range(args.steps + 4):
        def step():
            nonlocal token
            token = greedy_ids(model(token, caches=caches)[:, -1])
        steps.append(timed(step, device))
    kernel = caches[0]._executor[2].name if caches[0]._executor is not None else None
    return {"ms_per_token": 1e3 * statistics.median(steps[4:]), "prefill_s": prefill_s, "new_tokens": args.steps,
            "backend": backend, "step_kernel": kernel, "cache_bytes": sum(c.memory_bytes() for c in caches),
            "cache_rows": caches[0].capacity, "keys_read_last_step": sum(c.keys_read for c in caches)}


def hbm_bandwidth(device, warm_s: float = 1.0) -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + write): the same copy repeated for warm_s seconds
    first, then the median of 20 after 5 more."""
    src = torch.randn(2**28, device=device)
    dst = torch.empty_like(src)
    start = time.perf_counter()
    while time.perf_counter() - start < warm_s:
        for _ in range(8):
            dst.copy_(src)
        torch.cuda.synchronize(device)
    times = []
    for _ in range(25):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return 2 * src.numel() * src.element_size() / statistics.median(times[5:])


def step_bytes(model, key_rows: float, batch: int = 1) -> dict:
    """Bytes one decoding step must read: every weight once (the tied head reads the embedding) and, per layer, the
    key and value rows its branches see (key_rows: key rows x query heads per layer, attention.static_cache's
    keys_seen)."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    block = model.encoder.blocks[0].attention
    element = model.embedding.weight.element_size()
    keys = 2 * key_rows * block.head_dim * element * len(model.encoder.blocks) * batch
    return {"weight_bytes": weights, "kv_bytes": int(keys), "key_rows_x_heads_per_layer": key_rows}


class Clock:
    """A mark after each new token (decode_static's on_token). On a GPU the mark is a CUDA event recorded on the
    stream and the host does not wait: it runs ahead as generate's own loop does, and a gap is the GPU's time from
    one token to the next (its idle time included, where the host falls behind). Tokens whose index is in `synced`
    are waited for first (a device sync, as a caller that needs each token on the host before the next); on the
    CPU every token is."""

    def __init__(self, device, synced=()):
        self.device, self.synced, self.times, self.events = device, synced, [], []

    def __call__(self, tokens):
        if self.device.type != "cuda" or len(self.times) in self.synced:
            sync(self.device)
        self.times.append(time.perf_counter())
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.events.append(event)

    def gaps(self, warm: int = 4) -> list[float]:
        """Seconds between consecutive marks, the first `warm` left out."""
        if self.device.type != "cuda":
            return [b - a for a, b in zip(self.times, self.times[1:])][warm:]
        sync(self.device)
        return [a.elapsed_time(b) / 1e3 for a, b in zip(self.events, self.events[1:])][warm:]


def two_phases(warm: int, steps: int) -> tuple[range, int]:
    """(the indices of the tokens to wait for, how many tokens) of warm + 2 steps + 2 tokens: after `warm` gaps,
    `steps` gaps with the host running ahead, one left out, then `steps` gaps of tokens each waited for."""
    return range(warm + steps + 1, warm + 2 * steps + 2), warm + 2 * steps + 2


def phase_medians(clock: Clock, warm: int, steps: int) -> dict:
    """ms_per_token (the host running ahead, as generate runs) and ms_per_token_synced (each token waited for) of
    the marks of two_phases(warm, steps), with the first phase's min, max and gaps ("ahead_ms", in order)."""
    gaps = clock.gaps(0)
    ahead, synced = gaps[warm:warm + steps], gaps[warm + steps + 1:]
    return {"ms_per_token": 1e3 * statistics.median(ahead), "ms_per_token_min": 1e3 * min(ahead),
            "ms_per_token_max": 1e3 * max(ahead), "ms_per_token_synced": 1e3 * statistics.median(synced),
            "ahead_ms": [round(1e3 * gap, 4) for gap in ahead]}


KERNEL_KINDS = (("decode", ("_partial_kernel", "_merge_kernel")),
                ("gemv", ("_gemv_kernel", "_gemv_rows_kernel")),
                ("gemm", ("gemm", "nvjet", "cublas", "cutlass", "splitkreduce")), ("inductor", ("triton_",)))


def kernel_kind(name: str) -> str:
    """A kernel's part of a decoding step, by its name: the dilated step's launches ("decode"), the GEMVs of the
    linear layers ("gemv"), cuBLAS's GEMMs ("gemm"), torch.compile's fused small ops ("inductor"), or "other"."""
    lowered = name.lower()
    for kind, marks in KERNEL_KINDS:
        if any(lowered.startswith(mark) if mark.endswith("_") else mark in lowered for mark in marks):
            return kind
    return "other"


class ProfiledClock(Clock):
    """A Clock that runs torch.profiler (CPU and CUDA activity) over tokens start + 1 .. start + count, each waited
    for (as are tokens start - 1 and start, and those in `synced`)."""

    def __init__(self, device, start: int, count: int, synced=()):
        super().__init__(device, set(synced) | set(range(start - 1, start + count)))
        self.start, self.count = start, count
        self.profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])

    def __call__(self, tokens):
        super().__call__(tokens)
        if len(self.times) == self.start:
            self.profiler.start()
        elif len(self.times) == self.start + self.count:
            self.profiler.stop()

    def summary(self) -> dict:
        """Per token over the profiled tokens: wall time, kernel time (sum over CUDA kernels, graph replays
        included), the GPU's time without a kernel, and per kind the kernels' count and time; the 12 dearest."""
        kinds, names = {}, {}
        for event in self.profiler.events():
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            kind, took = kernel_kind(event.name), event.time_range.elapsed_us() / 1e3
            count, total = kinds.get(kind, (0, 0.0))
            kinds[kind] = (count + 1, total + took)
            names[event.name] = names.get(event.name, 0.0) + took
        tokens = self.count
        wall = (self.times[self.start + self.count - 1] - self.times[self.start - 1]) * 1e3 / tokens
        kernels = sum(total for _, total in kinds.values()) / tokens
        return {"tokens": tokens, "wall_ms_per_token": wall, "kernel_ms_per_token": kernels,
                "idle_ms_per_token": wall - kernels,
                "kinds": {kind: {"kernels_per_token": count / tokens, "ms_per_token": total / tokens}
                          for kind, (count, total) in sorted(kinds.items())},
                "dearest": [{"name": name[:120], "ms_per_token": took / tokens}
                            for name, took in sorted(names.items(), key=lambda item: -item[1])[:12]]}


@torch.inference_mode()
def measure_static(args, context: int, device, bandwidth: float | None) -> dict:
    """LongNetLM.generate's GPU path: static caches, the prompt, then the steps of every layer replayed as one CUDA
    graph per token (on the CPU the same steps run eagerly); the median gap between consecutive tokens after 4 (the
    eager step and the capture among them) and after the --profile-tokens ones (GPU; "profile": ProfiledClock's
    summary), over --steps tokens with the host running ahead and --steps more each waited for (two_phases),
    beside the memory-bandwidth limit of a step. The steps end at position `context` - 1, where every
    branch of a pattern whose longest segment divides `context` sees the most keys (the dearest steps). Past
    --prefill-max the caches are filled with random keys and values instead of a timed prompt (a step's cost does
    not depend on them)."""
    model = longnet(args, context, device)
    profiled = args.profile_tokens if device.type == "cuda" else 0
    # then the profiled tokens and one whose gap holds the profiler's stop
    warm = args.warm_tokens + (profiled + 1 if profiled else 0)
    synced, count = two_phases(warm, args.steps)
    first = context - count
    model.generate(prompt_of(args, 64, device), 4)  # warm-up: Triton kernels compiled
    caches = new_static_caches(model, 1, context + 8)
    filled = first > args.prefill_max
    if filled:
        for cache in caches:
            cache.keys.normal_()
            cache.values.normal_()
            cache.mark_filled([first])
    prompt = prompt_of(args, 1 if filled else first, device)
    synced = {0, *synced}  # the prompt's token waited for: prefill_s is the prompt's time, not its enqueueing
    clock = ProfiledClock(device, args.warm_tokens + 1, profiled, synced) if profiled else Clock(device, synced)
    sync(device)
    start = time.perf_counter()
    decode_static(model, prompt, caches, count, greedy_ids, device.type == "cuda", on_token=clock,
                  compile_step=args.compile_step)
    timed_positions = range(first + warm + 1, context)
    block = model.encoder.blocks[0].attention
    rows = statistics.mean(keys_seen(block.attention.pattern, block.num_heads, p) for p in timed_positions)
    entry = {**phase_medians(clock, warm, args.steps), "prefill_s": None if filled else clock.times[0] - start,
             "prompt": "random cache" if filled else first, "steps_at": [first + warm + 1, context - 1],
             "new_tokens": args.steps, "compile_step": args.compile_step,
             "cache_bytes": sum(c.memory_bytes() for c in caches), "cache_rows": caches[0].capacity,
             **step_bytes(model, rows)}
    if bandwidth:
        entry["hbm_bytes_per_s"] = bandwidth
        entry["limit_ms"] = 1e3 * (entry["weight_bytes"] + entry["kv_bytes"]) / bandwidth
        entry["x_limit"] = entry["ms_per_token"] / entry["limit_ms"]
        entry["x_limit_synced"] = entry["ms_per_token_synced"] / entry["limit_ms"]
    if profiled:
        entry["profile"] = clock.summary()
    return entry


@torch.inference_mode()
def measure_chunk(args, context: int, device) -> dict:
    """A chunk of --chunk-tokens T tokens after `context` tokens on static caches (filled with random keys and values
    instead of a prompt), as LongNetLM's forward runs it eagerly (per layer each branch's plan over the keys the
    chunk's segments reach), against the same T tokens as T one-token steps (eager): seconds of each, the
    second call of each timed (the first compiles and selects kernels), and the largest difference of their logits."""
    model = longnet(args, context, device)
    tokens = torch.randint(0, args.vocab, (1, args.chunk_tokens), generator=torch.Generator().manual_seed(2))
    tokens = tokens.to(device)
    caches = new_static_caches(model, 1, context + args.chunk_tokens + 8)

    def at_context():
        for cache in caches:
            cache.mark_filled([context])

    for cache in caches:
        cache.keys.normal_()
        cache.values.normal_()
    logits, seconds = {}, {}
    runs = {"chunk": lambda: model(tokens, caches=caches),
            "steps": lambda: torch.cat([model(tokens[:, t:t + 1], caches=caches) for t in range(tokens.shape[1])], 1)}
    for name, run_once in runs.items():
        for _ in range(2):
            at_context()
            seconds[name] = timed(lambda: logits.__setitem__(name, run_once()), device)
    return {"chunk_tokens": args.chunk_tokens, "chunk_s": seconds["chunk"], "steps_s": seconds["steps"],
            "steps_over_chunk": seconds["steps"] / seconds["chunk"],
            "max_logit_difference": (logits["chunk"].float() - logits["steps"].float()).abs().max().item()}


@torch.inference_mode()
def measure_batch(args, context: int, device, rows: int = 8) -> dict:
    """`rows` prompts of different lengths (context, context - 1/8 of it, ...) left-padded in one batch against each
    alone (batch 1): the same tokens, and tokens/s of the steps (graph replays) of both, each compiled first with
    --compile-step (as generate(compile_step=True) runs them). With --profile-tokens on a GPU, one more run of the
    batch and of its longest row alone under torch.profiler ("profile": ProfiledClock's summary of each)."""
    model = longnet(args, context, device)
    full = prompt_of(args, context, device)
    lengths = [context - i * (context // (2 * rows)) for i in range(rows)]
    prompt = torch.zeros(rows, context, dtype=full.dtype, device=device)
    mask = torch.zeros_like(prompt)
    for b, n in enumerate(lengths):
        prompt[b, context - n:] = full[0, :n]
        mask[b, context - n:] = 1
    model.generate(prompt[:, -64:], 4, attention_mask=mask[:, -64:])  # warm-up

    def run(tokens, row_lengths, clock=None):
        clock = clock or Clock(device)
        caches = new_static_caches(model, tokens.shape[0], context + args.steps + 8, row_lengths)
        new = decode_static(model, tokens, caches, args.steps + 5, greedy_ids, device.type == "cuda", on_token=clock,
                            compile_step=args.compile_step)
        return torch.cat(new, 1), statistics.median(clock.gaps())

    batched, batch_step = run(prompt, lengths)
    alone = [run(full[:, :n], None) for n in lengths]
    same = [bool(torch.equal(batched[b], tokens[0])) for b, (tokens, _) in enumerate(alone)]
    single = statistics.median(step for _, step in alone)
    entry = {"rows": rows, "lengths": lengths, "batch_ms_per_step": 1e3 * batch_step,
             "single_ms_per_step": 1e3 * single, "tokens_per_s_ratio": rows * single / batch_step,
             "same_tokens_per_row": same, "compile_step": args.compile_step}
    profiled = min(args.profile_tokens, args.steps) if device.type == "cuda" else 0
    if profiled:
        profiles = {}
        for name, tokens, row_lengths in (("batch", prompt, lengths), ("single", full, None)):
            clock = ProfiledClock(device, 5, profiled)
            run(tokens, row_lengths, clock)
            profiles[name] = clock.summary()
        entry["profile"] = profiles
    return entry


@torch.no_grad()
def measure_recompute(args, context: int, device) -> dict:
    model = longnet(args, context, device)
    tokens = prompt_of(args, context + 1, device)
    model(tokens)
    seconds = sorted(timed(lambda: model(tokens), device) for _ in range(3))
    return {"ms_per_token": 1e3 * seconds[1], "forward_tokens": context + 1}


def llama(args, context: int, device, dilated: bool, gemv_linears: bool = False):
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.dim, intermediate_size=args.llama_intermediate or 4 * args.dim,
        num_hidden_layers=args.depth,
        num_attention_heads=args.heads, num_key_value_heads=args.heads,
        max_position_embeddings=context + 2 * args.steps + 16,
        pad_token_id=0, bos_token_id=None, eos_token_id=None, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config).to(device=device, dtype=DTYPES[args.dtype]).eval()
    if dilated:
        from hilbert_lab.integrations.transformers import use_dilated_attention

        use_dilated_attention(model, args.segment_lengths, args.dilation_rates, backend=args.backend,
                              gemv_linears=gemv_linears)
    return model


@torch.no_grad()
def measure_hf(args, context: int, device, dilated: bool) -> dict:
    """transformers' generate (greedy, min_new_tokens = max_new_tokens) with a stopping criterion that notes the
    time after each token (device synced): the median gap between consecutive tokens after 4 warm-up tokens."""
    import transformers

    model = llama(args, context, device, dilated)
    prompt = prompt_of(args, context, device)
    extra = {"cache_implementation": "static"}

    class Clock(transformers.StoppingCriteria):
        def __init__(self):
            self.times = []

        def __call__(self, input_ids, scores, **kwargs):
            sync(device)
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def generate(tokens, n, clock=None):
        return model.generate(tokens, attention_mask=torch.ones_like(tokens), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=0,
                              stopping_criteria=transformers.StoppingCriteriaList([clock] if clock else []), **extra)

    generate(prompt[:, :64], 2)  # warm-up
    clock = Clock()
    sync(device)
    start = time.perf_counter()
    generate(prompt, args.steps + 5, clock)
    gaps = [b - a for a, b in zip(clock.times, clock.times[1:])]
    return {"ms_per_token": 1e3 * statistics.median(gaps[4:]), "prefill_s": clock.times[0] - start,
            "new_tokens": args.steps, "cache": "static"}


def dense_static_cache(model, max_length: int):
    """transformers' StaticCache for `model` (batch 1), its storage allocated."""
    import transformers

    config = model.config
    cache = transformers.StaticCache(config=config, max_cache_len=max_length)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache.early_initialization(1, config.num_key_value_heads, head_dim, model.dtype, model.device)
    return cache


def dense_steps(step, cache, token: torch.Tensor, start: int, count: int, on_token) -> torch.Tensor:
    """`count` greedy tokens of a transformers model `step` (the model, or it compiled) on `cache`, which holds
    positions 0 .. start - 1; token (1, 1) is the token at `start`. on_token(tokens (1, 1)) after each new token."""
    positions = torch.arange(start, start + count, device=token.device)  # no host-to-device copy per token
    for index in range(count):
        position = positions[index:index + 1]
        logits = step(input_ids=token, past_key_values=cache, cache_position=position, position_ids=position[None],
                      use_cache=True).logits
        token = logits[:, -1:].argmax(-1)
        on_token(token)
    return token


@torch.inference_mode()
def measure_dense_filled(args, context: int, device, dilated: bool = False, gemv_linears: bool = False) -> dict:
    """The Llama's steps at position `context` on transformers' StaticCache whose first `context` rows hold
    random keys and values instead of a prefill (the dense prefill of a long prompt takes minutes; a step's cost
    does not depend on the values): the forward compiled as transformers' generate compiles it (its CompileConfig:
    CUDA graphs), the median gap between consecutive tokens after 4 (compiling and recording among them), over
    --steps tokens with the host running ahead and --steps more each waited for (two_phases). With
    `dilated`, the same Llama on dilated attention through register() (its step reads the static cache in place),
    and with `gemv_linears` its linear layers on the decoding GEMV.
    "weight_bytes": what a step reads of the weights (all but the input embedding). With --profile-tokens on a
    GPU, "profile" as measure_static's (ProfiledClock's summary)."""
    import transformers

    model = llama(args, context, device, dilated=dilated, gemv_linears=gemv_linears)
    cache = dense_static_cache(model, context + 2 * args.steps + 16)
    for layer in cache.layers:
        layer.keys[:, :, :context].normal_()
        layer.values[:, :, :context].normal_()
        if hasattr(layer, "cumulative_length"):  # where the next update writes (transformers >= 5.2x)
            layer.cumulative_length.fill_(context)
    step = model
    if device.type == "cuda":
        options = transformers.CompileConfig().to_dict() if hasattr(transformers, "CompileConfig") else {}
        step = torch.compile(model, **{k: options[k] for k in ("fullgraph", "dynamic", "backend", "mode")
                                       if k in options})
    profiled = args.profile_tokens if device.type == "cuda" else 0
    warm = args.warm_tokens + (profiled + 1 if profiled else 0)
    synced, count = two_phases(warm, args.steps)
    clock = ProfiledClock(device, args.warm_tokens + 1, profiled, synced) if profiled else Clock(device, synced)
    token = prompt_of(args, 1, device)
    dense_steps(step, cache, token, context, count, clock)
    weights = sum(p.numel() * p.element_size() for name, p in model.named_parameters() if "embed_tokens" not in name)
    entry = {**phase_medians(clock, warm, args.steps), "prompt": "random cache", "new_tokens": args.steps,
             "cache": "static", "compiled": device.type == "cuda", "cache_length_after": int(cache.get_seq_length()),
             "weight_bytes": weights, "intermediate_size": model.config.intermediate_size}
    if profiled:
        entry["profile"] = clock.summary()
    return entry


@torch.inference_mode()
def measure_cpu_target(args, device, repeats: int = 7) -> dict:
    """The CPU target: 64 new tokens after a 1024-token prompt, against one forward pass over 1088 tokens (both in
    inference mode, as generate runs). Interleaved: each repeat times a forward pass, the cached generation and
    another forward pass, and divides by their mean (a shared machine's load drifts); the median ratio is reported
    with every repeat's."""
    model = longnet(args, 1088, device)
    prompt = prompt_of(args, 1024, device)
    full = prompt_of(args, 1088, device)
    model(full)
    model.generate(prompt, 2)
    ratios, forwards, generations = [], [], []
    for _ in range(repeats):
        before = timed(lambda: model(full), device)
        generation = timed(lambda: model.generate(prompt, 64), device)
        after = timed(lambda: model(full), device)
        forwards.append((before + after) / 2)
        generations.append(generation)
        ratios.append(generation / forwards[-1])
    recompute = timed(lambda: model.generate(prompt, 64, use_cache=False), device)
    return {"ratio": statistics.median(ratios), "ratios": ratios, "forward_1088_s": statistics.median(forwards),
            "generate_64_after_1024_s": statistics.median(generations), "recompute_64_after_1024_s": recompute,
            "recompute_ratio": recompute / statistics.median(forwards), "target_ratio": 8.0}


def compiled_graphs() -> int:
    """Graphs torch.compile has compiled in this process so far (each recompilation counts): a measurement's
    difference shows whether its steps compiled once or again per run (past torch.compile's limit of recompilations
    a step would run eagerly)."""
    return int(dynamo_counters["stats"]["unique_graphs"])


def release(device) -> None:
    """Start the next measurement as a fresh process would: torch.compile's compiled code dropped, the models and
    CUDA graphs of the last one collected, and on a GPU the allocator's cached blocks returned and its peak reset
    (the next one's tensors then do not land in blocks freed by another's)."""
    torch._dynamo.reset()
    free_cell_memory(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def run(args, write) -> dict:
    device = torch.device(args.device)
    report = dict(report_header(args, device), results=[])
    if args.threads:
        torch.set_num_threads(args.threads)
    report["config"]["torch_threads"] = torch.get_num_threads()

    def record(method: str, context, fn) -> None:
        entry = {"method": method, "context": context}
        graphs = compiled_graphs()
        try:
            entry.update(fn())
        except ImportError as error:  # transformers not installed: the 'hf' extra
            entry.update(status="skipped", reason=f"{type(error).__name__}: {error}")
        except (RuntimeError, ValueError) as error:  # out of memory, a backend that does not run: recorded
            entry.update(status="failed", reason=f"{type(error).__name__}: {str(error)[:300]}")
        else:
            entry["status"] = "ok"
            entry["compiled_graphs"] = compiled_graphs() - graphs
            if device.type == "cuda":
                entry["peak_bytes"] = torch.cuda.max_memory_allocated(device)
        release(device)
        report["results"].append(entry)
        write(report)
        shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in entry.items() if k != "reason"}
        print(json.dumps(shown), flush=True)

    if args.quick:
        record("cpu_target", 1024, lambda: measure_cpu_target(args, device))
    bandwidth = hbm_bandwidth(device) if device.type == "cuda" else None
    report["hbm_bytes_per_s"] = bandwidth
    release(device)
    for context in args.static:
        record("longnet_static_graph", context, lambda: measure_static(args, context, device, bandwidth))
    for context in args.batch:
        record("longnet_static_batch8", context, lambda: measure_batch(args, context, device))
    for context in args.chunk:
        record("longnet_static_chunk", context, lambda: measure_chunk(args, context, device))
    for backend in args.cache_backends:
        for context in args.contexts:
            record("longnet_cache", context, lambda: measure_cache(args, context, device, backend))
    for context in args.recompute:
        record("longnet_recompute", context, lambda: measure_recompute(args, context, device))
    for context in args.dense:
        record("llama_sdpa_static_cache", context, lambda: measure_hf(args, context, device, dilated=False))
    for context in args.hf_dilated:
        record("llama_dilated_static_cache", context, lambda: measure_hf(args, context, device, dilated=True))
    for context in args.dense_filled:
        record("llama_sdpa_static_cache_filled", context, lambda: measure_dense_filled(args, context, device))
    for context in args.hf_dilated_filled:
        record("llama_dilated_static_cache_filled", context,
               lambda: measure_dense_filled(args, context, device, dilated=True))
    for context in args.hf_gemv_filled:
        record("llama_dilated_gemv_static_cache_filled", context,
               lambda: measure_dense_filled(args, context, device, dilated=True, gemv_linears=True))
    return report


def parse_args(argv=None):
    parser = decode_parser(__doc__, "CPU-sized run (tiny model, short contexts, the CPU target)")
    parser.add_argument("--backend", default="auto", help="executor of the dilated attention outside the cache "
                        "runs (default auto)")
    parser.add_argument("--cache-backends", type=lambda text: [x for x in text.split(",") if x], default=None,
                        help="executors of the cached decoding, one run each (default: auto,sdpa_flash; --quick: "
                             "auto); the steps use the executor's dense kernel")
    parser.add_argument("--prefill-max", type=int, default=600000, help="longest prompt the static method times; "
                        "past it the caches are filled with random keys and values (default 600000)")
    parser.add_argument("--compile-step", action="store_true", help="longnet_static_graph: the steps through "
                        "torch.compile, as LongNetLM.generate(compile_step=True) runs them")
    parser.add_argument("--chunk-tokens", type=int, default=1024, help="longnet_static_chunk (--chunk): tokens per "
                        "chunk (default 1024)")
    parser.add_argument("--profile-tokens", type=int, default=0, help="longnet_static_graph, the filled Llamas and the "
                        "batch on a GPU: torch.profiler over this many tokens before the timed ones (where a step's time goes: "
                        "kernels per kind, the GPU's time without a kernel); 0: none")
    parser.add_argument("--warm-tokens", type=int, default=4, help="longnet_static_graph and the filled Llamas: "
                        "tokens stepped before the timed ones (default 4)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    for name in ("contexts", "static", "batch", "recompute", "dense", "hf_dilated", "dense_filled", "hf_dilated_filled",
                 "hf_gemv_filled", "chunk", "segment_lengths", "dilation_rates"):
        parser.add_argument("--" + name.replace("_", "-"), type=int_list(0), default=None,
                            help=f"comma-separated (default: {GPU[name]}; --quick: {QUICK[name]}); 0 for none")
    add_sized_options(parser, ("dim", "depth", "heads", "vocab", "steps"), GPU, QUICK)
    parser.add_argument("--llama-intermediate", type=int, default=0, help="the Llama's MLP width (default 4 x dim; "
                        "8/3 x dim, rounded, gives its three MLP weights the size of LongNetLM's two)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default bf16 (--quick: fp32)")
    args = parser.parse_args(argv)
    if args.warm_tokens < 4:
        parser.error(f"--warm-tokens must be >= 4 (the eager step and the capture among them), got {args.warm_tokens}")
    if args.profile_tokens < 0:
        parser.error(f"--profile-tokens must be >= 0, got {args.profile_tokens}")
    if args.chunk_tokens < 2:
        parser.error(f"--chunk-tokens must be >= 2, got {args.chunk_tokens}")
    defaults = QUICK if args.quick else GPU
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
        elif isinstance(value, list) and name != "cache_backends":
            setattr(args, name, [x for x in getattr(args, name) if x > 0])
    return args


def decode_parser(description: str, quick_help: str) -> argparse.ArgumentParser:
    """The arguments every decoding benchmark takes: --out (refused where it exists), --quick (its CPU-sized
    run, described by quick_help) and --device."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON output path (an existing file is refused)")
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return parser


def add_sized_options(parser: argparse.ArgumentParser, names, gpu: dict, quick: dict) -> None:
    """An integer option --name per name, default None (fill_sizes then sets the GPU or the --quick value)."""
    for name in names:
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=None,
                            help=f"default {gpu[name]} (--quick: {quick[name]})")


def fill_sizes(args, gpu: dict, quick: dict) -> None:
    """Every option still None takes its value from `quick` with --quick, else from `gpu`."""
    for name, value in (quick if args.quick else gpu).items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def report_header(args, device: torch.device) -> dict:
    """The opening fields of a decoding benchmark's JSON: its command (paths stripped), its arguments but --out,
    and the environment of `device`."""
    return {"command": strip_paths(" ".join(sys.argv)), "config": {k: v for k, v in vars(args).items() if k != "out"},
            "environment": collect_environment(str(device))}


def run_to_file(script: str, args, run) -> tuple[int, dict | None]:
    """(exit status, report) of run(args, write), write rewriting args.out as JSON after each result; status 2
    and one line naming `script` where args.out cannot be written (then nothing runs)."""
    try:
        out = prepare_output(args.out, "--out")
    except ValueError as error:
        print(f"{script}: error: {error}", file=sys.stderr)
        return 2, None
    report = run(args, lambda data: atomic_write(out, json.dumps(data, indent=1)))
    print(f"wrote {out}")
    return 0, report


def main(argv=None) -> int:
    return run_to_file("bench_decode", parse_args(argv), run)[0]


if __name__ == "__main__":
    sys.exit(main())
