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
# At the defaults (segments 16 and 64, dilations 1 and 4, 4x4 tiles) Hilbert and Morton lay each
# 16-token segment on a 4x4 square and walk it in 2x2 blocks, so the long branch's every-4th tokens
# (one column of the square) share tiles: about half of the tiles stay empty, where identity and snake
# touch every tile. dilation_major follows the shortest branch's dilation (1 here), so it equals
# identity; with dilation_rates "2,4" it packs best (each head then covers half of the queries, see the
# coverage plot). When the shortest branch is not dilated and its segments fit in one tile, every
# ordering gives the same tiles (the figure then says so).

# %% tags=["parameters"]
segment_lengths = "16,64"
dilation_rates = "1,4"
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
# ## Reference check at the notebook's parameters
# (the button above redoes it for the current controls; the tile numbers are under the bars)

# %%
from IPython.display import HTML

from hilbert_lab.viz.attention_explorer import reference_check_html

panel.state["compare"]()
HTML(reference_check_html(panel.state["reference_check"]))
