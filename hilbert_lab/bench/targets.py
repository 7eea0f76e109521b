"""Whether the engine's speed targets hold across runs of `benchmarks/bench_gpu_attention.py`: a target is met in a
cell only where every run of that cell meets it (one good run is not a result).

Each function takes the runs' JSON objects (as the benchmark writes them) and returns one row per cell:
`cell` (the cell's coordinates), `ratios` (one per run; None where that run lacks the cell or its ratio),
`limit`, `met` (every run has the ratio and none is above the limit) and `worst` (the largest ratio seen).
- `headline_verdicts`: `auto` over the FlashAttention-4-in-place floor of its run: head_groups fwd <= 1.05, every
  other headline cell <= 1.10.
- `sweep_verdicts`: `auto` over the cell's best floor: <= 1.30 at N <= 8192, else <= 1.15; with `hilbert=True`,
  `ordering="hilbert"` over the plain call, <= 1.05.
- `ragged_verdicts`: `auto` at N = m + 5 over N = m, <= 1.10.
`format_verdicts(rows, title, cells=True)` -> the lines of a table; `count_met(rows)` -> (met, cells).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

__all__ = ["count_met", "format_verdicts", "headline_verdicts", "ragged_verdicts", "sweep_verdicts"]

SWEEP_KEYS = ("mode", "causal", "seq_len", "head_dim", "direction")
RAGGED_KEYS = ("mode", "m", "direction")


def _ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    return numerator / denominator if numerator and denominator else None


def _verdicts(runs: Sequence[dict], part: str, keys: tuple[str, ...], ratio: Callable[[dict], Optional[float]],
              limit: Callable[[dict], float]) -> list[dict]:
    """One row per cell of `part` over the runs, cells in the order they first appear."""
    if not runs:
        raise ValueError("runs must hold at least one run of bench_gpu_attention.py, got none")
    cells: dict[tuple, list] = {}
    for index, run in enumerate(runs):
        if not isinstance(run, dict):
            raise ValueError(f"runs[{index}] must be a run's JSON object, got {type(run).__name__}")
        for row in run.get(part) or ():
            if not isinstance(row, dict) or any(row.get(key) is None for key in keys):
                raise ValueError(f"runs[{index}][{part!r}] must hold cells with {', '.join(keys)}, got {row!r:.80}")
            coordinates = tuple(row[key] for key in keys)
            cells.setdefault(coordinates, [None] * len(runs))[index] = ratio(row)
    rows = []
    for coordinates, ratios in cells.items():
        cell = dict(zip(keys, coordinates))
        bound = limit(cell)
        seen = [r for r in ratios if r is not None]
        rows.append(dict(cell=cell, ratios=ratios, limit=bound, worst=max(seen) if seen else None,
                         met=len(seen) == len(ratios) and all(r <= bound for r in seen)))
    return rows


def headline_verdicts(runs: Sequence[dict]) -> list[dict]:
    """The headline cells: `auto` over the FlashAttention-4-in-place floor (head_groups fwd <= 1.05, others
    <= 1.10)."""
    return _verdicts(runs, "headline", SWEEP_KEYS, lambda row: _ratio(row.get("auto_ms"), row.get("fa4_floor_ms")),
                     lambda cell: 1.05 if (cell["mode"], cell["direction"]) == ("head_groups", "fwd") else 1.10)


def sweep_verdicts(runs: Sequence[dict], *, hilbert: bool = False) -> list[dict]:
    """The sweep cells: `auto` over the best floor (<= 1.30 at N <= 8192, else <= 1.15), or with hilbert=True
    `ordering="hilbert"` over the plain call (<= 1.05)."""
    if hilbert:
        return _verdicts(runs, "sweep", SWEEP_KEYS, lambda row: _ratio(row.get("hilbert_ms"), row.get("auto_ms")),
                         lambda cell: 1.05)
    return _verdicts(runs, "sweep", SWEEP_KEYS, lambda row: row.get("auto_over_floor"),
                     lambda cell: 1.30 if cell["seq_len"] <= 8192 else 1.15)


def ragged_verdicts(runs: Sequence[dict]) -> list[dict]:
    """The ragged pairs: `auto` at N = m + 5 over N = m (<= 1.10)."""
    return _verdicts(runs, "ragged", RAGGED_KEYS, lambda row: (row.get("ratios") or {}).get("auto"),
                     lambda cell: 1.10)


def count_met(rows: Sequence[dict]) -> tuple[int, int]:
    """(cells met in every run, cells)."""
    return sum(row["met"] for row in rows), len(rows)


def format_verdicts(rows: Sequence[dict], title: str, *, cells: bool = True) -> list[str]:
    """A title line (cells met in every run, the range of the ratios) and, with cells=True, a line per cell: its
    coordinates, each run's ratio ("-" where missing), the limit and met / MISSED."""
    seen = [r for row in rows for r in row["ratios"] if r is not None]
    spread = f" (ratios {min(seen):.3f}-{max(seen):.3f})" if seen else ""
    lines = [f"{title}: met in every run in {count_met(rows)[0]} of {len(rows)} cells{spread}"]
    for row in rows if cells else ():
        cell = " ".join(f"{key}={value}" for key, value in row["cell"].items())
        ratios = " ".join("  -  " if r is None else f"{r:.3f}" for r in row["ratios"])
        lines.append(f"  {cell:72s} {ratios}  <= {row['limit']:.2f}  {'met' if row['met'] else 'MISSED'}")
    return lines
