"""The experiments of the claims report, one function per claim of claims.md (C1-C12): each returns rows
(claims_measure._row) of claimed vs measured with a verdict. Every experiment computes real dilated
attention through the engine; reports.claims.evaluate_all runs them all.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from hilbert_lab.reports.claims_measure import (
    VERDICTS, _clip_pattern, _row, dilation_mask_sparsity, make_inputs, ordering_speedup, ratio_with_bounds, time_pair,
    timing_verdict,
)


def claim_c1_c2(*, seq_lens: Sequence[int], repeats: int, device: str) -> tuple[list[dict], dict]:
    """C1 (ordering speedup at 1K-8K) and C2 (Hilbert tokens/s) from one set of measurements."""
    claimed_speedup = {1024: 0.99, 2048: 0.97, 4096: 0.60, 8192: 1.66}
    claimed_tps = {1024: 304e3, 2048: 289e3, 4096: 46e3, 8192: 52e3}
    segments, dilations = (512, 1024, 2048), (1, 2, 4)
    rows, measured = [], {}
    for seq_len in sorted(set(claimed_speedup) - set(seq_lens)):
        rows.append(_row("C1", f"Hilbert speedup at {seq_len}", "-", f"{claimed_speedup[seq_len]:.2f}x", "not run",
                         "not reproducible here", f"{seq_len} tokens is above this run's max_tokens"))
    for seq_len in seq_lens:
        lengths, rates = _clip_pattern(seq_len, segments, dilations)
        result = ordering_speedup(seq_len, lengths, rates, repeats=repeats, device=device)
        measured[seq_len] = result
        config = f"N={seq_len}, w={lengths}, r={rates}, B=1, H=8, D=64, fp32, {device}"
        if seq_len in claimed_speedup:
            claimed = claimed_speedup[seq_len]
            rows.append(_row("C1", f"Hilbert speedup at {seq_len}", config, f"{claimed:.2f}x",
                             f"{result['speedup']:.2f}x [{result['speedup_low']:.2f}, {result['speedup_high']:.2f}], "
                             f"max |out diff| {result['max_abs_output_difference']:.1e}",
                             timing_verdict(claimed, result["speedup_low"], result["speedup_high"],
                                            claimed_on_gpu=True, device=device),
                             "exact per-segment Hilbert layout (permutation after dilation: identical outputs); "
                             "GTX 1080 not available. The claim's own 4K time (202.53 ms) is 10x its 2K time for an "
                             "O(N) pattern, and 0.60x -> 1.66x between 4K and 8K, both signs of noise or unequal work."))
            claimed_tokens = claimed_tps[seq_len]
            rows.append(_row("C2", f"Hilbert tokens/s at {seq_len}", config, f"{claimed_tokens:,.0f}",
                             f"{result['ordered_tokens_per_s']:,.0f}",
                             "not reproducible here",
                             "absolute throughput is hardware-bound (claimed on a GTX 1080); C2 is C1's times "
                             "restated (1024/9.79 ms is not 304K, so the two claims disagree with each other)"))
    return rows, measured


def claim_c3(*, repeats: int, device: str, max_tokens: int) -> list[dict]:
    """C3: 'up to 7.95x' from a Triton Hilbert kernel at L=4096, dilation 64."""
    rows = []
    for seq_len, rate, claimed in ((4096, 64, 7.95), (1024, 1, 1.03), (2048, 2, 1.03)):
        if seq_len > max_tokens:
            rows.append(_row("C3", f"L={seq_len}, dilation {rate}", "-", f"{claimed:.2f}x", "not run",
                             "not reproducible here", f"L={seq_len} is above this run's max_tokens={max_tokens}"))
            continue
        result = ordering_speedup(seq_len, [seq_len], [rate], repeats=repeats, device=device)
        rows.append(_row("C3", f"L={seq_len}, dilation {rate}", f"one branch w={seq_len}, r={rate}, fp32, {device}",
                         f"{claimed:.2f}x",
                         f"{result['speedup']:.2f}x [{result['speedup_low']:.2f}, {result['speedup_high']:.2f}]",
                         timing_verdict(claimed, result["speedup_low"], result["speedup_high"], claimed_on_gpu=True,
                                        device=device),
                         "the predecessor's Triton 'Hilbert' kernel had no proper softmax, so its 7.95x timed a "
                         "different computation; here the exact engine with a Hilbert layout (identical output, "
                         f"max |diff| {result['max_abs_output_difference']:.1e}) is timed on what is available"))
    return rows


def claim_c4_c5_cache(progress: bool = False) -> list[dict]:
    """C4 / C5 cache-traffic parts: hilbert_lab.locality.evaluate_claims (LRU simulation)."""
    from hilbert_lab.locality import evaluate_claims

    frame = evaluate_claims(progress=progress)
    rows = []
    for record in frame.to_dict(orient="records"):
        verdict = record["verdict"] if record["verdict"] in VERDICTS else (
            "confirmed" if str(record["verdict"]).startswith("confirmed") else
            "refuted" if str(record["verdict"]).startswith("refuted") else "not reproducible here")
        measured = record["measured"]
        measured_text = (f"{measured:.1f}%" if isinstance(measured, float) and np.isfinite(measured) else
                         "not measured (a timing claim)" if isinstance(measured, float) else str(measured))
        rows.append(_row(record["claim"], f"cache: {record['metric']}", record["configuration"],
                         f"{record['claimed']}%", measured_text, verdict, record["why"]))
    return rows


def claim_c5_time(*, repeats: int, device: str, max_tokens: int) -> list[dict]:
    """C5 timing part: ring attention needs several processes/GPUs; the single-device analog is measured."""
    claimed = {8192: (2, 1.33), 16384: (4, 1.37), 32768: (8, 1.43), 65536: (16, 1.54)}
    rows = []
    for seq_len, (rate, ratio) in claimed.items():
        if seq_len > max_tokens:
            rows.append(_row("C5", f"ring time {seq_len}/dil {rate}", "-", f"{ratio:.2f}x", "not run",
                             "not reproducible here",
                             f"{seq_len} tokens is above this run's max_tokens={max_tokens}; ring timing needs several GPUs"))
            continue
        segment = min(4096, seq_len)
        result = ordering_speedup(seq_len, [segment], [rate], repeats=repeats, device=device)
        rows.append(_row("C5", f"ring time {seq_len}/dil {rate}",
                         f"single device analog: w={segment}, r={rate}, fp32, {device}", f"{ratio:.2f}x",
                         f"{result['speedup']:.2f}x [{result['speedup_low']:.2f}, {result['speedup_high']:.2f}]",
                         "not reproducible here",
                         "ring attention over several GPUs is not available here; the single-device kernel that "
                         "each ring step runs shows the layout effect a ring could inherit"))
    return rows


def claim_c6(*, results_dir: Path, device: str, max_tokens: int, progress: bool) -> list[dict]:
    """C6: Hilbert ordering lowers peak memory 15-30%. Measured peak of one forward+backward, isolated."""
    from hilbert_lab.reports.benchmark import run_benchmark
    from hilbert_lab.bench import expand_matrix

    seq_len = min(8192, max_tokens)
    cases = expand_matrix({"kind": "memory", "seq_len": seq_len, "segment_lengths": [1024, 2048],
                           "dilation_rates": [1, 2], "num_heads": 8, "head_dim": 64, "device": device,
                           "dtype": "float32", "warmup": 1},
                          {"ordering": [None, "hilbert"]})
    records = run_benchmark(cases, results_dir / "claims_memory.jsonl", progress=progress)
    peaks = {(record["params"]["ordering"] or "identity"): record.get("result", {}).get("forward_backward_peak_bytes")
             for record in records if record["status"] == "ok"}
    if len(peaks) < 2 or not all(peaks.values()):
        return [_row("C6", "peak memory", f"N={seq_len}", "15-30% lower", f"failed: {[r['error'] for r in records]}",
                     "not reproducible here", "the isolated memory measurement failed")]
    from hilbert_lab.reports.page import memory_change, memory_resolution_mib

    before, after = peaks["identity"] / 2**20, peaks["hilbert"] / 2**20
    resolution = memory_resolution_mib(device)
    reduction = 100.0 * (1 - after / before)
    verdict = ("inconclusive" if 0.15 * before < resolution else "confirmed" if 15 - 5 <= reduction
               and before - after >= resolution else "refuted")
    return [_row("C6", "peak memory, forward+backward", f"N={seq_len}, w=[1024, 2048], r=[1, 2], H=8, D=64, fp32, "
                 f"{device}, isolated process", "15-30% lower (8.2 -> 6.9 GB at 100K, ring)",
                 memory_change(before, after, resolution), verdict,
                 "a layout permutation keeps every tensor the same size (plus an index), so it cannot save "
                 "15-30%; the 100K ring figure needs GPUs, the mechanism is measured here")]


def claim_c7(*, repeats: int, device: str, max_tokens: int) -> list[dict]:
    """C7: tokens/s of Hilbert vs standard on six configurations."""
    configurations = (
        ("8K single segment", 8192, [8192], [1], 1.09),
        ("8K multi-segment", 8192, [2048, 4096, 8192], [1, 2, 4], 1.56),
        ("16K no dilation", 16384, [4096], [1], 1.12),
        ("16K dilation 2", 16384, [4096], [2], 2.66),
        ("32K no dilation", 32768, [4096], [1], 1.03),
        ("32K multi-dilation", 32768, [4096, 8192, 16384], [1, 2, 4], 0.97),
    )
    rows = []
    for name, seq_len, lengths, rates, claimed in configurations:
        if seq_len > max_tokens:
            rows.append(_row("C7", name, f"N={seq_len}", f"{claimed:.2f}x", "not run", "not reproducible here",
                             f"above this run's max_tokens={max_tokens} (CPU time budget)"))
            continue
        result = ordering_speedup(seq_len, lengths, rates, repeats=repeats, device=device, num_heads=8, head_dim=64)
        rows.append(_row("C7", name, f"N={seq_len}, w={lengths}, r={rates}, fp32, {device}", f"{claimed:.2f}x",
                         f"{result['speedup']:.2f}x [{result['speedup_low']:.2f}, {result['speedup_high']:.2f}] "
                         f"({result['identity_tokens_per_s']:,.0f} -> {result['ordered_tokens_per_s']:,.0f} tok/s)",
                         timing_verdict(claimed, result["speedup_low"], result["speedup_high"], claimed_on_gpu=True,
                                        device=device),
                         "same attention in both layouts (outputs agree to "
                         f"{result['max_abs_output_difference']:.1e}); claimed on a GTX 1080"))
    return rows


def claim_c8(*, repeats: int, device: str, max_tokens: int) -> list[dict]:
    """C8: SDPA with a dense dilation mask vs manual attention; accuracy; 43.8% sparsity at w=128, r=2."""
    from hilbert_lab.attention.pattern import DilatedPattern
    from hilbert_lab.attention.reference import reference_attention

    rows = []
    pattern = DilatedPattern.create([128], [2])
    sparsities = {n: dilation_mask_sparsity(n, 128, 2, 8) for n in (256, 1024, 4096) if n <= max_tokens}
    within_segment = 1.0 - (64 * 64) / (128 * 128)
    rows.append(_row("C8", "sparsity at w=128, r=2", "8 heads", "43.8%",
                     ", ".join(f"N={n}: {100 * s:.1f}%" for n, s in sparsities.items())
                     + f"; within one segment {100 * within_segment:.1f}%",
                     "refuted" if all(abs(100 * s - 43.8) > 1 for s in sparsities.values())
                     and abs(100 * within_segment - 43.8) > 1 else "confirmed",
                     "exact count of the masked-out share of the score matrix; no definition of the "
                     "pattern gives 43.8%"))
    dense_limit = 4096 if device.startswith("cuda") else 1024  # dense (2, 8, N, N) scores: 4096 is 1 GiB fp32
    for seq_len in (256, 1024, 4096):
        if seq_len > min(max_tokens, dense_limit):
            rows.append(_row("C8", f"SDPA-with-mask speedup over manual, N={seq_len}", "-", "39x", "not run",
                             "not reproducible here", f"dense N x N scores above {min(max_tokens, dense_limit)} "
                             "tokens do not fit this run's memory budget"))
            continue
        q, k, v = make_inputs(seq_len, batch_size=2, num_heads=8, head_dim=64, device=device)
        mask = pattern.dense_mask(seq_len, 8).to(device)  # (H, N, N)
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

        def sdpa_masked():
            return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)

        def manual_masked():
            scores = (qt @ kt.transpose(-1, -2)) * 64 ** -0.5
            return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ vt

        manual_ms, sdpa_ms = time_pair(manual_masked, sdpa_masked, repeats=repeats, device=device)
        speedup, low, high = ratio_with_bounds(manual_ms, sdpa_ms)
        with torch.no_grad():
            expected, _ = reference_attention(q[:1].cpu(), k[:1].cpu(), v[:1].cpu(), pattern) if seq_len <= 1024 else (None, None)
            error = (float((sdpa_masked()[:1].transpose(1, 2).cpu().double() - expected).abs().max())
                     if expected is not None else float("nan"))
        rows.append(_row("C8", f"SDPA-with-mask speedup over manual, N={seq_len}", f"B=2, H=8, D=64, fp32, {device}",
                         "39x (39.22 ms vs 1.00 ms)", f"{speedup:.2f}x [{low:.2f}, {high:.2f}]",
                         timing_verdict(39.0, low, high, claimed_on_gpu=True, device=device),
                         "both compute the same dense masked attention (O(N^2) work, most of it masked); "
                         "the claimed 39x came from a GTX 1080"))
        if np.isfinite(error):
            rows.append(_row("C8", f"accuracy of SDPA with the mask, N={seq_len}", "fp32 vs float64 reference",
                             "no accuracy loss", f"max |error| {error:.1e}",
                             "confirmed" if error < 1e-4 else "refuted",
                             "masked SDPA computes exact attention up to fp32 rounding"))
    return rows


def claim_c9(*, repeats: int, device: str, max_tokens: int = 4096) -> list[dict]:
    """C9: automatic backend selection improves throughput by 20-40%."""
    from hilbert_lab.viz.backends import time_backends

    from hilbert_lab.attention.selection import candidate_backends, rule_backend

    seq_len = min(4096, max_tokens)
    table = time_backends(device=device, seq_len=seq_len, num_heads=8, head_dim=64,
                          segment_lengths=[seq_len // 4, seq_len // 2], dilation_rates=[1, 2], repeats=repeats,
                          backends=candidate_backends(torch.device(device), torch.float32))
    table = table[table["error"] == ""]

    from hilbert_lab.bench.stats import format_ratio, ratio_ci

    auto = rule_backend(torch.device(device), torch.float32)
    times = dict(zip(table["backend"], table["median_ms"]))
    samples = dict(zip(table["backend"], table["times_ms"]))
    measured = ", ".join(f"{name} {ms:.1f} ms" for name, ms in times.items())
    best = min(times, key=times.get)
    gain = (f"auto over manual {format_ratio(*ratio_ci(samples['manual'], samples[auto]))}"
            if "manual" in samples and auto in samples and auto != "manual" else "manual not timed against auto")
    return [_row("C9", "auto vs fixed backends",
                 f"N={seq_len}, w=[{seq_len // 4}, {seq_len // 2}], r=[1, 2], H=8, D=64, fp32, {device}",
                 "+20-40% throughput", f"auto={auto}; {measured}; {gain}; best {best}",
                 "not reproducible here",
                 "the claim names no baseline (its 'manual' backend was one of the choices), so no number can "
                 "confirm it; here auto picks by rule and is compared with every backend")]


def claim_c10() -> list[dict]:
    """C10: ring attention O(n/p) memory per device, 'billions of tokens'. Estimated
    (distributed.memory.estimate_memory_per_rank)."""
    from hilbert_lab.attention.memory import MemoryConfig
    from hilbert_lab.distributed.memory import estimate_memory_per_rank

    base = dict(seq_len=1 << 20, num_heads=8, head_dim=64, segment_lengths=(4096,), dilation_rates=(1,),
                dtype="float16", device="cuda", backend="sdpa")
    per_rank = {p: estimate_memory_per_rank(MemoryConfig(**base, world_size=p)) for p in (1, 2, 4, 8)}
    totals = {p: estimate.total_forward_bytes for p, estimate in per_rank.items()}
    scaling = ", ".join(f"p={p}: {bytes_ / 2**30:.2f} GiB" for p, bytes_ in totals.items())
    halving = all(totals[p] <= 0.6 * totals[q] for p, q in ((4, 2), (8, 4)))  # p=1 has no ring buffers
    billion = estimate_memory_per_rank(MemoryConfig(**{**base, "seq_len": 1 << 30}, world_size=8)).total_forward_bytes
    gpus_needed = int(np.ceil(8 * billion / (141e9)))
    return [
        _row("C10", "O(n/p) memory per device", "1M tokens, H=8, D=64, fp16, forward, model estimate",
             "O(n/p)", scaling, "inconclusive",
             "per-rank memory from hilbert_lab.distributed.memory.estimate_memory_per_rank's ring model (an estimate, not a "
             f"multi-GPU measurement): from p=2 on each doubling of p {'halves' if halving else 'does not halve'} it; "
             "p=1 runs no ring buffers"),
        _row("C10", "billions of tokens", "2^30 tokens on 8 ranks, fp16, forward",
             "supports billions of tokens", f"{billion / 2**30:.0f} GiB per rank on 8 ranks",
             "not reproducible here",
             f"possible in principle with about {gpus_needed} GPUs of 141 GB (per-rank memory falls as 1/p), "
             "far beyond any machine here; nothing was run at that length"),
    ]


def claim_c11() -> list[dict]:
    """C11: memory pool and xFormers factors."""
    from hilbert_lab.attention.executors import unavailable_reason

    reason = unavailable_reason("xformers", "cuda" if torch.cuda.is_available() else "cpu", torch.float16)
    return [_row("C11", "memory pool / xFormers", "Hilbert + DilatedAttention", "0.98x small, pays off at 100K+; "
                 "xFormers 1.08x", "no memory pool in hilbert_lab (PyTorch's caching allocator); "
                 f"xformers: {reason or 'available'}", "not reproducible here",
                 "hilbert_lab has no custom memory pool to compare, and xformers is not installed here")]


def claim_c12(*, repeats: int, device: str, max_tokens: int = 4096) -> list[dict]:
    """C12: Flash-style fused attention 5-10x over the manual backend (on modern GPUs)."""
    from hilbert_lab.reports.claims_verdict import device_reason
    from hilbert_lab.viz.backends import time_backends

    fused = "sdpa_flash" if device.startswith("cuda") else "sdpa"
    seq_len = min(4096, max_tokens)
    table = time_backends(device=device, seq_len=seq_len, num_heads=8, head_dim=64, segment_lengths=[seq_len // 2],
                          dilation_rates=[1], backends=["manual", fused],
                          dtype="float16" if device.startswith("cuda") else "float32", repeats=repeats)
    ok = table[table["error"] == ""].set_index("backend")
    if len(ok) < 2:
        return [_row("C12", "flash vs manual", "-", "5-10x", f"failed: {list(table['error'])}",
                     "not reproducible here", "a backend failed to run")]
    from hilbert_lab.bench.stats import format_ratio, ratio_ci

    speedup, low, high = ratio_ci(ok.loc["manual", "times_ms"], ok.loc[fused, "times_ms"])
    return [_row("C12", f"{fused} vs manual", f"N={seq_len}, w={seq_len // 2}, H=8, D=64, {device}", "5-10x",
                 format_ratio(speedup, low, high),
                 ("confirmed" if 5 <= speedup <= 10 else "refuted") if device.startswith("cuda")
                 else "not reproducible here",
                 device_reason(device))]
