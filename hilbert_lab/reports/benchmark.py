"""Benchmark report logic: a case matrix through the isolated bench runner, useful FLOPs, tidy tables."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np


def useful_flops(case: dict[str, Any]) -> float:
    """Forward FLOPs of the useful pairs (bench.flops.useful_pairs): 4 * B * D per pair (QK^T and PV); x3 for
    forward+backward."""
    from hilbert_lab.attention.pattern import DilatedPattern
    from hilbert_lab.bench.flops import useful_pairs

    pattern = DilatedPattern.create(list(case["segment_lengths"]), list(case["dilation_rates"]),
                                    mode=case.get("mode", "longnet"), causal=bool(case.get("causal", False)))
    pairs = useful_pairs(pattern, case["seq_len"], case["num_heads"])
    flops = 4.0 * case.get("batch_size", 1) * case["head_dim"] * pairs
    return flops * (3.0 if case.get("pass") == "forward_backward" else 1.0)


def benchmark_cases(*, device: str, dtype: str, seq_lens: Sequence[int], modes: Sequence[str],
                    orderings: Sequence[str], backends: Sequence[str], segment_lengths: Sequence[int],
                    dilation_rates: Sequence[int], batch_size: int, num_heads: int, head_dim: int, repeats: int,
                    warmup: int, causal: bool = False, passes: Sequence[str] = ("forward",),
                    threads: int | None = None) -> list[dict[str, Any]]:
    """Validated bench cases: backends x seq_lens x modes x orderings x passes ("identity" -> ordering None).

    threads pins torch's CPU threads in each case's process (CPU cases only; None leaves the default)."""
    from hilbert_lab.bench import expand_matrix

    base = {"kind": "attention", "device": device, "dtype": dtype, "segment_lengths": list(segment_lengths),
            "dilation_rates": list(dilation_rates), "batch_size": batch_size, "num_heads": num_heads,
            "head_dim": head_dim, "repeats": repeats, "warmup": warmup, "causal": causal,
            "threads": threads if str(device) == "cpu" else None}
    matrix = {"backend": list(backends), "seq_len": list(seq_lens), "mode": list(modes),
              "ordering": [None if ordering == "identity" else ordering for ordering in orderings],
              "pass": list(passes)}
    return expand_matrix(base, matrix)


def run_benchmark(cases: list[dict[str, Any]], results_path: str | Path, *, progress: bool = True,
                  case_timeout_s: float | None = None) -> list[dict[str, Any]]:
    """Run `cases` in isolated subprocesses (SafeBenchmarkRunner, append-only JSON lines); their records."""
    from hilbert_lab.bench import SafeBenchmarkRunner, read_results
    from hilbert_lab.bench.config import SafetyConfig

    config = SafetyConfig() if case_timeout_s is None else SafetyConfig(case_timeout_s=case_timeout_s)
    runner = SafeBenchmarkRunner(str(results_path), config=config, progress=progress)
    runner.run(cases)
    records, _malformed = read_results(str(results_path))
    wanted = {case_key(case) for case in cases}
    return [record for record in records if case_key(record["params"]) in wanted]


def case_key(case: dict[str, Any]) -> str:
    from hilbert_lab.bench import case_id

    return case_id(case)


def results_table(records: list[dict[str, Any]]) -> Any:
    """Tidy DataFrame: one row per case with status, median/min/max ms, tokens/s, useful TFLOP/s, peak MiB
    and the per-repeat times (times_ms, a list: the page's intervals come from them)."""
    import pandas as pd

    rows = []
    for record in records:
        case, result = record["params"], record.get("result") or {}
        times = result.get("times_ms") or []
        median = result.get("time_ms_median", float("nan"))
        ok = record["status"] == "ok" and np.isfinite(median)
        flops = useful_flops(case)
        peak = result.get("peak_bytes")
        rows.append({
            "backend": case["backend"], "seq_len": case["seq_len"], "mode": case["mode"],
            "ordering": case["ordering"] or "identity", "pass": case["pass"], "status": record["status"],
            "median_ms": median if ok else float("nan"),
            "min_ms": min(times) if ok and times else float("nan"),
            "max_ms": max(times) if ok and times else float("nan"),
            "tokens_per_s": case["batch_size"] * case["seq_len"] / (median / 1e3) if ok else float("nan"),
            "useful_tflops": flops / (median / 1e3) / 1e12 if ok else float("nan"),
            "useful_gflop": flops / 1e9,
            "peak_mib": peak / 2**20 if ok and peak is not None else float("nan"),
            "peak_method": result.get("peak_method", ""),
            "error": record.get("error") or "",
            "times_ms": [float(t) for t in times] if ok else [],
        })
    return pd.DataFrame(rows)


def scaling_figure(table: Any, value: str = "median_ms", title: str | None = None) -> Any:
    """Log-log lines of `value` against seq_len, one line per (backend, mode, ordering, pass)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for key, group in table.groupby(["backend", "mode", "ordering", "pass"], sort=False):
        group = group.sort_values("seq_len")
        fig.add_trace(go.Scatter(x=group["seq_len"].tolist(), y=group[value].tolist(), mode="lines+markers",
                                 name=" / ".join(map(str, key))))
    axis = {"median_ms": "median time (ms, lower is better)", "useful_tflops": "useful TFLOP/s (higher is better)",
            "peak_mib": "peak memory above inputs (MiB, lower is better)"}.get(value, value)
    fig.update_layout(title=title or f"{value} vs sequence length", xaxis_title="sequence length (tokens)",
                      yaxis_title=axis,
                      xaxis_type="log", yaxis_type="log" if value in ("median_ms", "peak_mib") else "linear",
                      height=420)
    return fig


def ordering_ab(*, device: str, dtype: str, seq_lens: Sequence[int], modes: Sequence[str], orderings: Sequence[str],
                segment_lengths: Sequence[int], dilation_rates: Sequence[int], batch_size: int, num_heads: int,
                head_dim: int, repeats: int, backend: str = "auto", threads: int | None = 1, seed: int = 0,
                progress: bool = False) -> Any:
    """Identity vs each other ordering timed alternately in one process (bench.timing.time_interleaved):
    DataFrame (seq_len, mode, backend, ordering, identity_times_ms, ordered_times_ms, max_abs_difference).

    threads pins torch's CPU threads during the timing (ignored on CUDA); the outputs of the two layouts
    are compared (an ordering is a permutation in memory: the difference must be ~0).
    """
    import pandas as pd
    import torch
    from tqdm.auto import tqdm

    from hilbert_lab.attention.engine import dilated_attention
    from hilbert_lab.bench.timing import time_interleaved

    torch_dtype = getattr(torch, dtype)
    cuda = str(device).startswith("cuda")
    rows = []
    jobs = [(n, m, o) for n in seq_lens for m in modes for o in orderings if o != "identity"]
    for seq_len, mode, ordering in tqdm(jobs, desc="A/B", disable=not progress):
        generator = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(batch_size, seq_len, num_heads, head_dim, generator=generator)
                   .to(device=device, dtype=torch_dtype) for _ in range(3))
        lengths = [w for w in segment_lengths if w <= seq_len] or [seq_len]
        rates = list(dilation_rates)[:len(lengths)]

        def run(layout: str | None):
            with torch.no_grad():
                return dilated_attention(q, k, v, segment_lengths=lengths, dilation_rates=rates, mode=mode,
                                         backend=backend, ordering=layout)

        difference = float((run(None).double() - run(ordering).double()).abs().max())
        timings = time_interleaved({"identity": lambda: run(None), "ordered": lambda: run(ordering)}, device=device,
                                   warmup=1, rounds=repeats, max_seconds=float("inf"),
                                   threads=None if cuda else threads)
        rows.append({"seq_len": seq_len, "mode": mode, "backend": backend, "ordering": ordering,
                     "identity_times_ms": list(timings["identity"].samples),
                     "ordered_times_ms": list(timings["ordered"].samples),
                     "max_abs_difference": difference})
    return pd.DataFrame(rows, columns=["seq_len", "mode", "backend", "ordering", "identity_times_ms",
                                       "ordered_times_ms", "max_abs_difference"])


# ---------------------------------------------------------------------------------------------------
# the page (a pure function of metrics.json + env.json)

def _rows(metrics: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return list(((metrics.get("tables") or {}).get(name) or {}).get("rows") or [])


def comparisons(metrics: dict[str, Any]) -> Any:
    """Ordering vs identity with 95% intervals: from the interleaved A/B table when the run has one
    ("interleaved"), else from the per-case repeats of the results table ("separate runs")."""
    import pandas as pd

    from hilbert_lab.bench.stats import compare

    rows = []
    ab = _rows(metrics, "ordering_ab")
    if ab:
        for row in ab:
            result = compare(row["ordered_times_ms"], row["identity_times_ms"], row["ordering"], "identity")
            rows.append({"backend": row["backend"], "mode": row["mode"], "seq_len": row["seq_len"],
                         "ordering": row["ordering"], "timing": "interleaved", **result})
    else:
        results = [row for row in _rows(metrics, "results") if row.get("status") == "ok" and row.get("times_ms")]
        keys = ("backend", "mode", "pass", "seq_len")
        identity = {tuple(row[key] for key in keys): row for row in results if row["ordering"] == "identity"}
        for row in results:
            base = identity.get(tuple(row[key] for key in keys))
            if row["ordering"] == "identity" or base is None:
                continue
            result = compare(row["times_ms"], base["times_ms"], row["ordering"], "identity")
            rows.append({"backend": row["backend"], "mode": row["mode"], "seq_len": row["seq_len"],
                         "ordering": row["ordering"], "timing": "separate runs", **result})
    return pd.DataFrame(rows)


def _case_label(row: dict[str, Any]) -> str:
    return f"{row['backend']} / {row['ordering']}" + (f" / {row['mode']}" if row.get("mode") != "longnet" else "")


def render(metrics: dict[str, Any], env: dict[str, Any]) -> Any:
    """Benchmark page: summary with the ordering verdicts, time / TFLOP/s / memory / speedup figures with
    intervals and conclusions, comparison and case tables."""
    import numpy as np
    import pandas as pd
    import plotly.graph_objects as go

    from hilbert_lab.bench.stats import bootstrap_median_ci, format_ratio
    from hilbert_lab.reports.page import CPU_TIMING_NOTE, Page, Section, fmt, fmt_interval, is_gpu_env, style_axes

    gpu = is_gpu_env(env)
    parameters = metrics.get("parameters") or {}
    results = _rows(metrics, "results")
    ok = [row for row in results if row.get("status") == "ok"]
    pass_name = {"forward": "forward", "forward_backward": "forward+backward"}
    for row in ok:
        samples = row.get("times_ms") or [row["median_ms"]]
        row["median"], row["low"], row["high"] = bootstrap_median_ci(samples)
        row["repeats"] = len(row.get("times_ms") or [])
    sections: list[Section] = []
    bullets: list[str] = []
    lines: dict[str, list[dict]] = {}
    for row in ok:
        lines.setdefault(_case_label(row) + ("" if row["pass"] == "forward" else " (fwd+bwd)"), []).append(row)

    ticks = sorted({row["seq_len"] for row in ok})
    # time vs length
    fig = go.Figure()
    for label, group in lines.items():
        group = sorted(group, key=lambda r: r["seq_len"])
        fig.add_trace(go.Scatter(
            x=[r["seq_len"] for r in group], y=[r["median"] for r in group], name=label, mode="lines+markers",
            error_y=dict(type="data", symmetric=False, array=[r["high"] - r["median"] for r in group],
                         arrayminus=[r["median"] - r["low"] for r in group])))
    style_axes(fig, "sequence length (tokens, log scale)", "time per call (ms, log scale; lower is better)", ticks)
    fig.update_layout(title="median time per call vs sequence length (bars: 95% interval of the median)",
                      xaxis_type="log", yaxis_type="log", height=440)
    conclusion = "no case finished"
    if ok:
        longest = max(row["seq_len"] for row in ok)
        at_longest = sorted((row for row in ok if row["seq_len"] == longest), key=lambda r: r["median"])
        best = at_longest[0]
        conclusion = (f"At {longest:,} tokens the fastest case is {_case_label(best)}: "
                      f"{fmt_interval(best['median'], best['low'], best['high'], 'ms')}")
        if len(at_longest) > 1:
            second = at_longest[1]
            overlap = second["low"] <= best["high"]
            conclusion += (f"; {_case_label(second)} is {'within noise of it' if overlap else 'slower'} "
                           f"({fmt_interval(second['median'], second['low'], second['high'], 'ms')})")
        slopes = []
        for label, group in lines.items():
            group = sorted(group, key=lambda r: r["seq_len"])
            if len(group) >= 2:
                slope = np.polyfit(np.log([r["seq_len"] for r in group]), np.log([r["median"] for r in group]), 1)[0]
                slopes.append(slope)
        if slopes:
            conclusion += (f". Time grows like N^{min(slopes):.2f} to N^{max(slopes):.2f} across the cases "
                           f"(1.0 = linear, as the dilated pattern's work is).")
        else:
            conclusion += "."
    sections.append(Section("Time per call", conclusion, figure=fig))

    # useful TFLOP/s
    fig = go.Figure()
    for label, group in lines.items():
        group = sorted(group, key=lambda r: r["seq_len"])
        fig.add_trace(go.Scatter(x=[r["seq_len"] for r in group], y=[r["useful_tflops"] for r in group], name=label,
                                 mode="lines+markers"))
    style_axes(fig, "sequence length (tokens, log scale)", "useful TFLOP/s (higher is better)", ticks)
    fig.update_layout(title="useful TFLOP/s vs sequence length (FLOPs of the pairs the pattern computes)",
                      xaxis_type="log", height=400)
    if ok:
        top = max(ok, key=lambda r: r["useful_tflops"])
        flops_conclusion = (f"Highest useful throughput: {fmt(top['useful_tflops'])} TFLOP/s "
                            f"({_case_label(top)} at {top['seq_len']:,} tokens).")
    else:
        flops_conclusion = "no case finished"
    sections.append(Section("Useful throughput", flops_conclusion, figure=fig))

    # ordering comparisons
    table = comparisons(metrics)
    if len(table):
        timing = table["timing"].iloc[0]
        counts = table["verdict"].value_counts()
        faster = int(sum(count for verdict, count in counts.items() if verdict != "identity faster"
                         and verdict != "no difference"))
        slower = int(counts.get("identity faster", 0))
        same = int(counts.get("no difference", 0))
        fig = go.Figure()
        for (backend, mode, ordering), group in table.groupby(["backend", "mode", "ordering"], sort=False):
            group = group.sort_values("seq_len")
            fig.add_trace(go.Scatter(
                x=group["seq_len"].tolist(), y=group["speedup"].tolist(), mode="lines+markers",
                name=f"{backend} / {ordering}" + ("" if mode == "longnet" else f" / {mode}"),
                error_y=dict(type="data", symmetric=False, array=(group["speedup_high"] - group["speedup"]).tolist(),
                             arrayminus=(group["speedup"] - group["speedup_low"]).tolist())))
        fig.add_hline(y=1.0, line_dash="dash", line_color="#888", annotation_text="no difference")
        style_axes(fig, "sequence length (tokens, log scale)",
                   "speedup over identity layout (x; above 1 = ordering faster)", ticks)
        fig.update_layout(title=f"ordering vs identity, time ratio with 95% bootstrap interval ({timing})",
                          xaxis_type="log", height=420)
        real = table[table["verdict"] != "no difference"]
        if len(real):
            largest = real.iloc[(np.log(real["speedup"])).abs().argmax()]
            effect = (f"Largest effect beyond noise: {largest['ordering']} at {int(largest['seq_len']):,} tokens "
                      f"({largest['backend']}), "
                      f"{format_ratio(largest['speedup'], largest['speedup_low'], largest['speedup_high'])} "
                      f"({largest['verdict']}).")
        else:
            effect = "No ordering differs from identity beyond noise: every 95% interval contains 1."
        comparison_conclusion = (f"{len(table)} comparisons ({timing}): ordering faster in {faster}, identity "
                                 f"faster in {slower}, no difference in {same}. {effect}")
        sections.append(Section("Token orderings against the identity layout", comparison_conclusion, figure=fig,
                                text=["An ordering only moves tokens in memory (per segment, after dilation): "
                                      "the attention computed is the same, so any difference is layout alone."]))
        display = pd.DataFrame({
            "backend": table["backend"], "mode": table["mode"], "tokens": table["seq_len"],
            "ordering": table["ordering"],
            "identity ms [95%]": [fmt_interval(r.b_median, r.b_low, r.b_high) for r in table.itertuples()],
            "ordered ms [95%]": [fmt_interval(r.a_median, r.a_low, r.a_high) for r in table.itertuples()],
            "speedup [95%]": [format_ratio(r.speedup, r.speedup_low, r.speedup_high) for r in table.itertuples()],
            "repeats": table["samples"], "verdict": table["verdict"]})
        sections.append(Section("Ordering comparisons", table=display,
                                caption="speedup = identity time / ordered time; verdict 'no difference' when "
                                        "the interval contains 1"))
        how = "interleaved" if timing == "interleaved" else "in separate runs"
        bullets.append(f"Orderings vs identity (timed {how}): faster in {faster}, slower in {slower}, "
                       f"no difference in {same} of {len(table)} comparisons.")
        bullets.append(effect)

    if any(not pd.isna(row.get("peak_mib")) and row.get("peak_mib") is not None for row in ok):
        fig = go.Figure()
        for label, group in lines.items():
            group = sorted(group, key=lambda r: r["seq_len"])
            fig.add_trace(go.Scatter(x=[r["seq_len"] for r in group], y=[r["peak_mib"] for r in group], name=label,
                                     mode="lines+markers"))
        style_axes(fig, "sequence length (tokens, log scale)", "peak memory above inputs (MiB, lower is better)", ticks)
        fig.update_layout(title="peak memory vs sequence length", xaxis_type="log", yaxis_type="log", height=400)
        method = next((row.get("peak_method") for row in ok if row.get("peak_method")), "")
        top = max((row for row in ok if row.get("peak_mib") is not None), key=lambda r: r["peak_mib"])
        sections.append(Section("Peak memory", f"Largest peak: {fmt(top['peak_mib'])} MiB ({_case_label(top)} at "
                                f"{top['seq_len']:,} tokens; measured by {method or 'the runner'}).", figure=fig))

    cases = pd.DataFrame([{
        "backend": row["backend"], "tokens": row["seq_len"], "mode": row["mode"], "ordering": row["ordering"],
        "pass": pass_name.get(row["pass"], row["pass"]), "status": row["status"],
        "median ms [95%]": fmt_interval(row["median"], row["low"], row["high"]) if row in ok else "-",
        "repeats": row.get("repeats", 0), "tokens/s": row.get("tokens_per_s"),
        "useful TFLOP/s": row.get("useful_tflops"), "peak MiB": row.get("peak_mib"),
        "error": row.get("error") or ""} for row in results])
    sections.append(Section("Every case", table=cases,
                            caption="one isolated process per case; intervals from the per-repeat times"))
    finished = f"{len(ok)} of {len(results)} cases finished"
    bullets.insert(0, finished + (f" on {parameters.get('device', 'cpu')}, {parameters.get('dtype', '')}; "
                                  f"{parameters.get('repeats', '?')} repeats per case."))
    lengths = sorted({row["seq_len"] for row in results})
    summary = (f"Dilated attention timed over {len(lengths)} sequence lengths "
               f"({', '.join(f'{n:,}' for n in lengths)} tokens), backends "
               f"{', '.join(sorted({row['backend'] for row in results}))}, orderings "
               f"{', '.join(sorted({row['ordering'] for row in results}))}. Times are medians with 95% bootstrap "
               f"intervals; a ratio whose interval contains 1 is reported as no difference.")
    headline = " ".join(bullets[:2]) if bullets else finished
    notes = [] if gpu else [CPU_TIMING_NOTE]
    return Page(title="Benchmark: dilated attention time, throughput and memory", summary=summary,
                headline=headline, sections=sections, notes=notes, bullets=bullets)
