"""`hilbert-lab ring` / `python -m hilbert_lab.examples.ring`: self-check the ring, then time a long sequence.

    torchrun --nproc_per_node=4 -m hilbert_lab.examples.ring                      # gloo on CPU
    torchrun --nproc_per_node=2 -m hilbert_lab.examples.ring --seq-len 262144     # NCCL on GPUs
    torchrun --nproc_per_node=2 -m hilbert_lab.examples.ring --segment-lengths 2048,8192 --dilation-rates 1,2
    torchrun --nproc_per_node=2 -m hilbert_lab.cli ring --check-only               # the same via the CLI
    python -m hilbert_lab.examples.ring                                           # one process

Step 1 (small sizes, float64): every rank compares its output and q/k/v gradients (random upstream
gradient) with the engine run on the whole sequence, for both modes, causal and not; any
difference above 1e-10 fails (exit code 1). Step 2 (large): forward+backward of ring attention on
this rank's shard; rank 0 prints tokens/s and peak memory per rank. Lists are comma-separated
(--segment-lengths 2048,8192); every option is checked before the process group starts.
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import os
import resource
import tempfile
import time
from typing import Sequence

import torch
import torch.distributed as dist

from hilbert_lab.arguments import MAX_SEQ_LEN, help_formatter, int_list, integer
from hilbert_lab.distributed import comm
from hilbert_lab.distributed.ring import ring_dilated_attention
from hilbert_lab.distributed.sharding import shard_positions

CHECK_ATOL = 1e-10


def init_distributed(timeout_s: float = 300.0) -> torch.device:
    """Join the torchrun world (NCCL with GPUs, else gloo), or make a 1-process world; returns the device."""
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    backend = "nccl" if use_cuda else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    if "RANK" in os.environ:
        dist.init_process_group(backend, timeout=timeout)
    else:
        store = os.path.join(tempfile.mkdtemp(), "rendezvous")
        dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1, timeout=timeout)
    return torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def self_check(device: torch.device, *, shard_len: int = 16, heads: int = 4, head_dim: int = 8) -> float:
    """Largest |ring - engine| over outputs and q/k/v gradients, small float64 cases on all ranks."""
    from hilbert_lab.attention.engine import dilated_attention

    world, rank = dist.get_world_size(), dist.get_rank()
    seq_len = shard_len * world
    segment_lengths = [shard_len // 4, 2 * shard_len if world % 2 == 0 else shard_len, seq_len]
    dilation_rates = [1, 2, 4]
    worst = 0.0
    for mode, causal in itertools.product(("longnet", "head_groups"), (False, True)):
        gen = torch.Generator().manual_seed(7)
        q, k, v, grad = (torch.randn(2, seq_len, heads, head_dim, generator=gen, dtype=torch.float64).to(device)
                         for _ in range(4))
        args = dict(segment_lengths=segment_lengths, dilation_rates=dilation_rates, causal=causal, mode=mode)
        full = [t.clone().requires_grad_(True) for t in (q, k, v)]
        ref = dilated_attention(*full, **args)
        (ref * grad).sum().backward()
        pos = shard_positions(rank, world, seq_len).to(device)
        local = [t[:, pos].clone().requires_grad_(True) for t in (q, k, v)]
        out = ring_dilated_attention(*local, **args)
        (out * grad[:, pos]).sum().backward()
        errors = [(out - ref[:, pos]).detach().abs().max()] + [(a.grad - b.grad[:, pos]).abs().max() for a, b in zip(local, full)]
        worst = max(worst, max(float(e) for e in errors))
    result = torch.tensor([worst], dtype=torch.float64, device=device)
    dist.all_reduce(result, op=dist.ReduceOp.MAX)
    return float(result)


def time_forward_backward(
    seq_len: int, device: torch.device, *, heads: int, head_dim: int, segment_lengths: Sequence[int],
    dilation_rates: Sequence[int], causal: bool, mode: str, dtype: torch.dtype, iters: int, batch: int = 1,
) -> dict:
    """Median forward+backward seconds of ring attention on this rank's shard, tokens/s, peak memory."""
    world = dist.get_world_size()
    shard_len = seq_len // world
    gen = torch.Generator(device=device).manual_seed(dist.get_rank())
    q, k, v = (torch.randn(batch, shard_len, heads, head_dim, generator=gen, device=device, dtype=dtype)
               .requires_grad_(True) for _ in range(3))
    grad = torch.randn(batch, shard_len, heads, head_dim, generator=gen, device=device, dtype=dtype)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(iters + 1):  # the first one warms up
        comm.reset_stats()
        dist.barrier()
        _sync(device)
        start = time.perf_counter()
        out = ring_dilated_attention(q, k, v, segment_lengths=segment_lengths, dilation_rates=dilation_rates,
                                     causal=causal, mode=mode)
        out.backward(grad)
        _sync(device)
        times.append(time.perf_counter() - start)
        q.grad = k.grad = v.grad = None
        del out
    seconds = sorted(times[1:])[len(times[1:]) // 2]
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # process peak RSS (Linux: KiB)
    return {
        "rank": dist.get_rank(), "seq_len": seq_len, "shard_len": shard_len, "seconds": seconds,
        "tokens_per_s": seq_len / seconds, "tokens_per_s_per_rank": shard_len / seconds,
        "peak_memory_bytes": int(peak), "messages_sent": comm.STATS.messages, "bytes_sent": comm.STATS.bytes,
    }


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The example's options (shared by `python -m hilbert_lab.examples.ring` and `hilbert-lab ring`)."""
    parser.add_argument("--seq-len", type=integer(1, MAX_SEQ_LEN), default=None,
                        help="total tokens N, a multiple of the world size (default: 2048 per rank on CPU, 65536 on GPU)")
    parser.add_argument("--num-heads", type=integer(1, 4096), default=8, help="H, attention heads")
    parser.add_argument("--heads", dest="num_heads", type=integer(1, 4096), default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)  # hidden alias of --num-heads
    parser.add_argument("--head-dim", type=integer(1, 1024), default=64, help="D, channels per head")
    parser.add_argument("--segment-lengths", type=int_list(1, MAX_SEQ_LEN), default=[2048, 8192, 32768, 131072],
                        help="comma-separated, e.g. 2048,8192")
    parser.add_argument("--dilation-rates", type=int_list(1, MAX_SEQ_LEN), default=[1, 2, 4, 8],
                        help="comma-separated, one rate a segment length, e.g. 1,2")
    parser.add_argument("--mode", choices=("longnet", "head_groups"), default="longnet", help="longnet | head_groups")
    parser.add_argument("--causal", action="store_true", help="causal attention (default: not causal)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                        help="float32 | bfloat16 | float16 (default: bfloat16 on GPU, float32 on CPU)")
    parser.add_argument("--repeats", type=integer(1, 1000), default=3, help="timed runs after one warm-up, 1..1000")
    parser.add_argument("--iters", dest="repeats", type=integer(1, 1000), default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)  # hidden alias of --repeats
    parser.add_argument("--check-only", action="store_true", help="run the self-check and stop")
    return parser


def register_cli(subparsers) -> argparse.ArgumentParser:
    """Add the `ring` command to the `hilbert-lab` parser (run it under torchrun for several ranks)."""
    parser = subparsers.add_parser(
        "ring", help="ring attention: self-check vs the engine, then tokens/s per rank",
        description=__doc__.split("\n")[0], formatter_class=help_formatter,
        epilog="examples:\n"
               "  hilbert-lab ring --check-only                                   # one process\n"
               "  torchrun --nproc_per_node=4 -m hilbert_lab.cli ring --seq-len 65536 --segment-lengths 2048,8192 "
               "--dilation-rates 1,2\n\nlists are comma-separated; every option is checked before the process "
               "group starts")
    add_arguments(parser)
    parser.set_defaults(func=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry (the example): parse `argv` and `run`."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    return run(add_arguments(parser).parse_args(argv))


def validate_arguments(args: argparse.Namespace, world_size: int | None = None) -> None:
    """ValueError naming the option for a pattern or size the timed run cannot use (checked before
    the process group starts; world_size defaults to torchrun's WORLD_SIZE, else 1)."""
    from hilbert_lab.attention.pattern import DilatedPattern

    world = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    try:
        DilatedPattern.create(args.segment_lengths, args.dilation_rates, mode=args.mode, causal=args.causal)
    except ValueError as error:
        raise ValueError(f"--segment-lengths/--dilation-rates: {error}") from None
    if args.seq_len is not None and args.seq_len % world:
        raise ValueError(f"--seq-len must be a multiple of the world size {world}, got {args.seq_len}")


def run(args: argparse.Namespace) -> int:
    """Self-check, then (unless --check-only) time forward+backward; returns the exit code."""
    validate_arguments(args)
    device = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        worst = self_check(device)
        ok = worst <= CHECK_ATOL
        if rank == 0:
            print(f"self-check on {world} rank(s) ({dist.get_backend()}, {device.type}): max |ring - engine| = "
                  f"{worst:.3e} -> {'PASS' if ok else 'FAIL'} (atol {CHECK_ATOL:g})", flush=True)
        if not ok:
            return 1
        if args.check_only:
            return 0
        seq_len = args.seq_len if args.seq_len is not None else world * (65536 if device.type == "cuda" else 2048)
        dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
        try:
            stats = time_forward_backward(
                seq_len, device, heads=args.num_heads, head_dim=args.head_dim, segment_lengths=args.segment_lengths,
                dilation_rates=args.dilation_rates, causal=args.causal, mode=args.mode, dtype=dtype, iters=args.repeats)
        except (torch.OutOfMemoryError, RuntimeError) as error:
            if not isinstance(error, torch.OutOfMemoryError) and "allocate" not in str(error):
                raise
            raise ValueError(f"--seq-len {seq_len} (--num-heads {args.num_heads}, --head-dim {args.head_dim}) does not fit "
                             f"in this rank's memory: {str(error).splitlines()[0]}") from None
        gathered = [None] * world
        dist.all_gather_object(gathered, stats)
        if rank == 0:
            print(f"N={seq_len} on {world} rank(s), {dtype}, H={args.num_heads}, D={args.head_dim}, "
                  f"segments={args.segment_lengths}, dilations={args.dilation_rates}, causal={args.causal}")
            for s in gathered:
                print(f"  rank {s['rank']}: fwd+bwd {s['seconds']:.3f} s, {s['tokens_per_s_per_rank']:,.0f} tokens/s "
                      f"per rank ({s['tokens_per_s']:,.0f} total), peak memory {s['peak_memory_bytes'] / 2**20:,.0f} MiB, "
                      f"sent {s['messages_sent']} messages / {s['bytes_sent'] / 2**20:,.1f} MiB", flush=True)
        return 0
    finally:
        dist.destroy_process_group()
