"""Packed documents and grouped-query heads on one GPU: ours on a packed row against a loop over its
documents and the FlashAttention-4 varlen floor of the same kernel calls, all in one run.

The row: --tokens T (default 131072) tokens cut into --documents (default 64) documents of random
lengths (mean T / documents; cut points uniform, so lengths are roughly exponential, some tiny), bf16,
--heads H (16), --head-dim 64, the pattern --segment-lengths 1024,2048,4096 --dilation-rates 1,2,4,
causal unless --not-causal, longnet mode. For "fwd" (no_grad) and "fwd+bwd" (a fixed random upstream
gradient) it times, in the same process:
- ours[auto|sdpa|fa4]: dilated_attention(q, k, v, cu_seqlens=[0, n1, ...]) on the packed row, the boundaries
  given as host integers (a device tensor would be read back on every call; auto takes the
  executor declaring varlen where one runs: fa4's packs, a few FlashAttention-4 varlen calls);
- ours[auto,no-graphs] (GPU): the same with kernel.GRAPH_REGIONS off, every call's Python on the host (by
  default a row's calls on FlashAttention-4 are captured once and replayed as one CUDA graph per direction);
- loop[auto|fa4]: a Python loop calling dilated_attention on each document (the caller's fallback);
- floor[fa4-varlen]: FlashAttention-4's varlen kernels on the same packs (the calls fa4 makes), each
  pack's runs pre-gathered contiguous: no strided views, no rows between runs, no LSE copies, no merge;
  replayed from a CUDA graph (bench.timing.graphed): its kernels with no host time;
and prints loop/ours (target >= 6x) and ours/floor (target <= 1.25x), with each of ours' relative
error against the loop; ours[auto] and the floor are also timed together round by round (`interleaved`,
bench.timing.time_pair: bursts of about 25 ms timed as do_bench, the ratio with its 95% interval over the paired
rounds), as are GQA and MHA below; on a GPU also the profiler's kernel time of ours[auto] and of the floor
(bench.kernel_profile: the floor is at the kernel when its wall time is within a few % of it). GQA:
ours[auto] with H_kv = H / 4 against H_kv = H on the same row, fwd+bwd time and peak CUDA memory above the
inputs (eager: the temporaries a graph region's pool keeps), and the K/V bytes (target: time <= 0.9x MHA's,
K/V memory H_kv/H); with FlashAttention-4, the varlen floor's fwd+bwd at both H_kv too (the kernels' own ratio).
Each cell records how the graph regions ran while each variant was timed (`graph_regions`: replayed, or eager
outside them), and each interleaved pair while it ran (`interleaved.graph_regions`). Writes JSON with the
environment (--out). `--device cpu` runs the same on the CPU in float32 (a smoke test of this script: no
FlashAttention-4, no floor; small --tokens).

Usage: python benchmarks/bench_packed.py [--out PATH] [--tokens 131072] [--documents 64] [--repeats 10]
       [--backends auto,sdpa,fa4] (auto,fa4: the same targets without the slow sdpa anchor)
       python benchmarks/bench_packed.py --verdict RUN.json [RUN.json ...]  (no GPU: the targets over runs)
"""
from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hilbert_lab.attention import DilatedPattern, dilated_attention, unavailable_reason  # noqa: E402
from hilbert_lab.attention.executors.kernel import GRAPH_REGIONS  # noqa: E402
from hilbert_lab.attention.executors.varlen import packs_for, plan_packs  # noqa: E402
from hilbert_lab.attention.plan import cached_plan  # noqa: E402
from hilbert_lab.attention.views import KEY, QUERY  # noqa: E402
from hilbert_lab.bench.env import collect_environment  # noqa: E402
from hilbert_lab.bench.kernel_profile import kernel_profile  # noqa: E402
from hilbert_lab.bench.targets import (  # noqa: E402
    PACKED_LIMITS, format_verdicts, packed_verdicts, read_runs, runs_line,
)
from hilbert_lab.bench.timing import graphed, time_function, time_pair  # noqa: E402
from hilbert_lab.io import strip_paths  # noqa: E402


NO_GRAPHS = "ours[auto,no-graphs]"
FLOOR = "floor[fa4-varlen]"


def document_bounds(tokens: int, documents: int, seed: int = 0) -> list[int]:
    """[0, n1, n1 + n2, ..., tokens]: documents - 1 distinct cut points drawn uniformly."""
    gen = torch.Generator().manual_seed(seed)
    cuts = torch.randperm(tokens - 1, generator=gen)[:documents - 1] + 1
    return [0, *sorted(int(c) for c in cuts), tokens]


def make_inputs(args, kv_heads: int, device, dtype, requires_grad: bool):
    gen = torch.Generator(device=device).manual_seed(0)
    shape = lambda h: (1, args.tokens, h, args.head_dim)  # noqa: E731
    q = torch.randn(shape(args.heads), device=device, dtype=dtype, generator=gen)
    k, v = (torch.randn(shape(kv_heads), device=device, dtype=dtype, generator=gen) for _ in range(2))
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def ours(pattern, backend, cu):
    def run(q, k, v):
        return dilated_attention(q, k, v, segment_lengths=pattern.segment_lengths,
                                 dilation_rates=pattern.dilation_rates,
                                 mode=pattern.mode, causal=pattern.causal, backend=backend, cu_seqlens=cu)
    return run


@contextmanager
def graph_regions(enabled: bool):
    """kernel.GRAPH_REGIONS on or off (off: every pack call's Python on the host, forward and backward)."""
    GRAPH_REGIONS.enabled = enabled
    try:
        yield
    finally:
        GRAPH_REGIONS.enabled = True


def loop(pattern, backend, bounds):
    def run(q, k, v):
        return torch.cat([dilated_attention(q[:, a:b], k[:, a:b], v[:, a:b], segment_lengths=pattern.segment_lengths,
                                            dilation_rates=pattern.dilation_rates, mode=pattern.mode,
                                            causal=pattern.causal, backend=backend)
                          for a, b in zip(bounds, bounds[1:])], 1)
    return run


def varlen_floor(pattern, q, k, v, bounds, scale):
    """A step running FlashAttention-4's varlen forward (and with grad_out its backward) on every pack of
    the plan, each pack's runs gathered contiguous once beforehand (the time of the kernels alone)."""
    from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd

    documents = tuple((a, b - a) for a, b in zip(bounds, bounds[1:]) if b > a)
    plan = cached_plan(pattern, q.shape[1], q.shape[2], num_kv_heads=None if k.shape[2] == q.shape[2] else k.shape[2],
                       documents=documents)
    calls = []
    for pack in plan_packs(plan):
        rows = torch.cat([torch.arange(s, s + n) for s, n in zip(pack.starts, pack.lengths)]).to(q.device)
        gathered = [pack.view(t, role).index_select(0, rows).contiguous()
                    for t, role in ((q, QUERY), (k, KEY), (v, KEY))]
        cu = torch.tensor([0, *pack.lengths], dtype=torch.int32).cumsum(0).to(torch.int32).to(q.device)
        calls.append((gathered, cu, pack.max_length, torch.randn_like(gathered[0])))

    def step(backward: bool):
        for (qg, kg, vg), cu, longest, grad in calls:
            varlen = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest,
                          softmax_scale=scale, causal=pattern.causal)
            out, lse = _flash_attn_fwd(qg, kg, vg, return_lse=True, **varlen)[:2]
            if backward:
                _flash_attn_bwd(qg, kg, vg, out, grad, lse, **varlen)
    return step, len(calls)


def step_of(fn, q, k, v, grad, direction):
    """One call of fn on (q, k, v): no_grad for "fwd", with the backward of `grad` for "fwd+bwd"."""
    if direction == "fwd+bwd":
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]

        def step():
            torch.autograd.backward(fn(*leaves), grad)
            for t in leaves:
                t.grad = None
    else:
        def step():
            with torch.no_grad():
                fn(q, k, v)
    return step


def timed(fn, q, k, v, grad, direction, device, repeats):
    return time_function(step_of(fn, q, k, v, grad, direction), device=device, warmup=2, repeats=repeats).as_dict()


def counted_pair(fns: dict, device, rounds: int) -> dict:
    """time_pair's entry for the two steps, with how ours' graph regions ran while it timed (`graph_regions`)."""
    with GRAPH_REGIONS.counting() as regions:
        pair = time_pair(fns, device=device, rounds=rounds)
    return {**pair, "graph_regions": regions}


def failed(error: Exception) -> dict:
    """The JSON entry of a variant that could not run here, with why."""
    return {"error": f"{type(error).__name__}: {str(error)[:300]}"}


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def peak_bytes(fn, q, k, v, grad, device) -> int:
    """Peak CUDA memory above what is allocated before one fwd+bwd (inputs and their gradients' home)."""
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    torch.autograd.backward(fn(*leaves), grad)
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def run(args) -> dict:
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    pattern = DilatedPattern.create([int(w) for w in args.segment_lengths.split(",")],
                                    [int(r) for r in args.dilation_rates.split(",")], causal=not args.not_causal)
    bounds = document_bounds(args.tokens, args.documents)
    cu = bounds  # host boundaries, as the caller of a packed row holds them: no device-to-host read per call
    scale = args.head_dim ** -0.5
    backends = [b for b in args.backends.split(",") if b == "auto" or unavailable_reason(b, device, dtype) is None]
    has_fa4 = unavailable_reason("fa4", device, dtype) is None
    q, k, v = make_inputs(args, args.heads, device, dtype, False)
    grad = torch.randn_like(q)
    documents = tuple((a, b - a) for a, b in zip(bounds, bounds[1:]))
    plan = cached_plan(pattern, args.tokens, args.heads, documents=documents)
    packs = packs_for(plan, q)
    result = {"shape": [1, args.tokens, args.heads, args.head_dim], "dtype": str(dtype), "documents": args.documents,
              "lengths": {"min": min(n for _, n in documents), "max": max(n for _, n in documents),
                          "mean": args.tokens / args.documents},
              "segment_lengths": list(pattern.segment_lengths), "dilation_rates": list(pattern.dilation_rates),
              "causal": pattern.causal, "blocks": len(plan.blocks), "packs": None if packs is None else len(packs),
              "cells": {}}
    with torch.no_grad():
        expected = loop(pattern, "auto", bounds)(q, k, v)
    for direction in ("fwd", "fwd+bwd"):
        cell: dict = {"times_ms": {}, "errors": {}, "errors_after_timing": {}, "graph_regions": {}}
        variants = {f"ours[{b}]": ours(pattern, b, cu) for b in backends}
        if cuda:
            variants[NO_GRAPHS] = ours(pattern, "auto", cu)
        variants.update({f"loop[{b}]": loop(pattern, b, bounds) for b in backends if b != "sdpa"})
        for name, fn in variants.items():
            try:
                with graph_regions(name != NO_GRAPHS):
                    if name.startswith("ours"):
                        with torch.no_grad():
                            cell["errors"][name] = rel(fn(q, k, v), expected)
                    # how its regions ran while it was timed: replayed, or eager (outside or refused)
                    with GRAPH_REGIONS.counting() as cell["graph_regions"][name]:
                        cell["times_ms"][name] = timed(fn, q, k, v, grad, direction, device, args.repeats)
                    if name.startswith("ours"):  # again after the timing: the path a steady loop runs (replays)
                        with torch.no_grad():
                            cell["errors_after_timing"][name] = rel(fn(q, k, v), expected)
            except Exception as error:  # a backend that cannot run this shape is reported with why
                cell["times_ms"][name] = failed(error)
        steps = {"ours[auto]": step_of(variants["ours[auto]"], q, k, v, grad, direction)}
        if has_fa4:
            try:
                floor_step, calls = varlen_floor(pattern, q, k, v, bounds, scale)
                steps[FLOOR] = lambda: floor_step(direction == "fwd+bwd")
                cell["floor_calls"] = calls
                floor_graph = graphed(steps[FLOOR], device=device)
                cell["times_ms"][FLOOR] = time_function(floor_graph, device=device, warmup=2,
                                                        repeats=args.repeats).as_dict()
            except Exception as error:
                cell["times_ms"][FLOOR] = failed(error)
            else:  # the target's ratio from both timed together, round by round (drift hits both alike)
                try:
                    cell["interleaved"] = counted_pair({"ours[auto]": steps["ours[auto]"], FLOOR: floor_graph},
                                                       device, max(6, args.repeats))
                except Exception as error:
                    cell["interleaved"] = failed(error)
        if cuda:  # the kernels' own time: a floor is at the kernel when its wall time is within a few % of it
            cell["kernels"] = {}
            for name, step in steps.items():
                try:
                    cell["kernels"][name] = kernel_profile(step)
                except Exception as error:
                    cell["kernels"][name] = failed(error)
        result["cells"][direction] = cell
    gqa: dict = {}
    gqa_steps = {}
    for label, kv_heads in (("mha", args.heads), ("gqa", args.heads // 4)):
        q, k, v = make_inputs(args, kv_heads, device, dtype, False)
        fn = ours(pattern, "auto", cu)
        gqa_steps[label] = step_of(fn, q, k, v, grad, "fwd+bwd")
        row = {"kv_heads": kv_heads, "kv_bytes": 2 * k.numel() * k.element_size(),
               "fwd+bwd": time_function(gqa_steps[label], device=device, warmup=2, repeats=args.repeats).as_dict()}
        if cuda:
            with graph_regions(False):  # eager: its temporaries are what a graph region's pool keeps
                row["peak_bytes"] = peak_bytes(fn, q, k, v, grad, device)
        if has_fa4:  # the varlen kernels' own GQA / MHA ratio: how far below 1 the kernels go on this row
            try:
                floor_step, _ = varlen_floor(pattern, q, k, v, bounds, scale)
                row[FLOOR] = time_function(graphed(lambda: floor_step(True), device=device), device=device,
                                           warmup=2, repeats=args.repeats).as_dict()
            except Exception as error:
                row[FLOOR] = failed(error)
        gqa[label] = row
    try:
        gqa["interleaved"] = counted_pair({"gqa": gqa_steps["gqa"], "mha": gqa_steps["mha"]}, device,
                                          max(6, args.repeats))
    except Exception as error:
        gqa["interleaved"] = failed(error)
    result["gqa"] = gqa
    result["graph_regions"] = dict(GRAPH_REGIONS.counts)
    return result


def pair_text(pair: dict) -> str:
    """An interleaved pair's ratio and interval, or why it could not be timed."""
    if "error" in pair:
        return f"not timed: {pair['error']}"
    eager = pair.get("graph_regions", {}).get("eager", 0)
    return (f"{pair['of']}: {pair['ratio']:.3f} [{pair['interval'][0]:.3f}, {pair['interval'][1]:.3f}] "
            f"over {pair['rounds']} rounds" + (f" ({eager} region calls eager)" if eager else ""))


def median(cell, name):
    value = cell["times_ms"].get(name, {})
    return value.get("median")


def report(result) -> None:
    print(f"row {result['shape']} {result['dtype']}: {result['documents']} documents (lengths {result['lengths']}), "
          f"w {result['segment_lengths']} r {result['dilation_rates']} causal={result['causal']}: "
          f"{result['blocks']} blocks, {result['packs']} packs")
    for direction, cell in result["cells"].items():
        print(f"\n{direction}:")
        for name, value in cell["times_ms"].items():
            errors = [cell[kind].get(name) for kind in ("errors", "errors_after_timing")]
            text = f"{value['median']:.3f} ms" if "median" in value else value["error"]
            regions = cell.get("graph_regions", {}).get(name)
            print(f"  {name:22s} {text}" + ("  (rel err vs loop {:.2e}, after timing {:.2e})".format(*errors)
                                           if None not in errors else "")
                  + (f"  regions while timed {regions}" if regions and any(regions.values()) else ""))
        best_loop = min((median(cell, n) for n in cell["times_ms"] if n.startswith("loop") and median(cell, n)),
                        default=None)
        floor = median(cell, FLOOR)
        for name in cell["times_ms"]:
            time = median(cell, name)
            if name.startswith("ours") and time:
                line = f"  {name}:"
                if best_loop:
                    line += f" loop/ours {best_loop / time:.2f}x (target >= {PACKED_LIMITS['loop']:g})"
                if floor:
                    line += f", ours/floor {time / floor:.3f} (target <= {PACKED_LIMITS['floor']:g})"
                print(line)
        if "interleaved" in cell:
            print(f"  interleaved {pair_text(cell['interleaved'])} (target <= {PACKED_LIMITS['floor']:g})")
        for name, profile in cell.get("kernels", {}).items():
            if "ms_total" in profile and median(cell, name):
                print(f"  {name}: kernels {profile['ms_total']:.3f} ms, wall/kernels "
                      f"{median(cell, name) / profile['ms_total']:.3f}; by kind {profile['ms_by_kind']}")
    gqa = result["gqa"]
    mha_ms, gqa_ms = gqa["mha"]["fwd+bwd"]["median"], gqa["gqa"]["fwd+bwd"]["median"]
    peaks = [gqa[label].get("peak_bytes") for label in ("gqa", "mha")]
    print(f"\nGQA fwd+bwd ours[auto]: H_kv={gqa['gqa']['kv_heads']} {gqa_ms:.3f} ms vs MHA {mha_ms:.3f} ms "
          f"(ratio {gqa_ms / mha_ms:.3f}, target <= {PACKED_LIMITS['gqa']:g}); K/V bytes {gqa['gqa']['kv_bytes']} vs "
          f"{gqa['mha']['kv_bytes']}"
          + (f"; peak above inputs {peaks[0] / 2**20:.1f} MiB vs {peaks[1] / 2**20:.1f} MiB"
             if None not in peaks else ""))
    print(f"GQA fwd+bwd ours[auto], interleaved {pair_text(gqa['interleaved'])}")
    floors = [gqa[label].get(FLOOR, {}).get("median") for label in ("gqa", "mha")]
    if None not in floors:
        print(f"GQA fwd+bwd {FLOOR}: {floors[0]:.3f} ms vs MHA {floors[1]:.3f} ms "
              f"(ratio {floors[0] / floors[1]:.3f})")


def print_verdicts(parser: argparse.ArgumentParser, paths: list[str]) -> None:
    """The packed targets over the runs at `paths` (bench.targets): a target is met only where every run meets it."""
    try:
        rows = packed_verdicts(read_runs(paths))
    except ValueError as error:  # a file that cannot be read, or is JSON but not a run of this script
        parser.error(f"--verdict: {error}")
    print(runs_line(paths))
    print("\n".join(format_verdicts(rows, "packed row", spread=False)))  # each target its own ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="reports/results/packed_gpu.json")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, default=131072)
    parser.add_argument("--documents", type=int, default=64)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--segment-lengths", default="1024,2048,4096")
    parser.add_argument("--dilation-rates", default="1,2,4")
    parser.add_argument("--not-causal", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--backends", default="auto,sdpa,fa4",
                        help="executors timed as ours[...] and loop[...] (auto always; sdpa takes minutes)")
    parser.add_argument("--verdict", nargs="+", metavar="RUN.json", default=None,
                        help="no timing: read runs this benchmark wrote and print each target's ratio per run and "
                             "whether every run meets it (bench.targets)")
    args = parser.parse_args()
    if args.verdict:
        print_verdicts(parser, args.verdict)
        return
    if args.heads % 4:
        parser.error("--heads must be a multiple of 4 (the GQA comparison uses H / 4 key/value heads)")
    chosen = args.backends.split(",")
    if "auto" not in chosen or not set(chosen) <= {"auto", "sdpa", "fa4"}:
        parser.error(f"--backends must list auto and any of sdpa, fa4 (comma-separated), got {args.backends!r}")
    out = Path(args.out)
    if out.exists():
        parser.error(f"--out {out} exists; choose another path (results are never overwritten)")
    result = run(args)
    result["environment"] = collect_environment(args.device)
    result["command"] = strip_paths(" ".join(sys.argv))
    report(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
