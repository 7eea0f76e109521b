"""Runnable ring attention example: `torchrun --nproc_per_node=N -m hilbert_lab.examples.ring [--seq-len N ...]`.

Checks itself against the single-process engine on small sizes (float64, atol 1e-10), then prints
tokens/s and peak memory per rank for a long sequence; gloo on CPU, NCCL on GPUs. The code lives in
hilbert_lab.distributed.cli (also `hilbert-lab ring`); see its docstring for the options.
"""
from __future__ import annotations

import sys

from hilbert_lab.distributed.cli import add_arguments, init_distributed, main, run, self_check, time_forward_backward

__all__ = ["add_arguments", "init_distributed", "main", "run", "self_check", "time_forward_backward"]

if __name__ == "__main__":
    sys.exit(main())
