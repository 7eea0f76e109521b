"""The decoding step's kernels (kernels.triton_decode.dilated_decode) alone, per tuning, at one layer shape.

`--layers` caches of one layer each (B 1, `--heads` heads of `--head-dim`, `--context` rows), filled with random
keys and values; one step per layer at positions just below the context (no new key: the cache holds it), all
layers captured in one CUDA graph per tuning and replayed under triton.testing.do_bench (L2 flushed between
replays; the median of three medians). Per tuning: microseconds per layer, the bytes of the key and value rows
the step's branches see (attention.static_cache.keys_seen, exact) over that time, its ratio to the limit (those
bytes over the measured copy bandwidth, bench_decode.hbm_bandwidth), and the largest difference of its outputs
and LSEs from the float64 step (the torch path of static_cache.decode_step) on layer 0. The tunings: the two
defaults ("dot", the tensor-core path, and "reduce") and a grid of keys per iteration, pipeline stages, warps and
keys per program. The JSON is rewritten after each tuning.
GPU, a 1B-class layer (H 16, D 128, LongNet [2K, 8K, 32K, 128K] / [1, 2, 4, 8], 128K context, bf16):
    python benchmarks/bench_decode_kernel.py --out reports/results/decode_static/decode_kernel_h200.json
CPU smoke run under Triton's interpreter (tiny shapes, float16, a few tunings; times are not meaningful):
    TRITON_INTERPRET=1 python benchmarks/bench_decode_kernel.py --quick --out /tmp/decode_kernel.json
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_decode as decode  # noqa: E402
from hilbert_lab.arguments import int_list  # noqa: E402
from hilbert_lab.attention.pattern import DilatedPattern  # noqa: E402
from hilbert_lab.attention.static_cache import decode_step, keys_seen, step_tables  # noqa: E402
from hilbert_lab.bench.timing import graphed  # noqa: E402
from hilbert_lab.kernels import triton_decode  # noqa: E402

GPU = dict(layers=16, heads=16, head_dim=128, context=131072, segment_lengths=[2048, 8192, 32768, 131072],
           dilation_rates=[1, 2, 4, 8], dtype="bf16")
QUICK = dict(layers=2, heads=4, head_dim=32, context=256, segment_lengths=[16, 64, 256], dilation_rates=[1, 2, 4],
             dtype="fp16")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def tunings(quick: bool) -> list[dict]:
    """The defaults (empty: dilated_decode chooses), the other path's default, then the grid."""
    if quick:
        return [{}, {"dot": False}, {"dot": True, "block_keys": 16, "stages": 2, "keys_per_split": 32}]
    grid = [{"dot": True, "block_keys": block, "warps": warps, "stages": stages, "keys_per_split": split}
            for split in (128, 256, 512, 1024) for block, stages in ((32, 2), (32, 3), (64, 2), (64, 3))
            for warps in (4, 8)]
    return [{}, {"dot": False}] + grid + [{"dot": False, "block_keys": 32, "stages": 3}]


def layer_caches(args, device) -> tuple[list, list, list, list]:
    """Per layer: q (1, H, D), keys, values (1, C, H, D) random in args.dtype, position (1,) below the context."""
    dtype = DTYPES[args.dtype]
    generator = torch.Generator(device=device).manual_seed(0)
    shape = (1, args.context, args.heads, args.head_dim)
    keys = [torch.randn(shape, generator=generator, device=device).to(dtype) for _ in range(args.layers)]
    values = [torch.randn(shape, generator=generator, device=device).to(dtype) for _ in range(args.layers)]
    queries = [torch.randn((1, args.heads, args.head_dim), generator=generator, device=device).to(dtype)
               for _ in range(args.layers)]
    positions = [torch.tensor([args.context - 1 - 3 * layer], device=device) for layer in range(args.layers)]
    return queries, keys, values, positions


def largest_error(got: tuple, reference: tuple) -> tuple[float, float]:
    """(max |out - reference|, max |lse - reference| over finite LSEs) of one step."""
    out, lse = got
    ref_out, ref_lse = reference
    finite = torch.isfinite(ref_lse)
    return ((out.double() - ref_out).abs().max().item(), (lse.double() - ref_lse)[finite].abs().max().item())


def replay_ms(steps, device) -> float:
    """Milliseconds of all layers' steps: a CUDA graph's replay under do_bench (median of three medians) on the
    GPU; one eager pass on the CPU."""
    if device.type != "cuda":
        start = time.perf_counter()
        steps()
        return 1e3 * (time.perf_counter() - start)
    import triton.testing

    replay = graphed(steps, device=device)
    replay()
    torch.cuda.synchronize()
    return statistics.median(triton.testing.do_bench(replay, warmup=10, rep=60, return_mode="median")
                             for _ in range(3))


@torch.inference_mode()
def run(args, write) -> dict:
    device = torch.device(args.device)
    report = dict(decode.report_header(args, device), tunings=[])
    report["hbm_bytes_per_s"] = decode.hbm_bandwidth(device) if device.type == "cuda" else None
    pattern = DilatedPattern.create(args.segment_lengths, args.dilation_rates, mode="longnet", causal=True)
    tables = step_tables(pattern, args.heads, args.context, device)
    queries, keys, values, positions = layer_caches(args, device)
    kv_bytes = sum(keys_seen(pattern, args.heads, int(p)) for p in positions) * args.head_dim * 2 * keys[0].element_size()
    report["kv_bytes_per_layer"] = kv_bytes / args.layers
    if report["hbm_bytes_per_s"]:
        report["limit_us_per_layer"] = 1e6 * report["kv_bytes_per_layer"] / report["hbm_bytes_per_s"]
    scale = 1 / math.sqrt(args.head_dim)
    reference = decode_step(pattern, queries[0].double(), keys[0].double(), values[0].double(), positions[0], scale,
                            advance=False, tables=tables)
    for tuning in args.tunings:
        def steps(tuning=tuning):
            return [triton_decode.dilated_decode(q, None, None, k, v, p, *tables, scale, advance=False, **tuning)
                    for q, k, v, p in zip(queries, keys, values, positions)]
        entry = {"tuning": tuning}
        try:
            entry["out_error"], entry["lse_error"] = largest_error(steps()[0], reference)
            entry["us_per_layer"] = 1e3 * replay_ms(steps, device) / args.layers
            entry["TB_per_s"] = report["kv_bytes_per_layer"] / entry["us_per_layer"] / 1e6
            if report.get("limit_us_per_layer"):
                entry["x_limit"] = entry["us_per_layer"] / report["limit_us_per_layer"]
        except Exception as error:  # a tuning the compiler or the device refuses: recorded, the sweep goes on
            entry["error"] = f"{type(error).__name__}: {error}"[:400]
        report["tunings"].append(entry)
        shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in entry.items()}
        print(json.dumps(shown), flush=True)
        write(report)
    return report


def parse_args(argv=None):
    parser = decode.decode_parser(__doc__, "CPU-sized run (tiny shapes, three tunings)")
    decode.add_sized_options(parser, ("layers", "heads", "head_dim", "context"), GPU, QUICK)
    for name in ("segment_lengths", "dilation_rates"):
        parser.add_argument("--" + name.replace("_", "-"), type=int_list(1), default=None,
                            help=f"comma-separated; default {GPU[name]}")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default bf16 (--quick: fp16)")
    args = parser.parse_args(argv)
    decode.fill_sizes(args, GPU, QUICK)
    if min(args.layers, args.heads, args.head_dim) < 1:
        parser.error(f"--layers, --heads and --head-dim must be >= 1, got {args.layers}, {args.heads}, "
                     f"{args.head_dim}")
    if args.context < max(args.segment_lengths) or args.context <= 3 * args.layers:
        parser.error(f"--context must be at least the longest segment ({max(args.segment_lengths)}) and above "
                     f"3 x --layers ({3 * args.layers}), got {args.context}")
    if len(args.segment_lengths) != len(args.dilation_rates):
        parser.error(f"--segment-lengths and --dilation-rates must have the same length, got "
                     f"{args.segment_lengths} and {args.dilation_rates}")
    args.tunings = tunings(args.quick)
    return args


def main(argv=None) -> int:
    status, report = decode.run_to_file("bench_decode_kernel", parse_args(argv), run)
    done = [t for t in (report or {}).get("tunings", []) if "us_per_layer" in t]
    if done:
        best = min(done, key=lambda t: t["us_per_layer"])
        print(f"defaults: {done[0]['us_per_layer']:.2f} us per layer; fastest: {best['tuning']} "
              f"{best['us_per_layer']:.2f} us")
    return status


if __name__ == "__main__":
    sys.exit(main())
