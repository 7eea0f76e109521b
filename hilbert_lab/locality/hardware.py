"""Real cache parameters (bytes) of GPUs and a typical CPU, with their sources, as CacheLevel objects."""
from __future__ import annotations

from hilbert_lab.locality.cache import CacheLevel

__all__ = ["CACHE_PARAMETERS", "cache_levels", "cache_table"]

KIB = 1024
MIB = 1024 * 1024

# name -> (level, capacity_bytes, line_bytes, ways or None, source)
# GPU caches: NVIDIA does not publish L1/L2 associativity, so GPUs are modelled fully associative
# (ways=None). GPU L1 is per SM (a configurable carve-out of the unified L1/shared memory; the size
# below is the whole unified array, the upper bound of what L1 can hold); L2 is shared by all SMs.
# GPU L2 lines are 128 B made of four 32 B sectors; we simulate 128 B lines.
CACHE_PARAMETERS: dict[str, list[tuple[str, int, int, int | None, str]]] = {
    "H100-SXM5": [
        # NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): 256 KB combined L1/shared per SM.
        ("L1", 256 * KIB, 128, None, "NVIDIA H100 Tensor Core GPU Architecture whitepaper, SM section"),
        # Same whitepaper: "50 MB L2 cache" on H100 SXM5.
        ("L2", 50 * MIB, 128, None, "NVIDIA H100 Tensor Core GPU Architecture whitepaper, L2 section"),
    ],
    "A100": [
        # NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): 192 KB combined L1/shared per SM.
        ("L1", 192 * KIB, 128, None, "NVIDIA A100 Tensor Core GPU Architecture whitepaper, SM section"),
        # Same whitepaper: 40 MB L2 on A100 (SXM4 40GB / 80GB).
        ("L2", 40 * MIB, 128, None, "NVIDIA A100 Tensor Core GPU Architecture whitepaper, L2 section"),
    ],
    "GTX-1080": [
        # NVIDIA GeForce GTX 1080 whitepaper (Pascal GP104, 2016): 48 KB unified L1/texture per SM.
        ("L1", 48 * KIB, 128, None, "NVIDIA GeForce GTX 1080 whitepaper (GP104), SM section"),
        # Same whitepaper: 2048 KB L2 cache on GP104.
        ("L2", 2 * MIB, 128, None, "NVIDIA GeForce GTX 1080 whitepaper (GP104), memory subsystem"),
    ],
    "CPU-Zen4-core": [
        # AMD Software Optimization Guide for the AMD Zen4 Microarchitecture (pub. 57647): 32 KB 8-way L1D,
        # 1 MB 8-way private L2, 32 MB 16-way shared L3 per CCX, 64 B lines.
        ("L1", 32 * KIB, 64, 8, "AMD Zen4 Software Optimization Guide (57647), L1 data cache"),
        ("L2", 1 * MIB, 64, 8, "AMD Zen4 Software Optimization Guide (57647), L2 cache"),
        ("L3", 32 * MIB, 64, 16, "AMD Zen4 Software Optimization Guide (57647), L3 cache"),
    ],
}


def cache_levels(device: str) -> list[CacheLevel]:
    """The CacheLevel list (L1 first) of a device in CACHE_PARAMETERS."""
    if device not in CACHE_PARAMETERS:
        raise ValueError(f"device must be one of {sorted(CACHE_PARAMETERS)}, got {device!r}")
    return [
        CacheLevel(name=f"{device} {level}", capacity_bytes=capacity, line_bytes=line, ways=ways)
        for level, capacity, line, ways, _ in CACHE_PARAMETERS[device]
    ]


def cache_table():
    """CACHE_PARAMETERS as a pandas DataFrame (device, level, capacity_bytes, line_bytes, ways, source)."""
    import pandas as pd

    rows = [
        {"device": device, "level": level, "capacity_bytes": capacity, "line_bytes": line,
         "ways": ways, "source": source}
        for device, levels in CACHE_PARAMETERS.items()
        for level, capacity, line, ways, source in levels
    ]
    return pd.DataFrame(rows)
