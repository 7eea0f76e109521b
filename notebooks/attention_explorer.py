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
# # Attention-pattern explorer
# LongNet dilated attention: branch i splits the sequence into segments of `segment_lengths[i]` and
# keeps every `dilation_rates[i]`-th token (with a per-head offset). Below: the mask of each branch,
# the merged mask of each head, the multiplicity (how many branches allow a pair; the softmax weighs a
# pair by it), token coverage (a query with no keys gets no output), and the tile structure a
# block-sparse kernel would see under each token ordering. "compare with reference" runs the engine in
# float64 against the dense oracle.
#
# Every ordering computes the same attention; only the tiles a block-sparse kernel must visit change.
# The defaults dilate the shortest branch (r=2 on segments of 16), so the orderings differ: with
# dilation_major each head's dilated tokens sit next to each other and fill fewer, denser tiles. When the
# shortest branch has no dilation and its segments fit in one tile, every ordering gives the same tiles
# (the figure then says so).

# %% tags=["parameters"]
segment_lengths = "16,32"
dilation_rates = "2,4"
mode = "longnet"
causal = False
seq_len = 64
num_heads = 2
block_size = 4

# %%
from hilbert_lab.viz.attention_explorer import attention_explorer

panel = attention_explorer(segment_lengths=segment_lengths, dilation_rates=dilation_rates, mode=mode, causal=causal,
                           seq_len=seq_len, num_heads=num_heads, block_size=block_size)
panel.widget

# %% [markdown]
# ## Tile density table and a reference check at these settings

# %%
panel.state["compare"]()
display(panel.state.get("reference_check"))
panel.state["tile_table"]
