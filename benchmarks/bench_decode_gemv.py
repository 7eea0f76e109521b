"""A decoding step's linear layers alone: the GEMV (kernels.triton_gemv.gemv) per tuning beside cuBLAS (F.linear),
at the weights of one LongNetLM layer and its head, for one row of x or --rows of them (a batched step).

Per weight (q/k/v stacked, the output projection, the MLP's two, the head), `--layers` copies with random values
and x of one row; per variant, the products over all copies captured in one CUDA graph (the copies exceed the L2
cache, as a step's layers do) and timed as bench_decode_kernel times its steps (replay_ms: do_bench, the median
of three medians): microseconds per product, the weight's bytes over that time, and the largest difference from
the float64 product over the largest value. Variants: "cublas", "default" (gemv's own tuning) and a grid of rows
per program, columns per iteration and warps; where a decoding step gives the weight's GEMV more work
(models.decoding_layer: q/k/v the folded layer norm and the rotary pairs, the MLP's first layer the folded norm and
the GELU, the output projection and the MLP's second layer the residual), "fused" (that work, gemv's own tuning for
it) and the grid with it ("fused_t..."; with the rotation, two rows per program only), against float64
LayerNorm, linear, GELU, rotary and add. The summary gives, per weight, the fastest variant, the default over it,
cuBLAS over the default, and the fastest fused variant and the fused default over the plain default. The JSON is
rewritten after each weight. --weights picks some of the five; --fused-only keeps the fused grid whole and cuts a
fused weight's plain variants to cuBLAS and the default (a shorter run that tunes what a step launches).
With --rows R > 1 the rows' positions are POSITION + 997 i, and the grid adds the tensor-core tunings (block_n 16
and 32: the R rows in one MMA tile) to those that give each row its own programs.
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
from hilbert_lab.kernels.triton_gemv import MAX_ROWS, fold_layer_norm, gemv  # noqa: E402
from hilbert_lab.models.rotary import apply_rotary, inverse_frequencies  # noqa: E402

GPU = dict(dim=2048, mlp_ratio=4, vocab=32000, layers=16, heads=16, dtype="bf16")
QUICK = dict(dim=32, mlp_ratio=2, vocab=48, layers=2, heads=4, dtype="fp16")
STEP_PARTS = {"qkv": ("normalize", "rotation"), "out": ("residual",), "fc1": ("normalize", "gelu"),
              "fc2": ("residual",), "head": ()}  # what a decoding step's GEMV of each weight also does
EPS, POSITION = 1e-5, 1234
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def tunings(quick: bool, rows: int = 1) -> dict[str, dict]:
    """name -> gemv keyword arguments: the default (empty), then the grid (block_n x block_k <= 8192); with several
    rows, block_n 16 and 32 put them in one tensor-core tile."""
    if quick:
        grid = [(1, 16, 2), (4, 32, 4)] + ([(16, 16, 4)] if rows > 1 else [])
    else:
        grid = [(n, k, w) for n in (1, 2, 4, 8, 16) for k in (256, 512, 1024, 2048) for w in (2, 4, 8) if n * k <= 8192]
        if rows > 1:
            grid = [(n, k, w) for n, k, w in grid if n <= 2] + \
                [(n, k, w) for n in (16, 32) for k in (64, 128, 256, 512) for w in (4, 8) if n * k <= 8192]
    return {"default": {}, **{f"t{n}x{k}w{w}": dict(block_n=n, block_k=k, num_warps=w) for n, k, w in grid}}


def weights_of(args) -> dict[str, tuple[int, int, bool]]:
    """name -> (N, K, has bias) of one layer's weights and the head."""
    dim, hidden = args.dim, args.dim * args.mlp_ratio
    return {"qkv": (3 * dim, dim, True), "out": (dim, dim, True), "fc1": (hidden, dim, True),
            "fc2": (dim, hidden, True), "head": (args.vocab, dim, False)}


def _fused_parts(args, device, parts: tuple, weights: list, biases: list, x: torch.Tensor, generator) -> tuple:
    """(gemv keyword arguments per copy, the float64 references): the folded norm's weights (random affine), the
    rotary pairs of q and k at POSITION, a random residual, as models.decoding_layer gives them."""
    n, k = weights[0].shape
    dtype = weights[0].dtype
    rows = x.shape[0]
    residual = torch.randn(rows, 1, n, generator=generator, device=device).to(dtype) if "residual" in parts else None
    head_dim = args.dim // args.heads
    position = POSITION + 997 * torch.arange(rows, device=device)[:, None]  # (R, 1)
    frequencies = inverse_frequencies(head_dim, 10000.0, device)  # float64, as a step's
    calls, wanted = [], []
    for w, b in zip(weights, biases):
        want = x.double()
        options = {"activation": "gelu" if "gelu" in parts else None, "residual": residual}
        if "normalize" in parts:
            gamma = torch.rand(k, generator=generator, device=device) + 0.5
            beta = torch.randn(k, generator=generator, device=device) * 0.1
            want = F.layer_norm(want, (k,), gamma.double(), beta.double(), EPS)
            folded, folded_bias, row_sums = fold_layer_norm(w, b, gamma, beta, dtype)
            options.update(weight=folded, bias=folded_bias, normalize=(row_sums, EPS))
        else:
            options.update(weight=w, bias=b)
        want = want @ w.double().T + (0 if b is None else b.double())
        want = F.gelu(want) if "gelu" in parts else want
        if "rotation" in parts:
            rotated = 2 * args.dim  # q and k
            options["rotation"] = (position, frequencies, rotated)
            pairs = apply_rotary(want[..., :rotated].unflatten(-1, (-1, head_dim)), position)
            want = torch.cat((pairs.flatten(-2), want[..., rotated:]), -1)
        wanted.append(want if residual is None else want + residual.double())
        calls.append(options)
    return calls, wanted


def measure_weight(args, device, n: int, k: int, has_bias: bool, parts: tuple = ()) -> list[dict]:
    """One row per variant: microseconds per product, bytes per second, error against float64, fused or not."""
    dtype = DTYPES[args.dtype]
    generator = torch.Generator(device=device).manual_seed(n + k)
    weights = [(torch.randn(n, k, generator=generator, device=device) * k ** -0.5).to(dtype)
               for _ in range(args.layers)]
    biases = [torch.randn(n, generator=generator, device=device).to(dtype) if has_bias else None for _ in weights]
    x = torch.randn(args.rows, 1, k, generator=generator, device=device).to(dtype)
    wanted = [x.double() @ w.double().T + (0 if b is None else b.double()) for w, b in zip(weights, biases)]
    plain = [{"weight": w, "bias": b} for w, b in zip(weights, biases)]
    variants = {"cublas": (False, lambda call: F.linear(x, call["weight"], call["bias"]))}
    variants.update({name: (False, (lambda options: lambda call: gemv(x, **call, **options))(options))
                     for name, options in tunings(args.quick, args.rows).items()
                     if not (args.fused_only and parts and name != "default")})
    if parts:
        fused_calls, fused_wanted = _fused_parts(args, device, parts, weights, biases, x, generator)
        for name, options in tunings(args.quick, args.rows).items():
            if "rotation" in parts and options.get("block_n", 2) != 2 and options["block_n"] < 16:
                continue  # a rotary pair per program, or (several rows) pairs in a tensor-core tile
            variants["fused" if name == "default" else f"fused_{name}"] = (
                True, (lambda options: lambda call: gemv(x, **call, **options))(options))
    rows = []
    for name, (fused, product) in variants.items():
        calls, references = (fused_calls, fused_wanted) if fused else (plain, wanted)
        error = max(((product(call).double() - want).abs().max() / want.abs().max()).item()
                    for call, want in zip(calls, references))
        took = 1e-3 * kernel.replay_ms(lambda: [product(call) for call in calls], device) / args.layers
        rows.append({"variant": name, "fused": fused, "us": 1e6 * took,
                     "bytes_per_s": n * k * x.element_size() / took, "max_error": error})
    return rows


def summary(rows: list[dict]) -> dict:
    """The fastest plain variant, the default over it and cuBLAS over the default; with fused variants, the
    fastest of them and the fused default over the plain default."""
    by_name = {row["variant"]: row["us"] for row in rows}
    fastest = min((row for row in rows if not row["fused"]), key=lambda row: row["us"])
    result = {"fastest": fastest["variant"], "fastest_us": fastest["us"],
              "default_over_fastest": by_name["default"] / fastest["us"],
              "cublas_over_default": by_name["cublas"] / by_name["default"]}
    fused = [row for row in rows if row["fused"]]
    if fused:
        best = min(fused, key=lambda row: row["us"])
        result.update(fused_fastest=best["variant"], fused_fastest_us=best["us"],
                      fused_over_default=by_name["fused"] / by_name["default"])
    return result


def run(args, write) -> dict:
    device = torch.device(args.device)
    report = dict(decode.report_header(args, device), weights={})
    for name, (n, k, has_bias) in weights_of(args).items():
        if name not in args.weights:
            continue
        rows = measure_weight(args, device, n, k, has_bias, STEP_PARTS[name])
        report["weights"][name] = {"n": n, "k": k, "bias": has_bias, "variants": rows, "summary": summary(rows)}
        write(report)
        shown = report["weights"][name]["summary"]
        fused = (f"; fused {shown['fused_over_default']:.3f}x the default, its fastest {shown['fused_fastest']} "
                 f"{shown['fused_fastest_us']:.2f} us") if "fused_fastest" in shown else ""
        print(f"{name:5s} {n:6d} x {k:5d}: fastest {shown['fastest']} {shown['fastest_us']:.2f} us, default "
              f"{shown['default_over_fastest']:.3f}x it, cuBLAS {shown['cublas_over_default']:.3f}x the default"
              f"{fused}", flush=True)
    return report


def parse_args(argv=None):
    parser = decode.decode_parser(__doc__, "CPU-sized run under Triton's interpreter (tiny weights, a few tunings)")
    sizes = ("dim", "mlp_ratio", "vocab", "layers", "heads")
    decode.add_sized_options(parser, sizes, GPU, QUICK)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default bf16 (--quick: fp16)")
    parser.add_argument("--rows", type=int, default=1, help=f"rows of x (1 to {MAX_ROWS}: a batched step's tokens; "
                        "default 1)")
    parser.add_argument("--weights", default=",".join(STEP_PARTS),
                        help=f"which weights, comma-separated (default all: {','.join(STEP_PARTS)})")
    parser.add_argument("--fused-only", action="store_true",
                        help="where a step fuses more into the weight's GEMV, its plain variants cut to cuBLAS and the "
                             "default (the fused grid whole)")
    args = parser.parse_args(argv)
    names = [name for name in args.weights.split(",") if name]
    unknown = sorted(set(names) - set(STEP_PARTS))
    if unknown or not names:
        parser.error(f"--weights must name some of {', '.join(STEP_PARTS)}, got {args.weights!r}")
    args.weights = names
    decode.fill_sizes(args, GPU, QUICK)
    if not 1 <= args.rows <= MAX_ROWS:
        parser.error(f"--rows must be 1 to {MAX_ROWS}, got {args.rows}")
    for name in sizes:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.dim % args.heads or (args.dim // args.heads) % 2:
        parser.error(f"--dim must be --heads times an even head dim, got {args.dim} and {args.heads}")
    return args


def main(argv=None) -> int:
    return decode.run_to_file("bench_decode_gemv", parse_args(argv), run)[0]


if __name__ == "__main__":
    raise SystemExit(main())
