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
    """Tidy DataFrame: one row per case with status, median/min/max ms, tokens/s, useful TFLOP/s, peak MiB,
    the backend that ran (backend_used: what "auto" chose, when the worker recorded it) and the per-repeat
    times (times_ms, a list: the page's intervals come from them)."""
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
            "backend_used": result.get("backend_used") or (case["backend"] if case["backend"] != "auto" else ""),
            "error": record.get("error") or "",
            "times_ms": [float(t) for t in times] if ok else [],
        })
    return pd.DataFrame(rows)


def scaling_figure(table: Any, value: str = "median_ms", title: str | None = None) -> Any:
    """Log-log lines of `value` against seq_len, one line per (backend, mode, ordering, pass); log axes with
    labelled ticks, coinciding lines drawn apart (viz.style)."""
    import plotly.graph_objects as go

    from hilbert_lab.viz.style import ordering_name, ordering_trace, readable_log_axes, separate_overlapping

    fig = go.Figure()
    variants: dict[tuple[Any, ...], int] = {}
    for (backend, mode, ordering, pass_), group in table.groupby(["backend", "mode", "ordering", "pass"], sort=False):
        group = group.sort_values("seq_len")
        variant = variants.setdefault((backend, mode, pass_), len(variants))
        fig.add_trace(go.Scatter(x=group["seq_len"].tolist(), y=group[value].tolist(), mode="lines+markers",
                                 name=" / ".join([str(backend), ordering_name(ordering), str(mode), str(pass_)]),
                                 **ordering_trace(ordering, variant)))
    axis = {"median_ms": "median time (ms, lower is better)", "useful_tflops": "useful TFLOP/s (higher is better)",
            "peak_mib": "peak memory above inputs (MiB, lower is better)"}.get(value, value)
    fig.update_layout(title=title or f"{value} vs sequence length", xaxis_title="sequence length (tokens)",
                      yaxis_title=axis,
                      xaxis_type="log", yaxis_type="log" if value in ("median_ms", "peak_mib") else "linear",
                      height=420)
    return separate_overlapping(readable_log_axes(fig))


def ordering_ab(*, device: str, dtype: str, seq_lens: Sequence[int], modes: Sequence[str], orderings: Sequence[str],
                segment_lengths: Sequence[int], dilation_rates: Sequence[int], batch_size: int, num_heads: int,
                head_dim: int, repeats: int, backend: str = "auto", threads: int | None = 1, seed: int = 0,
                progress: bool = False, max_rounds: int | None = None) -> Any:
    """Identity vs each other ordering timed alternately in one process (bench.timing.time_interleaved):
    DataFrame (seq_len, mode, backend, ordering, segment_lengths, dilation_rates, identity_times_ms,
    ordered_times_ms, max_abs_difference, rounds, settled). The pattern is the cases' own (a segment longer than
    the sequence covers it, as in benchmark_cases), so the two tables time the same attention.

    Rounds come `repeats` at a time until the speed-up's interval settles (bench.stats.settled: it excludes 1, or
    lies within 5% of it) or `max_rounds` (default 4 x repeats) are spent; `settled` says which.

    threads pins torch's CPU threads during the timing (ignored on CUDA); the outputs of the two layouts
    are compared (an ordering is a permutation in memory: the difference must be ~0).
    """
    import pandas as pd
    import torch
    from tqdm.auto import tqdm

    from hilbert_lab.attention.engine import dilated_attention
    from hilbert_lab.bench.stats import ratio_ci, settled
    from hilbert_lab.bench.timing import time_interleaved

    if repeats < 1 or (max_rounds is not None and max_rounds < repeats):
        raise ValueError(f"repeats must be >= 1 and max_rounds None or >= repeats, got {repeats} and {max_rounds}")
    limit = 4 * repeats if max_rounds is None else max_rounds
    torch_dtype = getattr(torch, dtype)
    cuda = str(device).startswith("cuda")
    rows = []
    jobs = [(n, m, o) for n in seq_lens for m in modes for o in orderings if o != "identity"]
    for seq_len, mode, ordering in tqdm(jobs, desc="A/B", disable=not progress):
        generator = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(batch_size, seq_len, num_heads, head_dim, generator=generator)
                   .to(device=device, dtype=torch_dtype) for _ in range(3))
        lengths, rates = list(segment_lengths), list(dilation_rates)

        def run(layout: str | None):
            with torch.no_grad():
                return dilated_attention(q, k, v, segment_lengths=lengths, dilation_rates=rates, mode=mode,
                                         backend=backend, ordering=layout)

        difference = float((run(None).double() - run(ordering).double()).abs().max())
        samples: dict[str, list[float]] = {"identity": [], "ordered": []}
        decided = False
        while not decided and len(samples["identity"]) < limit:
            timings = time_interleaved({"identity": lambda: run(None), "ordered": lambda: run(ordering)},
                                       device=device, warmup=0 if samples["identity"] else 1,
                                       rounds=min(repeats, limit - len(samples["identity"])),
                                       max_seconds=float("inf"), threads=None if cuda else threads)
            for name, timing in timings.items():
                samples[name] += list(timing.samples)
            decided = settled(*ratio_ci(samples["identity"], samples["ordered"])[1:])
        rows.append({"seq_len": seq_len, "mode": mode, "backend": backend, "ordering": ordering,
                     "segment_lengths": lengths, "dilation_rates": rates, "identity_times_ms": samples["identity"],
                     "ordered_times_ms": samples["ordered"], "max_abs_difference": difference,
                     "rounds": len(samples["identity"]), "settled": decided})
    return pd.DataFrame(rows, columns=["seq_len", "mode", "backend", "ordering", "segment_lengths", "dilation_rates",
                                       "identity_times_ms", "ordered_times_ms", "max_abs_difference", "rounds",
                                       "settled"])


# ---------------------------------------------------------------------------------------------------
# the page (a pure function of metrics.json + env.json)

def _rows(metrics: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return list(((metrics.get("tables") or {}).get(name) or {}).get("rows") or [])


# a comparison's columns (bench.stats.compare's keys after the case's), also where the run compared no ordering
COMPARISON_COLUMNS = ("backend", "mode", "seq_len", "ordering", "timing", "a_median", "a_low", "a_high", "b_median",
                      "b_low", "b_high", "speedup", "speedup_low", "speedup_high", "samples", "verdict", "settled",
                      "text")


def comparisons(metrics: dict[str, Any]) -> Any:
    """Ordering vs identity with 95% intervals: from the interleaved A/B table when the run has one
    ("interleaved": repeats paired by round), else from the per-case repeats of the results table ("separate
    runs": each side resampled on its own, since the i-th repeats of two processes have nothing in common)."""
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
            result = compare(row["times_ms"], base["times_ms"], row["ordering"], "identity", paired=False)
            rows.append({"backend": row["backend"], "mode": row["mode"], "seq_len": row["seq_len"],
                         "ordering": row["ordering"], "timing": "separate runs", **result})
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)
