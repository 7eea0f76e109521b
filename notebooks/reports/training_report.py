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
# # Training report
# Loss and accuracy curves of LongNet language-model training runs on the needle-retrieval task
# (`hilbert_lab.models.tasks.RetrievalTask`): key/value pairs lie in the context and a question at the end
# asks for the value of one key; loss and accuracy are measured on the answer tokens only. The GPU runs
# are the JSON logs that `benchmarks/train_gpu.py` wrote (committed under `reports/results/`); paths are
# resolved against the repository root. `cpu_train_steps > 0` adds a live run of the `cpu-tiny` preset
# trained here on the CPU.
#
# `runs` maps a group (one loss figure and one accuracy figure) to {run label: JSON path}.

# %% tags=["parameters"]
runs = {
    "32K needle retrieval on one H100": {
        "H100 32K curriculum": "reports/results/train_gpu_h100.json",
        "H100 short curriculum": "reports/results/train_gpu_h100_short_curriculum.json",
        "H100 no curriculum": "reports/results/train_gpu_h100_no_curriculum.json",
    },
    "128K needle retrieval on one H100 (dil8 fine-tuned from 32K)": {
        "H100 128K dil8 fine-tune (32K seed 0)": "reports/results/train_gpu_h100_128k.json",
        "H100 128K dil8 fine-tune (32K seed 1)": "reports/results/train_gpu_h100_128k_seed1.json",
    },
    "128K retrieval, context parallel on 2 H200s": {
        "2 H200 context parallel 128K fine-tune (32K seed 2)": "reports/results/train_mesh/retrieval_128k_cp2_h200.json",
    },
    "32K start of the 2-GPU run, one H200": {
        "H200 32K seed 2": "reports/results/train_mesh/pretrain_32k_seed2_h200.json",
        "H200 32K seed 0": "reports/results/train_mesh/pretrain_32k_seed0_h200.json",
    },
    "ring attention on 2 H200 vs 1 H200 (60 steps)": {
        "H200 1 GPU": "reports/results/train_h200_1gpu_60steps.json",
        "H200 ring 2 GPUs": "reports/results/train_h200_ring2_60steps.json",
    },
}
# retrieval grids (benchmarks/train_retrieval_grid.py): {label: JSON path}; an absent file is listed as not run
grids = {
    "32K grid on H100": "reports/results/retrieval_grid_h100.json",
    "CPU small-scale grid (N=512)": "reports/results/retrieval_grid_cpu.json",
}
# tokens/s per GPU on 1, 2 and 4 GPUs at a fixed length per GPU (train_gpu.py runs merged); absent: no section
scaling = "reports/results/train_mesh/scaling_h200.json"
cpu_train_steps = 0
output_dir = "."

# %%
from hilbert_lab.reports.recorder import ReportRecorder
from hilbert_lab.reports.training import (
    cpu_training_report,
    final_evals_table,
    grid_buckets_table,
    grid_rows_table,
    group_chance,
    histories,
    history_table,
    load_grids,
    load_runs,
    load_scaling,
    longest_trainable_table,
    phases_table,
    ring_comparison_table,
    run_phases,
    scaling_table,
    throughput_table,
)
from hilbert_lab.viz.training import (
    accuracy_by_distance,
    accuracy_vs_flops,
    memory_by_length,
    throughput_bars,
    training_curves,
)
import pandas as pd

recorder = ReportRecorder(output_dir, "training", dict(runs=runs, grids=grids, scaling=scaling,
                                                            cpu_train_steps=cpu_train_steps))
groups = load_runs(runs)
if cpu_train_steps > 0:
    groups[f"live CPU run (cpu-tiny, {cpu_train_steps} steps)"] = {
        "CPU cpu-tiny live": cpu_training_report(cpu_train_steps)}
finals = final_evals_table(groups)
recorder.table("final_evals", finals,
               caption="last eval of each run (at the full sequence length) against chance; steps = last logged step")
# the curves' data, so that the page can be rebuilt from metrics.json alone
recorder.table("history", history_table(groups), caption="every logged point", show=False)
recorder.table("phases", phases_table(groups), caption="length-curriculum phases", show=False)

# %% [markdown]
# ## Loss and accuracy curves
# Thin lines are the training batches (at the curriculum's length of the moment), markers are the evals,
# always at the full sequence length; the dashed line is chance (uniform over the values: 1/64 for the
# 32K task). Dotted vertical lines and the labels at the top mark the length-curriculum phases of each
# run (training length from that step on).
#
# **32K needle retrieval on one H100.** The pair sits at least 8K tokens before the question, beyond the
# 2048- and 8192-token segments, so only the segment spanning the whole sequence can fetch it. Two things
# were needed: rotary base 1e6 (every run here uses it; with the usual 10000 and head dim 32 the slowest
# rotary frequency turns a full circle over ~35K tokens, so no q/k channel can match content 8K-32K tokens
# apart) and the length curriculum 1K -> 4K -> 16K -> 32K. The run without curriculum, trained at 32K from
# step 0 with the same rotary base, stays at chance: initially the needle gets ~1/32768 of the attention.
# Learned at 1K, the retrieval carries over to 32K; the longer curriculum ends far higher than the short one.
#
# **128K needle retrieval on one H100.** The 32K grid's `gpu-32k-dil8-long1k` models (seeds 0 and 1) fine-tuned at
# 131072 tokens with a fourth branch of 131072 tokens at rate 32 (4096 keys per query, like the others); the
# pair sits at least 32K tokens before the question, so only that branch can carry it. Its final evaluation
# has 512 answers with a Wilson 95% interval.
#
# **Ring attention vs 1 GPU.** The same 60-step run (20 steps at 1K, then 32K) on one H200 and with each
# sequence sharded over 2 H200s by ring attention: the curves lie on top of each other (see the comparison
# table below).

# %%
for group, reports in groups.items():
    safe = "".join(ch if ch.isalnum() else "_" for ch in group).strip("_")[:60]
    phases = {label: run_phases(report) for label, report in reports.items()}
    for metric in ("loss", "accuracy"):
        recorder.figure(f"{metric}_{safe}", training_curves(
            histories(reports), metric, group_chance(reports, metric), phases=phases, title=f"{group}: {metric}"))

# %% [markdown]
# ## Ring attention vs one GPU
# For each run that was compared against another (`--compare`): the differences recorded by the benchmark,
# and the same recomputed here from both logs over the (kind, step) points they share.

# %%
comparison = ring_comparison_table(groups)
recorder.table("ring_comparison", comparison, caption="loss differences of the sharded run against its 1-GPU twin")
for row in comparison.to_dict(orient="records"):
    recorder.metric(f"{row['run']} vs {row['against']}: max relative loss difference",
                    row["recomputed_max_rel_loss_difference"] if row["recomputed_points"]
                    else row["max_rel_loss_difference"],
                    note=f"over {row['recomputed_points'] or row['points']} logged points")

# %% [markdown]
# ## Scaling over GPUs
# Tokens/s per GPU of training steps at the same tokens per GPU on 1, 2 and 4 GPUs: data parallel splits the
# batch's rows, context parallel each sequence (`benchmarks/train_gpu.py --data-parallel / --context-parallel`
# under torchrun, FSDP2 on a DeviceMesh). Every segment fits a shard, so context parallelism sends no keys.
#

# %%
scaling_data = load_scaling(scaling)
scaling_rows = scaling_table(scaling_data) if scaling_data else pd.DataFrame()
recorder.table("scaling", scaling_rows.drop(columns=["tokens_per_s_per_gpu"], errors="ignore"),
               caption="tokens/s per GPU per setup (runs: slowest, median, fastest) against one GPU")

# %% [markdown]
# ## Throughput and memory at 32K tokens
# Training steps at the full 32K length, batch 8, bf16 autocast, with and without gradient checkpointing
# (measured by `benchmarks/train_gpu.py` before each run that has a throughput section).

# %%
throughput = throughput_table(groups)
recorder.table("throughput", throughput, caption="tokens/s and peak memory of training steps")
if len(throughput):
    recorder.figure("throughput", throughput_bars(throughput.to_dict(orient="records")))

# %% [markdown]
# ## Longest trainable sequence
# One training step at doubling lengths (batch 1, gradient checkpointing, bf16 autocast) with the dilated
# pattern extended by segments four times longer at 4096 keys per query until one spans the sequence, until a length
# fails (`benchmarks/train_gpu.py --probe-lengths`).

# %%
probes = longest_trainable_table(groups)
recorder.table("longest_trainable", probes, caption="peak memory and tokens/s of a training step per length")
if len(probes):
    recorder.figure("longest_trainable", memory_by_length(probes.to_dict(orient="records")))

# %% [markdown]
# ## Accuracy against attention compute (retrieval grids)
# Each grid row is one attention pattern (and, where the row's name says so, a length curriculum) trained with
# the same model size and steps over several seeds; its accuracy is pooled over the seeds' final evaluations (Wilson 95% interval over all answers).
# Attention FLOPs per token come from the plan (`hilbert_lab.models.cost`: depth x 4 x head_dim x causal
# query-key pairs / N, forward). In LongNet mode a query takes part in a dilated branch through one head
# offset only and sees keys of its residue, so a dilated whole-sequence branch needs a local branch in an
# earlier layer to move the needle to the query's residue; rows without a whole-sequence branch are controls
# that must stay at chance. The per-distance figure splits the answers by needle-to-query distance.

# %%
loaded_grids, missing_grids = load_grids(grids)
recorder.table("grids_missing", pd.DataFrame([{"grid": m.split(" (")[0], "path": m.split(" (", 1)[1][:-1]}
                                              for m in missing_grids], columns=["grid", "path"]),
               caption="grids not run yet")
grid_rows = grid_rows_table(loaded_grids)
recorder.table("grid_rows", grid_rows, caption="accuracy (pooled over seeds) and attention cost per grid row")
grid_buckets = grid_buckets_table(loaded_grids)
recorder.table("grid_buckets", grid_buckets, caption="accuracy per needle-distance bucket", show=False)
for grid in loaded_grids:
    safe = "".join(ch if ch.isalnum() else "_" for ch in grid).strip("_")[:60]
    mine = grid_rows[grid_rows["grid"] == grid].to_dict(orient="records")
    distance = grid_buckets[grid_buckets["grid"] == grid].to_dict(orient="records")
    if mine:
        recorder.figure(f"grid_flops_{safe}", accuracy_vs_flops(mine, chance=mine[0]["chance_accuracy"]))
    if distance:
        recorder.figure(f"grid_distance_{safe}", accuracy_by_distance(distance, chance=mine[0]["chance_accuracy"]))
recorder.save();
