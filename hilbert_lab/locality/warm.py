"""Compile the Numba kernels of the curve maps and the locality metrics once, on tiny inputs.

Numba compiles a kernel for each argument signature at its first call and keeps the machine code in its on-disk
cache (every kernel here is `cache=True`), so later processes load it in milliseconds. A fresh checkout has no
cache: the first report or test to call each kernel pays seconds for it (about half a minute of one core in all).
`compile_kernels` pays that at once, through the same public functions the reports and tests call, so that the
signatures are theirs; `make` runs it beside the rest of its set-up.
"""
from __future__ import annotations

import time

import numpy as np


def compile_kernels() -> float:
    """Run every curve and locality kernel once on tiny inputs (compiling it, or loading it from Numba's cache);
    returns the seconds it took."""
    from hilbert_lab.curves import GRID_ORDERINGS, ORDERINGS, SERIALIZATIONS, segment_permutation
    from hilbert_lab.locality.compare import compare_orderings
    from hilbert_lab.locality.neighbours import clustered_points, uniform_points
    from hilbert_lab.locality.serialization import serialization_table

    start = time.perf_counter()
    for ordering in ORDERINGS:
        segment_permutation(64, ordering)
    compare_orderings(((8, 8), (4, 4, 4)), grid_orderings=GRID_ORDERINGS, box_sizes=(2,), segment_lengths=(16,),
                      dilated_configs=((256, 64, 2),), tile_size=16, head_dim=8, cache_lines=(8,), progress=False)
    datasets: dict[str, object] = {"2D grid": (8, 8), "3D grid": (4, 4, 4),
                                   "uniform 3D": uniform_points(64, 3, seed=0),
                                   "clustered 3D": clustered_points(64, 3, seed=0)}
    serialization_table(datasets, SERIALIZATIONS, (([16], [1]), ([16, 32], [1, 2])))
    return time.perf_counter() - start


if __name__ == "__main__":
    print(f"compiled the curve and locality kernels in {compile_kernels():.1f} s")
