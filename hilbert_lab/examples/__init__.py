"""Runnable examples: `torchrun --nproc_per_node=N -m hilbert_lab.examples.ring` (ring attention)."""
