"""The measured table `backend="auto"` reads: per GPU kind, the time of each executor in cells of a sweep.

A table is a JSON file of the package (hilbert_lab/attention/auto_tables/<kind>.json, kind from the device's
name: "NVIDIA H200" -> "nvidia-h200"), written by `benchmarks/bench_auto_table.py` on that GPU. Each cell
holds its coordinates (mode, causal, N, batch B, heads H, head dim D, training: forward and backward or forward
alone, ragged: N leaves uneven blocks) and the median milliseconds of every executor timed there
(bench.auto_table).

`table_choice` answers a call from the cell of the same mode, causal, training and raggedness nearest in
head dim, then in query rows B * N * H on a log scale (the GPU work per kernel call grows with them while the
host time per call does not), then in N: the fastest executor of that cell that runs the call, or the caller's
preferred one (the rules' pick) where the cell timed it within TIE of the fastest (a tie the table cannot
tell). A cell answers only calls within a factor REACH of its head dim and of its query rows: which executor
wins turns on the balance of host and GPU time, which the table has not measured between its cells. A call with
no such cell (another GPU kind, another dtype class, work the table does not reach) gets None and `auto` keeps its
rules.
"""
from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

TABLE_DIR = Path(__file__).with_name("auto_tables")
REACH = 2 ** 0.5  # a cell answers calls whose head dim and query rows lie within this factor of its own
TIE = 1.03  # times within this factor of a cell's fastest are one time: two timings of one executor differ so much
CELL_KEYS = ("mode", "causal", "seq_len", "batch", "heads", "head_dim", "training", "ragged", "times_ms")


@dataclass(frozen=True)
class Cell:
    """One measured cell: its coordinates and the median milliseconds per executor name."""

    mode: str
    causal: bool
    seq_len: int
    batch: int
    heads: int
    head_dim: int
    training: bool
    ragged: bool
    times_ms: tuple[tuple[str, float], ...]

    @property
    def rows(self) -> int:
        """Query rows B * N * H."""
        return self.batch * self.seq_len * self.heads

    def fastest_first(self) -> list[str]:
        """The executors of the cell, fastest first."""
        return [name for name, _ in sorted(self.times_ms, key=lambda item: item[1])]


def device_kind(name: str) -> str:
    """The table name of a device: its name in lower case, runs of other characters as one '-'
    ("NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3")."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def is_ragged(seq_len: int, segment_lengths: Sequence[int], dilation_rates: Optional[Sequence[int]] = None) -> bool:
    """Whether N leaves blocks of uneven length: a segment length w <= N that does not divide N, or a segment
    covering all N (w > N) whose dilation rate does not divide N."""
    rates = list(dilation_rates) if dilation_rates is not None else [1] * len(segment_lengths)
    return any(seq_len % w if w <= seq_len else seq_len % r for w, r in zip(segment_lengths, rates))


def table_path(kind: str) -> Path:
    """Where the table of GPU kind `kind` lives in the package."""
    return TABLE_DIR / f"{kind}.json"


def parse_table(data: object, source: str) -> tuple[Cell, ...]:
    """The cells of a table's JSON object; ValueError naming `source` and the key when it is malformed."""
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise ValueError(f"{source}: a table is a JSON object with a list 'cells'")
    cells = []
    for index, raw in enumerate(data["cells"]):
        missing = [key for key in CELL_KEYS if not isinstance(raw, dict) or key not in raw]
        if missing:
            raise ValueError(f"{source}: cells[{index}] lacks {missing} (each cell has {list(CELL_KEYS)})")
        times = raw["times_ms"]
        if not isinstance(times, dict) or not times or not all(
                isinstance(value, (int, float)) and math.isfinite(value) and value > 0 for value in times.values()):
            raise ValueError(f"{source}: cells[{index}].times_ms must map executor names to positive milliseconds")
        cells.append(Cell(str(raw["mode"]), bool(raw["causal"]), int(raw["seq_len"]), int(raw["batch"]),
                          int(raw["heads"]), int(raw["head_dim"]), bool(raw["training"]), bool(raw["ragged"]),
                          tuple(sorted((str(name), float(value)) for name, value in times.items()))))
    return tuple(cells)


@functools.lru_cache(maxsize=16)
def load_table(kind: str) -> tuple[Cell, ...]:
    """The packaged table of GPU kind `kind` (read once per process); () when there is none."""
    path = table_path(kind)
    if not path.is_file():
        return ()
    return parse_table(json.loads(path.read_text()), str(path.name))


def describe_table(kind: str) -> str:
    """One line on the packaged table of GPU kind `kind`: its cells and what they span, or that `auto` keeps its
    rules there."""
    cells = load_table(kind)
    if not cells:
        return f"no measured table for {kind}: auto keeps its rules"
    rows = sorted({cell.rows for cell in cells if not cell.ragged})
    dims = sorted({cell.head_dim for cell in cells})
    ragged = sum(cell.ragged for cell in cells)
    return (f"measured table {kind}: {len(cells)} cells ({ragged} of them ragged N) at head dims "
            f"{', '.join(map(str, dims))} and query rows B*N*H {', '.join(f'{n:,}' for n in rows)}; auto takes it "
            f"for fp16/bf16 calls within a factor {REACH:.2f} of a cell")


def nearest_cell(cells: Sequence[Cell], *, mode: str, causal: bool, seq_len: int, rows: int, head_dim: int,
                 training: bool, ragged: bool) -> Optional[Cell]:
    """The cell of the same mode, causal, training and raggedness nearest in head dim, then in log query rows
    (B * N * H), then in log N; None when the table has none of that kind."""
    same = [cell for cell in cells if (cell.mode, cell.causal, cell.training, cell.ragged) ==
            (mode, bool(causal), bool(training), bool(ragged))]
    if not same:
        return None
    return min(same, key=lambda cell: (abs(cell.head_dim - head_dim), abs(math.log2(cell.rows / rows)),
                                       abs(math.log2(cell.seq_len / seq_len)), cell.rows))


def table_choice(cells: Sequence[Cell], *, mode: str, causal: bool, seq_len: int, rows: int, head_dim: int,
                 training: bool, ragged: bool, runs: Callable[[str], bool],
                 prefer: Optional[str] = None) -> Optional[str]:
    """The fastest executor of the nearest cell (`nearest_cell`) for which runs(name) holds, or `prefer` where it
    runs and the cell timed it within TIE of that fastest; None without one, or when that cell's head dim or query
    rows are more than a factor REACH from the call's."""
    cell = nearest_cell(cells, mode=mode, causal=causal, seq_len=seq_len, rows=rows, head_dim=head_dim,
                        training=training, ragged=ragged)
    if cell is None or not (_within(cell.head_dim, head_dim) and _within(cell.rows, rows)):
        return None
    times = {name: ms for name, ms in cell.times_ms if runs(name)}
    if not times:
        return None
    fastest = min(times, key=times.get)
    return prefer if prefer in times and times[prefer] <= TIE * times[fastest] else fastest


def _within(measured: int, wanted: int) -> bool:
    return max(measured / wanted, wanted / measured) <= REACH * (1 + 1e-9)
