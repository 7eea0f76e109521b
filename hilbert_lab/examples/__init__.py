"""Runnable examples: `torchrun --nproc_per_node=N -m hilbert_lab.examples.ring` (ring attention),
`python -m hilbert_lab.examples.hf_dilated` (a Hugging Face Llama on dilated attention: fine-tune, generate)."""
