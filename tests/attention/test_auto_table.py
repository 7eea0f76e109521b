"""The measured table `auto` reads: names, raggedness, parsing, the nearest cell, the rule reading the packaged
table, and the bench functions that measure and check one (on the CPU, tiny)."""
from __future__ import annotations

import functools
import json

import pytest
import torch

from hilbert_lab.attention import auto_table, selection
from hilbert_lab.attention.auto_table import Cell, is_ragged, nearest_cell, parse_table, table_choice
from hilbert_lab.attention.executors import EXECUTORS
from hilbert_lab.attention.executors.kernel import GRAPH_REGIONS
from hilbert_lab.bench.stats import ratio_ci
from hilbert_lab.bench.auto_table import (
    check_auto_table, check_summary, measure_auto_table, sweep_cells, update_cells,
)


def _cell(n, times, *, batch=1, heads=12, mode="longnet", causal=True, d=64, training=False, ragged=False):
    return Cell(mode, causal, n, batch, heads, d, training, ragged, tuple(sorted(times.items())))


def test_device_kind_and_raggedness():
    assert auto_table.device_kind("NVIDIA H200") == "nvidia-h200"
    assert auto_table.device_kind("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    segments, rates = [2048, 4096, 8192], [1, 2, 4]
    assert not is_ragged(32768, segments, rates)
    assert is_ragged(32773, segments, rates)  # every segment length leaves a tail
    assert not is_ragged(1000, [2048], [4]) and is_ragged(1001, [2048], [4])  # one segment: the rate decides
    assert not is_ragged(4096, [2048, 8192], [1, 2]) and is_ragged(4097, [2048, 8192], [1, 2])


def test_the_nearest_cell_answers_and_the_fastest_runnable_executor_wins():
    cells = [_cell(8192, {"sdpa": 2.0, "triton": 1.0, "fa4": 1.5}),
             _cell(131072, {"sdpa": 5.0, "triton": 6.0, "fa4": 4.0}),
             _cell(32773, {"sdpa": 3.0, "triton": 2.5}, ragged=True),
             _cell(8192, {"sdpa": 1.0, "triton": 3.0}, training=True)]
    choose = functools.partial(table_choice, cells, mode="longnet", causal=True, head_dim=64, ragged=False,
                               training=False, runs=lambda name: True)
    assert choose(seq_len=8192, rows=8192 * 12) == "triton"
    assert choose(seq_len=131072, rows=131072 * 12) == "fa4"
    # the query rows decide: 8K tokens in a batch of 16 are as much work per call as 128K in one
    assert choose(seq_len=8192, rows=16 * 8192 * 12) == "fa4"
    assert choose(seq_len=11000, rows=11000 * 12) == "triton"  # within sqrt(2) of the 8K cell's rows
    for n in (16384, 65536, 1 << 20, 4096):  # a factor 2 or more from every cell: the table does not answer
        assert choose(seq_len=n, rows=n * 12) is None, n
    assert table_choice(cells, mode="longnet", causal=True, seq_len=8192, rows=8192 * 12, head_dim=64, ragged=False,
                        training=False, runs=lambda name: name != "triton") == "fa4"  # the next fastest that runs
    assert choose(seq_len=131072, rows=131072 * 12, runs=lambda name: False) is None
    assert table_choice(cells, mode="longnet", causal=True, seq_len=40000, rows=40000 * 12, head_dim=64, ragged=True,
                        training=False, runs=lambda name: True) == "triton"
    assert table_choice(cells, mode="longnet", causal=True, seq_len=8192, rows=8192 * 12, head_dim=80, ragged=False,
                        training=True, runs=lambda name: True) == "sdpa"  # nearest head dim of its kind
    assert table_choice(cells, mode="longnet", causal=True, seq_len=8192, rows=8192 * 12, head_dim=128, ragged=False,
                        training=True, runs=lambda name: True) is None  # twice the cell's head dim: not measured
    for other in (dict(mode="head_groups", causal=True), dict(mode="longnet", causal=False)):
        assert table_choice(cells, seq_len=8192, rows=8192 * 12, head_dim=64, ragged=False, training=False,
                            runs=lambda name: True, **other) is None  # no cell of that kind: the rules decide
    assert nearest_cell(cells, mode="longnet", causal=True, seq_len=8192, rows=8192 * 12, head_dim=64,
                        training=False, ragged=False).times_ms == (("fa4", 1.5), ("sdpa", 2.0), ("triton", 1.0))


def test_the_table_of_a_kind_is_described_in_one_line():
    cells = auto_table.load_table("nvidia-h200")
    line = auto_table.describe_table("nvidia-h200")
    assert line.startswith(f"measured table nvidia-h200: {len(cells)} cells ({sum(c.ragged for c in cells)} of them "
                           "ragged N) at head dims 64, 128 and query rows")
    assert f"{min(cell.rows for cell in cells):,}" in line and "within a factor 1.41 of a cell" in line
    assert auto_table.describe_table("no-such-gpu") == "no measured table for no-such-gpu: auto keeps its rules"


def test_a_malformed_table_is_refused_naming_the_file_and_the_key():
    with pytest.raises(ValueError, match="x.json: a table is a JSON object with a list 'cells'"):
        parse_table([], "x.json")
    cell = dict(mode="longnet", causal=True, seq_len=8, batch=1, heads=2, head_dim=4, training=False, ragged=False,
                times_ms={"sdpa": 1.0})
    assert parse_table({"cells": [cell]}, "x.json")[0].rows == 16
    with pytest.raises(ValueError, match=r"x.json: cells\[0\] lacks \['heads'\]"):
        parse_table({"cells": [{k: v for k, v in cell.items() if k != "heads"}]}, "x.json")
    with pytest.raises(ValueError, match=r"cells\[0\].times_ms must map executor names to positive milliseconds"):
        parse_table({"cells": [{**cell, "times_ms": {"sdpa": float("nan")}}]}, "x.json")


def test_a_tie_in_the_table_goes_to_the_preferred_executor():
    """Within TIE of a cell's fastest the caller's preference (the rules' pick) stands; beyond it, the fastest."""
    cells = [_cell(32768, {"triton": 0.675, "fa4": 0.677, "sdpa": 0.75})]
    choose = functools.partial(table_choice, cells, mode="longnet", causal=True, seq_len=32768, rows=32768 * 12,
                               head_dim=64, training=False, ragged=False)
    assert choose(runs=lambda name: True) == choose(runs=lambda name: True, prefer="sdpa") == "triton"
    assert choose(runs=lambda name: True, prefer="fa4") == "fa4"
    assert choose(runs=lambda name: name != "fa4", prefer="fa4") == "triton"  # a preference that cannot run
    assert choose(runs=lambda name: name == "sdpa", prefer="fa4") == "sdpa"
    assert auto_table.TIE == 1.03


def test_the_measured_choice_wins_unless_the_in_place_buffers_do_not_fit():
    rule = functools.partial(selection.rule_for, "cuda", (9, 0), torch.bfloat16, triton_ok=True, seq_len=32768,
                             head_dim=64)
    assert rule() == "sdpa" and rule(measured="fa4") == "fa4" and rule(measured="triton") == "triton"
    assert rule(measured="fa4", inplace_fits=False) == "triton"
    assert selection.rule_for("cpu", None, torch.float32, measured="fa4") == "sdpa"  # tables are for CUDA
    assert rule(head_dim=4, measured="sdpa") == "triton"  # the head-dim rule still stands after it


def test_auto_reads_the_packaged_table(monkeypatch):
    """Every cell of every packaged table names known executors, and the rule returns each cell's fastest at
    that cell's own coordinates (the device, its facts and availability stubbed: no GPU here)."""
    tables = sorted(auto_table.TABLE_DIR.glob("*.json"))
    assert tables, "no table in the package"
    monkeypatch.setattr(selection, "_cuda_facts", lambda device, dtype: ((9, 0), True, False, True))
    monkeypatch.setattr(selection, "_inplace_fits", lambda *args: True)
    monkeypatch.setattr(selection, "unavailable_reason", lambda *args, **kwargs: None)
    for path in tables:
        data = json.loads(path.read_text())
        cells = auto_table.load_table(path.stem)
        assert len(cells) == len(data["cells"]) > 0
        segments, rates = data["pattern"]["segment_lengths"], data["pattern"]["dilation_rates"]
        monkeypatch.setattr(selection, "_device_kind", lambda device, kind=path.stem: kind)
        selection._measured_choice.cache_clear()
        for cell in cells:
            assert {name for name, _ in cell.times_ms} <= set(EXECUTORS)
            assert cell.ragged == is_ragged(cell.seq_len, segments, rates)
            picked = selection.rule_backend("cuda", torch.bfloat16, shape=(cell.batch, cell.seq_len, cell.heads,
                                                                          cell.head_dim),
                                            segment_lengths=segments, dilation_rates=rates, mode=cell.mode,
                                            causal=cell.causal, training=cell.training)
            times = dict(cell.times_ms)
            fastest = cell.fastest_first()[0]
            rules = selection.rule_for("cuda", (9, 0), torch.bfloat16, triton_ok=True, fa4_ok=True,
                                       seq_len=cell.seq_len, head_dim=cell.head_dim, mode=cell.mode,
                                       training=cell.training)
            tie = rules in times and times[rules] <= auto_table.TIE * times[fastest]
            assert picked == (rules if tie else fastest), cell
        cell = cells[0]
        shape = (cell.batch, cell.seq_len, cell.heads, cell.head_dim)
        common = dict(shape=shape, segment_lengths=segments, dilation_rates=rates, mode=cell.mode, causal=cell.causal,
                      training=cell.training)
        rules = functools.partial(selection.rule_for, "cuda", (9, 0), triton_ok=True, fa4_ok=True,
                                  seq_len=cell.seq_len, head_dim=cell.head_dim, mode=cell.mode, training=cell.training)
        # dense-block callers (the ring's steps) and full-precision calls keep the rules: the table timed neither
        assert selection.rule_backend("cuda", torch.bfloat16, whole_pattern=False, **common) == \
            rules(torch.bfloat16, triton_ok=False, dense_blocks=True)
        assert selection.rule_backend("cuda", torch.float32, **common) == rules(torch.float32) == "sdpa"
        # a call far below every cell's query rows is not the table's to answer
        assert selection._measured_choice(torch.device("cuda"), torch.bfloat16, cell.seq_len, cell.heads,
                                          cell.head_dim, tuple(segments), tuple(rates), cell.mode, cell.causal,
                                          cell.training) is None
    selection._measured_choice.cache_clear()


def test_measuring_and_checking_a_table_on_the_cpu():
    assert len(sweep_cells([64, 128], [8, 16], [69], heads=2, batches=(1, 2))) == (4 + 1) * 2 * 8
    cells = sweep_cells([64], [8], [69], heads=2, modes=("longnet",))
    assert len(cells) == 8 and {c.seq_len for c in cells} == {64, 69} and {c.training for c in cells} == {False, True}
    kept = []
    table = measure_auto_table(cells[:2], ["sdpa", "manual"], [16, 32], [1, 2], device="cpu", repeats=2,
                               on_cell=lambda t: kept.append(len(t["cells"])), progress=False)
    assert kept == [1, 2] and table["kind"] == "cpu"
    parsed = parse_table(table, "cpu.json")
    assert [c.seq_len for c in parsed] == [64, 64] and all(dict(c.times_ms).keys() == {"manual", "sdpa"}
                                                          for c in parsed)
    kept_rows = []
    GRAPH_REGIONS.seen[("a finished cell's region",)] = 1
    rows = check_auto_table(table, device="cpu", repeats=2, progress=False,
                            on_row=lambda done: kept_rows.append([row["seq_len"] for row in done]))
    assert kept_rows == [[64], [64, 64]]  # the rows so far, after each finished cell
    assert not GRAPH_REGIONS.seen  # each cell's regions freed before the next (their pools held its temporaries)
    assert [row["auto_picks"] for row in rows] == ["sdpa", "sdpa"]  # the CPU rule (no table for the CPU)
    # sdpa and manual run no plan regions: every name's tally is there, all zero
    assert all(row["graph_regions"] == {name: {"eager": 0, "captured": 0, "replayed": 0, "refused": 0}
                                        for name in ("auto", "sdpa", "manual")} for row in rows)
    summary = check_summary(rows, 1e9)
    assert summary["cells"] == 2 and summary["auto"]["within"] == 2 and summary["picked"]["within"] == 2
    assert summary["auto"]["settled_within"] == 2  # every interval below a tolerance of 1e9
    for row in rows:  # the interval of auto over the fastest: from the samples of both, round by round
        fastest = row["samples_ms"][row["fastest"]]
        assert len(row["samples_ms"]["auto"]) == len(fastest) == 2
        assert row["auto_over_fastest_interval"] == pytest.approx(list(ratio_ci(row["samples_ms"]["auto"], fastest)[1:]),
                                                                rel=1e-3)  # samples kept to 10 ns
    # bursts: each round's sample the median of calls issued back to back, recorded in the table and the rows
    bursts = measure_auto_table(cells[:1], ["sdpa"], [16, 32], [1, 2], device="cpu", repeats=2, progress=False,
                                burst_ms=5.0)
    assert bursts["burst_ms"] == 5.0 and table["burst_ms"] is None and len(bursts["cells"]) == 1
    rows = check_auto_table(bursts, device="cpu", repeats=2, progress=False, burst_ms=5.0)
    assert rows[0]["burst_ms"] == 5.0 and rows[0]["graph_regions"]["sdpa"]["eager"] == 0
    assert len(rows[0]["samples_ms"]["auto"]) == 2
    with pytest.raises(ValueError, match="seq_lens or ragged_lens, head_dims and batches must be non-empty"):
        sweep_cells([], [64])
    assert {c.seq_len for c in sweep_cells([], [8, 16], [69], heads=2)} == {69}  # the ragged cells alone


def test_a_checks_region_tally_counts_each_names_own_calls(monkeypatch):
    """The tally of a name adds what GRAPH_REGIONS counted during that name's calls only."""
    from hilbert_lab.bench import auto_table as bench_auto_table

    regions = bench_auto_table.GRAPH_REGIONS
    monkeypatch.setattr(regions, "counts", {"eager": 0, "captured": 0, "replayed": 0, "refused": 0})

    def replaying():
        regions.counts["replayed"] += 3
        return "out"

    tally = dict.fromkeys(regions.counts, 0)
    call = bench_auto_table._tallied(replaying, tally)
    regions.counts["eager"] += 5  # another name's calls, between this one's
    assert call() == "out" and call() == "out"
    assert tally == {"eager": 0, "captured": 0, "replayed": 6, "refused": 0}


def test_measured_cells_replace_the_tables_cells_at_their_coordinates():
    """An update keeps every other cell, replaces the cells it measured (marked with its revision), adds new ones,
    and refuses cells of another kind, dtype or pattern."""
    def cell(n, training, ms):
        return dict(mode="longnet", causal=True, seq_len=n, batch=1, heads=12, head_dim=64, training=training,
                    ragged=n % 2 == 1, times_ms={"fa4": ms})

    meta = dict(kind="nvidia-h200", dtype="bfloat16", pattern={"segment_lengths": [8], "dilation_rates": [1]})
    table = dict(meta, env={"git": {"commit": "old"}}, cells=[cell(64, False, 1.0), cell(65, True, 2.0)])
    measured = dict(meta, cells=[cell(65, True, 0.5), cell(67, True, 0.7)])
    updated = update_cells(table, measured, revision="new")
    assert [(c["seq_len"], c["times_ms"]["fa4"], c.get("revision")) for c in updated["cells"]] == \
        [(64, 1.0, None), (65, 0.5, "new"), (67, 0.7, "new")]
    assert updated["env"] == table["env"] and updated["updates"] == [{"revision": "new", "cells": 2}]
    assert len(parse_table(updated, "nvidia-h200.json")) == 3
    with pytest.raises(ValueError, match="share the table's dtype"):
        update_cells(table, dict(measured, dtype="float16"), revision="new")


def test_check_summary_counts_auto_and_its_pick_against_the_fastest():
    rows = [{"auto_picks": "a", "times_ms": {"auto": 1.1, "a": 1.0, "b": 1.0}},
            {"auto_picks": "a", "times_ms": {"auto": 2.0, "a": 1.5, "b": 1.0}}]
    summary = check_summary(rows, 1.03)
    assert summary["auto"] == {"within": 0, "median": 2.0, "worst": 2.0}
    assert summary["picked"] == {"within": 1, "median": 1.5, "worst": 1.5}


def test_check_summary_sorts_auto_by_the_interval_of_its_ratio():
    """A cell is settled within the tolerance when its whole interval is at or below it, settled beyond when the
    whole interval is above it, and undecided when the interval holds it; rows without an interval count only by
    their medians."""
    def row(auto, interval):
        return {"auto_picks": "a", "times_ms": {"auto": auto, "a": 1.0}, "auto_over_fastest_interval": interval}

    rows = [row(1.0, [0.99, 1.01]), row(1.02, [0.98, 1.06]), row(1.05, [1.04, 1.07]), row(1.01, [1.0, 1.03]),
            {"auto_picks": "a", "times_ms": {"auto": 1.0, "a": 1.0}}]
    summary = check_summary(rows, 1.03)
    assert summary["auto"]["within"] == 4
    assert (summary["auto"]["settled_within"], summary["auto"]["settled_beyond"], summary["auto"]["undecided"]) == \
        (2, 1, 1)
    assert "settled_within" not in check_summary(rows[-1:], 1.03)["auto"]


def test_an_undecided_cell_is_timed_again_alone_with_the_settle_rounds(monkeypatch):
    """A cell whose interval of auto over the fastest holds the tolerance is timed a second time with settle_rounds
    rounds, the row then being that timing with the first kept; a settled cell is timed once."""
    from hilbert_lab.bench import auto_table as bench_auto_table

    intervals = iter([[0.99, 1.06], [1.0, 1.02], [1.0, 1.01]])  # cell 1: undecided, then settled; cell 2: settled
    rounds_asked = []

    def timing(cell, names, segments, rates, device, dtype, rounds, burst_ms=None):
        rounds_asked.append(rounds)
        return {"times_ms": {"auto": 1.01, "sdpa": 1.0}, "intervals_ms": {}, "samples_ms": {}, "errors": {},
                "graph_regions": {}, "rounds": rounds, "fastest": "sdpa", "auto_over_fastest": 1.01,
                "auto_over_fastest_interval": next(intervals)}

    monkeypatch.setattr(bench_auto_table, "_check_cell", timing)
    cell = dict(mode="longnet", causal=False, seq_len=64, head_dim=8, training=False, batch=1, heads=2, ragged=False,
                times_ms={"sdpa": 1.0})
    table = {"pattern": {"segment_lengths": [16, 32], "dilation_rates": [1, 2]}, "cells": [cell, dict(cell, seq_len=128)]}
    rows = check_auto_table(table, device="cpu", repeats=4, settle_rounds=16, progress=False)
    assert rounds_asked == [4, 16, 4]
    assert rows[0]["rounds"] == 16 and rows[0]["auto_over_fastest_interval"] == [1.0, 1.02]
    assert rows[0]["first_pass"]["rounds"] == 4 and rows[0]["first_pass"]["auto_over_fastest_interval"] == [0.99, 1.06]
    assert "first_pass" not in rows[1] and rows[1]["rounds"] == 4
    assert check_summary(rows, 1.03)["auto"]["retimed"] == 1
    with pytest.raises(ValueError, match="settle_rounds must be >= 0"):
        check_auto_table(table, device="cpu", settle_rounds=-1, progress=False)


def test_a_check_against_the_fastest_times_auto_beside_the_tables_fastest_executor_of_each_cell(monkeypatch):
    """against="fastest": each cell times auto beside the one executor its table row measured fastest (which
    differs between cells), on the first pass and on a settling one; "all" times every executor of the row."""
    from hilbert_lab.bench import auto_table as bench_auto_table

    names_asked = []

    def timing(cell, names, segments, rates, device, dtype, rounds, burst_ms=None):
        names_asked.append(list(names))
        return {"times_ms": dict.fromkeys(names, 1.0), "intervals_ms": {}, "samples_ms": {}, "errors": {},
                "graph_regions": {}, "rounds": rounds, "fastest": names[1], "auto_over_fastest": 1.0,
                "auto_over_fastest_interval": [0.99, 1.06] if rounds == 2 else [0.99, 1.01]}

    monkeypatch.setattr(bench_auto_table, "_check_cell", timing)
    cell = dict(mode="longnet", causal=False, seq_len=64, head_dim=8, training=False, batch=1, heads=2, ragged=False,
                times_ms={"sdpa": 1.0, "manual": 2.0})
    table = {"pattern": {"segment_lengths": [16, 32], "dilation_rates": [1, 2]},
             "cells": [cell, dict(cell, seq_len=128, times_ms={"sdpa": 3.0, "manual": 2.5})]}
    rows = check_auto_table(table, device="cpu", repeats=2, settle_rounds=8, against="fastest", progress=False)
    assert names_asked == [["auto", "sdpa"], ["auto", "sdpa"], ["auto", "manual"], ["auto", "manual"]]
    assert [row["against"] for row in rows] == ["fastest", "fastest"]
    names_asked.clear()
    check_auto_table(table, device="cpu", repeats=4, progress=False)
    assert names_asked == [["auto", "sdpa", "manual"], ["auto", "sdpa", "manual"]]
    with pytest.raises(ValueError, match=r"against must be one of \('all', 'fastest'\), got 'best'"):
        check_auto_table(table, device="cpu", against="best", progress=False)
