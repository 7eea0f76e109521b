"""The benchmark page's section on auto's measured table: the table of a committed check, its finding's counts
recomputed from the check's rows, the heatmap's cells, and a missing or malformed file."""
from __future__ import annotations

import json
import statistics

import pytest

pytest.importorskip("pandas", reason="pandas (notebooks extra) holds the tables")
pytest.importorskip("plotly", reason="plotly draws the figures")

from hilbert_lab.reports.auto_check import (  # noqa: E402
    auto_check_sections, auto_check_source, auto_check_table, load_auto_check,
)
from hilbert_lab.viz.backends import auto_choice_heatmap  # noqa: E402

CHECK = "reports/results/auto_table/check_h200_run1.json"


def _metrics(table, source):
    return {"tables": {"auto_check": {"columns": list(table.columns), "rows": table.to_dict("records")},
                       "auto_check_source": {"columns": list(source), "rows": [source]}}}


def test_the_committed_check_gives_the_finding_its_rows_say():
    data = load_auto_check(CHECK)
    table = auto_check_table(data)
    assert len(table) == len(data["rows"]) == 80
    picked, auto = [], []
    for row in data["rows"]:
        times = {k: v for k, v in row["times_ms"].items() if k != "auto"}
        picked.append(times[row["auto_picks"]] / min(times.values()))
        auto.append(row["times_ms"]["auto"] / min(times.values()))
    assert table["picked_over_fastest"].tolist() == pytest.approx(picked)
    source = auto_check_source(data, CHECK)
    assert source["revision"].startswith("5d0c0f2") and "H200" in source["device"]
    sections, findings, sources = auto_check_sections(_metrics(table, source))
    assert len(sections) == 2 and len(findings) == 1 and sources == [source]
    within = sum(value <= 1.03 for value in picked)
    assert f"in {within} of 80 cells (worst {max(picked):.2f}x" in findings[0]
    assert f"in {sum(value <= 1.03 for value in auto)} (median {statistics.median(auto):.2f}x)" in findings[0]
    heat = sections[0].figure.data[0]
    row = table.iloc[0]
    line = (f"{row['mode']} {'causal' if row['causal'] else 'full'} D{row['head_dim']} "
            f"{'fwd+bwd' if row['training'] else 'fwd'}")
    column = list(heat.x).index(f"{row['seq_len'] // 1024}K")
    assert heat.z[list(heat.y).index(line)][column] == pytest.approx(row["picked_over_fastest"])
    assert heat.text[list(heat.y).index(line)][column].startswith(row["auto_picks"])


def test_no_check_no_section_and_a_malformed_check_is_refused(tmp_path):
    assert load_auto_check(str(tmp_path / "absent.json")) is None
    assert auto_check_sections({"tables": {}}) == ([], [], [])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"cells": []}))
    with pytest.raises(ValueError, match="must hold 'rows'"):
        load_auto_check(str(bad))


def test_the_heatmap_labels_ragged_lengths_and_leaves_unmeasured_cells_empty():
    rows = [dict(mode="longnet", causal=True, head_dim=64, training=False, seq_len=n, auto_picks="fa4",
                 picked_over_fastest=ratio) for n, ratio in ((8192, 1.0), (32773, 1.2))]
    rows.append(dict(mode="longnet", causal=True, head_dim=128, training=False, seq_len=8192, auto_picks="sdpa",
                     picked_over_fastest=1.05))
    heat = auto_choice_heatmap(rows).data[0]
    assert list(heat.x) == ["8K", "32K+5"] and list(heat.y) == ["longnet causal D64 fwd", "longnet causal D128 fwd"]
    assert list(heat.z[0]) == [1.0, 1.2] and list(heat.z[1]) == [1.05, None]


def test_a_check_of_two_batch_sizes_keeps_every_cell_on_its_own_line():
    """A check measured at B 1 and 2 (the same N, D and mode at both) draws each batch on its own heatmap line,
    so no cell hides another; the finding names the worst cell's batch, or says that every pick was the fastest."""
    path = "reports/results/auto_table/check_h200_7692652.json"
    data = load_auto_check(path)
    table = auto_check_table(data)
    assert len(table) == len(data["rows"]) == 160 and sorted(set(table["batch"])) == [1, 2]
    sections, findings, _ = auto_check_sections(_metrics(table, auto_check_source(data, path)))
    heat = sections[0].figure.data[0]
    assert sum(value is not None for line in heat.z for value in line) == 160
    assert all(label.endswith((" B1", " B2")) for label in heat.y)
    assert table["picked_over_fastest"].max() == 1.0  # the tie rule: every pick the fastest of its cell here
    assert "in 160 of 160 cells (every pick the fastest of its cell); auto itself" in findings[0]
    assert "(B 1 and 2, H 12" in sections[0].text[0]
    slower = table.copy()
    slower.loc[slower.index[5], "picked_over_fastest"] = 1.2
    worst = slower.loc[slower.index[5]]
    sections, findings, _ = auto_check_sections(_metrics(slower, auto_check_source(data, path)))
    assert f"in 159 of 160 cells (worst 1.20x: {worst['mode']}" in findings[0]
    assert f"B{int(worst['batch'])} D{int(worst['head_dim'])}" in findings[0]
