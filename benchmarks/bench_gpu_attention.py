"""Dilated attention on one GPU against the strongest simple compositions, all in one run.

For each cell (mode x causal x N x D x direction) it times, in the same process:
- ours: `backend="auto"` and each executor it can pick ("sdpa": cuDNN on the plan's strided views,
  exact backward with the merged out/LSE; "triton": the fused kernel; "fa4": FlashAttention-4 reading
  and writing the views in place, where installed), and `ordering="hilbert"` beside the plain call;
- anchors (hilbert_lab.bench.anchors, fastest SDPA kernel of this GPU each): the kernel-only floor on
  pre-gathered blocks, the FlashAttention-4-in-place floor (every block read and written in place,
  no merge) (both floors replayed from a CUDA graph, bench.timing.graphed: their kernels with no host
  time), the strided-view composition (head_groups) and the torchscale-style composition (both
  modes; its merge weights carry no gradient);
and checks each output against the torchscale-style composition (relative error) before timing. auto, auto with
ordering="hilbert" and the FlashAttention-4 floor, whose ratios the targets are, are timed round by round together
(`bench.timing.time_interleaved` with bursts of about 25 ms timed as Triton's do_bench times: the median over
rounds, with the 10th-90th percentile interval); the other variants by do_bench, one after another.
Directions: "fwd" (no_grad) and "fwd+bwd" (autograd with a fixed random upstream gradient).
Also: the headline shape (bf16, B=2, N=32768, H=12, D=64, w [2048, 4096, 8192], r [1, 2, 4]) and
the longest causal LongNet fwd+bwd that runs (B=1, H=12, D=64, w [2048, 8192, 32768, 131072],
r [1, 2, 4, 8]). Writes JSON with the environment after every cell (a run cut short keeps what it finished).

Part "ragged": causal cells at N = m and m + 5 (m 32K with H 12, D 64; m 128K with H 8, D 32; B 1; w [2048,
8192, 32768, 131072], r [1, 4, 8, 32]; both modes, fwd and fwd+bwd), each timed as a sweep cell, and the ratio
(m + 5) / m of auto, of each executor and of the FlashAttention-4 floor (target: <= 1.10); then auto at both
lengths again, timed round by round together (`auto_interleaved`: the ratio with its 95% interval). Each pair
runs in a fresh process: on an H200 (torch 2.11, cuDNN 9.19) cuDNN's backward, under an anchor, has killed the process
with a segmentation fault in head_groups fwd+bwd at m 128K after the cells before it, and not when that pair
ran alone; a pair whose process dies is recorded with how it died, and the others keep their results.

Part "profile": torch.profiler's CUDA kernel time per call of each of ours on the headline cells (causal or not), by
kind (attention kernels, copies, fills, elementwise adds/conversions, merge, other), beside the wall time of the
same calls issued back to back (`wall_over_kernels`, target <= 1.05); and of
the FlashAttention-4 floor's calls, whose graph-replayed time (part "headline") over that kernel sum is printed
(target: within 5%).

A plan's FlashAttention-4 calls run as one CUDA graph per direction once a step repeats (executors.kernel.
GRAPH_REGIONS); `--no-graphs` times every call of ours eagerly. The JSON records which, with the regions' counts
(in each cell's timings, how a variant's regions ran while it was timed).

`--backward-thread caller` runs every timed backward on the calling thread (`torch.autograd.
set_multithreading_enabled(False)`), where PyTorch runs a CUDA backward on its device thread by default: a small
step then skips the two hand-overs between threads (tens to hundreds of microseconds on a host whose idle cores
wake slowly). The JSON records which (`backward_thread`).

Usage: python benchmarks/bench_gpu_attention.py [--out PATH] [--parts headline,sweep,ragged,longest,profile]
[--variants auto,executors,hilbert,compositions,floors] [--seq-lens 8192,32768,...] [--quick] [--no-graphs]
[--backward-thread worker|caller]
       python benchmarks/bench_gpu_attention.py --verdict RUN.json [RUN.json ...]  (no GPU: the targets over runs)
"""
from __future__ import annotations

import argparse
import itertools
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hilbert_lab.io import atomic_write, strip_paths  # noqa: E402
from hilbert_lab.attention import DilatedPattern, dilated_attention, unavailable_reason  # noqa: E402
from hilbert_lab.attention.executors.kernel import GRAPH_REGIONS  # noqa: E402
from hilbert_lab.attention.selection import select_backend  # noqa: E402
from hilbert_lab.bench import anchors  # noqa: E402
from hilbert_lab.bench.env import collect_environment  # noqa: E402
from hilbert_lab.bench.flops import attention_flops  # noqa: E402
from hilbert_lab.bench.kernel_profile import kernel_profile  # noqa: E402
from hilbert_lab.bench.targets import (  # noqa: E402
    format_verdicts, headline_verdicts, ragged_verdicts, read_runs, runs_line, sweep_verdicts,
)
from hilbert_lab.bench.timing import (  # noqa: E402
    PAIR_BURST_MS, free_cell_memory, graphed, time_function, time_interleaved, time_pair,
)

HEADLINE = dict(segment_lengths=[2048, 4096, 8192], dilation_rates=[1, 2, 4])
LONGEST = dict(segment_lengths=[2048, 8192, 32768, 131072], dilation_rates=[1, 2, 4, 8])
RAGGED = dict(segment_lengths=[2048, 8192, 32768, 131072], dilation_rates=[1, 4, 8, 32])
RAGGED_CELLS = ((32768, 12, 64), (131072, 8, 32))  # (m, H, D): N = m and m + 5
DEV = torch.device("cuda")
# what a cell may time (--variants): auto; each executor auto can pick, by name; auto with ordering="hilbert"; the
# torchscale-style and strided compositions; the floors (FlashAttention-4 in place, cuDNN and flash on gathered blocks)
VARIANTS = ("auto", "executors", "hilbert", "compositions", "floors")


def inputs(batch, seq_len, heads, head_dim, seed=0, requires_grad=False):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    return [torch.randn(batch, seq_len, heads, head_dim, device=DEV, dtype=torch.bfloat16, generator=gen)
            .requires_grad_(requires_grad) for _ in range(3)]


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def run_variants(pattern, q, k, v, direction, scale, repeats, variants=VARIANTS):
    """{variant: Timing dict} for ours and the anchors of the groups in `variants` (VARIANTS); errors against the
    torchscale-style output."""
    training = direction == "fwd+bwd"
    grad = torch.randn_like(q)
    kernels = ["cudnn", "flash"]
    ours = {}
    if "auto" in variants:
        ours["auto"] = lambda q, k, v: dilated_attention(
            q, k, v, mode=pattern.mode, causal=pattern.causal, backend="auto", segment_lengths=pattern.segment_lengths,
            dilation_rates=pattern.dilation_rates, scale=scale)
    for name in executors() if "executors" in variants else ():
        ours[name] = (lambda name: lambda q, k, v: dilated_attention(
            q, k, v, mode=pattern.mode, causal=pattern.causal, backend=name, segment_lengths=pattern.segment_lengths,
            dilation_rates=pattern.dilation_rates, scale=scale))(name)
    if "hilbert" in variants:
        ours["auto[hilbert]"] = lambda q, k, v: dilated_attention(
            q, k, v, mode=pattern.mode, causal=pattern.causal, backend="auto", segment_lengths=pattern.segment_lengths,
            dilation_rates=pattern.dilation_rates, scale=scale, ordering="hilbert")
    anchor_fns = {}
    for kern in kernels if "compositions" in variants else ():
        anchor_fns[f"torchscale[{kern}]"] = (lambda kern: lambda q, k, v: anchors.torchscale_composition(
            q, k, v, pattern, scale=scale, kernel=kern))(kern)
        if pattern.mode == "head_groups" or len(pattern.segment_lengths) == 1:
            anchor_fns[f"strided[{kern}]"] = (lambda kern: lambda q, k, v: anchors.strided_composition(
                q, k, v, pattern, scale=scale, kernel=kern))(kern)
    results, errors = {}, {}
    # auto, auto with ordering="hilbert" and the FlashAttention-4 floor (the targets' ratios) are timed interleaved, in
    # bursts timed as do_bench
    grouped = ("auto", "auto[hilbert]") if "floors" in variants and "fa4" in executors() else ()
    deferred = {}
    with torch.no_grad():
        reference = anchors.torchscale_composition(q, k, v, pattern, scale=scale, kernel="cudnn")
    for name, fn in {**ours, **anchor_fns}.items():
        try:
            with torch.no_grad():
                errors[name] = rel(fn(q, k, v), reference)
            if training:
                leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]

                def step(fn=fn, leaves=leaves):
                    out = fn(*leaves)
                    torch.autograd.backward(out, grad)
                    for t in leaves:
                        t.grad = None
            else:
                def step(fn=fn):
                    with torch.no_grad():
                        fn(q, k, v)
            if name in grouped:  # timed below, interleaved with the FlashAttention-4 floor
                deferred[name] = step
                continue
            results[name] = timed_with_regions(lambda: time_function(step, device=DEV, warmup=3, repeats=repeats))
        except Exception as error:  # an anchor kernel that does not run this shape is left out, with why
            results[name] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
    if "fa4" in executors() and "floors" in variants:
        if training:
            def step():
                anchors.fa4_floor(q, k, v, pattern, scale=scale, grad_out=grad)
        else:
            def step():
                anchors.fa4_floor(q, k, v, pattern, scale=scale)
        try:
            floor_step = graphed(step, device=DEV)
            if not deferred:
                results["floor[fa4]"] = time_function(floor_step, device=DEV, warmup=3, repeats=repeats).as_dict()
            else:  # round by round together: drift and the call before hit them alike
                group = {**deferred, "floor[fa4]": floor_step}
                timings, regions = regions_while(lambda: time_interleaved(
                    group, device=DEV, warmup=3, rounds=max(6, repeats), max_seconds=float("inf"),
                    burst_ms=PAIR_BURST_MS))
                for name, timing in timings.items():
                    results[name] = {**timing.as_dict(), "interleaved_with": sorted(set(group) - {name})}
                    if name in deferred and any(regions.values()):  # ours' regions over the whole group's calls
                        results[name]["graph_regions_of_the_group"] = regions
                deferred = {}
        except Exception as error:
            results["floor[fa4]"] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
    for name, step in deferred.items():  # their floor did not run: each alone
        try:
            results[name] = timed_with_regions(lambda: time_function(step, device=DEV, warmup=3, repeats=repeats))
        except Exception as error:
            results[name] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
    if "floors" not in variants:
        return results, errors
    blocks = anchors.gather_blocks(q.detach(), k.detach(), v.detach(), pattern)
    for kern in kernels:
        try:
            if training:
                leaves = [[t.detach().requires_grad_(True) for t in blk] for blk in blocks]
                grads = [torch.randn_like(blk[0]) for blk in blocks]

                def step(kern=kern, leaves=leaves, grads=grads):
                    outs = anchors.kernel_floor(leaves, causal=pattern.causal, scale=scale, kernel=kern)
                    torch.autograd.backward(outs, grads)
                    for blk in leaves:
                        for t in blk:
                            t.grad = None
            else:
                def step(kern=kern):
                    with torch.no_grad():
                        anchors.kernel_floor(blocks, causal=pattern.causal, scale=scale, kernel=kern)
            results[f"floor[{kern}]"] = time_function(graphed(step, device=DEV), device=DEV, warmup=3,
                                                      repeats=repeats).as_dict()
        except Exception as error:
            results[f"floor[{kern}]"] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
    return results, errors


def executors() -> list[str]:
    """Our executors that auto can pick on this GPU (bf16)."""
    return [name for name in ("sdpa", "triton", "fa4") if unavailable_reason(name, DEV, torch.bfloat16) is None]


def profile_cell(mode, causal, direction, names, calls=5, wall_calls=20):
    """CUDA kernel time per call of each of ours (and of "floor[fa4]", FlashAttention-4's floor calls run eagerly),
    by kind (bench.kernel_profile), on the headline shape; the wall time over `wall_calls` calls (a pause of the
    host in one of a few calls would weigh as much as the host time of all of them)."""
    pattern = DilatedPattern.create(HEADLINE["segment_lengths"], HEADLINE["dilation_rates"], mode=mode, causal=causal)
    q, k, v = inputs(2, 32768, 12, 64, requires_grad=direction == "fwd+bwd")
    grad = torch.randn_like(q)
    rows = {}
    for name in names:
        def once():
            if name == "floor[fa4]":  # the floor's calls, eagerly: its graph replay should take their kernel time
                plain = [t.detach() for t in (q, k, v)]
                anchors.fa4_floor(*plain, pattern, scale=64 ** -0.5, grad_out=grad if direction == "fwd+bwd" else None)
                return
            out = dilated_attention(q, k, v, segment_lengths=pattern.segment_lengths,
                                    dilation_rates=pattern.dilation_rates,
                                    mode=mode, causal=causal, backend=name)
            if direction == "fwd+bwd":
                torch.autograd.backward(out, grad)
                for t in (q, k, v):
                    t.grad = None
        try:
            rows[name] = kernel_profile(once, calls=calls)
            rows[name]["wall_ms"], rows[name]["host_ms"] = back_to_back_ms(once, wall_calls)
            rows[name]["wall_over_kernels"] = rows[name]["wall_ms"] / rows[name]["ms_total"]
        except Exception as error:
            rows[name] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
    return dict(mode=mode, causal=causal, direction=direction, shape=[2, 32768, 12, 64], profile=rows)


def back_to_back_ms(step, calls: int) -> tuple[float, float]:
    """(wall, host) milliseconds per call of `calls` calls issued back to back. wall: between two CUDA events, as the
    profiler runs them (no cache flush between calls): the time the kernel sum is compared with (target: within
    5%). The timed calls queue behind as many untimed ones, as in a loop of steps: an idle GPU would wait for the
    first call's host time, which a step in a loop hides behind the step before it, and a host slower than the GPU
    still shows. host: the host's time to issue them (a step is host-bound where it is close to wall; a launch
    queue that fills makes it wait for the GPU, so it is at most about wall)."""
    step()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(calls):
        step()
    start.record()
    issued = time.perf_counter()
    for _ in range(calls):
        step()
    issued = time.perf_counter() - issued
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls, issued * 1000 / calls


def best(results, prefix):
    times = {k: v["median"] for k, v in results.items() if k.startswith(prefix) and "median" in v}
    return (min(times, key=times.get), min(times.values())) if times else (None, None)


def regions_while(run):
    """(run(), what ours' graph regions did meanwhile: GRAPH_REGIONS.counts' increments, replayed or eager)."""
    with GRAPH_REGIONS.counting() as done:
        result = run()
    return result, done


def timed_with_regions(time_it):
    """time_it()'s Timing as a dict, with how ours' graph regions ran while it timed (where they ran at all)."""
    timing, regions = regions_while(time_it)
    return {**timing.as_dict(), **({"graph_regions": regions} if any(regions.values()) else {})}


def cell(mode, causal, seq_len, head_dim, direction, batch, heads, config, repeats, variants=VARIANTS):
    pattern = DilatedPattern.create(config["segment_lengths"], config["dilation_rates"], mode=mode, causal=causal)
    q, k, v = inputs(batch, seq_len, heads, head_dim)
    scale = head_dim**-0.5
    results, errors = run_variants(pattern, q, k, v, direction, scale, repeats, variants)
    picked = select_backend(DEV, torch.bfloat16, shape=tuple(q.shape), segment_lengths=pattern.segment_lengths,
                            dilation_rates=pattern.dilation_rates, mode=mode, causal=causal,
                            training=direction == "fwd+bwd")
    floor_name, floor = best(results, "floor[")
    strided_name, strided = best(results, "strided[")
    ts_name, ts = best(results, "torchscale[")
    auto = results.get("auto", {}).get("median")
    flops = attention_flops(pattern, batch, seq_len, heads, head_dim, backward=direction == "fwd+bwd")
    row = dict(mode=mode, causal=causal, seq_len=seq_len, head_dim=head_dim, direction=direction, batch=batch,
               heads=heads, auto_picks=picked, auto_ms=auto, floor=floor_name, floor_ms=floor,
               strided=strided_name, strided_ms=strided, torchscale=ts_name, torchscale_ms=ts,
               sdpa_ms=results.get("sdpa", {}).get("median"), triton_ms=results.get("triton", {}).get("median"),
               fa4_ms=results.get("fa4", {}).get("median"), hilbert_ms=results.get("auto[hilbert]", {}).get("median"),
               fa4_floor_ms=results.get("floor[fa4]", {}).get("median"),
               auto_over_floor=auto / floor if auto and floor else None,
               strided_over_auto=strided / auto if auto and strided else None,
               torchscale_over_auto=ts / auto if auto and ts else None,
               auto_tflops=flops / (auto * 1e-3) / 1e12 if auto else None,
               rel_error_vs_torchscale=errors, timings=results)
    del q, k, v
    free_cell_memory(DEV)
    return row


def ragged_in_process(pair: str, repeats: int, no_graphs: bool, variants=VARIANTS, backward_thread="worker") -> dict:
    """Part ragged's entry for pair "M,MODE,DIRECTION", run by this script in a fresh process (with that process's
    graph-region counts); where that process dies, an entry with the pair and how it died."""
    m, mode, direction = pair.split(",")
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "pair.json"
        command = [sys.executable, __file__, "--parts", "ragged", "--ragged-pair", pair, "--repeats", str(repeats),
                   "--variants", ",".join(variants), "--out", str(out), "--backward-thread", backward_thread] + \
            (["--no-graphs"] if no_graphs else [])
        code = subprocess.run(command).returncode
        if code == 0 and out.exists():
            child = json.loads(out.read_text())  # with how the child's graph regions ran (all its variants)
            return {**child["ragged"][0], "graph_regions": child.get("graph_regions")}
    names = {int(number): number.name for number in signal.Signals}
    how = f"signal {names.get(-code, -code)}" if code < 0 else f"exit status {code}"
    print(f"ragged {mode:11s} m={m} {direction:7s} the process died: {how}", flush=True)
    return dict(mode=mode, m=int(m), direction=direction, error=f"the process running the pair died: {how}")


def ragged_pair(m, heads, head_dim, mode, direction, repeats, variants=VARIANTS):
    """The causal cells N = m and m + 5 (pattern RAGGED, B 1) and the ratio (m + 5) / m of auto, each executor
    and the FlashAttention-4 floor; and auto at both lengths timed round by round together (`auto_interleaved`:
    the target's ratio with its 95% interval, rounds resampled in pairs), where the cells time them minutes apart."""
    rows = [cell(mode, True, n, head_dim, direction, 1, heads, RAGGED, repeats, variants) for n in (m, m + 5)]
    for row in rows:
        row.pop("timings")
        print(fmt(row), flush=True)
    names = [name for name in ("auto", *executors(), "fa4_floor")
             if rows[0].get(f"{name}_ms") and rows[1].get(f"{name}_ms")]
    ratios = {name: rows[1][f"{name}_ms"] / rows[0][f"{name}_ms"] for name in names}
    print(f"ragged {mode:11s} m={m} H={heads} D={head_dim} {direction:7s} (m+5)/m: "
          + " ".join(f"{name}={value:.2f}" for name, value in ratios.items()), flush=True)
    entry = dict(mode=mode, m=m, heads=heads, head_dim=head_dim, direction=direction, ratios=ratios, rows=rows)
    if "auto" in variants:
        try:
            entry["auto_interleaved"] = auto_at_both_lengths(m, heads, head_dim, mode, direction, max(6, repeats))
            found = entry["auto_interleaved"]
            print(f"ragged {mode:11s} m={m} {direction:7s} auto interleaved (m+5)/m: {found['ratio']:.3f} "
                  f"[{found['interval'][0]:.3f}, {found['interval'][1]:.3f}]", flush=True)
        except Exception as error:
            entry["auto_interleaved"] = {"error": f"{type(error).__name__}: {str(error)[:200]}"}
    return entry


def auto_at_both_lengths(m, heads, head_dim, mode, direction, rounds) -> dict:
    """auto on the causal RAGGED pattern at N = m and m + 5 (B 1), timed round by round together in bursts timed as
    do_bench (bench.timing.time_pair): each length's Timing and (m + 5) / m with its 95% interval (paired rounds)."""
    pattern = DilatedPattern.create(RAGGED["segment_lengths"], RAGGED["dilation_rates"], mode=mode, causal=True)
    steps = {}
    for n in (m, m + 5):
        q, k, v = inputs(1, n, heads, head_dim, requires_grad=direction == "fwd+bwd")
        grad = torch.randn_like(q)

        def step(q=q, k=k, v=v, grad=grad):
            with torch.set_grad_enabled(direction == "fwd+bwd"):
                out = dilated_attention(q, k, v, segment_lengths=pattern.segment_lengths,
                                        dilation_rates=pattern.dilation_rates, mode=mode, causal=True, backend="auto")
                if direction == "fwd+bwd":
                    torch.autograd.backward(out, grad)
                    for t in (q, k, v):
                        t.grad = None
        steps[str(n)] = step
    pair = time_pair({str(m + 5): steps[str(m + 5)], str(m): steps[str(m)]}, device=DEV, rounds=rounds, warmup=3)
    return dict(m=pair[str(m)], m_plus_5=pair[str(m + 5)], ratio=pair["ratio"], interval=pair["interval"],
                rounds=rounds)


def fmt(row):
    f = lambda x: "   -  " if x is None else f"{x:6.3f}"  # noqa: E731
    return (f"{row['mode']:11s} c={int(row['causal'])} N={row['seq_len']:>7d} D={row['head_dim']:>3d} {row['direction']:7s} "
            f"auto={f(row['auto_ms'])}({row['auto_picks'][:6]}) sdpa={f(row['sdpa_ms'])} triton={f(row['triton_ms'])} "
            f"fa4={f(row['fa4_ms'])} fa4floor={f(row['fa4_floor_ms'])} hilbert={f(row['hilbert_ms'])} "
            f"floor={f(row['floor_ms'])} strided={f(row['strided_ms'])} ts={f(row['torchscale_ms'])} "
            f"auto/floor={f(row['auto_over_floor'])} ts/auto={f(row['torchscale_over_auto'])} "
            f"strided/auto={f(row['strided_over_auto'])}")


def longest(max_tokens: int, start: int, backend: str = "auto") -> dict:
    """Doubling then bisection (in steps of the largest segment) of causal LongNet fwd+bwd on `backend`."""
    step = LONGEST["segment_lengths"][-1]
    pattern = DilatedPattern.create(**LONGEST, mode="longnet", causal=True)

    def fits(n):
        try:
            q, k, v = inputs(1, n, 12, 64, requires_grad=True)
            torch.cuda.reset_peak_memory_stats()
            out = dilated_attention(q, k, v, segment_lengths=pattern.segment_lengths,
                                    dilation_rates=pattern.dilation_rates, causal=True, backend=backend)
            out.backward(torch.randn_like(out))
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / 2**30
            ok = bool(torch.isfinite(q.grad).all())
            del q, k, v, out
            return ok, peak
        except torch.OutOfMemoryError:
            return False, None
        finally:
            free_cell_memory(DEV)

    tried, good, bad = [], None, None
    n = start
    while n <= max_tokens:
        ok, peak = fits(n)
        tried.append(dict(tokens=n, ok=ok, peak_gib=peak))
        print(f"  longest[{backend}]: {n} tokens -> {'ok' if ok else 'OOM'} {peak}", flush=True)
        if not ok:
            bad = n
            break
        good = n
        n *= 2
    if good and bad:
        lo, hi = good, bad
        while hi - lo > step:
            mid = (lo + hi) // 2 // step * step
            ok, peak = fits(mid)
            tried.append(dict(tokens=mid, ok=ok, peak_gib=peak))
            print(f"  longest[{backend}]: {mid} tokens -> {'ok' if ok else 'OOM'} {peak}", flush=True)
            lo, hi = (mid, hi) if ok else (lo, mid)
        good = lo
    return dict(backend=backend, config=LONGEST, batch=1, heads=12, head_dim=64, causal=True, longest_tokens=good,
                tried=tried)


def print_verdicts(parser: argparse.ArgumentParser, paths: list[str]) -> None:
    """The targets over the runs at `paths` (bench.targets): a cell meets its target only where every run does."""
    try:
        runs = read_runs(paths)
        parts = [("headline, auto over the FlashAttention-4 floor", headline_verdicts(runs), True),
                 ("sweep, auto over the best floor", sweep_verdicts(runs), True),
                 ("sweep, ordering='hilbert' over the plain call", sweep_verdicts(runs, hilbert=True), False),
                 ("ragged, auto at m + 5 over m", ragged_verdicts(runs), True)]
    except ValueError as error:  # a file that cannot be read, or is JSON but not a run
        parser.error(f"--verdict: {error}")
    print(runs_line(paths))
    for title, rows, cells in parts:
        if rows:
            print("\n".join(format_verdicts(rows, title, cells=cells)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="reports/results/gpu_attention.json")
    parser.add_argument("--parts", default="headline,sweep,ragged,longest")
    parser.add_argument("--seq-lens", default="8192,32768,131072,524288")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"what headline, sweep and ragged cells time, of {','.join(VARIANTS)} (default: all); "
                             "e.g. auto,hilbert,floors for the targets alone (auto and its ordering over the floors)")
    parser.add_argument("--ragged-pair", default=None, help="M,MODE,DIRECTION: part ragged runs this pair alone "
                        "in this process (how it runs each pair in a fresh one)")
    parser.add_argument("--ragged-only", default=None, help="M,MODE,DIRECTION[;...]: part ragged runs only these "
                        "pairs (each in a fresh process), e.g. 32768,head_groups,fwd+bwd;131072,head_groups,fwd+bwd")
    parser.add_argument("--longest-start", type=int, default=4 * 1048576)
    parser.add_argument("--longest-max", type=int, default=8 * 1048576)
    parser.add_argument("--longest-backends", default="auto")
    parser.add_argument("--quick", action="store_true", help="headline only, fewer repeats")
    parser.add_argument("--no-graphs", action="store_true",
                        help="every call of ours eager (executors.kernel.GRAPH_REGIONS off: each call's Python on "
                             "the host); by default a plan's FlashAttention-4 calls replay as one CUDA graph")
    parser.add_argument("--backward-thread", choices=("worker", "caller"), default="worker",
                        help="where timed backwards run: PyTorch's device thread (its default) or the calling thread "
                             "(torch.autograd.set_multithreading_enabled(False))")
    parser.add_argument("--verdict", nargs="+", metavar="RUN.json", default=None,
                        help="no timing: read runs this benchmark wrote and print, per cell, each run's ratio and "
                             "whether every run meets the target (bench.targets)")
    args = parser.parse_args()
    if args.verdict:
        print_verdicts(parser, args.verdict)
        return
    known = {f"{m},{mode},{direction}" for m, _, _ in RAGGED_CELLS for mode in ("longnet", "head_groups")
             for direction in ("fwd", "fwd+bwd")}
    unknown = [pair for pair in (args.ragged_only or "").split(";") if pair and pair not in known]
    if unknown:
        parser.error(f"--ragged-only: unknown pairs {unknown}; allowed: {';'.join(sorted(known))}")
    variants = tuple(name for name in args.variants.split(",") if name)
    if not variants or set(variants) - set(VARIANTS):
        parser.error(f"--variants: {args.variants!r}; allowed: comma-separated names of {','.join(VARIANTS)}")
    GRAPH_REGIONS.enabled = not args.no_graphs
    torch.autograd.set_multithreading_enabled(args.backward_thread == "worker")  # this (the timing) thread's setting
    parts = set(args.parts.split(","))
    if args.quick:
        parts, args.repeats = {"headline"}, 7
    began = time.time()
    result = dict(env=collect_environment(str(DEV)), command=strip_paths(" ".join(sys.argv)),
                  backward_thread=args.backward_thread, headline=[], sweep=[])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every cell: a run cut short keeps what it finished
        result["seconds"] = time.time() - began
        result["graph_regions"] = dict(enabled=GRAPH_REGIONS.enabled, counts=dict(GRAPH_REGIONS.counts))
        atomic_write(out, json.dumps(result, indent=1, default=str))

    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  cudnn {torch.backends.cudnn.version()}")
    if "headline" in parts:
        for mode in ("head_groups", "longnet"):
            for causal in (False, True):
                for direction in ("fwd", "fwd+bwd"):
                    row = cell(mode, causal, 32768, 64, direction, 2, 12, HEADLINE, args.repeats, variants)
                    result["headline"].append(row)
                    print(fmt(row), flush=True)
                    save()
    if "sweep" in parts:
        for seq_len in (int(s) for s in args.seq_lens.split(",")):
            for head_dim in (int(d) for d in args.head_dims.split(",")):
                for mode in ("head_groups", "longnet"):
                    for causal in (False, True):
                        for direction in ("fwd", "fwd+bwd"):
                            batch = 2 if seq_len <= 131072 else 1
                            row = cell(mode, causal, seq_len, head_dim, direction, batch, 12, HEADLINE,
                                       max(5, args.repeats // (2 if seq_len > 131072 else 1)), variants)
                            timings = row.pop("timings")  # a variant that failed keeps why
                            row["failures"] = {name: t["error"] for name, t in timings.items() if "error" in t}
                            result["sweep"].append(row)
                            print(fmt(row), flush=True)
                            save()
    if "ragged" in parts:
        result["ragged"] = []
        for m, heads, head_dim in RAGGED_CELLS:
            for mode in ("longnet", "head_groups"):
                for direction in ("fwd", "fwd+bwd"):
                    pair = f"{m},{mode},{direction}"
                    if args.ragged_only is not None and pair not in args.ragged_only.split(";"):
                        continue
                    if args.ragged_pair == pair:
                        result["ragged"].append(ragged_pair(m, heads, head_dim, mode, direction, args.repeats,
                                                            variants))
                    elif args.ragged_pair is None:
                        result["ragged"].append(ragged_in_process(pair, args.repeats, args.no_graphs, variants,
                                                                  args.backward_thread))
                    save()
    if "profile" in parts:
        result["profile"] = []
        for mode, causal, direction in itertools.product(("head_groups", "longnet"), (False, True), ("fwd", "fwd+bwd")):
            floor = ["floor[fa4]"] if "fa4" in executors() else []
            row = profile_cell(mode, causal, direction, ["auto"] + executors() + floor)
            kernels = row["profile"].get("floor[fa4]", {}).get("ms_total")
            timed = [r["fa4_floor_ms"] for r in result.get("headline", [])
                     if (r["mode"], r["causal"], r["direction"]) == (mode, causal, direction) and r["fa4_floor_ms"]]
            if kernels and timed:  # the floor's graph replay over its calls' summed kernel time (target <= 1.05)
                row["floor_over_kernels"] = timed[0] / kernels
            result["profile"].append(row)
            for name, data in row["profile"].items():
                print(f"profile {mode:11s} c={int(causal)} {direction:7s} {name:10s} {data}", flush=True)
            if "floor_over_kernels" in row:
                ratio = row["floor_over_kernels"]
                print(f"profile {mode:11s} c={int(causal)} {direction:7s} floor[fa4] graph / kernel sum {ratio:.3f}")
            save()
    if "longest" in parts:
        result["longest"] = []
        for name in args.longest_backends.split(","):
            result["longest"].append(longest(args.longest_max, args.longest_start, name))
            save()
    save()
    print(f"wrote {out} in {result['seconds']:.0f} s")


if __name__ == "__main__":
    main()
