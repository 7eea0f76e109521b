"""Benchmark report logic: a case matrix through the isolated bench runner, useful FLOPs, tidy tables."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np


def useful_pairs(seq_len: int, num_heads: int, segment_lengths: Sequence[int], dilation_rates: Sequence[int],
                 mode: str = "longnet", causal: bool = False) -> int:
    """Query-key pairs the dilated attention computes, summed over heads and branches.

    Each (branch, offset) group attends within its segments: c selected tokens give c*c pairs
    (c*(c+1)/2 causal). A pair allowed by two branches counts twice, as the branches compute it twice
    (the reference weighs it twice). Padding and masked-out work done by a kernel are not counted.
    """
    from hilbert_lab.attention.pattern import DilatedPattern

    pattern = DilatedPattern.create(list(segment_lengths), list(dilation_rates), mode=mode, causal=causal)
    total = 0
    for group in pattern.groups(seq_len, num_heads):
        counts = (group.index >= 0).sum(dim=1).numpy().astype(np.int64)
        pairs = counts * (counts + 1) // 2 if causal else counts * counts
        total += int(pairs.sum()) * len(group.heads)
    return total


def useful_flops(case: dict[str, Any]) -> float:
    """Forward FLOPs of the useful pairs: 4 * B * D per pair (QK^T and PV); x3 for forward+backward."""
    pairs = useful_pairs(case["seq_len"], case["num_heads"], case["segment_lengths"], case["dilation_rates"],
                         case.get("mode", "longnet"), bool(case.get("causal", False)))
    flops = 4.0 * case.get("batch_size", 1) * case["head_dim"] * pairs
    return flops * (3.0 if case.get("pass") == "forward_backward" else 1.0)


def benchmark_cases(*, device: str, dtype: str, seq_lens: Sequence[int], modes: Sequence[str],
                    orderings: Sequence[str], backends: Sequence[str], segment_lengths: Sequence[int],
                    dilation_rates: Sequence[int], batch_size: int, num_heads: int, head_dim: int, repeats: int,
                    warmup: int, causal: bool = False, passes: Sequence[str] = ("forward",)) -> list[dict[str, Any]]:
    """Validated bench cases: backends x seq_lens x modes x orderings x passes ("identity" -> ordering None)."""
    from hilbert_lab.bench import expand_matrix

    base = {"kind": "attention", "device": device, "dtype": dtype, "segment_lengths": list(segment_lengths),
            "dilation_rates": list(dilation_rates), "batch_size": batch_size, "num_heads": num_heads,
            "head_dim": head_dim, "repeats": repeats, "warmup": warmup, "causal": causal}
    matrix = {"backend": list(backends), "seq_len": list(seq_lens), "mode": list(modes),
              "ordering": [None if ordering == "identity" else ordering for ordering in orderings],
              "pass": list(passes)}
    return expand_matrix(base, matrix)


def run_benchmark(cases: list[dict[str, Any]], results_path: str | Path, *, progress: bool = True,
                  case_timeout_s: float | None = None) -> list[dict[str, Any]]:
    """Run `cases` in isolated subprocesses (SafeBenchmarkRunner, append-only JSON lines); their records."""
    from hilbert_lab.bench import SafeBenchmarkRunner, read_results
    from hilbert_lab.safety.config import SafetyConfig

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
    """Tidy DataFrame: one row per case with status, median/min/max ms, tokens/s, useful TFLOP/s, peak MiB."""
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
            "error": (record.get("error") or "")[:160],
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
    fig.update_layout(title=title or f"{value} vs sequence length", xaxis_title="tokens", yaxis_title=value,
                      xaxis_type="log", yaxis_type="log" if value in ("median_ms", "peak_mib") else "linear",
                      height=420)
    return fig


def ordering_speedups(table: Any) -> Any:
    """DataFrame: for each non-identity ordering case, median identity time / its median time (same
    backend, mode, pass and seq_len)."""
    import pandas as pd

    ok = table[table["status"] == "ok"]
    keys = ["backend", "mode", "pass", "seq_len"]
    baseline = ok[ok["ordering"] == "identity"].set_index(keys)["median_ms"]
    rows = []
    for record in ok[ok["ordering"] != "identity"].to_dict(orient="records"):
        key = tuple(record[name] for name in keys)
        if key in baseline.index:
            rows.append({**{name: record[name] for name in keys}, "ordering": record["ordering"],
                         "speedup_vs_identity": float(baseline[key] / record["median_ms"])})
    return pd.DataFrame(rows, columns=keys + ["ordering", "speedup_vs_identity"])
