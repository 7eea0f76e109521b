"""Measuring the table `auto` reads (attention.auto_table), and checking `auto` against it.

`measure_auto_table` times every candidate executor in every cell of a sweep (mode x causal x N x head dim x
forward / forward and backward, and ragged N), round-robin in one process (`time_interleaved`), and returns
the table as a JSON object; `benchmarks/bench_auto_table.py` writes it into the package for the GPU it ran on,
keeping every finished cell. `check_auto_table` times `backend="auto"` beside the same executors per cell:
auto over the fastest of them with the 95% interval of that ratio (rounds resampled in pairs, `bench.stats`), each
name's samples, and per name what its plan regions did (`graph_regions`: eager runs, captures, replays over its
warm-up and timed calls).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

import torch

from hilbert_lab.attention.auto_table import device_kind, is_ragged
from hilbert_lab.attention.engine import dilated_attention
from hilbert_lab.attention.executors.kernel import GRAPH_REGIONS
from hilbert_lab.attention.pattern import MODES, DilatedPattern
from hilbert_lab.attention.selection import resolve_executor
from hilbert_lab.bench.stats import ratio_ci
from hilbert_lab.bench.targets import AUTO_CHECK_LIMIT
from hilbert_lab.bench.timing import Timing, free_cell_memory, time_interleaved


@dataclass(frozen=True)
class SweepCell:
    """Where one cell is timed: the pattern's mode and causality, N, head dim, forward and backward or not,
    and the batch and heads of its inputs."""

    mode: str
    causal: bool
    seq_len: int
    head_dim: int
    training: bool
    batch: int
    heads: int


def sweep_cells(seq_lens: Sequence[int], head_dims: Sequence[int], ragged_lens: Sequence[int] = (), *,
                heads: int = 12, batches: Sequence[int] = (1,), modes: Sequence[str] = MODES) -> list[SweepCell]:
    """The cells of a table: every mode, causal or not, forward alone or with the backward, for each N of
    seq_lens at each head dim and each N of ragged_lens at the smallest head dim, each at every batch size of
    `batches`; inputs (batch, N, heads, D)."""
    if not (seq_lens or ragged_lens) or not head_dims or not batches or \
            any(int(n) < 1 for n in (*seq_lens, *ragged_lens, *batches)):
        raise ValueError(f"seq_lens or ragged_lens, head_dims and batches must be non-empty and positive, got "
                         f"seq_lens={seq_lens!r}, head_dims={head_dims!r}, ragged_lens={ragged_lens!r}, "
                         f"batches={batches!r}")
    points = [(int(n), int(d)) for n in seq_lens for d in head_dims] + [(int(n), min(head_dims)) for n in ragged_lens]
    return [SweepCell(mode, causal, n, d, training, int(batch), heads) for n, d in points for batch in batches
            for mode in modes for causal in (False, True) for training in (False, True)]


def cell_calls(cell: SweepCell, names: Sequence[str], segment_lengths: Sequence[int], dilation_rates: Sequence[int],
               *, device: torch.device | str, dtype: torch.dtype = torch.bfloat16,
               seed: int = 0) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """(calls, errors): one call per executor name of `names` on random inputs of the cell (forward under
    no_grad, or forward and backward with a random upstream gradient), each run once here; a name whose call
    raises is left out, with its error line."""
    generator = torch.Generator(device=device).manual_seed(seed)
    shape = (cell.batch, cell.seq_len, cell.heads, cell.head_dim)
    q, k, v, upstream = (torch.randn(shape, generator=generator, device=device).to(dtype) for _ in range(4))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    kwargs = dict(segment_lengths=list(segment_lengths), dilation_rates=list(dilation_rates), mode=cell.mode,
                  causal=cell.causal)

    def call(name: str):
        if cell.training:
            out = dilated_attention(*leaves, backend=name, **kwargs)
            return torch.autograd.grad(out, leaves, upstream)
        with torch.no_grad():
            return dilated_attention(q, k, v, backend=name, **kwargs)

    calls, errors = {}, {}
    for name in names:
        try:
            call(name)
        except Exception as error:  # a candidate that cannot run the cell is not in its row
            errors[name] = f"{type(error).__name__}: {error}"[:200]
            continue
        calls[name] = lambda name=name: call(name)
    return calls, errors


def _timing_row(timings: dict[str, Timing]) -> dict:
    return {"times_ms": {name: t.median for name, t in timings.items()},
            "intervals_ms": {name: [t.low, t.high] for name, t in timings.items()}}


def measure_auto_table(cells: Sequence[SweepCell], backends: Sequence[str], segment_lengths: Sequence[int],
                       dilation_rates: Sequence[int], *, device: torch.device | str, repeats: int = 8,
                       on_cell: Optional[Callable[[dict], None]] = None, progress: bool = True,
                       burst_ms: Optional[float] = None) -> dict:
    """The table (a JSON object) of `backends` timed in every cell on `device`: {"device", "kind", "dtype",
    "pattern", "backends", "cells": [{mode, causal, seq_len, head_dim, training, ragged, batch, heads,
    times_ms, intervals_ms, errors}]}. on_cell(table) runs after each finished cell (to keep it). burst_ms: each
    round's sample a burst of calls issued back to back (time_interleaved), as a training loop issues steps, where
    None times one call after a device sync; the table records which ("burst_ms")."""
    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    dtype = _dtype_on(device)
    table = {"device": name, "kind": device_kind(name), "dtype": str(dtype).removeprefix("torch."),
             "pattern": {"segment_lengths": list(segment_lengths), "dilation_rates": list(dilation_rates)},
             "backends": list(backends), "burst_ms": burst_ms, "cells": []}
    for cell in _cells_progress(cells, progress):
        calls, errors = cell_calls(cell, backends, segment_lengths, dilation_rates, device=device, dtype=dtype)
        if not calls:
            continue
        timings = time_interleaved(calls, device=device, warmup=2, rounds=repeats, max_seconds=float("inf"),
                                   burst_ms=burst_ms)
        row = {**asdict(cell), "ragged": is_ragged(cell.seq_len, segment_lengths, dilation_rates),
               **_timing_row(timings), "errors": errors}
        table["cells"].append(row)
        if on_cell is not None:
            on_cell(table)
        del calls, timings
        free_cell_memory(device)
    return table


CELL_COORDINATES = ("mode", "causal", "seq_len", "batch", "heads", "head_dim", "training")


def update_cells(table: dict, measured: dict, *, revision: str) -> dict:
    """`table` with the cells of `measured` (a table of the same device kind, dtype and pattern) in place of its
    cells at the same coordinates (CELL_COORDINATES), or added; each such cell records the `revision` it was
    measured at, and the table's "updates" lists the update. The other cells are kept as they were."""
    for key in ("kind", "dtype", "pattern"):
        if table.get(key) != measured.get(key):
            raise ValueError(f"measured cells must share the table's {key}: {measured.get(key)!r} != {table.get(key)!r}")
    where = lambda cell: tuple(cell[key] for key in CELL_COORDINATES)  # noqa: E731
    fresh = {where(cell): {**cell, "revision": revision} for cell in measured["cells"]}
    cells = [fresh.pop(where(cell), cell) for cell in table["cells"]] + list(fresh.values())
    updates = [*table.get("updates", []), {"revision": revision, "cells": len(measured["cells"])}]
    return {**table, "cells": cells, "updates": updates}


CHECK_AGAINST = ("all", "fastest")  # what check_auto_table times beside auto: every executor, or the fastest


def check_auto_table(table: dict, *, device: torch.device | str, repeats: int = 8, settle_rounds: int = 0,
                     tolerance: float = AUTO_CHECK_LIMIT, progress: bool = True, burst_ms: Optional[float] = None,
                     against: str = "all", on_row: Optional[Callable[[list[dict]], None]] = None) -> list[dict]:
    """Per cell of `table`: auto timed beside the table's executors, round-robin, on fresh inputs; each row has
    the medians and intervals, each name's samples, the executor auto resolved to, auto over the fastest executor
    with the 95% interval of that ratio, and per name the counts of its plan regions' eager runs, captures and
    replays (`graph_regions`). settle_rounds > 0: a cell whose interval holds `tolerance` (undecided) is timed
    again, on its own, with that many rounds; the row is then that second timing (`rounds`), the first one kept
    under "first_pass". burst_ms: as measure_auto_table's (each row records it). against: "all" times every
    executor of the cell's table row beside auto, "fastest" only the one the table measured fastest there (auto
    over our fastest executor, at a fraction of the time; each row records which). on_row(rows) runs after each
    finished cell (to keep the rows so far)."""
    if settle_rounds < 0:
        raise ValueError(f"settle_rounds must be >= 0, got {settle_rounds}")
    if against not in CHECK_AGAINST:
        raise ValueError(f"against must be one of {CHECK_AGAINST}, got {against!r}")
    device = torch.device(device)
    dtype = _dtype_on(device)
    segments, rates = table["pattern"]["segment_lengths"], table["pattern"]["dilation_rates"]
    rows = []
    for raw in _cells_progress(table["cells"], progress):
        cell = SweepCell(**{field: raw[field] for field in SweepCell.__dataclass_fields__})
        picked = resolve_executor("auto", _probe(cell, device, dtype),
                                  DilatedPattern.create(segments, rates, mode=cell.mode, causal=cell.causal),
                                  training=cell.training).name
        names = ["auto", *(raw["times_ms"] if against == "all" else
                           [min(raw["times_ms"], key=raw["times_ms"].get)])]
        row = {**asdict(cell), "ragged": raw["ragged"], "auto_picks": picked, "against": against,
               **_check_cell(cell, names, segments, rates, device, dtype, repeats, burst_ms)}
        interval = row.get("auto_over_fastest_interval")
        if settle_rounds and interval is not None and _interval_side(interval, tolerance) == "undecided":
            first = {key: row[key] for key in ("times_ms", "intervals_ms", "samples_ms", "fastest", "auto_over_fastest",
                                               "auto_over_fastest_interval", "rounds")}
            row.update(_check_cell(cell, names, segments, rates, device, dtype, settle_rounds, burst_ms),
                       first_pass=first)
        rows.append(row)
        if on_row is not None:
            on_row(rows)
    return rows


def _check_cell(cell: SweepCell, names: Sequence[str], segments: Sequence[int], rates: Sequence[int],
                device: torch.device, dtype: torch.dtype, rounds: int, burst_ms: Optional[float] = None) -> dict:
    """One timing of a cell for check_auto_table: medians, intervals, samples, region tallies, errors, and auto over
    the fastest with its interval (rounds pair auto's calls with the fastest's: resampled by round)."""
    calls, errors = cell_calls(cell, names, segments, rates, device=device, dtype=dtype, seed=1)
    tallies = {name: dict.fromkeys(GRAPH_REGIONS.counts, 0) for name in calls}
    timings = time_interleaved({name: _tallied(call, tallies[name]) for name, call in calls.items()},
                               device=device, warmup=2, rounds=rounds, max_seconds=float("inf"), burst_ms=burst_ms)
    del calls
    free_cell_memory(device)
    result = {**_timing_row(timings), "errors": errors, "graph_regions": tallies, "rounds": rounds,
              "burst_ms": burst_ms,
              "samples_ms": {name: [round(s, 5) for s in t.samples] for name, t in timings.items()}}
    others = {name: t.median for name, t in timings.items() if name != "auto"}
    if "auto" in timings and others:
        fastest = min(others, key=others.get)
        _, low, high = ratio_ci(timings["auto"].samples, timings[fastest].samples)
        result.update(fastest=fastest, auto_over_fastest=timings["auto"].median / others[fastest],
                      auto_over_fastest_interval=[low, high])
    return result


def _tallied(call: Callable[[], object], tally: dict[str, int]) -> Callable[[], object]:
    """call, adding to `tally` what its plan regions did (GRAPH_REGIONS.counts: eager, captured, replayed, refused):
    two names of one executor can time apart where one replays its graphs and the other keeps meeting new tensor
    addresses (eager runs and captures)."""
    def run():
        with GRAPH_REGIONS.counting() as done:
            result = call()
        for kind, count in done.items():
            tally[kind] += count
        return result

    return run


def check_summary(rows: Sequence[dict], tolerance: float = AUTO_CHECK_LIMIT) -> dict:
    """Over the rows of `check_auto_table`: how many cells `auto` (its own timing, host time of choosing included)
    and its pick (that executor's timing by name: the choice alone, in the cells where it was timed) are within
    `tolerance` of the fastest executor, with the median and worst ratio of each. Where rows hold the 95% interval
    of auto over the fastest (`auto_over_fastest_interval`), auto's cells are also sorted by it: "settled_within"
    (the whole interval at or below `tolerance`), "settled_beyond" (the whole interval above it) and "undecided"
    (the interval holds `tolerance`: more rounds would tell), and how many were timed a second time ("retimed":
    check_auto_table's settle_rounds)."""
    auto, picked, intervals = [], [], []
    for row in rows:
        times = row["times_ms"]
        others = {name: value for name, value in times.items() if name != "auto"}
        if "auto" not in times or not others:
            continue
        fastest = min(others.values())
        auto.append(times["auto"] / fastest)
        if row["auto_picks"] in others:
            picked.append(others[row["auto_picks"]] / fastest)
        if row.get("auto_over_fastest_interval") is not None:
            intervals.append(row["auto_over_fastest_interval"])

    def stats(ratios: list[float]) -> dict:
        ordered = sorted(ratios)
        return {"within": sum(r <= tolerance for r in ordered),
                "median": ordered[len(ordered) // 2] if ordered else None, "worst": ordered[-1] if ordered else None}

    summary = {"cells": len(rows), "tolerance": tolerance, "auto": stats(auto), "picked": stats(picked)}
    if intervals:
        sides = [_interval_side(interval, tolerance) for interval in intervals]
        summary["auto"].update(settled_within=sides.count("within"), settled_beyond=sides.count("beyond"),
                               undecided=sides.count("undecided"), retimed=sum("first_pass" in row for row in rows))
    return summary


def _interval_side(interval: Sequence[float], tolerance: float) -> str:
    """Where a ratio's interval [low, high] lies against `tolerance`: "within" (high <= tolerance), "beyond"
    (low > tolerance) or "undecided" (it holds the tolerance)."""
    low, high = interval
    return "within" if high <= tolerance else "beyond" if low > tolerance else "undecided"


def _dtype_on(device: torch.device) -> torch.dtype:
    """What tables are timed in: bf16 on a GPU, float32 on the CPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _probe(cell: SweepCell, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of the cell's (B, N, H, D) shape on `device` for `resolve_executor` (expanded from one element:
    no memory)."""
    return torch.zeros((), device=device, dtype=dtype).expand(cell.batch, cell.seq_len, cell.heads, cell.head_dim)


def _cells_progress(cells, show: bool):
    if not show:
        return cells
    from tqdm.auto import tqdm

    return tqdm(cells, desc="cells")
