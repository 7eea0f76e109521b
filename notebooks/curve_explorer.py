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
# # Curve explorer
# Space-filling curves over 2D/3D grids: Hilbert (order n), generalized Hilbert (any width x height),
# Morton, snake and row-major. Pick a curve and a size, colour the cells by their index, animate the
# traversal with the play button, and read the locality metrics (step lengths, compactness of runs of
# 16 cells) live. Out-of-range sizes are clamped with a visible note.

# %% tags=["parameters"]
family = "hilbert"
ndim = 2
order = 3
width = 12
height = 8
depth = 4

# %%
from hilbert_lab.viz.curve_explorer import curve_explorer

panel = curve_explorer(family=family, ndim=ndim, order=order, width=width, height=height, depth=depth)
panel.widget

# %% [markdown]
# ## All curves side by side
# Locality metrics of every family on the same 16 x 16 grid (Hilbert/Morton: order 4).

# %%
from hilbert_lab.viz.curves import (CURVE_FAMILIES, ORDER_FAMILIES, curve_coordinates, metrics_figure,
                                    traversal_metrics, traversal_metrics_table)

side_order = 4
metrics_by_family = {
    name: traversal_metrics(
        curve_coordinates(name, order=side_order) if name in ORDER_FAMILIES
        else curve_coordinates(name, width=2**side_order, height=2**side_order)
    )
    for name in CURVE_FAMILIES
}
display(traversal_metrics_table(metrics_by_family))
metrics_figure(metrics_by_family)

# %% [markdown]
# ## Animated traversal (plain figure: press play)

# %%
from hilbert_lab.viz.curves import curve_animation_figure

curve_animation_figure(curve_coordinates("gilbert", width=width, height=height), title=f"generalized Hilbert {width} x {height}")

# %% [markdown]
# ## Serialized attention: the windows on the image
# An image is serialized into a sequence by an ordering, and segment / dilated attention then groups
# consecutive tokens. Pick the image side, the ordering, the segment length and the dilation: each colour is
# one attention group, and the table gives the exact locality metrics (k-NN recall, group diameter, adjacent
# pairs that never meet) next to row-major order (`hilbert_lab.locality.serialization`).

# %%
from hilbert_lab.viz.serialization import serialization_panel

serialization = serialization_panel(size=32, ordering="hilbert", segment_length=64, dilation_rate=1)
serialization.widget
