# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Benchmark report
# Backends x sequence lengths x modes x orderings, each case in its own process through
# `hilbert_lab.bench.SafeBenchmarkRunner` (append-only results, memory checks, timeouts). Reported per case:
# median / min / max wall time over `repeats`, tokens/s, useful TFLOP/s (4 * B * D FLOPs per query-key pair
# the dilated pattern computes, summed over branches and heads: no padding, no masked work) and peak
# memory above the inputs (CUDA: max_memory_allocated; CPU: peak RSS of the isolated process).
#
# Orderings are also timed against the identity layout in one process, alternating A and B (`ab_repeats`
# pairs, `threads` pinned CPU threads, as in the per-case runs), which the page uses for the ordering
# verdicts: the median ratio with its 95% bootstrap interval, "no difference" when the interval
# contains 1. The page itself (`benchmark-small.html` / `benchmark.html`) is rebuilt from metrics.json by
# `hilbert_lab.reports.benchmark.render`.

# %% tags=["parameters"]
device = "cpu"
dtype = "float32"
seq_lens = [1024, 2048, 4096, 8192]
modes = ["longnet", "head_groups"]
orderings = ["identity", "hilbert", "morton"]
backends = ["auto", "manual"]
segment_lengths = [512, 1024]
dilation_rates = [1, 2]
batch_size = 1
num_heads = 8
head_dim = 64
repeats = 5
warmup = 1
ab_repeats = 21
threads = 1
ab_backend = "auto"
case_timeout_s = 300.0
auto_check = "reports/results/auto_table/check_h200_7692652.json"  # committed GPU check of auto's table ("" for none)
save_png = True
output_dir = "."

# %%
from pathlib import Path

from hilbert_lab.reports.benchmark import benchmark_cases, results_table, run_benchmark, scaling_figure
from hilbert_lab.reports.recorder import ReportRecorder

parameters = dict(device=device, dtype=dtype, seq_lens=seq_lens, modes=modes, orderings=orderings, backends=backends,
                  segment_lengths=segment_lengths, dilation_rates=dilation_rates, batch_size=batch_size,
                  num_heads=num_heads, head_dim=head_dim, repeats=repeats, warmup=warmup, threads=threads or None)
recorder = ReportRecorder(output_dir, "benchmark", {**parameters, "case_timeout_s": case_timeout_s, "save_png": save_png,
                                                   "ab_repeats": ab_repeats, "ab_backend": ab_backend}, png=save_png)
cases = benchmark_cases(**parameters)
recorder.metric("cases", len(cases))

# %%
records = run_benchmark(cases, Path(output_dir) / "bench_results.jsonl", case_timeout_s=case_timeout_s)
table = results_table(records)
recorder.metric("cases ok", int((table["status"] == "ok").sum()), note=f"of {len(table)}")
recorder.table("results", table, caption="every case (times in ms; NaN where a case did not finish)")

# %% [markdown]
# ## Scaling

# %%
ok = table[table["status"] == "ok"].drop(columns=["times_ms"])
recorder.figure("time_scaling", scaling_figure(ok, "median_ms", "median forward time vs tokens"), png=True)
recorder.figure("tflops_scaling", scaling_figure(ok, "useful_tflops", "useful TFLOP/s vs tokens"), png=True)
if ok["peak_mib"].notna().any():
    recorder.figure("memory_scaling", scaling_figure(ok, "peak_mib", "peak memory above inputs (MiB) vs tokens"))

# %% [markdown]
# ## Orderings against identity (same attention, different layout)

# %%
from hilbert_lab.reports.benchmark import comparisons, ordering_ab

if ab_repeats > 0 and "identity" in orderings and len(orderings) > 1:
    ab = ordering_ab(device=device, dtype=dtype, seq_lens=seq_lens, modes=modes, orderings=orderings,
                     segment_lengths=segment_lengths, dilation_rates=dilation_rates, batch_size=batch_size,
                     num_heads=num_heads, head_dim=head_dim, repeats=ab_repeats, backend=ab_backend,
                     threads=threads or None)
    recorder.table("ordering_ab", ab, caption="interleaved identity / ordered times (ms) per pair", show=False)
comparisons(recorder.data)[["backend", "mode", "seq_len", "ordering", "timing", "speedup", "speedup_low",
                            "speedup_high", "verdict"]]

# %% [markdown]
# ## auto's measured table (a committed GPU check)
# Per cell of the table `backend="auto"` reads on that GPU (`benchmarks/bench_auto_table.py`): the executor auto
# picked, its time by name over the fastest executor's, and auto's own time over it.

# %%
import pandas as pd

from hilbert_lab.reports.auto_check import auto_check_source, auto_check_table, load_auto_check
from hilbert_lab.viz.backends import auto_choice_heatmap

auto_data = load_auto_check(auto_check) if auto_check else None
if auto_data is not None:
    auto_rows = auto_check_table(auto_data)
    recorder.table("auto_check", auto_rows, caption=f"auto against the fastest executor ({auto_check})", show=False)
    recorder.table("auto_check_source", pd.DataFrame([auto_check_source(auto_data, auto_check)]), show=False)
    auto_choice_heatmap(auto_rows.to_dict("records")).show()
