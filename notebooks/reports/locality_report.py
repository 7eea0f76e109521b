# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Locality report
# Every locality metric of `hilbert_lab.locality.compare_orderings` for 2D/3D grid orderings and 1D dilated
# layouts: step lengths, stretch, segment compactness, box clustering, cache lines and tiles per query box,
# tile density of the dilated masks, and LRU misses of the K/V cache-line traces of a flash-style kernel.
# Orderings only move rows in memory: the attention computed is the same.

# %% tags=["parameters"]
grid_shapes = [[32, 32], [8, 8, 8]]
box_sizes = [4, 8]
segment_lengths = [64]
dilated_configs = [[4096, 1024, 4]]
tile_size = 64
head_dim = 64
element_bytes = 2
line_bytes = 128
cache_lines = [64, 256, 1024]
output_dir = "."

# %%
from hilbert_lab.locality import compare_orderings
from hilbert_lab.reports.recorder import ReportRecorder
from hilbert_lab.viz.locality import metric_bars, miss_curves_from_table

parameters = dict(grid_shapes=grid_shapes, box_sizes=box_sizes, segment_lengths=segment_lengths,
                  dilated_configs=dilated_configs, tile_size=tile_size, head_dim=head_dim,
                  element_bytes=element_bytes, line_bytes=line_bytes, cache_lines=cache_lines)
recorder = ReportRecorder(output_dir, "locality", parameters)
table = compare_orderings([tuple(shape) for shape in grid_shapes], box_sizes=box_sizes,
                          segment_lengths=segment_lengths, dilated_configs=[tuple(c) for c in dilated_configs],
                          tile_size=tile_size, head_dim=head_dim, element_bytes=element_bytes, line_bytes=line_bytes,
                          cache_lines=cache_lines)
recorder.table("compare_orderings", table, caption="every metric, ordering and configuration (tidy)")

# %% [markdown]
# ## Geometry of the orderings

# %%
for metric in ("step_mean", "clustering_mean", "lines_per_box_mean", "tile_nonempty_share"):
    if (table["metric"] == metric).any():
        recorder.figure(f"bars_{metric}", metric_bars(table, metric))

# %% [markdown]
# ## Miss curves

# %%
for configuration in table.loc[table["metric"] == "misses", "configuration"].unique():
    safe = "".join(ch if ch.isalnum() else "_" for ch in configuration)[:60]
    recorder.figure(f"misses_{safe}", miss_curves_from_table(table, configuration))
recorder.save();
