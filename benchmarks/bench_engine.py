"""Benchmark the dilated attention engine per backend against SDPA alone on pre-gathered contiguous blocks.

GPU (the issue's configuration; bf16, B=2, N=32768, H=12, D=64, segments [2048, 4096, 8192],
dilations [1, 2, 4]):
    python benchmarks/bench_engine.py --out results/bench_engine.json
CPU smoke check (small shapes, float32):
    python benchmarks/bench_engine.py --small --out /tmp/bench_engine.json

"baseline" is torch.nn.functional.scaled_dot_product_attention (CUDA: flash kernel preferred, as in
the engine's "sdpa") called on the same blocks the engine
builds, gathered into contiguous (B * segments, heads, L, D) tensors before timing (so it measures
the attention kernels alone, without gather, scatter or merge); fwd+bwd baselines back-propagate a
fixed random upstream gradient through those calls. Times are medians (triton.testing.do_bench on
CUDA when available, else CUDA events / perf_counter) after warm-up, on random inputs. The table
also reports each backend's max |out - out_sdpa| as a cross-check.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hilbert_lab.attention import dilated_attention  # noqa: E402
from hilbert_lab.attention.backends import unavailable_reason  # noqa: E402
from hilbert_lab.attention.engine import _cached_plan  # noqa: E402
from hilbert_lab.attention.pattern import DilatedPattern  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}


def timed_ms(fn, device: torch.device, warmup: int, repeats: int) -> float:
    """Median milliseconds of fn() after `warmup` calls."""
    if device.type == "cuda":
        try:
            from triton.testing import do_bench

            return float(do_bench(fn, warmup=max(warmup, 1) * 5, rep=max(repeats, 1) * 20, return_mode="median"))
        except ImportError:
            pass
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            torch.cuda.synchronize(device)
            samples.append(start.elapsed_time(stop))
        else:
            begin = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(samples)


def baseline_kernel(device: torch.device):
    """SDPA kernel context of the baseline: flash (then cuDNN, efficient) on CUDA, the default on CPU."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION],
                       set_priority=True)


def pregathered_blocks(q, k, v, pattern: DilatedPattern, requires_grad: bool):
    """(q, k, v) contiguous (B * count, h, L, D) per engine block, built before any timing."""
    plan = _cached_plan(pattern, q.shape[1], q.shape[2], None, min(max(pattern.segment_lengths), q.shape[1]))
    blocks = []
    for blk in plan.blocks:
        blocks.append(tuple(blk.read(t).transpose(1, 2).contiguous().detach().requires_grad_(requires_grad)
                            for t in (q, k, v)))
    return blocks


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
        if backend == "baseline":
            blocks = pregathered_blocks(q, k, v, pattern, requires_grad=False)
            sdpa = torch.nn.functional.scaled_dot_product_attention

            def forward():
                with baseline_kernel(device):
                    return [sdpa(bq, bk, bv, is_causal=args.causal) for bq, bk, bv in blocks]

            row["forward_ms"] = timed_ms(forward, device, args.warmup, args.repeats)
            if args.backward:
                grad_blocks = pregathered_blocks(q, k, v, pattern, requires_grad=True)
                grads = [torch.randn_like(b[0]) for b in grad_blocks]

                def forward_backward():
                    with baseline_kernel(device):
                        outs = [sdpa(bq, bk, bv, is_causal=args.causal) for bq, bk, bv in grad_blocks]
                        torch.autograd.backward(outs, grads)

                row["forward_backward_ms"] = timed_ms(forward_backward, device, args.warmup, args.repeats)
            row["blocks"] = len(blocks)
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
            with torch.no_grad():
                out = dilated_attention(q, k, v, **kwargs)
                row["forward_ms"] = timed_ms(lambda: dilated_attention(q, k, v, **kwargs), device, args.warmup,
                                             args.repeats)
            if mode not in reference_out:
                reference_out[mode] = out
            row["max_abs_diff_vs_first_backend"] = (out.float() - reference_out[mode].float()).abs().max().item()
            if args.backward:
                qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))

                def forward_backward():
                    dilated_attention(qg, kg, vg, **kwargs).backward(upstream)

                row["forward_backward_ms"] = timed_ms(forward_backward, device, args.warmup, args.repeats)
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
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "results": rows,
    }


def print_table(report: dict) -> None:
    print(f"device: {report['device']}  torch {report['torch']}  config: {report['config']}")
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
