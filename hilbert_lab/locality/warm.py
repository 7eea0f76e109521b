"""Compile the Numba kernels of the curve maps and the locality metrics once, on tiny inputs.

Numba compiles a kernel for each argument signature at its first call and keeps the machine code in its on-disk
cache (every kernel here is `cache=True`), so later processes load it in milliseconds. A fresh checkout has no
cache: the first report or test to call each kernel pays seconds for it (about half a minute of one core in all).
`compile_kernels` pays that at once, through the same public functions the reports and tests call, so that the
signatures are theirs; `make` runs its groups in two processes beside the rest of its set-up
(`python -m hilbert_lab.locality.warm [GROUP ...]`).
"""
from __future__ import annotations

import sys
import time
from typing import Callable, Sequence


def _curves() -> None:
    from hilbert_lab.curves import ORDERINGS, segment_permutation

    for ordering in ORDERINGS:
        segment_permutation(64, ordering)


def _locality() -> None:
    from hilbert_lab.curves import GRID_ORDERINGS
    from hilbert_lab.locality.compare import compare_orderings

    compare_orderings(((8, 8), (4, 4, 4)), grid_orderings=GRID_ORDERINGS, box_sizes=(2,), segment_lengths=(16,),
                      dilated_configs=((256, 64, 2),), tile_size=16, head_dim=8, cache_lines=(8,), progress=False)


def _serialization() -> None:
    from hilbert_lab.curves import SERIALIZATIONS
    from hilbert_lab.locality.neighbours import clustered_points, uniform_points
    from hilbert_lab.locality.serialization import serialization_table

    datasets: dict[str, object] = {"2D grid": (8, 8), "3D grid": (4, 4, 4),
                                   "uniform 3D": uniform_points(64, 3, seed=0),
                                   "clustered 3D": clustered_points(64, 3, seed=0)}
    serialization_table(datasets, SERIALIZATIONS, (([16], [1]), ([16, 32], [1, 2])))


# The kernels each group runs: the 1D segment orderings; the grid orderings, traces, LRU simulation and box metrics
# of compare_orderings; the serialization metrics and k-NN of grids and point clouds.
GROUPS: dict[str, Callable[[], None]] = {"curves": _curves, "locality": _locality, "serialization": _serialization}


def compile_kernels(groups: Sequence[str] = tuple(GROUPS)) -> float:
    """Run the kernels of `groups` (names of GROUPS) once on tiny inputs, compiling each or loading it from Numba's
    cache; returns the seconds it took."""
    unknown = [name for name in groups if name not in GROUPS]
    if unknown:
        raise ValueError(f"groups must be drawn from {tuple(GROUPS)}, got {unknown}")
    start = time.perf_counter()
    for name in groups:
        GROUPS[name]()
    return time.perf_counter() - start


if __name__ == "__main__":
    names = sys.argv[1:] or list(GROUPS)
    print(f"compiled the {', '.join(names)} kernels in {compile_kernels(names):.1f} s")
