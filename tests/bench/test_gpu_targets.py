"""bench.targets: a cell meets its target only where every run has it within the limit; the benchmarks' --verdict
reads runs they wrote (no GPU) and prints that per cell."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hilbert_lab.bench.targets import (
    auto_check_verdicts, count_met, format_verdicts, headline_verdicts, packed_verdicts, ragged_verdicts,
    runs_line, sweep_verdicts,
)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "reports" / "results"
SCRIPT = ROOT / "benchmarks" / "bench_gpu_attention.py"
PACKED_SCRIPT = ROOT / "benchmarks" / "bench_packed.py"
AUTO_TABLE_SCRIPT = ROOT / "benchmarks" / "bench_auto_table.py"


def _sweep_row(mode, seq_len, ratio, causal=True, head_dim=64, direction="fwd", auto_ms=1.0, hilbert_ms=None):
    return dict(mode=mode, causal=causal, seq_len=seq_len, head_dim=head_dim, direction=direction,
                auto_over_floor=ratio, auto_ms=auto_ms, hilbert_ms=hilbert_ms)


def test_a_cell_is_met_only_where_every_run_meets_its_limit():
    runs = [dict(sweep=[_sweep_row("longnet", 8192, 1.29), _sweep_row("longnet", 32768, 1.14),
                        _sweep_row("head_groups", 32768, 1.10)]),
            dict(sweep=[_sweep_row("longnet", 8192, 1.25), _sweep_row("longnet", 32768, 1.16)])]
    rows = sweep_verdicts(runs)
    assert [(row["cell"]["mode"], row["cell"]["seq_len"], row["ratios"], row["limit"], row["met"], row["worst"])
            for row in rows] == [("longnet", 8192, [1.29, 1.25], 1.30, True, 1.29),
                                 ("longnet", 32768, [1.14, 1.16], 1.15, False, 1.16),
                                 ("head_groups", 32768, [1.10, None], 1.15, False, 1.10)]  # run 2 lacks it
    assert count_met(rows) == (1, 3)


def test_hilbert_headline_and_ragged_ratios_and_limits():
    runs = [dict(sweep=[_sweep_row("longnet", 32768, 1.0, auto_ms=2.0, hilbert_ms=2.1)],
                 headline=[dict(mode="head_groups", causal=False, seq_len=32768, head_dim=64, direction="fwd",
                                auto_ms=1.06, fa4_floor_ms=1.0),
                           dict(mode="head_groups", causal=False, seq_len=32768, head_dim=64, direction="fwd+bwd",
                                auto_ms=1.06, fa4_floor_ms=1.0)],
                 ragged=[dict(mode="longnet", m=32768, direction="fwd", ratios={"auto": 1.09, "fa4_floor": 1.2}),
                         dict(mode="longnet", m=131072, direction="fwd+bwd", error="the process died")])]
    (hilbert,) = sweep_verdicts(runs, hilbert=True)
    assert hilbert["ratios"] == [pytest.approx(1.05)] and hilbert["limit"] == 1.05
    assert [(row["ratios"], row["limit"], row["met"]) for row in headline_verdicts(runs)] == [
        ([pytest.approx(1.06)], 1.05, False), ([pytest.approx(1.06)], 1.10, True)]
    assert [(row["cell"], row["ratios"], row["met"]) for row in ragged_verdicts(runs)] == [
        (dict(mode="longnet", m=32768, direction="fwd"), [1.09], True),
        (dict(mode="longnet", m=131072, direction="fwd+bwd"), [None], False)]  # a pair that died is not met


def test_the_committed_runs_give_the_verdicts_the_docs_state():
    def load(*names):
        return [json.loads((RESULTS / name).read_text()) for name in names]

    ragged = ragged_verdicts(load(*(f"gpu_attention_ragged_caller_h100_11bbebf_run{i}.json" for i in (1, 2, 3))))
    worst = max(row["ratios"]["auto"] for i in (1, 2, 3)
                for row in load(f"gpu_attention_ragged_caller_h100_11bbebf_run{i}.json")[0]["ragged"])
    assert count_met(ragged) == (8, 8) and max(row["worst"] for row in ragged) == worst < 1.06
    headline = headline_verdicts(load(*(f"gpu_attention_headline_h100_1510a94_run{i}.json" for i in (1, 2, 3))))
    assert [(row["cell"]["mode"], row["cell"]["causal"]) for row in headline if not row["met"]] == [
        ("longnet", True), ("longnet", True)]
    sweep = sweep_verdicts(load("gpu_attention_sweep_h100_200211b_run1.json",
                                *(f"gpu_attention_sweep_h100_107fe7c_run{i}.json" for i in (2, 3))))
    assert count_met([row for row in sweep if row["cell"]["seq_len"] > 8192]) == (33, 48)
    assert count_met([row for row in sweep if row["cell"]["seq_len"] == 8192]) == (8, 16)
    caller = sweep_verdicts(load("gpu_attention_sweep_caller_h100_11bbebf_run1.json",
                                 "gpu_attention_sweep_caller_h100_f665f2d_run2.json",
                                 "gpu_attention_sweep_caller_h100_a0c2551_run3.json"))
    assert count_met([row for row in caller if row["cell"]["seq_len"] > 8192]) == (41, 48)
    assert count_met([row for row in caller if row["cell"]["seq_len"] == 8192]) == (13, 16)
    for revision in ("f665f2d", "b8e880c", "2435667"):  # the H100's bursts of one or two calls (docs/attention.md)
        packed = packed_verdicts(load(*(f"packed_h100_{revision}_run{i}.json" for i in (1, 2, 3))))
        assert [(row["cell"]["target"], row["cell"]["direction"]) for row in packed if row["met"]] == [
            ("ours over the varlen floor", "fwd"), ("the per-document loop over ours", "fwd+bwd")]
    for machine, revision in (("h200", "50d02c8"), ("h100", "1220b36")):  # the H100 since bursts of three calls or more
        packed = packed_verdicts(load(*(f"packed_{machine}_{revision}_run{i}.json" for i in (1, 2, 3))))
        assert [(row["cell"]["target"], row["cell"]["direction"]) for row in packed if row["met"]] == [
            ("ours over the varlen floor", "fwd"), ("ours over the varlen floor", "fwd+bwd"),
            ("the per-document loop over ours", "fwd+bwd")]
        assert max(row["worst"] for row in packed if row["cell"]["direction"] == "fwd+bwd"
                   and row["cell"]["target"] == "ours over the varlen floor") < 1.22


def test_format_verdicts_names_each_cell_its_runs_and_the_verdict():
    rows = sweep_verdicts([dict(sweep=[_sweep_row("longnet", 32768, 1.2)]), dict(sweep=[])])
    assert format_verdicts(rows, "sweep") == [
        "sweep: met in every run in 0 of 1 cells (ratios 1.200-1.200)",
        f"  {'mode=longnet causal=True seq_len=32768 head_dim=64 direction=fwd':72s} 1.200   -    <= 1.15  MISSED"]
    assert format_verdicts(rows, "sweep", cells=False) == ["sweep: met in every run in 0 of 1 cells (ratios "
                                                           "1.200-1.200)"]
    both = sweep_verdicts([dict(sweep=[_sweep_row("longnet", 32768, 1.2), _sweep_row("longnet", 65536, 1.1)])])
    assert format_verdicts(both, "sweep", missed_only=True) == [
        "sweep: met in every run in 1 of 2 cells (ratios 1.100-1.200)",
        f"  {'mode=longnet causal=True seq_len=32768 head_dim=64 direction=fwd':72s} 1.200  <= 1.15  MISSED"]
    assert runs_line(["a/run1.json", "b/run2.json"]) == "2 runs: run1.json, run2.json"
    assert runs_line(["c/check.json"], "check") == "1 check: check.json"


@pytest.mark.parametrize("runs, message", [([], "at least one run"), ([["not", "a", "run"]], r"runs\[0\] must be"),
                                           ([dict(sweep=[dict(mode="longnet")])], r"runs\[0\]\['sweep'\] must hold")])
def test_bad_runs_are_refused_naming_the_argument(runs, message):
    with pytest.raises(ValueError, match=message):
        sweep_verdicts(runs)


def test_the_benchmark_prints_the_verdicts_of_runs_and_refuses_a_missing_file(tmp_path):
    runs = [str(RESULTS / f"gpu_attention_ragged_caller_h100_11bbebf_run{i}.json") for i in (1, 2, 3)]
    done = subprocess.run([sys.executable, str(SCRIPT), "--verdict", *runs], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "ragged, auto at m + 5 over m: met in every run in 8 of 8 cells" in done.stdout
    assert "mode=head_groups m=32768 direction=fwd+bwd" in done.stdout and "MISSED" not in done.stdout
    missing = subprocess.run([sys.executable, str(SCRIPT), "--verdict", str(tmp_path / "none.json")],
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and "--verdict: cannot read" in missing.stderr.splitlines()[-1]
    (tmp_path / "list.json").write_text("[1, 2]")
    not_a_run = subprocess.run([sys.executable, str(SCRIPT), "--verdict", str(tmp_path / "list.json")],
                               capture_output=True, text=True, timeout=300)
    assert not_a_run.returncode == 2 and "runs[0] must be a run's JSON object" in not_a_run.stderr.splitlines()[-1]


def _packed_run(floor_fwd, floor_both, loop_ms, ours_ms, gqa):
    timing = lambda ms: dict(median=ms)  # noqa: E731
    cells = {direction: dict(times_ms={"ours[auto]": timing(ours_ms), "loop[auto]": timing(loop_ms),
                                       "loop[fa4]": timing(loop_ms * 2)}, interleaved=dict(ratio=floor))
             for direction, floor in (("fwd", floor_fwd), ("fwd+bwd", floor_both))}
    return dict(cells=cells, gqa=dict(interleaved=dict(ratio=gqa) if gqa else dict(error="out of memory")))


def test_packed_targets_read_the_interleaved_pairs_and_the_fastest_loop():
    rows = packed_verdicts([_packed_run(1.20, 1.24, 12.0, 2.0, 0.85), _packed_run(1.21, 1.26, 13.0, 2.0, None)])
    by_target = {(row["cell"]["target"], row["cell"]["direction"]): row for row in rows}
    floor_fwd = by_target["ours over the varlen floor", "fwd"]
    assert (floor_fwd["ratios"], floor_fwd["bound"], floor_fwd["limit"], floor_fwd["met"]) == ([1.20, 1.21], "<=",
                                                                                               1.25, True)
    assert by_target["ours over the varlen floor", "fwd+bwd"]["met"] is False  # 1.26 in run 2
    loop = by_target["the per-document loop over ours", "fwd"]  # the faster loop (12, 13 ms) over ours (2 ms)
    assert (loop["ratios"], loop["bound"], loop["limit"], loop["worst"], loop["met"]) == ([6.0, 6.5], ">=", 6.0,
                                                                                          6.0, True)
    gqa = by_target["GQA over MHA", "fwd+bwd"]
    assert (gqa["ratios"], gqa["limit"], gqa["met"]) == ([0.85, None], 0.9, False)  # not timed in run 2: not met
    assert count_met(rows) == (3, 5)
    line = format_verdicts([loop], "packed", spread=False)
    assert line[0] == "packed: met in every run in 1 of 1 cells" and line[1].endswith("6.000 6.500  >= 6.00  met")


@pytest.mark.parametrize("runs, message", [([], "at least one run"), ([dict(sweep=[])], "without 'cells'"),
                                           ([[1]], r"runs\[0\] must be a run of bench_packed.py")])
def test_packed_verdicts_refuse_what_is_not_a_packed_run(runs, message):
    with pytest.raises(ValueError, match=message):
        packed_verdicts(runs)


def test_the_packed_benchmark_prints_the_verdicts_of_its_committed_runs(tmp_path):
    runs = [str(RESULTS / f"packed_h100_edcdf46_run{i}.json") for i in (1, 2)]
    done = subprocess.run([sys.executable, str(PACKED_SCRIPT), "--verdict", *runs], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1] == "packed row: met in every run in 3 of 5 cells"
    assert [line.split()[-1] for line in lines[2:]] == ["met", "MISSED", "met", "met", "MISSED"]
    assert "1.198 1.199  <= 1.25" in lines[2] and "1.246 1.247  <= 1.25" in lines[4]
    missing = subprocess.run([sys.executable, str(PACKED_SCRIPT), "--verdict", str(tmp_path / "none.json")],
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and "--verdict: cannot read" in missing.stderr.splitlines()[-1]


def test_auto_check_verdicts_read_auto_over_the_fastest_per_cell_of_each_check():
    def row(seq_len, ratio, training=False):
        return dict(mode="longnet", causal=True, seq_len=seq_len, batch=1, head_dim=64, training=training,
                    auto_over_fastest=ratio)

    rows = auto_check_verdicts([dict(rows=[row(8192, 1.02), row(8192, 1.0, True)]),
                                dict(rows=[row(8192, 1.031), row(8192, 0.97, True)])])
    assert [(r["cell"]["training"], r["ratios"], r["limit"], r["met"]) for r in rows] == [
        (False, [1.02, 1.031], 1.03, False), (True, [1.0, 0.97], 1.03, True)]
    with pytest.raises(ValueError, match=r"runs\[0\]\['rows'\] must hold cells with mode"):
        auto_check_verdicts([dict(rows=[dict(mode="longnet")])])


def test_the_auto_table_benchmark_prints_the_verdict_of_its_committed_checks(tmp_path):
    checks = [str(RESULTS / "auto_table" / f"check_fastest_h100_7bf0b26_run{i}.json") for i in (1, 2, 3)]
    done = subprocess.run([sys.executable, str(AUTO_TABLE_SCRIPT), "--verdict", *checks], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()  # the title, then the cells that miss (docs/attention.md)
    assert lines[1] == "auto within 3% of the fastest: met in every run in 158 of 160 cells (ratios 0.966-1.041)"
    assert [line.split()[:3] for line in lines[2:]] == [
        ["mode=head_groups", "causal=False", "seq_len=8192"], ["mode=head_groups", "causal=True", "seq_len=524288"]]
    settled_checks = [str(RESULTS / "auto_table" / name) for name in (
        "check_fastest_settle40_h100_7bf0b26_run1.json", "check_fastest_settle40_h100_225ad6b_run2.json")]
    one = subprocess.run([sys.executable, str(AUTO_TABLE_SCRIPT), "--verdict", settled_checks[0]], capture_output=True,
                         text=True, timeout=300)
    assert one.stdout.splitlines()[1:] == [
        "auto within 3% of the fastest: met in every run in 160 of 160 cells (ratios 0.969-1.009)"]
    both = subprocess.run([sys.executable, str(AUTO_TABLE_SCRIPT), "--verdict", *settled_checks], capture_output=True,
                          text=True, timeout=300)
    lines = both.stdout.splitlines()
    assert lines[1] == "auto within 3% of the fastest: met in every run in 159 of 160 cells (ratios 0.914-1.066)"
    assert [line.split() for line in lines[2:]] == [["mode=head_groups", "causal=True", "seq_len=8192", "batch=2",
                                                     "head_dim=128", "training=True", "0.999", "1.066", "<=", "1.03",
                                                     "MISSED"]]
    missing = subprocess.run([sys.executable, str(AUTO_TABLE_SCRIPT), "--verdict", str(tmp_path / "none.json")],
                             capture_output=True, text=True, timeout=300)
    assert missing.returncode == 2 and "--verdict: cannot read" in missing.stderr.splitlines()[-1]
