"""The training page's retrieval-grid sections: built from the recorded tables alone; an absent grid file
is listed as not run; the conclusion names the rows that meet the target."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="plotly draws the figures")

from hilbert_lab.models.evaluate import bucket_rows, pooled_accuracy  # noqa: E402
from hilbert_lab.reports.training import (  # noqa: E402
    grid_buckets_table, grid_rows_table, load_grids, render,
)


def _row(segments, rates, flops, correct, count, spans=True, keys=512):
    evals = [{"correct": correct, "count": count, "accuracy": correct / count}]
    return {"segment_lengths": segments, "dilation_rates": rates, "num_heads": 8, "dim": 64, "depth": 3,
            "seq_len": 32768, "steps": 800, "seeds": [0], "chance_accuracy": 0.125, "tokens_per_s": 1000.0,
            "attention": {"flops_per_token": flops, "max_keys_per_query": keys,
                          "branches": [{"spans_sequence": spans}]},
            "pooled": pooled_accuracy(evals),
            "pooled_by_distance": bucket_rows([0, 0, correct // 2, correct - correct // 2], [0, 0, count // 2, count - count // 2])}


def _grid(tmp_path):
    grid = {"kind": "retrieval_grid", "runs": [], "rows": {
        "dense": _row([32, 128, 512], [1, 4, 1], 2e5, 510, 512),
        "dilated": _row([32, 128, 512], [1, 4, 8], 2e4, 500, 512, keys=64),
        "local": _row([32, 128], [1, 4], 1.5e4, 60, 512, spans=False, keys=32),
    }}
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(grid))
    return path


def _metrics(tables):
    return {"tables": {name: {"columns": list(frame.columns), "rows": frame.to_dict(orient="records")}
                       for name, frame in tables.items()}}


def test_grid_sections_from_tables(tmp_path):
    pd = pytest.importorskip("pandas", reason="pandas (notebooks extra) holds the tables")

    grids, missing = load_grids({"CPU": str(_grid(tmp_path)), "GPU": str(tmp_path / "absent.json")})
    assert list(grids) == ["CPU"] and missing == [f"GPU ({tmp_path / 'absent.json'})"]
    rows, buckets = grid_rows_table(grids), grid_buckets_table(grids)
    assert rows.set_index("row")["flops_fraction"].to_dict() == pytest.approx({"dense": 1.0, "dilated": 0.1, "local": 0.075})
    assert len(buckets) == 6
    page = render(_metrics({"grid_rows": rows, "grid_buckets": buckets, "grids_missing": pd.DataFrame(
        [{"grid": "GPU", "path": "absent.json"}])}), {})
    headings = [section.heading for section in page.sections]
    assert "Retrieval grid: GPU" in headings
    compute = next(s for s in page.sections if s.heading == "CPU: accuracy against attention compute")
    # rows are named by their pattern, not their ids
    assert "Target met" in compute.conclusion and "dilated r=8, 32K" in compute.conclusion.split("Target met")[1]
    assert "local only, 32K 11.7% [" in compute.conclusion  # the control, with its interval
    assert page.findings[0].startswith("Main result: dilated r=8, 32K retrieves the needle at 97.7% [")
    distance = next(s for s in page.sections if s.heading == "CPU: accuracy per needle distance")
    small = rows.assign(seq_len=512)  # the 32K target is not judged on a small-scale grid
    page = render(_metrics({"grid_rows": small, "grid_buckets": buckets}), {})
    assert "Target" not in next(s for s in page.sections if s.heading.endswith("attention compute")).conclusion
    assert len(compute.figure.data) == 3
    # one colour per row in both figures
    colours = {t.name: t.marker.color for t in compute.figure.data}
    assert all(colours[t.name] == t.marker.color for t in distance.figure.data)


def test_load_grids_refuses_a_foreign_file(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"kind": "something"}))
    with pytest.raises(ValueError, match="retrieval_grid"):
        load_grids({"x": str(path)})


def test_flops_fraction_against_the_reference_config_when_it_did_not_run(tmp_path):
    """A grid without its dense-top row still states each row's cost relative to the dense-top config."""
    grid = json.loads(_grid(tmp_path).read_text())
    del grid["rows"]["dense"]
    grid["reference"] = {"row": "dense", "attention": {"flops_per_token": 4e5}}
    path = tmp_path / "no_dense.json"
    path.write_text(json.dumps(grid))
    rows = grid_rows_table(load_grids({"CPU": str(path)})[0])
    assert rows.set_index("row")["flops_fraction"].to_dict() == pytest.approx({"dilated": 0.05, "local": 0.0375})


def test_grid_table_shows_each_rows_curriculum(tmp_path):
    path = _grid(tmp_path)
    grid = json.loads(path.read_text())
    grid["rows"]["dilated"]["curriculum"] = [[1024, 1600], [16384, 1900]]
    path.write_text(json.dumps(grid))
    rows = grid_rows_table(load_grids({"GPU": str(path)})[0]).set_index("row")
    assert rows.loc["dilated", "curriculum"] == "1024:1600, 16384:1900" and rows.loc["dense", "curriculum"] == ""
    page = render(_metrics({"grid_rows": rows.reset_index(), "grid_buckets": grid_buckets_table(load_grids(
        {"GPU": str(path)})[0])}), {})
    table = next(s for s in page.sections if s.heading == "GPU: every row").table
    assert "curriculum (length to step)" in table.columns
    by_pattern = table.set_index("pattern")
    assert by_pattern.loc["dense top, 32K", "accuracy [95%]"].startswith("99.6% [")
    assert by_pattern.loc["dilated r=8, 32K", "curriculum (length to step)"] == "1024 to 1600, 16384 to 1900"


def test_longest_trainable_section_names_the_longest_length_and_the_failure():
    from hilbert_lab.reports.training import longest_trainable_table

    probe = [{"seq_len": 2**20 * k, "segment_lengths": [2048, 2**20 * k], "dilation_rates": [1, 256 * k],
              "tokens_per_s": 2e6, "peak_memory_gib": 16.0 * k, "device_memory_gib": 79.2} for k in (1, 2, 4)]
    probe.append({"seq_len": 2**23, "segment_lengths": [2048, 2**23], "dilation_rates": [1, 2048],
                  "device_memory_gib": 79.2, "error": "out of memory: CUDA out of memory. Tried to allocate 1 GiB"})
    head = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()  # a probe of the current code, with its own command
    groups = {"128K": {"H100 run": {"training": {"history": []}, "longest_trainable": probe,
                                    "environment": {"device": {"name": "H100"}, "git": {"commit": head}}}}}
    table = longest_trainable_table(groups)
    assert list(table["seq_len"]) == [2**20, 2**21, 2**22, 2**23] and table["pattern"][0] == "2048,1048576 / 1,256"
    page = render(_metrics({"longest_trainable": table}), {})
    section = next(s for s in page.sections if s.heading == "Longest trainable sequence")
    assert section.conclusion.startswith("H100 length probe (stored in H100 run) trains 4M tokens (batch 1, gradient "
                                         "checkpointing): peak 64 GiB")
    assert "16 GiB per 1M tokens" in section.conclusion
    assert "8M tokens: out of memory (tried to allocate 1 GiB)" in section.conclusion
    # the series is the probe (device, revision), not the run whose JSON stores it
    assert {trace.name for trace in section.figure.data} == {f"length probe, H100, rev {head[:7]}",
                                                             f"length probe, H100, rev {head[:7]}: failed"}
    failed = [trace for trace in section.figure.data if trace.name == f"length probe, H100, rev {head[:7]}: failed"]
    assert len(failed) == 1 and list(failed[0].x) == [2**23]
    assert any(finding.startswith("H100 length probe (stored in H100 run) trains 4M") for finding in page.findings)
    assert "run" not in section.table.columns and "device memory (GiB)" in section.table.columns
    # the failure is a short cell, not the multi-line CUDA message
    assert list(section.table["failure"]) == ["", "", "", "out of memory (tried to allocate 1 GiB)"]
    assert list(section.figure.layout.xaxis.ticktext) == ["1M", "2M", "4M", "8M"]
