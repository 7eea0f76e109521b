"""Ring dilated attention on 1, 2, 4 or 8 GPUs (NCCL): correctness, tokens/s per GPU, hidden communication,
causal layouts, PyTorch's context parallelism on dense causal attention, the ring against head-parallel
(Ulysses) and hybrid context parallelism, longest sequence.

Run once per GPU count with the same arguments, passing the 1-GPU JSON as --baseline to the others:

    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    torchrun --nproc_per_node=1 benchmarks/bench_ring.py --out reports/results/ring_1gpu.json
    torchrun --nproc_per_node=2 benchmarks/bench_ring.py --out reports/results/ring_2gpu.json \
        --baseline reports/results/ring_1gpu.json
CPU smoke run (gloo; --smoke shrinks every size: H 4, D 16, N 1024 / 2048, segments 64 / 256, one iteration,
two rounds; no context_parallel section); --nproc_per_node=4 also runs the hybrid mode:
    torchrun --nproc_per_node=2 benchmarks/bench_ring.py --smoke --out /tmp/ring_smoke.json

Modes (hilbert_lab.bench.parallel_modes): "ring" (ring_dilated_attention), "ulysses" (head-parallel:
ulysses_dilated_attention, H divisible by P) and "hybrid" (hybrid_dilated_attention on a mesh of ring 2 x
ulysses P/2: an even P >= 4, H divisible by P/2; on 2 ranks a 2 x 1 or 1 x 2 mesh is the ring or ulysses
itself, so it is skipped). A mode that cannot run on this world is recorded with its reason, never run.

Sections of the JSON (rank 0 rewrites it after every measurement, so a crash keeps what was done):
- correctness: N = --check-len, bf16, per config; also the spanning one causal on zigzag shards, alone and
  with grouped-query heads (H/4 key/value heads), and the longnet one causal on zigzag shards of packed
  documents crossing shard borders. Each rank runs the single-GPU engine on the whole
  sequence (bf16, and float32 as the yardstick) and compares its shard of the ring output and of
  dq/dk/dv (same random upstream gradient). Pass when the ring's error against float32 is at most twice
  the single-GPU bf16 error against float32 plus 1e-3 (ring and single GPU round differently). Every row
  names its mode in `parallel`; the ring's rows are keyed by check, those of the other modes (P > 1 only: on
  one rank every mode is the engine) "ulysses_<check>" and "hybrid_<check>" (same checks, rule and fields,
  "ring_vs_*" then meaning that mode's result; hybrid rows add `mesh` [R, U]). A skipped mode is one entry
  keyed by its name: {"parallel", "skipped": reason}.
- throughput: per config and N in --seq-lens, median fwd+bwd seconds over --iters after one warm-up
  (host wall time of a step that starts with a barrier and ends with a device sync; the slowest rank's
  median), tokens/s per GPU = N / seconds / P, bytes sent per rank, and on P > 1 the hidden share of the
  communication: --iters pairs of the step and the same step with a communicator that moves no byte (compute
  alone), back to back, give the exposed communication time = the median over pairs of (step - compute alone);
  the transfer time alone = bytes sent / the measured P2P bandwidth;
  hidden share = 1 - exposed / transfer (clipped to [0, 1]). Configs: "longnet" (--segment-lengths /
  --dilation-rates: with N/P >= 131072 every segment lies inside a shard and nothing is sent) and
  "spanning" (the same plus a whole-sequence branch, dilation --spanning-dilation: K/V travel around the
  whole ring).
- overhead (P > 1): per config "longnet" and N in --seq-lens, each rank's ring call against the single-GPU
  engine on a sequence of the shard's length, back-to-back calls, interleaved rounds: what the ring adds
  where nothing is sent, with its per-call configuration check and without it (check_config=False: what the
  check's host all_gather costs) (not in the default sections).
- causal_layouts (P > 1): the spanning config, causal, at --layout-len tokens: contiguous against zigzag
  shards, interleaved, ratio with its bootstrap interval.
- context_parallel (P > 1): dense causal attention (one branch, segment N, dilation 1) at --cp-len tokens:
  our ring (zigzag and contiguous; `ring_auto_steps` names the executor of auto's ring steps, and each other dense
  executor that runs here is timed by name on zigzag: ring_zigzag_<name>) against
  torch.distributed.tensor.experimental.context_parallel (ring
  SDPA, its default head-tail load balance; cuDNN and flash kernels, both rotate methods), interleaved
  rounds, medians with bootstrap intervals; on 1 GPU the same attention by SDPA (cuDNN) for reference.
- parallel_modes (P > 1): per config "longnet" and "spanning" at --modes-len tokens (default: the largest of
  --seq-lens divisible by 2P), fwd+bwd of each mode on the same shards (non-causal, so contiguous shards, as
  in the throughput section), interleaved rounds as causal_layouts: per mode
  median_ms, ci_ms, samples_ms, speed_vs_ring (time(ring) / time(mode), > 1: the mode is faster, with its
  bootstrap interval and verdict; not on the ring itself), bytes_sent_max_rank (one step's sends: ring
  steps and all-to-alls, as comm.STATS counts them), and hybrid's mesh [R, U]; besides the modes: seq_len,
  segment_lengths, dilation_rates, causal, layout, heads, and `skipped` {mode: reason}.
- longest: per config, the longest N whose fwd+bwd runs: doubling from --max-start, then bisection in
  steps of the granularity every shard needs (all ranks agree by an all-reduce on an OOM).
- ratios (with --baseline): tokens/s per GPU over the baseline's, longest N over the baseline's.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hilbert_lab.io import strip_paths  # noqa: E402
from hilbert_lab.attention.engine import dilated_attention  # noqa: E402
from hilbert_lab.bench.env import collect_environment  # noqa: E402
from hilbert_lab.bench.parallel_modes import (  # noqa: E402
    default_seq_len, hybrid_mesh_shape, placement, ring_layout, sent_bytes, skip_reason,
)
from hilbert_lab.bench.stats import bootstrap_median_ci, ratio_ci, verdict  # noqa: E402
from hilbert_lab.bench.timing import free_cell_memory, time_function  # noqa: E402
from hilbert_lab.distributed import comm, ring  # noqa: E402
from hilbert_lab.distributed.modules import PARALLEL_MODES  # noqa: E402
from hilbert_lab.attention import unavailable_reason  # noqa: E402
from hilbert_lab.attention.pattern import DilatedPattern  # noqa: E402
from hilbert_lab.distributed.ring import resolve_step_executor, ring_dilated_attention  # noqa: E402


def _environment(device: torch.device) -> dict:
    """The kit's environment block plus the process group this run uses."""
    return {**collect_environment(str(device)), "world_size": dist.get_world_size(), "backend": dist.get_backend()}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _inputs(seq_len: int, heads: int, head_dim: int, device, dtype, seed: int):
    """q, k, v, upstream grad (1, N, H, D) of the whole sequence from a seed (float32 draws, then dtype)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = [torch.randn(1, seq_len, heads, head_dim, generator=gen, device=device, dtype=torch.float32)
               for _ in range(4)]
    return [t.to(dtype) for t in tensors]


class _NoTransfer(comm.RingComm):
    """A ring communicator that moves no byte (receive buffers keep what they hold): the ring's compute
    and bookkeeping alone, for the exposed-communication measurement. Never used for results."""

    class _Done:
        def wait(self) -> None:
            return None

    def exchange(self, sends=(), recvs=(), label="", step=None):
        return self._Done()


@contextlib.contextmanager
def _compute_only():
    original = ring.RingComm
    ring.RingComm = _NoTransfer
    try:
        yield
    finally:
        ring.RingComm = original


def _max_over_ranks(values: list[float], device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def correctness(args, device, segment_lengths, dilation_rates, causal=False, layout="contiguous", *,
                kv_heads: int | None = None, packed: bool = False, parallel: str = "ring") -> dict:
    """Ring (or the mode `parallel`; bf16) vs single-GPU engine (bf16 and float32) on --check-len tokens; max
    abs errors. kv_heads: k and v with that many heads (grouped-query); packed: documents of uneven lengths
    crossing shard borders."""
    seq_len = args.check_len
    place = placement(parallel, seq_len, layout, device)
    pos = place.positions.to(device)
    kwargs = dict(segment_lengths=segment_lengths, dilation_rates=dilation_rates, causal=causal, mode=args.mode)
    bounds = [0, seq_len // 3 + 5, seq_len // 3 + 7, seq_len // 2 + 17, seq_len - 9, seq_len] if packed else None
    if bounds is not None:
        kwargs["cu_seqlens"] = torch.tensor(bounds, dtype=torch.int32, device=device)

    def draw(dtype):
        q, k, v, grad = _inputs(seq_len, args.heads, args.head_dim, device, dtype, seed=1)
        if kv_heads is not None:
            k, v = k[:, :, :kv_heads].contiguous(), v[:, :, :kv_heads].contiguous()
        return q, k, v, grad

    results = {}
    for dtype in (args.dtype, torch.float32):
        q, k, v, grad = draw(dtype)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = dilated_attention(*leaves, **kwargs)
        out.backward(grad)
        results[dtype] = [out.detach()[:, pos].float()] + [t.grad[:, pos].float() for t in leaves]
        del leaves, out
    q, k, v, grad = draw(args.dtype)
    local = [t[:, pos].clone().requires_grad_(True) for t in (q, k, v)]
    out = place.call(*local, **kwargs)
    out.backward(grad[:, pos])
    ring_values = [out.detach().float()] + [t.grad.float() for t in local]
    names = ("out", "dq", "dk", "dv")
    stats = torch.tensor([[float((r - s).abs().max()), float((r - f).abs().max()), float((s - f).abs().max())]
                          for r, s, f in zip(ring_values, results[args.dtype], results[torch.float32])], device=device)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    report = {name: {"ring_vs_single": row[0], "ring_vs_fp32": row[1], "single_vs_fp32": row[2]}
              for name, row in zip(names, stats.tolist())}
    passed = all(r["ring_vs_fp32"] <= 2 * r["single_vs_fp32"] + 1e-3 for r in report.values())
    mesh = {} if place.mesh is None else {"mesh": list(place.mesh)}
    return {"parallel": parallel, **mesh, "seq_len": seq_len, "dtype": str(args.dtype), "causal": causal,
            "layout": layout, "kv_heads": kv_heads, "cu_seqlens": bounds, "max_abs_error": report, "pass": passed}


def _ring_step(args, device, seq_len, segment_lengths, dilation_rates, causal=False, layout="contiguous",
               parallel="ring", backend="auto"):
    """A fwd+bwd step on this rank's shard (barrier first, device sync last), and a reset; parallel: the mode
    (PARALLEL_MODES). The shard's values are drawn directly (seeded by rank): nothing of the whole sequence is held, so
    the longest run measures the ring's memory, not the benchmark's."""
    world = dist.get_world_size()
    call = placement(parallel, seq_len, layout, device).call
    gen = torch.Generator(device=device).manual_seed(100 + dist.get_rank())
    q, k, v, grad = (torch.randn(1, seq_len // world, args.heads, args.head_dim, generator=gen, device=device,
                                 dtype=args.dtype) for _ in range(4))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))

    def step() -> None:
        dist.barrier()
        out = call(q, k, v, segment_lengths=segment_lengths, dilation_rates=dilation_rates, causal=causal,
                   mode=args.mode, backend=backend)
        out.backward(grad)
        _sync(device)
        q.grad = k.grad = v.grad = None

    return step


def _median_seconds(step, iters: int) -> float:
    # No time limit: every rank must make the same number of collective calls.
    return time_function(step, warmup=1 if iters else 0, repeats=max(iters, 1), max_seconds=float("inf")).median / 1e3


def p2p_bandwidth(device, size_bytes: int = 256 << 20, iters: int = 5) -> float | None:
    """Bytes/s of one ring exchange (each rank sends to the next, receives from the previous), median."""
    world = dist.get_world_size()
    if world == 1 or device.type != "cuda":
        return None
    rank = dist.get_rank()
    send = torch.ones(size_bytes, dtype=torch.uint8, device=device)
    recv = torch.empty_like(send)

    def step() -> None:
        dist.barrier()
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        _sync(device)

    step()
    seconds = _max_over_ranks([_median_seconds(step, iters)], device)[0]
    return size_bytes / seconds


def throughput(args, device, seq_len, segment_lengths, dilation_rates, bandwidth, iters) -> dict:
    """Median fwd+bwd seconds, tokens/s per GPU, peak memory, bytes sent per rank, hidden communication."""
    world = dist.get_world_size()
    step = _ring_step(args, device, seq_len, segment_lengths, dilation_rates)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    comm.reset_stats()
    step()
    sent = float(comm.STATS.bytes)
    seconds = _median_seconds(step, iters)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0.0
    seconds, peak, sent = _max_over_ranks([seconds, peak, sent], device)  # the slowest rank sets the pace
    row = {"seq_len": seq_len, "seconds": seconds, "tokens_per_s_per_gpu": seq_len / seconds / world,
           "peak_memory_gib_max_rank": peak / 2**30, "bytes_sent_max_rank": int(sent)}
    if world > 1 and sent > 0:
        compute, exposed = _paired_compute(step, iters, device)
        row["exposed_pairs"] = max(iters, 1)
        row["compute_only_seconds"] = compute
        row["exposed_communication_seconds"] = exposed
        if bandwidth:
            transfer = sent / bandwidth
            row["transfer_seconds_alone"] = transfer
            row["hidden_share"] = min(1.0, max(0.0, 1.0 - exposed / transfer))
    return row


def _paired_compute(step, iters: int, device) -> tuple[float, float]:
    """(compute-alone seconds, exposed communication seconds): `iters` interleaved rounds (_interleaved) of the
    step and the same step moving no byte, back to back; exposed = the median over rounds of (step - compute
    alone), clipped at 0, and compute = the median compute-alone step (each sample the slowest rank's)."""

    @contextlib.contextmanager
    def alone():
        with _compute_only():
            yield step

    samples = _interleaved({"full": lambda: contextlib.nullcontext(step), "alone": alone}, max(iters, 1), device)
    exposed = statistics.median(full - quiet for full, quiet in zip(samples["full"], samples["alone"]))
    return statistics.median(samples["alone"]), max(exposed, 0.0)


def _interleaved(variants: dict, rounds: int, device) -> dict[str, list[float]]:
    """Round-robin samples (seconds, max over ranks) of variants {name: enter}, where `with enter() as step`
    prepares one call (outside the timed region); the order rotates every round."""
    names = list(variants)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm-up
        with variants[name]() as step:
            step()
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            with variants[name]() as step:
                dist.barrier()
                _sync(device)
                start = time.perf_counter()
                step()
                _sync(device)
                elapsed = time.perf_counter() - start
            samples[name].append(_max_over_ranks([elapsed], device)[0])
    return samples


def _summary(samples: dict[str, list[float]], baseline: str) -> dict:
    out = {}
    for name, values in samples.items():
        median, low, high = bootstrap_median_ci([v * 1e3 for v in values])
        out[name] = {"median_ms": median, "ci_ms": [low, high], "samples_ms": [v * 1e3 for v in values]}
    for name, values in samples.items():
        if name != baseline:
            ratio, low, high = ratio_ci(samples[baseline], values)  # time(baseline) / time(name): > 1 = name faster
            out[name]["speed_vs_" + baseline] = {"ratio": ratio, "ci": [low, high],
                                                 "verdict": verdict(ratio, low, high)}
    return out


def causal_layouts(args, device, segment_lengths, dilation_rates) -> dict:
    """Spanning config, causal: contiguous against zigzag shards (interleaved)."""
    seq_len = args.layout_len
    steps = {layout: _ring_step(args, device, seq_len, segment_lengths, dilation_rates, True, layout)
             for layout in ("contiguous", "zigzag")}
    variants = {layout: (lambda s=step: contextlib.nullcontext(s)) for layout, step in steps.items()}
    result = _summary(_interleaved(variants, args.rounds, device), baseline="contiguous")
    return {"seq_len": seq_len, "segment_lengths": segment_lengths, "dilation_rates": dilation_rates, **result}


def compare_modes(args, device, seq_len, segment_lengths, dilation_rates) -> dict:
    """One config: fwd+bwd of every mode that runs on this world (interleaved, the ring as reference), with the
    bytes each sends per rank (max over ranks); the others under `skipped` with their reason."""
    world, causal = dist.get_world_size(), False  # non-causal, as the throughput section
    layout = ring_layout(causal)
    skipped = {mode: reason for mode in PARALLEL_MODES if (reason := skip_reason(mode, world, args.heads))}
    steps = {mode: _ring_step(args, device, seq_len, segment_lengths, dilation_rates, causal, layout, mode)
             for mode in PARALLEL_MODES if mode not in skipped}
    sent = {mode: _max_over_ranks([float(sent_bytes(step))], device)[0] for mode, step in steps.items()}
    variants = {mode: (lambda s=step: contextlib.nullcontext(s)) for mode, step in steps.items()}
    result = _summary(_interleaved(variants, args.rounds, device), baseline="ring")
    for mode in steps:
        result[mode]["bytes_sent_max_rank"] = int(sent[mode])
    if "hybrid" in steps:
        result["hybrid"]["mesh"] = list(hybrid_mesh_shape(world))
    return {"seq_len": seq_len, "segment_lengths": segment_lengths, "dilation_rates": dilation_rates,
            "causal": causal, "layout": layout, "heads": args.heads, "skipped": skipped, **result}


def overhead(args, device, seq_len, segment_lengths, dilation_rates) -> dict:
    """Per rank, the ring on its shard against the single-GPU engine on a sequence of the shard's length
    (what one GPU costs for the shard): --iters fwd+bwd calls back to back (no barrier between them, as
    a model's layers run), timed by CUDA events, in --rounds interleaved rounds; ratio = ring / engine
    per rank (median over rounds, paired bootstrap interval), and the slowest rank's."""
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator(device=device).manual_seed(200 + rank)
    q, k, v, grad = (torch.randn(1, seq_len // world, args.heads, args.head_dim, generator=gen, device=device,
                                 dtype=args.dtype) for _ in range(4))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    kwargs = dict(segment_lengths=segment_lengths, dilation_rates=dilation_rates, mode=args.mode)
    calls = {"engine_on_shard": lambda: dilated_attention(q, k, v, **kwargs),
             "ring": lambda: ring_dilated_attention(q, k, v, **kwargs),
             "ring_unchecked": lambda: ring_dilated_attention(q, k, v, check_config=False, **kwargs)}

    def batch(call, iters: int) -> float:
        dist.barrier()
        _sync(device)
        start = time.perf_counter()
        for _ in range(iters):
            call().backward(grad)
            q.grad = k.grad = v.grad = None
        _sync(device)
        return (time.perf_counter() - start) / iters

    for call in calls.values():
        batch(call, 2)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            times[name].append(batch(call, max(args.iters, 1)))
    per_rank = torch.tensor([*ratio_ci(times["ring"], times["engine_on_shard"]),
                             *ratio_ci(times["ring_unchecked"], times["engine_on_shard"])],
                            dtype=torch.float64, device=device)
    gathered = [torch.empty_like(per_rank) for _ in range(world)]
    dist.all_gather(gathered, per_rank)
    rows = [t.tolist() for t in gathered]
    worst = max(range(world), key=lambda r: rows[r][0])
    unchecked_worst = max(range(world), key=lambda r: rows[r][3])
    return {"seq_len": seq_len, "shard_len": seq_len // world, "segment_lengths": segment_lengths,
            "dilation_rates": dilation_rates, "seconds_rank0": times,
            "ring_over_engine_per_rank": [{"ratio": r[0], "low": r[1], "high": r[2]} for r in rows],
            "unchecked_ring_over_engine_per_rank": [{"ratio": r[3], "low": r[4], "high": r[5]} for r in rows],
            "slowest_rank": worst, "per_gpu_throughput_vs_one_gpu_on_its_shard": 1 / rows[worst][0],
            "per_gpu_throughput_vs_one_gpu_on_its_shard_unchecked": 1 / rows[unchecked_worst][3]}


def context_parallel_anchor(args, device) -> dict:
    """Dense causal attention: our ring (zigzag, contiguous; "auto" and, on zigzag, each dense executor that runs
    here by name) against PyTorch's context parallel SDPA."""
    seq_len, world = args.cp_len, dist.get_world_size()
    variants = {}
    for layout in ("zigzag", "contiguous"):
        step = _ring_step(args, device, seq_len, [seq_len], [1], True, layout)
        variants[f"ring_{layout}"] = lambda s=step: contextlib.nullcontext(s)
    probe = torch.empty(1, seq_len // world, args.heads, args.head_dim, device=device, dtype=args.dtype)
    auto_steps = resolve_step_executor("auto", probe, DilatedPattern.create([seq_len], [1], causal=True),
                                       training=True).name
    for name in ("sdpa", "fa4"):
        if name != auto_steps and unavailable_reason(name, device, args.dtype) is None:
            step = _ring_step(args, device, seq_len, [seq_len], [1], True, "zigzag", backend=name)
            variants[f"ring_zigzag_{name}"] = lambda s=step: contextlib.nullcontext(s)
    errors = {}
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import _attention as cp_attention
        from torch.distributed.tensor.experimental import context_parallel
        from torch.nn.attention import SDPBackend, sdpa_kernel

        mesh = init_device_mesh(device.type, (world,))
        gen = torch.Generator(device=device).manual_seed(100)
        full = [torch.randn(1, args.heads, seq_len, args.head_dim, generator=gen, device=device, dtype=args.dtype)
                for _ in range(4)]
        for kernel in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
            for rotate in ("allgather", "alltoall"):
                @contextlib.contextmanager
                def enter(kernel=kernel, rotate=rotate):
                    cp_attention.set_rotate_method(rotate)
                    buffers = [t.clone() for t in full]
                    with sdpa_kernel([kernel]), context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2] * 4):
                        q, k, v = (t.detach().requires_grad_(True) for t in buffers[:3])

                        def step() -> None:
                            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                            out.backward(buffers[3])

                        yield step

                name = f"context_parallel_{kernel.name.lower()}_{rotate}"
                try:
                    with enter() as probe:
                        probe()
                    variants[name] = enter
                except Exception as exc:  # a kernel or rotate method this torch cannot run: recorded, skipped
                    errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    except ImportError as exc:
        errors["context_parallel"] = f"ImportError: {exc}"
    samples = _interleaved(variants, args.rounds, device)
    return {"seq_len": seq_len, "heads": args.heads, "head_dim": args.head_dim, "errors": errors,
            "ring_auto_steps": auto_steps, **_summary(samples, baseline="ring_zigzag")}


def single_gpu_dense_causal(args, device) -> dict:
    """The same dense causal attention on one GPU: SDPA (cuDNN) on the whole sequence, for reference."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator(device=device).manual_seed(100)
    q, k, v, grad = (torch.randn(1, args.heads, args.cp_len, args.head_dim, generator=gen, device=device,
                                 dtype=args.dtype) for _ in range(4))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))

    def step() -> None:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)
        _sync(device)

    return {"seq_len": args.cp_len, "sdpa_cudnn_seconds": _median_seconds(step, args.iters)}


def _fits(args, device, seq_len, segment_lengths, dilation_rates) -> bool:
    ok = torch.ones(1, device=device)
    try:
        _ring_step(args, device, seq_len, segment_lengths, dilation_rates)()
    except torch.OutOfMemoryError:
        ok.zero_()
    free_cell_memory(device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())


def longest(args, device, segment_lengths, dilation_rates, name: str) -> dict:
    """Doubling from --max-start, then bisection in steps of `grain` (N / P a multiple of the largest
    segment inside a shard, so that every P runs the same plan)."""
    world = dist.get_world_size()
    grain = max(w for w in segment_lengths if w < (1 << 40)) * world
    best, seq_len, trials = None, args.max_start, 0
    progress = tqdm(desc=f"longest ({name})", unit="trial", disable=dist.get_rank() != 0)
    while seq_len <= args.max_limit and _fits(args, device, seq_len, segment_lengths, dilation_rates):
        best, seq_len = seq_len, seq_len * 2
        trials += 1
        progress.update(1)
        progress.set_postfix(seq_len=best)
    low, high = best, min(seq_len, args.max_limit + grain)
    while low is not None and high - low > grain:
        middle = low + ((high - low) // 2 // grain) * grain
        trials += 1
        progress.update(1)
        if _fits(args, device, middle, segment_lengths, dilation_rates):
            low = middle
            progress.set_postfix(seq_len=low)
        else:
            high = middle
    progress.close()
    return {"seq_len": low, "first_failure_or_limit": high, "grain": grain, "trials": trials}


def _configs(args) -> dict:
    return {"longnet": (list(args.segment_lengths), list(args.dilation_rates)),
            "spanning": (list(args.segment_lengths) + [1 << 40], list(args.dilation_rates) + [args.spanning_dilation])}


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write (rank 0, after every measurement)")
    parser.add_argument("--baseline", default=None, help="JSON of the same run on 1 GPU, for the ratios")
    parser.add_argument("--heads", type=int, default=12, help="query heads H (ulysses needs H %% P == 0)")
    parser.add_argument("--head-dim", type=int, default=64, help="head dimension D")
    parser.add_argument("--segment-lengths", type=_int_list, default=[2048, 8192, 32768, 131072],
                        help="segment lengths of the longnet config (comma-separated)")
    parser.add_argument("--dilation-rates", type=_int_list, default=[1, 2, 4, 8],
                        help="dilation rates of the longnet config, one per segment length")
    parser.add_argument("--spanning-dilation", type=int, default=16,
                        help="dilation of the spanning config's whole-sequence branch")
    parser.add_argument("--mode", choices=("longnet", "head_groups"), default="longnet",
                        help="how the branches share the heads (DilatedPattern mode)")
    parser.add_argument("--seq-lens", type=_int_list, default=[524288, 1048576],
                        help="sequence lengths N of the throughput and overhead sections")
    parser.add_argument("--check-len", type=int, default=32768, help="sequence length of the correctness section")
    parser.add_argument("--iters", type=int, default=5, help="timed fwd+bwd steps per measurement (throughput)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds of the A/B sections")
    parser.add_argument("--layout-len", type=int, default=524288, help="sequence length of the causal_layouts section")
    parser.add_argument("--cp-len", type=int, default=131072, help="sequence length of the context_parallel section")
    parser.add_argument("--modes-len", type=int, default=None,
                        help="sequence length of the parallel_modes section (default: the largest of --seq-lens "
                             "divisible by 2P)")
    parser.add_argument("--max-start", type=int, default=1 << 20, help="first N of the longest section's doubling")
    parser.add_argument("--max-limit", type=int, default=1 << 25, help="largest N the longest section tries")
    parser.add_argument("--sections", default="correctness,throughput,layouts,context_parallel,parallel_modes,longest",
                        help="comma-separated sections to run (also: overhead)")
    parser.add_argument("--smoke", action="store_true", help="tiny CPU sizes (float32) to check the script runs")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=300))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    args.dtype = torch.bfloat16 if cuda else torch.float32
    if args.smoke:
        args.heads, args.head_dim, args.iters, args.rounds, args.check_len = 4, 16, 1, 2, 1024
        args.segment_lengths, args.dilation_rates, args.seq_lens = [64, 256], [1, 2], [1024, 2048]
        args.max_start, args.max_limit, args.layout_len, args.cp_len = 1024, 4096, 2048, 1024
        sections.discard("context_parallel")  # needs CUDA SDPA kernels
    rank, world = dist.get_rank(), dist.get_world_size()
    report = {"command": strip_paths(" ".join(sys.argv)), "environment": _environment(device),
              "config": {k: (str(v) if isinstance(v, torch.dtype) else strip_paths(v) if isinstance(v, str) else v)
                         for k, v in vars(args).items()}}

    def save() -> None:
        if rank == 0:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=2))

    try:
        configs = _configs(args)
        if "correctness" in sections:
            zigzag = dict(causal=True, layout="zigzag")
            checks = [(name, cfg, {}) for name, cfg in configs.items()] + [
                ("spanning_causal_zigzag", configs["spanning"], zigzag),
                ("gqa_causal_zigzag", configs["spanning"], {**zigzag, "kv_heads": max(1, args.heads // 4)}),
                ("packed_causal_zigzag", configs["longnet"], {**zigzag, "packed": True})]
            report["correctness"] = {}
            for parallel in PARALLEL_MODES:
                reason = skip_reason(parallel, world, args.heads)
                if reason is not None:
                    report["correctness"][parallel] = {"parallel": parallel, "skipped": reason}
                    continue
                for name, cfg, options in checks:
                    key = name if parallel == "ring" else f"{parallel}_{name}"
                    report["correctness"][key] = correctness(args, device, *cfg, **options, parallel=parallel)
                save()
        if "throughput" in sections:
            bandwidth = p2p_bandwidth(device)
            report["p2p_bandwidth_bytes_per_s"] = bandwidth
            report["throughput"] = {name: [] for name in configs}
            runs = [(name, seq_len) for name in configs for seq_len in args.seq_lens]
            for name, seq_len in tqdm(runs, desc="throughput", disable=rank != 0):
                report["throughput"][name].append(throughput(args, device, seq_len, *configs[name], bandwidth,
                                                             args.iters))
                save()
        if "overhead" in sections and world > 1:
            report["overhead"] = [overhead(args, device, seq_len, *configs["longnet"]) for seq_len in args.seq_lens]
            save()
        if "layouts" in sections and world > 1:
            report["causal_layouts"] = causal_layouts(args, device, *configs["spanning"])
            save()
        if "context_parallel" in sections:
            report["context_parallel"] = (context_parallel_anchor(args, device) if world > 1
                                          else single_gpu_dense_causal(args, device))
            save()
        if "parallel_modes" in sections and world > 1:
            modes_len = args.modes_len or default_seq_len(args.seq_lens, world)
            if modes_len is None:
                report["parallel_modes"] = {"skipped": f"no --seq-lens divisible by 2P = {2 * world}: pass --modes-len"}
            else:
                report["parallel_modes"] = {}
                for name in ("longnet", "spanning"):
                    report["parallel_modes"][name] = compare_modes(args, device, modes_len, *configs[name])
                    save()
        if "longest" in sections:
            report["longest"] = {}
            for name, cfg in configs.items():
                report["longest"][name] = longest(args, device, *cfg, name)
                save()
        if args.baseline:
            base = json.loads(Path(args.baseline).read_text())
            ratios = {}
            for name, rows in report.get("throughput", {}).items():
                base_rows = {r["seq_len"]: r for r in base.get("throughput", {}).get(name, [])}
                ratios[name] = {str(r["seq_len"]): r["tokens_per_s_per_gpu"] / base_rows[r["seq_len"]]["tokens_per_s_per_gpu"]
                                for r in rows if r["seq_len"] in base_rows}
            if "longest" in report and "longest" in base:
                ratios["longest_seq_len"] = {
                    name: (report["longest"][name]["seq_len"] / base["longest"][name]["seq_len"]
                           if report["longest"][name]["seq_len"] and base["longest"].get(name, {}).get("seq_len") else None)
                    for name in report["longest"]}
            report["ratios_vs_baseline"] = ratios
            save()
        if rank == 0:
            print(json.dumps({k: report[k] for k in report if k not in ("environment", "config")}, indent=1))
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
