"""Benchmark the dilated attention engine per backend against SDPA alone on pre-gathered contiguous blocks.

GPU (the issue's configuration; bf16, B=2, N=32768, H=12, D=64, segments [2048, 4096, 8192],
dilations [1, 2, 4]):
    python benchmarks/bench_engine.py --out results/bench_engine.json
CPU smoke check (small shapes, float32):
    python benchmarks/bench_engine.py --small --out /tmp/bench_engine.json

"baseline" is the kernel floor of hilbert_lab.bench.anchors: one scaled_dot_product_attention call
per block length of the plan the engine runs, on blocks gathered into contiguous tensors before
timing (the attention kernels alone, without gather, scatter or merge), with each SDPA kernel that
runs (CUDA: cudnn and flash; CPU: flash and math) and the fastest kept; fwd+bwd baselines
back-propagate a fixed random upstream gradient through those calls. Times come from
hilbert_lab.bench.timing.time_function: medians (triton.testing.do_bench on CUDA when available,
else CUDA events / perf_counter) after warm-up, on random inputs; "tflops" counts the pattern's
useful work (hilbert_lab.bench.flops). The table also reports each backend's max |out - out of the
first backend| as a cross-check; the JSON carries the environment block (hilbert_lab.bench.env).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hilbert_lab.io import strip_paths  # noqa: E402
from hilbert_lab.attention import DilatedPattern, dilated_attention  # noqa: E402
from hilbert_lab.attention.executors import unavailable_reason  # noqa: E402
from hilbert_lab.bench import anchors  # noqa: E402
from hilbert_lab.bench.env import collect_environment  # noqa: E402
from hilbert_lab.bench.flops import attention_flops  # noqa: E402
from hilbert_lab.bench.timing import time_function  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}


def floor_kernels(device: torch.device) -> list[str]:
    """SDPA kernels the baseline tries (the fastest that runs is kept)."""
    return ["cudnn", "flash"] if device.type == "cuda" else ["flash", "math"]


def baseline_times(q, k, v, pattern: DilatedPattern, args, device: torch.device) -> dict:
    """{"forward": Timing, "forward_backward": Timing, "kernel": ..., "blocks": ...} of the fastest kernel floor."""
    scale = q.shape[-1] ** -0.5
    blocks = anchors.gather_blocks(q, k, v, pattern)
    leaves = [[t.detach().requires_grad_(True) for t in blk] for blk in blocks]
    grads = [torch.randn_like(blk[0]) for blk in blocks]
    best: dict = {"blocks": len(blocks)}
    for kernel in floor_kernels(device):
        def forward(kernel=kernel):
            with torch.no_grad():
                anchors.kernel_floor(blocks, causal=args.causal, scale=scale, kernel=kernel)

        def forward_backward(kernel=kernel):
            outs = anchors.kernel_floor(leaves, causal=args.causal, scale=scale, kernel=kernel)
            torch.autograd.backward(outs, grads)
            for blk in leaves:
                for t in blk:
                    t.grad = None

        try:
            timings = {"forward": time_function(forward, device=device, warmup=args.warmup, repeats=args.repeats)}
            if args.backward:
                timings["forward_backward"] = time_function(forward_backward, device=device, warmup=args.warmup,
                                                            repeats=args.repeats)
        except Exception as error:  # a kernel that does not run this shape / dtype / device is skipped
            best.setdefault("skipped_kernels", {})[kernel] = f"{type(error).__name__}: {str(error)[:200]}"
            continue
        if "forward" not in best or timings["forward"].median < best["forward"].median:
            best.update(timings, kernel=kernel)
    return best


def run(args) -> dict:
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    shape = (args.batch, args.seq_len, args.heads, args.head_dim)
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, generator=gen) for _ in range(3))
    upstream = torch.randn(shape, device=device, dtype=dtype, generator=gen)
    rows = []
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        tqdm = lambda x, **_: x  # noqa: E731
    jobs = [(mode, backend) for mode in args.modes for backend in ["baseline", *args.backends]]
    reference_out = {}
    for mode, backend in tqdm(jobs, desc="bench_engine"):
        pattern = DilatedPattern.create(args.segment_lengths, args.dilation_rates, mode=mode, causal=args.causal)
        row = {"mode": mode, "backend": backend}
        flops = {key: attention_flops(pattern, args.batch, args.seq_len, args.heads, args.head_dim,
                                      backward=key == "forward_backward") for key in ("forward", "forward_backward")}
        if backend == "baseline":
            best = baseline_times(q, k, v, pattern, args, device)
            timings = {key: best.pop(key) for key in ("forward", "forward_backward") if key in best}
            row.update(best)
            record(row, timings, flops)
            rows.append(row)
            continue
        reason = unavailable_reason(backend, device, dtype)
        if reason is not None:
            row["skipped"] = reason
            rows.append(row)
            continue
        kwargs = dict(segment_lengths=args.segment_lengths, dilation_rates=args.dilation_rates, mode=mode,
                      causal=args.causal, backend=backend)
        try:
            timings = {}
            with torch.no_grad():
                out = dilated_attention(q, k, v, **kwargs)
                timings["forward"] = time_function(lambda: dilated_attention(q, k, v, **kwargs), device=device,
                                                   warmup=args.warmup, repeats=args.repeats)
            if mode not in reference_out:
                reference_out[mode] = out
            row["max_abs_diff_vs_first_backend"] = (out.float() - reference_out[mode].float()).abs().max().item()
            if args.backward:
                qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))

                def forward_backward():
                    dilated_attention(qg, kg, vg, **kwargs).backward(upstream)
                    qg.grad = kg.grad = vg.grad = None

                timings["forward_backward"] = time_function(forward_backward, device=device, warmup=args.warmup,
                                                            repeats=args.repeats)
            record(row, timings, flops)
        except Exception as error:  # report and keep going: one failing backend must not hide the others
            row["error"] = f"{type(error).__name__}: {error}"
        rows.append(row)
    for row in rows:
        base = next(r for r in rows if r["mode"] == row["mode"] and r["backend"] == "baseline")
        for key in ("forward_ms", "forward_backward_ms"):
            if key in row and key in base:
                row[key.replace("_ms", "_vs_baseline")] = row[key] / base[key]
    return {
        "config": {k: getattr(args, k) for k in ("batch", "seq_len", "heads", "head_dim", "segment_lengths",
                                                   "dilation_rates", "modes", "backends", "causal", "dtype",
                                                   "warmup", "repeats", "backward")},
        "command": strip_paths(" ".join(sys.argv)),
        "env": collect_environment(str(device)),
        "results": rows,
    }


def record(row: dict, timings: dict, flops: dict) -> None:
    """Median ms, useful TFLOP/s and the full Timing of each timed direction into the row."""
    for key, timing in timings.items():
        row[f"{key}_ms"] = timing.median
        row[f"{key}_tflops"] = flops[key] / (timing.median * 1e-3) / 1e12
        row.setdefault("timings", {})[key] = timing.as_dict()


def print_table(report: dict) -> None:
    env = report["env"]
    print(f"device: {env['device']['name']}  torch {env['packages']['torch']}  config: {report['config']}")
    header = f"{'mode':<12} {'backend':<15} {'fwd ms':>10} {'x base':>8} {'fwd+bwd ms':>11} {'x base':>8}  note"
    print(header)
    print("-" * len(header))
    for r in report["results"]:
        fmt = lambda key, spec: format(r[key], spec) if key in r else "-"  # noqa: E731
        note = r.get("skipped") or r.get("error") or (
            f"max|diff|={r['max_abs_diff_vs_first_backend']:.2e}" if "max_abs_diff_vs_first_backend" in r else "")
        print(f"{r['mode']:<12} {r['backend']:<15} {fmt('forward_ms', '10.3f')} {fmt('forward_vs_baseline', '8.2f')} "
              f"{fmt('forward_backward_ms', '11.3f')} {fmt('forward_backward_vs_baseline', '8.2f')}  {note}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="CPU smoke check: small shapes in float32")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--heads", type=int, default=None)
    parser.add_argument("--head-dim", type=int, default=None)
    parser.add_argument("--segment-lengths", type=int, nargs="+", default=None)
    parser.add_argument("--dilation-rates", type=int, nargs="+", default=None)
    parser.add_argument("--modes", nargs="+", default=["head_groups", "longnet"], choices=["head_groups", "longnet"])
    parser.add_argument("--backends", nargs="+", default=None)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--no-backward", dest="backward", action="store_false", help="time the forward only")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True, help="JSON output path")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.small
    args.device = args.device or ("cuda" if cuda else "cpu")
    small = args.small or args.device == "cpu"
    defaults = dict(dtype="fp32", seq_len=1024, heads=4, head_dim=32, segment_lengths=[128, 256, 512],
                    dilation_rates=[1, 2, 4], backends=["manual", "sdpa", "sdpa_math"]) if small else dict(
        dtype="bf16", seq_len=32768, heads=12, head_dim=64, segment_lengths=[2048, 4096, 8192], dilation_rates=[1, 2, 4],
        backends=["sdpa", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "flex", "triton", "flash", "xformers"])
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if small:
        args.warmup, args.repeats = min(args.warmup, 1), min(args.repeats, 3)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    report = run(args)
    print_table(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
