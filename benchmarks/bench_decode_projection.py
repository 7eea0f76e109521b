"""Decoding steps on each layer's prepared linear layers against the block's own modules.

LongNetLM.generate's GPU path (bench_decode's "longnet_static_graph" method: static caches, the steps of every layer
replayed as one CUDA graph per token) on one model, in one process, the two variants interleaved round by round
(A B, B A, ...): "prepared" runs the caches as `models.generate.new_static_caches` makes them (`projections` set:
models.decoding_layer, the norms folded into the stacked q, k, v and the MLP's first layer, the rotary pairs and
residual adds inside the GEMVs), "modules" the same caches with `projections` None (the block's forward: layer
norms, three projections, rotary and residual adds as ops of their own). Each run fills fresh caches with random
keys and values up to `--context` - steps - 5 and times the steps ending at `--context`; eager steps first, then the
steps through torch.compile (as `LongNetLM.generate(compile_step=True)` runs them). Per run the median gap between
tokens after 4 (bench_decode.Clock: on a GPU CUDA events, the host running ahead; before rev fca577e each token was
waited for), and the tokens themselves (the two variants round differently: the share of equal tokens is
reported). Prints the medians, their ratio and the memory-bandwidth limit of a step (bench_decode.step_bytes over the measured copy bandwidth).
GPU, the 1B-class config (dim 2048, depth 16, 16 heads of 128, vocab 32000, bf16):
    python benchmarks/bench_decode_projection.py --out reports/results/decode_static/decode_1b_projection.json
CPU smoke run (a tiny model, eager steps):
    python benchmarks/bench_decode_projection.py --quick --out /tmp/decode_projection.json
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_decode as decode  # noqa: E402
from hilbert_lab.models.generate import decode_static, greedy_ids, new_static_caches  # noqa: E402

GPU = dict(vocab=32000, dim=2048, depth=16, heads=16, segment_lengths=[2048, 8192, 32768, 131072],
           dilation_rates=[1, 2, 4, 8], steps=24, dtype="bf16", context=131072)
QUICK = dict(vocab=64, dim=64, depth=2, heads=4, segment_lengths=[32, 64], dilation_rates=[1, 2], steps=8,
             dtype="fp32", context=256)


def one_run(model, args, device, prepared: bool, compile_step: bool) -> tuple[float, list[int]]:
    """(median ms per token, the tokens) of one decode on fresh random caches, prepared projections or modules."""
    first = args.context - args.steps - 5
    caches = new_static_caches(model, 1, args.context + 8)
    generator = torch.Generator(device=device).manual_seed(3)
    for cache in caches:
        cache.keys.normal_(generator=generator)
        cache.values.normal_(generator=generator)
        cache.mark_filled([first])
        if not prepared:
            cache.projections = None
    clock = decode.Clock(device)
    tokens = decode_static(model, decode.prompt_of(args, 1, device), caches, args.steps + 5,
                           greedy_ids, device.type == "cuda", on_token=clock, compile_step=compile_step)
    return 1e3 * statistics.median(clock.gaps()), [int(t) for t in torch.cat(tokens).flatten().tolist()]


def summary(runs: list[dict], mode: str) -> dict:
    """Medians of the two variants' runs in `mode`, their ratio (prepared / modules), whether each variant gave the
    same tokens in every round, and the share of positions where the two variants' first runs agree."""
    prepared = [r for r in runs if r["mode"] == mode and r["prepared"]]
    modules = [r for r in runs if r["mode"] == mode and not r["prepared"]]
    if not prepared or not modules:
        return {}
    a, b = prepared[0]["tokens"], modules[0]["tokens"]
    prepared_ms, modules_ms = (statistics.median(r["ms_per_token"] for r in group) for group in (prepared, modules))
    return {"prepared_ms": prepared_ms, "modules_ms": modules_ms, "ratio": prepared_ms / modules_ms,
            "repeatable": all(len({tuple(r["tokens"]) for r in group}) == 1 for group in (prepared, modules)),
            "agreement": sum(x == y for x, y in zip(a, b)) / len(a)}


@torch.inference_mode()
def run(args, write) -> dict:
    device = torch.device(args.device)
    report = dict(decode.report_header(args, device), runs=[])
    report["hbm_bytes_per_s"] = decode.hbm_bandwidth(device) if device.type == "cuda" else None
    model = decode.longnet(args, args.context, device)
    model.generate(decode.prompt_of(args, 64, device), 4)  # warm-up: kernels compiled
    block = model.encoder.blocks[0].attention
    first = args.context - args.steps - 5
    rows = statistics.mean(decode.keys_seen(block.attention.pattern, block.num_heads, p)
                           for p in range(first + 5, args.context))
    report.update(decode.step_bytes(model, rows))
    if report["hbm_bytes_per_s"]:
        report["limit_ms"] = 1e3 * (report["weight_bytes"] + report["kv_bytes"]) / report["hbm_bytes_per_s"]
    modes = [("eager", False, args.rounds)] + ([("compiled", True, args.compiled_rounds)] if args.compiled_rounds
                                              else [])
    start = time.perf_counter()
    for mode, compile_step, rounds in modes:
        for index in range(rounds):
            for prepared in ((True, False) if index % 2 == 0 else (False, True)):
                ms, tokens = one_run(model, args, device, prepared, compile_step)
                report["runs"].append({"mode": mode, "prepared": prepared, "round": index, "ms_per_token": ms,
                                       "tokens": tokens, "seconds": time.perf_counter() - start})
                print(f"{mode:9s} round {index} {'prepared' if prepared else 'modules':8s} {ms:.3f} ms", flush=True)
                write(report)
        report[mode] = summary(report["runs"], mode)
        write(report)
    return report


def parse_args(argv=None):
    parser = decode.decode_parser(__doc__, "CPU-sized run (tiny model, eager steps only)")
    parser.add_argument("--context", type=int, default=None, help="position where the timed steps end "
                        f"(default {GPU['context']}; --quick: {QUICK['context']})")
    parser.add_argument("--rounds", type=int, default=4, help="eager rounds, each one run of both (default 4)")
    parser.add_argument("--compiled-rounds", type=int, default=None,
                        help="compiled rounds (default 3; --quick: 0)")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else GPU).items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if args.compiled_rounds is None:
        args.compiled_rounds = 0 if args.quick else 3
    args.backend = "auto"
    if args.rounds < 1 or args.compiled_rounds < 0:
        parser.error(f"--rounds must be >= 1 and --compiled-rounds >= 0, got {args.rounds} and {args.compiled_rounds}")
    if args.context <= args.steps + 8:
        parser.error(f"--context must exceed {args.steps + 8} (the steps and their warm-up), got {args.context}")
    return args


def main(argv=None) -> int:
    status, report = decode.run_to_file("bench_decode_projection", parse_args(argv), run)
    for mode in ("eager", "compiled"):
        if (report or {}).get(mode):
            s = report[mode]
            print(f"{mode}: prepared {s['prepared_ms']:.3f} ms, modules {s['modules_ms']:.3f} ms, "
                  f"ratio {s['ratio']:.3f}, repeatable: {s['repeatable']}, agreement {s['agreement']:.2f}")
    if (report or {}).get("limit_ms"):
        print(f"bandwidth limit {report['limit_ms']:.3f} ms ({report['hbm_bytes_per_s'] / 1e12:.2f} TB/s)")
    return status


if __name__ == "__main__":
    sys.exit(main())
