"""Ring dilated attention scaling on 1, 2, 4 or 8 GPUs (NCCL): bf16 correctness, tokens/s, longest sequence.

Run once per GPU count with the same arguments, passing the 1-GPU JSON as --baseline to the others:

    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    torchrun --nproc_per_node=1 benchmarks/bench_ring.py --out reports/results/ring_1gpu.json
    torchrun --nproc_per_node=2 benchmarks/bench_ring.py --out reports/results/ring_2gpu.json \
        --baseline reports/results/ring_1gpu.json
CPU smoke run (gloo, tiny):
    torchrun --nproc_per_node=2 benchmarks/bench_ring.py --smoke --out /tmp/ring_smoke.json

Sections of the JSON (rank 0 rewrites it after every measurement, so a crash keeps what was done):
- correctness: N = --check-len, bf16. Each rank runs the single-GPU engine on the whole sequence
  (bf16, and float32 as the yardstick) and compares its shard of the ring output and of dq/dk/dv
  (same random upstream gradient). Pass when the ring's error against float32 is at most twice
  the single-GPU bf16 error against float32 plus 1e-3 (ring and single GPU round differently).
- throughput: per config and N in --seq-lens, median fwd+bwd seconds over --iters after one
  warm-up (hilbert_lab.bench.timing.time_function: host wall time of a step that starts with a
  barrier and ends with a device sync, so every rank makes the same calls; the slowest rank's
  median is kept); tokens/s per GPU = N / seconds / P. Configs: "longnet" (--segment-lengths /
  --dilation-rates, the issue's [2048, 8192, 32768, 131072] / [1, 2, 4, 8]: with N/P >= 131072
  every segment lies inside a shard and nothing is sent) and "spanning" (the same plus a
  whole-sequence branch, dilation --spanning-dilation, so K/V travel around the whole ring).
- longest: doubling N from --max-start, the longest N whose fwd+bwd runs (OOM -> stop; all ranks
  agree by an all-reduce; a rank that dies mid-ring ends the run at the NCCL timeout).
- ratios (with --baseline): tokens/s per GPU over the baseline's, longest N over the baseline's.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hilbert_lab.attention.engine import dilated_attention  # noqa: E402
from hilbert_lab.bench.env import collect_environment  # noqa: E402
from hilbert_lab.bench.timing import time_function  # noqa: E402
from hilbert_lab.distributed import comm  # noqa: E402
from hilbert_lab.distributed.ring import ring_dilated_attention  # noqa: E402
from hilbert_lab.distributed.sharding import shard_positions  # noqa: E402


def _environment(device: torch.device) -> dict:
    """The kit's environment block plus the process group this run uses."""
    return {**collect_environment(str(device)), "world_size": dist.get_world_size(), "backend": dist.get_backend()}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _inputs(seq_len: int, heads: int, head_dim: int, device, dtype, seed: int, shard_of: int | None = None):
    """q, k, v, upstream grad (1, N, H, D) from a seed (the whole sequence, or rank `shard_of`'s shard)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = [torch.randn(1, seq_len, heads, head_dim, generator=gen, device=device, dtype=torch.float32)
               for _ in range(4)]
    if shard_of is not None:
        pos = shard_positions(shard_of, dist.get_world_size(), seq_len).to(device)
        tensors = [t[:, pos] for t in tensors]
    return [t.to(dtype) for t in tensors]


def correctness(args, device, segment_lengths, dilation_rates) -> dict:
    """Ring (bf16) vs single-GPU engine (bf16 and float32) on --check-len tokens; max abs errors."""
    rank, world = dist.get_rank(), dist.get_world_size()
    seq_len = args.check_len
    pos = shard_positions(rank, world, seq_len).to(device)
    kwargs = dict(segment_lengths=segment_lengths, dilation_rates=dilation_rates, causal=args.causal, mode=args.mode)
    results = {}
    for dtype in (args.dtype, torch.float32):
        q, k, v, grad = _inputs(seq_len, args.heads, args.head_dim, device, dtype, seed=1)
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = dilated_attention(*leaves, **kwargs)
        out.backward(grad)
        results[dtype] = [out.detach()[:, pos].float()] + [t.grad[:, pos].float() for t in leaves]
        del leaves, out
    q, k, v, grad = _inputs(seq_len, args.heads, args.head_dim, device, args.dtype, seed=1)
    local = [t[:, pos].clone().requires_grad_(True) for t in (q, k, v)]
    out = ring_dilated_attention(*local, **kwargs)
    out.backward(grad[:, pos])
    ring = [out.detach().float()] + [t.grad.float() for t in local]
    names = ("out", "dq", "dk", "dv")
    stats = torch.tensor([[float((r - s).abs().max()), float((r - f).abs().max()), float((s - f).abs().max())]
                          for r, s, f in zip(ring, results[args.dtype], results[torch.float32])], device=device)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    report = {name: {"ring_vs_single": row[0], "ring_vs_fp32": row[1], "single_vs_fp32": row[2]}
              for name, row in zip(names, stats.tolist())}
    passed = all(r["ring_vs_fp32"] <= 2 * r["single_vs_fp32"] + 1e-3 for r in report.values())
    return {"seq_len": seq_len, "dtype": str(args.dtype), "max_abs_error": report, "pass": passed}


def fwd_bwd_seconds(args, device, seq_len, segment_lengths, dilation_rates, iters) -> dict:
    """Median fwd+bwd seconds on this rank's shard; also peak memory and bytes sent."""
    q, k, v, grad = _inputs(seq_len // dist.get_world_size(), args.heads, args.head_dim, device, args.dtype,
                            seed=100 + dist.get_rank())
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def step() -> None:
        comm.reset_stats()
        dist.barrier()
        out = ring_dilated_attention(q, k, v, segment_lengths=segment_lengths, dilation_rates=dilation_rates,
                                     causal=args.causal, mode=args.mode)
        out.backward(grad)
        _sync(device)
        q.grad = k.grad = v.grad = None

    # No time limit: every rank must make the same number of collective calls.
    seconds = time_function(step, warmup=1 if iters else 0, repeats=max(iters, 1), max_seconds=float("inf")).median / 1e3
    result = torch.tensor([seconds, torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0.0,
                           float(comm.STATS.bytes)], dtype=torch.float64, device=device)
    dist.all_reduce(result, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    world = dist.get_world_size()
    return {"seq_len": seq_len, "seconds": result[0].item(), "tokens_per_s_per_gpu": seq_len / result[0].item() / world,
            "peak_memory_gib_max_rank": result[1].item() / 2**30, "bytes_sent_max_rank": int(result[2].item())}


def _fits(args, device, seq_len, segment_lengths, dilation_rates) -> bool:
    ok = torch.ones(1, device=device)
    try:
        fwd_bwd_seconds(args, device, seq_len, segment_lengths, dilation_rates, iters=0)
    except torch.OutOfMemoryError:
        ok.zero_()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())


def _configs(args) -> dict:
    return {"longnet": (list(args.segment_lengths), list(args.dilation_rates)),
            "spanning": (list(args.segment_lengths) + [1 << 40], list(args.dilation_rates) + [args.spanning_dilation])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--baseline", default=None, help="JSON of the same run on 1 GPU, for the ratios")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--segment-lengths", type=int, nargs="+", default=[2048, 8192, 32768, 131072])
    parser.add_argument("--dilation-rates", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--spanning-dilation", type=int, default=16)
    parser.add_argument("--mode", choices=("longnet", "head_groups"), default="longnet")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[262144, 524288, 1048576])
    parser.add_argument("--check-len", type=int, default=32768)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--max-start", type=int, default=1 << 20)
    parser.add_argument("--max-limit", type=int, default=1 << 25)
    parser.add_argument("--skip-longest", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny CPU sizes (float32) to check the script runs")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=300))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    args.dtype = torch.bfloat16 if cuda else torch.float32
    if args.smoke:
        args.heads, args.head_dim, args.iters, args.check_len = 2, 16, 1, 1024
        args.segment_lengths, args.dilation_rates, args.seq_lens = [64, 256], [1, 2], [1024, 2048]
        args.max_start, args.max_limit = 1024, 4096
    rank = dist.get_rank()
    report = {"command": " ".join(sys.argv), "environment": _environment(device),
              "config": {k: (str(v) if isinstance(v, torch.dtype) else v) for k, v in vars(args).items()}}

    def save() -> None:
        if rank == 0:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=2))

    try:
        configs = _configs(args)
        report["correctness"] = {name: correctness(args, device, *cfg) for name, cfg in configs.items()}
        save()
        report["throughput"] = {name: [] for name in configs}
        runs = [(name, seq_len) for name in configs for seq_len in args.seq_lens]
        for name, seq_len in tqdm(runs, desc="throughput", disable=rank != 0):
            report["throughput"][name].append(fwd_bwd_seconds(args, device, seq_len, *configs[name], iters=args.iters))
            save()
        if not args.skip_longest:
            report["longest"] = {}
            for name, cfg in configs.items():
                seq_len, best = args.max_start, None
                progress = tqdm(desc=f"longest ({name})", unit="trial", disable=rank != 0)
                while seq_len <= args.max_limit and _fits(args, device, seq_len, *cfg):
                    best, seq_len = seq_len, seq_len * 2
                    progress.update(1)
                    progress.set_postfix(seq_len=best)
                progress.close()
                report["longest"][name] = {"seq_len": best, "first_failure_or_limit": seq_len}
                save()
        if args.baseline:
            base = json.loads(Path(args.baseline).read_text())
            ratios = {}
            for name, rows in report["throughput"].items():
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
