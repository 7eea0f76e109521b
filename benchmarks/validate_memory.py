"""Compare hilbert_lab.distributed.memory.estimate_memory_per_rank with measured peaks; print a table, write JSON
to --out.

Every configuration runs in a fresh subprocess (hilbert_lab.bench.isolate) as a "memory" case:
a warm-up forward+backward, then the peak above the inputs of one forward (no grad) and of one
forward+backward. CPU: peak RSS (VmHWM after /proc/self/clear_refs, glibc mmap threshold 64 KiB,
1 thread). CUDA: torch.cuda.max_memory_allocated minus memory_allocated at the start.

  python benchmarks/validate_memory.py --out reports/results/memory_estimate_cpu.json
  python benchmarks/validate_memory.py --device cuda --out reports/results/memory_estimate_gpu.json
  python benchmarks/validate_memory.py --device cuda --backends sdpa,flash --dtype bfloat16 --out gpu.json
  python benchmarks/validate_memory.py --ring 2 --out reports/results/memory_estimate_ring_cpu.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hilbert_lab.io import atomic_write, strip_paths  # noqa: E402
from hilbert_lab.bench.cases import CASE_TARGET, normalize_case, worker_env  # noqa: E402
from hilbert_lab.bench.env import collect_environment  # noqa: E402
from hilbert_lab.attention.memory import MemoryConfig  # noqa: E402
from hilbert_lab.distributed.memory import estimate_memory_per_rank  # noqa: E402
from hilbert_lab.bench.config import format_bytes  # noqa: E402
from hilbert_lab.bench.isolate import run_isolated  # noqa: E402

TOLERANCE = 0.1

CPU_CASES = [
    {"backend": "manual", "seq_len": 4096, "segment_lengths": [512, 1024], "dilation_rates": [1, 2], "num_heads": 4, "head_dim": 32},
    {"backend": "manual", "seq_len": 8192, "segment_lengths": [512, 1024], "dilation_rates": [1, 2], "num_heads": 4, "head_dim": 32},
    {"backend": "manual", "seq_len": 16384, "segment_lengths": [2048, 4096], "dilation_rates": [1, 2], "num_heads": 4, "head_dim": 64},
    {"backend": "manual", "seq_len": 8192, "segment_lengths": [512, 1024], "dilation_rates": [1, 2], "num_heads": 4, "head_dim": 32, "ordering": "hilbert"},
    {"backend": "manual", "seq_len": 3000, "batch_size": 2, "segment_lengths": [256, 512], "dilation_rates": [1, 2], "num_heads": 4, "head_dim": 32, "dtype": "float64", "causal": True},
    {"backend": "manual", "seq_len": 8192, "segment_lengths": [512, 1024, 2048], "dilation_rates": [1, 2, 4], "num_heads": 6, "head_dim": 32, "mode": "head_groups"},
    {"backend": "sdpa", "seq_len": 8192, "segment_lengths": [512, 1024], "dilation_rates": [1, 2], "num_heads": 4, "head_dim": 32},
    {"backend": "sdpa", "seq_len": 32768, "segment_lengths": [512, 1024], "dilation_rates": [1, 2], "num_heads": 4, "head_dim": 32},
    {"backend": "sdpa", "seq_len": 65536, "segment_lengths": [2048, 4096, 8192], "dilation_rates": [1, 2, 4], "num_heads": 8, "head_dim": 64},
    {"backend": "sdpa", "seq_len": 16384, "segment_lengths": [1024, 2048, 4096], "dilation_rates": [1, 2, 4], "num_heads": 8, "head_dim": 64, "ordering": "hilbert"},
    {"backend": "sdpa", "seq_len": 6000, "batch_size": 2, "segment_lengths": [512, 1024, 2048], "dilation_rates": [1, 2, 4], "num_heads": 6, "head_dim": 64, "mode": "head_groups"},
    {"backend": "sdpa", "seq_len": 16384, "segment_lengths": [2048, 8192], "dilation_rates": [1, 1], "num_heads": 8, "head_dim": 64},
    {"backend": "manual", "seq_len": 8192, "segment_lengths": [1024, 8192], "dilation_rates": [1, 1], "num_heads": 4, "head_dim": 32},
]


def gpu_cases(backends: list[str], dtype: str, sizes: tuple[int, ...] = (16384, 32768, 65536)) -> list[dict]:
    """The GPU set: B=2, H=12, D=64, segments 2048/4096/8192, dilations 1/2/4, over N and both modes."""
    cases = []
    for backend in backends:
        for seq_len in sizes:
            for mode in ("longnet", "head_groups"):
                cases.append({"backend": backend, "seq_len": seq_len, "batch_size": 2, "num_heads": 12, "head_dim": 64,
                              "segment_lengths": [2048, 4096, 8192], "dilation_rates": [1, 2, 4], "mode": mode,
                              "dtype": dtype, "device": "cuda"})
    return cases


RING_CASES = [  # per-rank peaks of ring attention (gloo, CPU); the second branch spans the ranks
    {"backend": "sdpa", "seq_len": 16384, "segment_lengths": [1024, 2048], "dilation_rates": [1, 2], "num_heads": 4, "head_dim": 32},
    {"backend": "sdpa", "seq_len": 16384, "segment_lengths": [2048, 16384], "dilation_rates": [1, 2], "num_heads": 4, "head_dim": 32},
    {"backend": "sdpa", "seq_len": 32768, "segment_lengths": [2048, 32768], "dilation_rates": [1, 4], "num_heads": 8, "head_dim": 64},
    {"backend": "manual", "seq_len": 8192, "segment_lengths": [512, 8192], "dilation_rates": [1, 2], "num_heads": 4, "head_dim": 32},
    {"backend": "sdpa", "seq_len": 16384, "segment_lengths": [1024, 16384], "dilation_rates": [1, 2], "num_heads": 6, "head_dim": 32, "mode": "head_groups"},
    {"backend": "sdpa", "seq_len": 16384, "segment_lengths": [2048, 16384], "dilation_rates": [1, 2], "num_heads": 4, "head_dim": 32, "causal": True},
]


def _ring_rank(rank: int, world_size: int, init_file: str, case: dict, out_dir: str) -> None:
    """One gloo rank: warm-up, then the peaks above its shard inputs of a forward and a forward+backward."""
    import datetime

    import torch
    import torch.distributed as dist

    from hilbert_lab.distributed.ring import ring_dilated_attention
    from hilbert_lab.bench.measure import PeakMeter

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=300))
    shard = (case["batch_size"], case["seq_len"] // world_size, case["num_heads"], case["head_dim"])
    generator = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(shard, generator=generator, dtype=getattr(torch, case["dtype"])).requires_grad_()
               for _ in range(3))
    upstream = torch.randn(shard, generator=generator, dtype=q.dtype)

    def attend():
        return ring_dilated_attention(q, k, v, segment_lengths=case["segment_lengths"],
                                      dilation_rates=case["dilation_rates"], causal=case["causal"],
                                      mode=case["mode"], backend=case["backend"])

    out = attend()
    out.backward(upstream)
    q.grad = k.grad = v.grad = None
    del out
    dist.barrier()
    with torch.no_grad(), PeakMeter("cpu") as forward_meter:
        out = attend()
        del out
    dist.barrier()
    with PeakMeter("cpu") as training_meter:
        out = attend()
        out.backward(upstream)
        del out
    dist.barrier()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump({"forward_peak_bytes": forward_meter.peak_bytes,
                   "forward_backward_peak_bytes": training_meter.peak_bytes}, handle)
    dist.destroy_process_group()


def run_ring(cases: list[dict], world_size: int, timeout_s: float) -> list[dict]:
    """Per-rank measured peaks (the largest over ranks) against the ring estimate."""
    import tempfile

    import torch.multiprocessing as mp

    os.environ.update(MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    rows = []
    for params in tqdm(cases, desc=f"ring x{world_size}", unit="case"):
        case = normalize_case({"kind": "memory", **params})
        estimate = estimate_memory_per_rank(MemoryConfig.from_case({**case, "world_size": world_size}))
        row = {"params": {**case, "world_size": world_size}, "status": "ok", "error": "",
               "estimated_forward_bytes": estimate.forward_bytes,
               "estimated_forward_backward_bytes": estimate.forward_backward_bytes,
               "inputs_bytes": estimate.inputs_bytes, "breakdown": estimate.breakdown}
        with tempfile.TemporaryDirectory(prefix="hilbert_lab_ring_") as out_dir:
            context = mp.start_processes(_ring_rank, args=(world_size, os.path.join(out_dir, "rendezvous"), case,
                                                           out_dir), nprocs=world_size, join=False, start_method="spawn")
            deadline = time.monotonic() + timeout_s
            try:
                while not context.join(timeout=1.0):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"ring ranks did not finish in {timeout_s:g} s")
                ranks = [json.load(open(os.path.join(out_dir, f"rank{r}.json"))) for r in range(world_size)]
            except Exception as error:  # a failed or hung world is a row, not the end of the run
                for process in context.processes:
                    if process.is_alive():
                        process.kill()
                row.update(status="error", error=" ".join(f"{type(error).__name__}: {error}".split())[:500])
                rows.append(row)
                continue
        measured_f = max(r["forward_peak_bytes"] for r in ranks)
        measured_fb = max(r["forward_backward_peak_bytes"] for r in ranks)
        row.update(measured_forward_bytes=measured_f, measured_forward_backward_bytes=measured_fb,
                   per_rank=ranks, peak_method="VmHWM after clear_refs, per rank (max over ranks)",
                   ratio_forward=estimate.forward_bytes / max(measured_f, 1),
                   ratio_forward_backward=estimate.forward_backward_bytes / max(measured_fb, 1))
        rows.append(row)
    return rows


def run(cases: list[dict], timeout_s: float, on_row=lambda rows: None) -> list[dict]:
    """Each case in a fresh process; on_row(rows so far) after each, so that an interrupted run keeps them."""
    rows = []
    for params in tqdm(cases, desc="memory", unit="case"):
        case = normalize_case({"kind": "memory", "threads": 1, **params})
        estimate = estimate_memory_per_rank(MemoryConfig.from_case(case))
        outcome = run_isolated(CASE_TARGET, case, timeout_s=timeout_s, env=worker_env(case))
        row = {"params": case, "status": outcome.status, "error": outcome.error,
               "estimated_forward_bytes": estimate.forward_bytes,
               "estimated_forward_backward_bytes": estimate.forward_backward_bytes,
               "inputs_bytes": estimate.inputs_bytes, "breakdown": estimate.breakdown}
        if outcome.ok:
            measured_f = outcome.result["forward_peak_bytes"]
            measured_fb = outcome.result["forward_backward_peak_bytes"]
            row.update(measured_forward_bytes=measured_f, measured_forward_backward_bytes=measured_fb,
                       peak_method=outcome.result["peak_method"],
                       ratio_forward=estimate.forward_bytes / max(measured_f, 1),
                       ratio_forward_backward=estimate.forward_backward_bytes / max(measured_fb, 1))
        rows.append(row)
        on_row(rows)
    return rows


def describe(params: dict) -> str:
    text = (f"{params['backend']:>7} {params['mode'][:8]:>8} {params['dtype'][:7]:>7} B={params['batch_size']} "
            f"N={params['seq_len']:<6} H={params['num_heads']:<2} D={params['head_dim']:<3} "
            f"w={','.join(map(str, params['segment_lengths']))} r={','.join(map(str, params['dilation_rates']))}")
    extras = [name for name in ("causal",) if params[name]] + ([params["ordering"]] if params["ordering"] else [])
    if params.get("world_size", 1) > 1:
        extras.append(f"ring P={params['world_size']}")
    return text + (" " + " ".join(extras) if extras else "")


def print_table(rows: list[dict]) -> None:
    print(f"{'case':<84} {'fwd est':>10} {'fwd meas':>10} {'ratio':>6} {'f+b est':>10} {'f+b meas':>10} {'ratio':>6}")
    for row in rows:
        if row["status"] != "ok":
            print(f"{describe(row['params']):<84} {row['status']}: {row['error']}")
            continue
        print(f"{describe(row['params']):<84} {format_bytes(row['estimated_forward_bytes']):>10} "
              f"{format_bytes(row['measured_forward_bytes']):>10} {row['ratio_forward']:>6.2f} "
              f"{format_bytes(row['estimated_forward_backward_bytes']):>10} "
              f"{format_bytes(row['measured_forward_backward_bytes']):>10} {row['ratio_forward_backward']:>6.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu | cuda (default cpu)")
    parser.add_argument("--backends", default="all",
                        help="GPU only: comma-separated backends, or 'all' (every executor that runs here but the "
                             "dense reference; default all)")
    parser.add_argument("--sizes", default="16384,32768,65536", help="GPU only: comma-separated sequence lengths")
    parser.add_argument("--dtype", default="bfloat16", help="GPU only (default bfloat16)")
    parser.add_argument("--quick", action="store_true", help="first three cases only")
    parser.add_argument("--cases", default=None, help="comma-separated indices into the case list (e.g. 0,3)")
    parser.add_argument("--ring", type=int, default=0, metavar="P",
                        help="CPU: validate the per-rank ring estimate with P gloo ranks instead")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per case")
    parser.add_argument("--out", required=True, help="JSON output path")
    args = parser.parse_args(argv)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir) or not os.access(out_dir, os.W_OK):
        parser.error(f"--out {args.out!r}: directory {out_dir!r} missing or not writable")
    if args.device.startswith("cuda"):
        import torch

        from hilbert_lab.attention.executors import available_backends

        backends = ([b for b in available_backends(args.device, getattr(torch, args.dtype)) if b != "reference"]
                    if args.backends == "all" else [b for b in args.backends.split(",") if b])
        try:
            sizes = tuple(int(n) for n in args.sizes.split(","))
        except ValueError:
            parser.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
        cases = gpu_cases(backends, args.dtype, sizes)
    else:
        cases = RING_CASES if args.ring else CPU_CASES
    if args.quick:
        cases = cases[:3]
    if args.cases:
        try:
            cases = [cases[int(i)] for i in args.cases.split(",")]
        except (ValueError, IndexError):
            parser.error(f"--cases must be indices below {len(cases)}, got {args.cases!r}")
    start = time.time()

    def write(rows: list[dict]) -> list[dict]:
        measured = [r for r in rows if r["status"] == "ok"]
        within = [r for r in measured
                  if all(abs(r[k] - 1) <= TOLERANCE for k in ("ratio_forward", "ratio_forward_backward"))]
        payload = {"tolerance": TOLERANCE, "device": args.device,
                   "command": strip_paths(" ".join([os.path.basename(sys.argv[0])] + (argv or sys.argv[1:]))),
                   "environment": environment, "within_tolerance": len(within), "measured": len(measured),
                   "cases": len(cases), "rows": rows}
        atomic_write(args.out, json.dumps(payload, indent=1, default=str))
        return within

    environment = collect_environment(args.device)
    rows = run_ring(cases, args.ring, args.timeout) if args.ring else run(cases, args.timeout, on_row=write)
    print_table(rows)
    within = write(rows)
    measured = [r for r in rows if r["status"] == "ok"]
    print(f"{len(within)}/{len(measured)} measured cases within {TOLERANCE:.0%} "
          f"({len(rows) - len(measured)} did not run); {time.time() - start:.0f} s")
    print(f"wrote {args.out}")
    return 0 if len(within) == len(measured) and measured else 1


if __name__ == "__main__":
    sys.exit(main())
