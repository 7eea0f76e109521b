"""What the custom op costs and what CUDA graphs give back, on one GPU, in one run.

For the headline shape (bf16, B=2, N=32768, H=12, D=64, w [2048, 4096, 8192], r [1, 2, 4]), both modes, not
causal, forward+backward, and each executor (`auto`, sdpa, fa4 where installed) it times, interleaved over
rounds:
- "op": the call by backend name, through the custom op (its backward rebuilds every per-call state);
- "eager": the same executor given as an Executor object (the eager function that keeps its forward's states);
- "graph": the op's forward+backward captured once in a CUDA graph and replayed (no host time per block);
- "floor[fa4]": FlashAttention-4 on every block in place, no merge (bench.anchors.fa4_floor), where installed,
  replayed from a CUDA graph (bench.timing.graphed): its kernels alone, a floor with no host time.
It first checks that op, eager and graph give the same output and gradients. Writes JSON with medians and
the per-round values.

Usage: python benchmarks/bench_compile.py [--out PATH] [--rounds 3] [--modes longnet,head_groups]
                                         [--backends auto,sdpa,fa4]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hilbert_lab.attention import DilatedPattern, dilated_attention, unavailable_reason  # noqa: E402
from hilbert_lab.attention.executors import get_executor  # noqa: E402
from hilbert_lab.attention.selection import resolve_executor  # noqa: E402
from hilbert_lab.bench import anchors  # noqa: E402
from hilbert_lab.bench.env import save_run  # noqa: E402
from hilbert_lab.bench.timing import graphed, time_function  # noqa: E402

HEADLINE = dict(segment_lengths=[2048, 4096, 8192], dilation_rates=[1, 2, 4])
DEV = torch.device("cuda")


def _step(fn, leaves, grad):
    def step():
        out = fn(*leaves)
        torch.autograd.backward(out, grad)
        return out

    return step


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def cell(mode: str, backend: str, rounds: int) -> dict:
    pattern = DilatedPattern.create(HEADLINE["segment_lengths"], HEADLINE["dilation_rates"], mode=mode)
    gen = torch.Generator(device=DEV).manual_seed(0)
    q, k, v = (torch.randn(2, 32768, 12, 64, device=DEV, dtype=torch.bfloat16, generator=gen) for _ in range(3))
    grad = torch.randn(q.shape, device=DEV, dtype=q.dtype, generator=gen)
    arguments = dict(mode=mode, **HEADLINE)
    variants, checks = {}, {}
    by_name = lambda *t: dilated_attention(*t, backend=backend, **arguments)  # noqa: E731
    results = {}
    for name, fn in (("op", by_name), ("eager", None)):
        if name == "eager":
            chosen = get_executor(backend) if backend != "auto" else get_executor(_resolved(q, pattern))
            fn = lambda *t, chosen=chosen: dilated_attention(*t, backend=chosen, **arguments)  # noqa: E731
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        step = _step(fn, leaves, grad)
        out = step()
        results[name] = [out.detach().clone()] + [t.grad.clone() for t in leaves]
        variants[name] = (step, leaves)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    step, held = _step(by_name, leaves, grad), {}

    def captured():  # gradients set to None first: the captured backward allocates them in the graph's pool
        for t in leaves:
            t.grad = None
        held["out"] = step()

    replay = graphed(captured, device=DEV)
    replay()
    torch.cuda.synchronize()
    results["graph"] = [held["out"].detach().clone()] + [t.grad.clone() for t in leaves]
    variants["graph"] = (replay, [])
    for name in ("eager", "graph"):
        checks[name] = max(_rel(a, b) for a, b in zip(results[name], results["op"]))
    if unavailable_reason("fa4", DEV, torch.bfloat16, 64) is None:  # replayed from a graph: the kernels alone
        floor = graphed(lambda: anchors.fa4_floor(q, k, v, pattern, scale=64 ** -0.5, grad_out=grad), device=DEV)
        variants["floor[fa4]"] = (floor, [])
    timings = {name: [] for name in variants}
    for _ in range(rounds):  # interleaved: every variant once per round
        for name, (fn, leaves) in variants.items():
            def call(fn=fn, leaves=leaves):
                for t in leaves:
                    t.grad = None
                fn()
            timings[name].append(time_function(call, device=DEV, warmup=3, repeats=20).median)
    medians = {name: sorted(values)[len(values) // 2] for name, values in timings.items()}
    return {"mode": mode, "backend": backend, "resolved": _resolved(q, pattern) if backend == "auto" else backend,
            "rel_error_vs_op": checks, "ms_per_round": timings, "median_ms": medians,
            "op_over_eager": medians["op"] / medians["eager"], "op_over_graph": medians["op"] / medians["graph"]}


def _resolved(q, pattern) -> str:
    return resolve_executor("auto", q, pattern, training=True).name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="reports/results/compile_op_gpu.json", help="JSON output path")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per cell (default: 3)")
    parser.add_argument("--modes", default="longnet,head_groups", help="comma-separated modes (default: both)")
    parser.add_argument("--backends", default="auto,sdpa,fa4",
                        help="comma-separated backends; fa4 is left out where not installed (default: auto,sdpa,fa4)")
    args = parser.parse_args()
    fa4 = unavailable_reason("fa4", DEV, torch.bfloat16, 64) is None
    backends = [b for b in args.backends.split(",") if b != "fa4" or fa4]
    rows = []
    print(f"{'mode':12s} {'backend':8s} {'op':>8s} {'eager':>8s} {'graph':>8s} {'floor':>8s}  op/eager  graph/floor")
    for mode in args.modes.split(","):
        for backend in backends:
            row = cell(mode, backend, args.rounds)
            rows.append(row)
            m = row["median_ms"]
            floor = m.get("floor[fa4]", float("nan"))
            print(f"{mode:12s} {backend:8s} {m['op']:8.3f} {m['eager']:8.3f} {m['graph']:8.3f} {floor:8.3f}  "
                  f"{row['op_over_eager']:8.3f}  {m['graph'] / floor:8.3f}   errors {row['rel_error_vs_op']}")
    print("wrote", save_run(args.out, str(DEV), rows=rows))


if __name__ == "__main__":
    main()
