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
# # Locality explorer
# How well does each token ordering keep the keys/values a query tile needs in cache? Pick a 2D grid
# with window attention or a 1D sequence with dilated attention, the query box / segment, the cache
# size (in lines) and the line size: the heatmaps show the layout slot of every cell (access order),
# the curves the LRU misses of the K/V cache-line trace of a flash-style kernel for every ordering
# (lower is better), and the table under them the numbers behind the curves; all follow the controls.
# The attention computed is the same in every layout; only where the rows sit in memory changes.
# The dilation slider applies to the 1D sequence study only (window attention on a grid has none).

# %% tags=["parameters"]
kind = "grid"
size = 16
box_or_segment = 4
dilation_rate = 2
max_cache_lines = 256
line_bytes = 128

# %%
from hilbert_lab.viz.locality_explorer import locality_explorer

panel = locality_explorer(kind=kind, size=size, box_or_segment=box_or_segment, dilation_rate=dilation_rate,
                          max_cache_lines=max_cache_lines, line_bytes=line_bytes)
panel.widget
