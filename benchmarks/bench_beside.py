"""What running the zero fills beside the attention calls gives, on one GPU, in one run.

For the head_groups headline (bf16, B=2, N=32768, H=12, D=64, w [2048, 4096, 8192], r [1, 2, 4]), causal or
not, forward or forward+backward, it times `auto` with the fills of the entries no block writes run beside the
calls (`kernels.beside.enabled`, the default) and in line, and FlashAttention-4 in place on the same blocks
(`bench.anchors.fa4_floor`, replayed from a CUDA graph: its kernels alone), all three round by round together
(`bench.timing.time_interleaved`, bursts as do_bench). Each variant has its own inputs, so each keeps its own
captured regions. It first checks that the two runs of ours give the same output and gradients (the forward
bitwise; FlashAttention-4's backward adds dQ atomically). Writes JSON with the medians and each ratio with its
95% interval.

Usage: python benchmarks/bench_beside.py [--out PATH] [--rounds 12]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hilbert_lab.attention import DilatedPattern, dilated_attention, unavailable_reason  # noqa: E402
from hilbert_lab.bench import anchors  # noqa: E402
from hilbert_lab.bench.env import save_run  # noqa: E402
from hilbert_lab.bench.stats import ratio_ci  # noqa: E402
from hilbert_lab.bench.timing import PAIR_BURST_MS, graphed, time_interleaved  # noqa: E402
from hilbert_lab.kernels import beside  # noqa: E402

HEADLINE = dict(segment_lengths=[2048, 4096, 8192], dilation_rates=[1, 2, 4])
SHAPE = (2, 32768, 12, 64)
DEV = torch.device("cuda")


def _ours(inputs: list[torch.Tensor], causal: bool, train: bool, fills_beside: bool):
    """One call of ours on its own copies of the inputs: -> (step returning (out, *grads), its results)."""
    leaves = [t.clone().requires_grad_(train) for t in inputs[:3]]
    upstream = inputs[3].clone()

    def step():
        beside.enabled = fills_beside
        try:
            out = dilated_attention(*leaves, mode="head_groups", causal=causal, backend="auto", **HEADLINE)
            return (out, *torch.autograd.grad(out, leaves, upstream)) if train else (out,)
        finally:
            beside.enabled = True

    for _ in range(4):  # twice eagerly, a capture, a replay (executors.kernel.GRAPH_REGIONS)
        results = [t.clone() for t in step()]
    return step, results


def cell(causal: bool, direction: str, rounds: int) -> dict:
    train = direction == "fwd+bwd"
    gen = torch.Generator(device=DEV).manual_seed(0)
    inputs = [torch.randn(SHAPE, device=DEV, dtype=torch.bfloat16, generator=gen) for _ in range(4)]
    steps, results = {}, {}
    for name, fills_beside in (("beside", True), ("in line", False)):
        steps[name], results[name] = _ours(inputs, causal, train, fills_beside)
    pattern = DilatedPattern.create(HEADLINE["segment_lengths"], HEADLINE["dilation_rates"], mode="head_groups",
                                    causal=causal)
    q, k, v, upstream = (t.clone() for t in inputs)
    steps["floor[fa4]"] = graphed(lambda: anchors.fa4_floor(q, k, v, pattern, scale=SHAPE[3] ** -0.5,
                                                            grad_out=upstream if train else None), device=DEV)
    equal = [bool(torch.equal(a, b)) for a, b in zip(results["beside"], results["in line"])]
    max_diff = [float((a.float() - b.float()).abs().max()) for a, b in zip(results["beside"], results["in line"])]
    timings = time_interleaved(steps, device=DEV, warmup=2, rounds=rounds, max_seconds=float("inf"),
                               burst_ms=PAIR_BURST_MS)
    row = dict(causal=causal, direction=direction, shape=list(SHAPE), equal=equal, max_abs_diff=max_diff,
               median_ms={name: timing.median for name, timing in timings.items()}, ratios={})
    for first, second in (("beside", "in line"), ("beside", "floor[fa4]"), ("in line", "floor[fa4]")):
        ratio, low, high = ratio_ci(timings[first].samples, timings[second].samples)
        row["ratios"][f"{first} / {second}"] = [ratio, low, high]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="reports/results/beside_gpu.json", help="JSON output path")
    parser.add_argument("--rounds", type=int, default=12, help="interleaved rounds per cell (default: 12)")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error(f"--rounds must be at least 3 (an interval needs them), got {args.rounds}")
    reason = unavailable_reason("fa4", DEV, torch.bfloat16, SHAPE[3]) if torch.cuda.is_available() else "no GPU"
    if reason is not None:
        parser.error(f"needs a GPU with FlashAttention-4 (the floor): {reason}")
    rows = []
    print(f"{'causal':6s} {'direction':9s} {'beside':>8s} {'in line':>8s} {'floor':>8s}  beside/in line [95%]")
    for causal in (False, True):
        for direction in ("fwd", "fwd+bwd"):
            row = cell(causal, direction, args.rounds)
            rows.append(row)
            m, (ratio, low, high) = row["median_ms"], row["ratios"]["beside / in line"]
            print(f"{int(causal):6d} {direction:9s} {m['beside']:8.3f} {m['in line']:8.3f} {m['floor[fa4]']:8.3f}  "
                  f"{ratio:.4f} [{low:.4f}, {high:.4f}]  equal {row['equal']}")
    print("wrote", save_run(args.out, str(DEV), rows=rows))


if __name__ == "__main__":
    main()
