"""A decoding step's linear layers alone: the one-row GEMV (kernels.triton_gemv.gemv) per tuning beside cuBLAS
(F.linear), at the weights of one LongNetLM layer and its head.

Per weight (q/k/v stacked, the output projection, the MLP's two, the head), `--layers` copies with random values
and x of one row; per variant, the products over all copies captured in one CUDA graph (the copies exceed the L2
cache, as a step's layers do) and timed as bench_decode_kernel times its steps (replay_ms: do_bench, the median
of three medians): microseconds per product, the weight's bytes over that time, and the largest difference from
the float64 product over the largest value. Variants: "cublas", "default" (gemv's own tuning) and a grid of rows
per program, columns per iteration and warps. The summary gives, per weight, the fastest variant, the default over
it and cuBLAS over the default. The JSON is rewritten after each weight.
GPU, a 1B-class layer (dim 2048, MLP 4 x dim, vocab 32000, bf16):
    python benchmarks/bench_decode_gemv.py --out reports/results/decode_static/gemv_h200.json
CPU smoke run under Triton's interpreter (tiny shapes, float16, a few tunings; times are not meaningful):
    TRITON_INTERPRET=1 python benchmarks/bench_decode_gemv.py --quick --out /tmp/gemv.json
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_decode as decode  # noqa: E402
import bench_decode_kernel as kernel  # noqa: E402
from hilbert_lab.kernels.triton_gemv import gemv  # noqa: E402

GPU = dict(dim=2048, mlp_ratio=4, vocab=32000, layers=16, dtype="bf16")
QUICK = dict(dim=32, mlp_ratio=2, vocab=48, layers=2, dtype="fp16")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def tunings(quick: bool) -> dict[str, dict]:
    """name -> gemv keyword arguments: the default (empty), then the grid (block_n x block_k <= 8192)."""
    if quick:
        grid = [(1, 16, 2), (4, 32, 4)]
    else:
        grid = [(n, k, w) for n in (1, 2, 4, 8, 16) for k in (256, 512, 1024, 2048) for w in (2, 4, 8) if n * k <= 8192]
    return {"default": {}, **{f"t{n}x{k}w{w}": dict(block_n=n, block_k=k, num_warps=w) for n, k, w in grid}}


def weights_of(args) -> dict[str, tuple[int, int, bool]]:
    """name -> (N, K, has bias) of one layer's weights and the head."""
    dim, hidden = args.dim, args.dim * args.mlp_ratio
    return {"qkv": (3 * dim, dim, True), "out": (dim, dim, True), "fc1": (hidden, dim, True),
            "fc2": (dim, hidden, True), "head": (args.vocab, dim, False)}


def measure_weight(args, device, n: int, k: int, has_bias: bool) -> list[dict]:
    """One row per variant: microseconds per product, bytes per second, error against float64."""
    dtype = DTYPES[args.dtype]
    generator = torch.Generator(device=device).manual_seed(n + k)
    weights = [(torch.randn(n, k, generator=generator, device=device) * k ** -0.5).to(dtype)
               for _ in range(args.layers)]
    biases = [torch.randn(n, generator=generator, device=device).to(dtype) if has_bias else None for _ in weights]
    x = torch.randn(1, 1, k, generator=generator, device=device).to(dtype)
    wanted = [x.double() @ w.double().T + (0 if b is None else b.double()) for w, b in zip(weights, biases)]
    variants = {"cublas": lambda w, b: F.linear(x, w, b)}
    variants.update({name: (lambda options: lambda w, b: gemv(x, w, b, **options))(options)
                     for name, options in tunings(args.quick).items()})
    rows = []
    for name, product in variants.items():
        error = max(((product(w, b).double() - want).abs().max() / want.abs().max()).item()
                    for w, b, want in zip(weights, biases, wanted))
        took = 1e-3 * kernel.replay_ms(lambda: [product(w, b) for w, b in zip(weights, biases)], device) / args.layers
        rows.append({"variant": name, "us": 1e6 * took, "bytes_per_s": n * k * x.element_size() / took,
                     "max_error": error})
    return rows


def summary(rows: list[dict]) -> dict:
    """The fastest variant, the default over it and cuBLAS over the default."""
    by_name = {row["variant"]: row["us"] for row in rows}
    fastest = min(rows, key=lambda row: row["us"])
    return {"fastest": fastest["variant"], "fastest_us": fastest["us"],
            "default_over_fastest": by_name["default"] / fastest["us"],
            "cublas_over_default": by_name["cublas"] / by_name["default"]}


def run(args, write) -> dict:
    device = torch.device(args.device)
    report = dict(decode.report_header(args, device), weights={})
    for name, (n, k, has_bias) in weights_of(args).items():
        rows = measure_weight(args, device, n, k, has_bias)
        report["weights"][name] = {"n": n, "k": k, "bias": has_bias, "variants": rows, "summary": summary(rows)}
        write(report)
        shown = report["weights"][name]["summary"]
        print(f"{name:5s} {n:6d} x {k:5d}: fastest {shown['fastest']} {shown['fastest_us']:.2f} us, default "
              f"{shown['default_over_fastest']:.3f}x it, cuBLAS {shown['cublas_over_default']:.3f}x the default",
              flush=True)
    return report


def parse_args(argv=None):
    parser = decode.decode_parser(__doc__, "CPU-sized run under Triton's interpreter (tiny weights, a few tunings)")
    sizes = ("dim", "mlp_ratio", "vocab", "layers")
    decode.add_sized_options(parser, sizes, GPU, QUICK)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default bf16 (--quick: fp16)")
    args = parser.parse_args(argv)
    decode.fill_sizes(args, GPU, QUICK)
    for name in sizes:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv=None) -> int:
    return decode.run_to_file("bench_decode_gemv", parse_args(argv), run)[0]


if __name__ == "__main__":
    raise SystemExit(main())
