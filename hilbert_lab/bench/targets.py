"""Whether the engine's speed targets hold across runs of `benchmarks/bench_gpu_attention.py` and
`benchmarks/bench_packed.py` (and the checks of `benchmarks/bench_auto_table.py`): a target is met in a cell only where
every run of that cell meets it (one good run is not a result).

Each function takes the runs' JSON objects (as the benchmark writes them) and returns one row per cell:
`cell` (the cell's coordinates), `ratios` (one per run; None where that run lacks the cell or its ratio),
`limit`, `bound`, `met` (every run has the ratio and none is on the wrong side of the limit) and `worst` (the largest
ratio seen; the smallest where the bound is ">=").
- `headline_verdicts`: `auto` over the FlashAttention-4-in-place floor of its run: head_groups fwd <= 1.05, every
  other headline cell <= 1.10.
- `sweep_verdicts`: `auto` over the cell's best floor: <= 1.30 at N <= 8192, else <= 1.15; with `hilbert=True`,
  `ordering="hilbert"` over the plain call, <= 1.05.
- `ragged_verdicts`: `auto` at N = m + 5 over N = m, <= 1.10.
- `packed_verdicts` (runs of `benchmarks/bench_packed.py`): ours over the FlashAttention-4 varlen floor, timed round by
  round together, <= 1.25 (fwd, fwd+bwd); the per-document loop over ours >= 6; GQA (H_kv = H / 4) over MHA <= 0.9.
- `auto_check_verdicts` (checks of `benchmarks/bench_auto_table.py`, `--check-out`): `auto` over the fastest executor
  timed beside it, <= 1.03.
A row's `bound` says which side of the limit meets it: "<=", or ">=" where a speed-up is the target.
`read_runs(paths)` -> the runs' JSON objects; `runs_line(paths)` -> the line naming them; `format_verdicts(rows, title,
cells=True, missed_only=False)` -> the lines of a table;
`count_met(rows)` -> (met, cells).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional, Sequence

__all__ = ["AUTO_CHECK_LIMIT", "PACKED_LIMITS", "auto_check_verdicts", "count_met", "format_verdicts",
           "headline_verdicts", "packed_verdicts", "ragged_verdicts", "read_runs", "runs_line", "sweep_verdicts"]

SWEEP_KEYS = ("mode", "causal", "seq_len", "head_dim", "direction")
# the packed row's targets: ours over the varlen floor (at most), the per-document loop over ours (at least), GQA
# with H_kv = H / 4 over MHA (at most)
PACKED_LIMITS = {"floor": 1.25, "loop": 6.0, "gqa": 0.9}
RAGGED_KEYS = ("mode", "m", "direction")
AUTO_CHECK_KEYS = ("mode", "causal", "seq_len", "batch", "head_dim", "training")
AUTO_CHECK_LIMIT = 1.03  # auto within 3% of our fastest executor


def _ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    return numerator / denominator if numerator and denominator else None


def _verdicts(runs: Sequence[dict], part: str, keys: tuple[str, ...], ratio: Callable[[dict], Optional[float]],
              limit: Callable[[dict], float]) -> list[dict]:
    """One row per cell of `part` over the runs, cells in the order they first appear."""
    if not runs:
        raise ValueError(f"runs must hold at least one run (a benchmark's JSON object with {part!r}), got none")
    cells: dict[tuple, list] = {}
    for index, run in enumerate(runs):
        if not isinstance(run, dict):
            raise ValueError(f"runs[{index}] must be a run's JSON object, got {type(run).__name__}")
        for row in run.get(part) or ():
            if not isinstance(row, dict) or any(row.get(key) is None for key in keys):
                raise ValueError(f"runs[{index}][{part!r}] must hold cells with {', '.join(keys)}, got {row!r:.80}")
            coordinates = tuple(row[key] for key in keys)
            cells.setdefault(coordinates, [None] * len(runs))[index] = ratio(row)
    named = [(dict(zip(keys, coordinates)), ratios) for coordinates, ratios in cells.items()]
    return [_row(cell, ratios, limit(cell)) for cell, ratios in named]


def _row(cell: dict, ratios: list, limit: float, *, at_least: bool = False) -> dict:
    """A cell's row: met where every run has a ratio on the meeting side of `limit` (above it with at_least)."""
    seen = [r for r in ratios if r is not None]
    meets = (lambda r: r >= limit) if at_least else (lambda r: r <= limit)
    worst = (min if at_least else max)(seen) if seen else None
    return dict(cell=cell, ratios=ratios, limit=limit, bound=">=" if at_least else "<=", worst=worst,
                met=len(seen) == len(ratios) and all(meets(r) for r in seen))


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


def auto_check_verdicts(runs: Sequence[dict]) -> list[dict]:
    """The cells of checks of `benchmarks/bench_auto_table.py`: `auto` over the fastest executor timed beside it
    (<= 1.03)."""
    return _verdicts(runs, "rows", AUTO_CHECK_KEYS, lambda row: row.get("auto_over_fastest"),
                     lambda cell: AUTO_CHECK_LIMIT)


def _value(entry: Optional[dict], key: str) -> Optional[float]:
    """entry[key] of a timing ("median") or of a pair timed round by round ("ratio"); None where the entry is
    missing or records why it was not timed."""
    return entry.get(key) if isinstance(entry, dict) else None


def packed_verdicts(runs: Sequence[dict]) -> list[dict]:
    """The packed row's targets over runs of `benchmarks/bench_packed.py`: per direction ours[auto] over the
    FlashAttention-4 varlen floor (the interleaved pair, <= 1.25) and the fastest per-document loop over ours[auto]
    (>= 6); GQA over MHA, fwd+bwd (the interleaved pair, <= 0.9)."""
    if not runs:
        raise ValueError("runs must hold at least one run of bench_packed.py, got none")
    found: dict[tuple, list] = {}
    for index, run in enumerate(runs):
        if not isinstance(run, dict) or not isinstance(run.get("cells"), dict):
            got = "a JSON object without 'cells'" if isinstance(run, dict) else type(run).__name__
            raise ValueError(f"runs[{index}] must be a run of bench_packed.py (a JSON object with 'cells'), got {got}")
        for direction, cell in run["cells"].items():
            times = cell.get("times_ms") or {}
            loops = [_value(times[name], "median") for name in times if name.startswith("loop")]
            loop = min((t for t in loops if t), default=None)
            found.setdefault(("floor", direction), [None] * len(runs))[index] = _value(cell.get("interleaved"), "ratio")
            found.setdefault(("loop", direction), [None] * len(runs))[index] = _ratio(
                loop, _value(times.get("ours[auto]"), "median"))
        found.setdefault(("gqa", "fwd+bwd"), [None] * len(runs))[index] = _value(
            (run.get("gqa") or {}).get("interleaved"), "ratio")
    names = dict(floor="ours over the varlen floor", loop="the per-document loop over ours", gqa="GQA over MHA")
    return [_row(dict(target=names[target], direction=direction), ratios, PACKED_LIMITS[target],
                 at_least=target == "loop")
            for (target, direction), ratios in found.items()]


def read_runs(paths: Sequence[str]) -> list[dict]:
    """The JSON objects of the runs at `paths`; ValueError naming a path that cannot be read as JSON."""
    runs = []
    for path in paths:
        try:
            runs.append(json.loads(Path(path).read_text()))
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot read {path}: {type(error).__name__}: {error}") from None
    return runs


def runs_line(paths: Sequence[str], noun: str = "run") -> str:
    """The line that names the runs a verdict read: "3 runs: a.json, b.json, c.json"."""
    return f"{len(paths)} {noun}{'' if len(paths) == 1 else 's'}: " + ", ".join(Path(path).name for path in paths)


def count_met(rows: Sequence[dict]) -> tuple[int, int]:
    """(cells met in every run, cells)."""
    return sum(row["met"] for row in rows), len(rows)


def format_verdicts(rows: Sequence[dict], title: str, *, cells: bool = True, spread: bool = True,
                    missed_only: bool = False) -> list[str]:
    """A title line (cells met in every run and, with spread=True, the range of the ratios: for rows of one kind of
    ratio) and, with cells=True, a line per cell (with missed_only=True, per cell that misses): its coordinates, each
    run's ratio ("-" where missing), the bound and limit, and met / MISSED."""
    seen = [r for row in rows for r in row["ratios"] if r is not None]
    span = f" (ratios {min(seen):.3f}-{max(seen):.3f})" if seen and spread else ""
    lines = [f"{title}: met in every run in {count_met(rows)[0]} of {len(rows)} cells{span}"]
    for row in rows if cells else ():
        if missed_only and row["met"]:
            continue
        cell = " ".join(f"{key}={value}" for key, value in row["cell"].items())
        ratios = " ".join("  -  " if r is None else f"{r:.3f}" for r in row["ratios"])
        lines.append(f"  {cell:72s} {ratios}  {row['bound']} {row['limit']:.2f}  {'met' if row['met'] else 'MISSED'}")
    return lines
