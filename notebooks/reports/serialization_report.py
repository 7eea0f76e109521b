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
# # Serialization report: where the curve matters
# A Hilbert *layout* of a 1D sequence changes nothing. An image, a video or a point cloud, however, must be
# serialized into a sequence first, and segment (window) and dilated attention over that sequence then decide
# which spatial neighbours each token sees. This report measures, exactly and without training, how well each
# ordering (`hilbert_lab.curves.SERIALIZATIONS`: row-major, snake, Hilbert, Morton and their transposes) keeps
# neighbourhoods together at a given segment length and dilation, and shows what that does to a trained model
# (`benchmarks/train_serialization.py`, results committed under `reports/results/`).
#
# Metrics (`hilbert_lab.locality.serialization`): **k-NN recall** = share of a token's k nearest spatial
# neighbours that share an attention group (segment and dilation offset) with it, in any branch; **group
# diameter** = largest distance between two tokens of one attention group of the first branch (grid cells, or
# unit-cube units for point clouds); **unmet adjacent** = share of adjacent pairs (grid: face neighbours; points:
# each point's 2d nearest) that meet in no branch.

# %% tags=["parameters"]
grids = [[64, 64], [256, 256], [16, 32, 32]]
point_clouds = {"uniform 3D": 65536, "clustered 3D": 65536}
settings = [[[16], [1]], [[64], [1]], [[256], [1]], [[256], [4]], [[1024], [1]], [[64, 256, 1024], [1, 4, 16]]]
orderings = ["rowmajor", "snake", "hilbert", "morton", "rowmajor-trans", "snake-trans", "hilbert-trans",
             "morton-trans"]
ks = [4, 8, 26]
timing_grid = [1024, 1024]
trained_results = {"GPU": "reports/results/serialization_h100.json", "CPU": "reports/results/serialization_cpu.json"}
window_examples = [[32, "rowmajor", 64, 1], [32, "hilbert", 64, 1], [32, "morton", 64, 1], [32, "hilbert", 256, 4]]
save_png = True  # also write the accuracy and recall figures as PNG files (kaleido: seconds each)
output_dir = "."

# %%
import json
import time

import pandas as pd

from hilbert_lab.locality import clustered_points, serialization_metrics, serialization_table, uniform_points
from hilbert_lab.reports.recorder import ReportRecorder
from hilbert_lab.viz.serialization import accuracy_figure, locality_figure, windows_grid_figure

parameters = dict(grids=grids, point_clouds=point_clouds, settings=settings, orderings=orderings, ks=ks,
                  timing_grid=timing_grid, trained_results=trained_results, window_examples=window_examples,
                  save_png=save_png)
recorder = ReportRecorder(output_dir, "serialization", parameters, png=save_png)
datasets = {" x ".join(map(str, shape)): tuple(shape) for shape in grids}
for name, count in point_clouds.items():
    dims = 3 if "3D" in name else 2
    make = clustered_points if name.startswith("clustered") else uniform_points
    datasets[f"{name} ({count} points)"] = make(count, dims, seed=0)
start = time.perf_counter()
table = serialization_table(datasets, orderings, [tuple(s) for s in settings], ks=ks)
recorder.metric("locality_seconds", round(time.perf_counter() - start, 2), "s",
                f"{len(table)} rows, all data sets x settings x orderings (k-NN of the clouds included)")
recorder.table("locality", table.round(4), caption="exact locality metrics per data set, setting and ordering")

# %% [markdown]
# ## The windows on the grid
# Each colour is one attention group (a segment, and within it one dilation offset); the grey line is the
# serialization. Row-major windows are strips one pixel high; Hilbert and Morton windows are compact blocks.

# %%
if window_examples:
    recorder.figure("windows", windows_grid_figure(window_examples))

# %% [markdown]
# ## Locality per ordering

# %%
for metric in [m for m in ("recall@8", "recall@26", "unmet_adjacent", "diameter_mean") if m in table.columns]:
    recorder.figure(f"locality_{metric}", locality_figure(table, metric), png=metric == "recall@8")

# %% [markdown]
# ## Speed of the exact metrics at 1M tokens

# %%
if timing_grid:
    for ordering in ("rowmajor", "hilbert"):
        start = time.perf_counter()
        serialization_metrics(tuple(timing_grid), ordering, [1024], [1], ks=ks)
        recorder.metric(f"seconds_1M_grid_{ordering}", round(time.perf_counter() - start, 2), "s",
                        f"all metrics, {' x '.join(map(str, timing_grid))} grid, window 1024, on this machine")

# %% [markdown]
# ## Trained comparison
# The same small LongNet (`hilbert_lab.models.spatial.SpatialClassifier`) trained with each ordering on the
# spatial majority task: every token carries a random bit and must output the majority of the bits in its
# spatial neighbourhood (a disk of radius r on the image, the k nearest points in the cloud). Chance is about
# 0.5; a token that sees its whole neighbourhood can be 100% right. Bars are 95% Student t intervals over seeds.
# Runs are read from the JSON files; a missing file is listed and skipped.

# %%
from hilbert_lab.reports.serialization import trained_run_row, trained_rows
from hilbert_lab.reports.training import resolve_repo_path

recorder.metric("chance_accuracy", 0.5, note="majority of random bits: a constant guess is right half the time")
trained, runs = [], []
for label, path in trained_results.items():
    file = resolve_repo_path(path)
    if not file.exists():
        recorder.metric(f"missing_{label}", str(path), note="no such results file yet")
        continue
    document = json.loads(file.read_text())
    rows = trained_rows(document, label)
    trained += rows
    runs.append(trained_run_row(document, label, path))
    recorder.figure(f"accuracy_{label}", accuracy_figure(
        [{"name": task["name"], "summary": task["summary"]} for task in document["tasks"]],
        title=f"{label} ({rows[0]['device'] if rows else document['device']}): eval accuracy per ordering, "
              "95% intervals over seeds", chance=0.5), png=True)
trained = pd.DataFrame(trained)
if len(trained):
    recorder.table("trained", trained, caption="accuracy per task and ordering (ranked), with the exact "
                   "locality metrics of the same setting; device = the machine in the results file's env block")
    recorder.table("trained_runs", pd.DataFrame(runs), caption="where each results file was made")

# %% [markdown]
# ## Conclusion
# Three facts hold exactly, whatever the data (tested in `tests/locality/test_serialization.py` and
# `tests/models/test_spatial.py`): without causal masking or sequence-position encodings, attention depends only
# on *which* tokens share a group, not on their order inside it, so (1) snake and row-major give identical
# models when the window is a multiple of the image width, (2) Hilbert and Morton give identical models on
# 2^k x 2^k images with windows of 4^j tokens (both are aligned squares), and (3) once a window covers the whole
# image the ordering makes no difference. Off those cases the numbers below decide:

# %%
from IPython.display import Markdown

from hilbert_lab.reports.serialization import conclusion_paragraphs

conclusion = "\n\n".join(conclusion_paragraphs(table, trained))
recorder.metric("conclusion", conclusion)
Markdown(conclusion)
