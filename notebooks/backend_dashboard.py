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
# # Backend dashboard
# The hardware at hand, every attention backend with the reason when it cannot run, what
# `backend="auto"` picks here and why, and a quick live timing of the available backends at a size
# you choose (press "time backends"). The backends run round-robin (every repeat runs each once, in a
# rotating order, one pinned CPU thread) so machine noise hits them alike; the table gives each median
# with its 95% bootstrap interval and warns when an interval is wide or two backends are within noise of
# each other. `auto` is timed too, and its row says which backend it ran for this input. Every timed
# backend must produce the same output: the table shows the largest difference to the first backend.
# When a control changes, the figure and table are marked out of date until the next press.

# %% tags=["parameters"]
device = "cpu"
dtype = "float32"
seq_len = 1024
num_heads = 4
head_dim = 32
segment_lengths = "256,512"
dilation_rates = "1,2"
repeats = 15
run_timing = True

# %%
from hilbert_lab.viz.backends import backend_dashboard

panel = backend_dashboard(device=device, dtype=dtype, seq_len=seq_len, num_heads=num_heads, head_dim=head_dim,
                          segment_lengths=segment_lengths, dilation_rates=dilation_rates, repeats=repeats)
if run_timing:
    panel.refresh()
panel.widget
