"""Every notebook executes top to bottom on the CPU with small parameters (papermill)."""
from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

papermill = pytest.importorskip("papermill", reason="papermill (notebooks extra) executes the notebooks")

from hilbert_lab.reports.export import page_loads_plotly_offline  # noqa: E402
from hilbert_lab.reports.runner import run_report  # noqa: E402

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"

INTERACTIVE = {
    "curve_explorer": {"family": "gilbert", "width": 6, "height": 5},
    "locality_explorer": {"size": 8, "box_or_segment": 3, "max_cache_lines": 32},
    "attention_explorer": {"seq_len": 16, "segment_lengths": "4,8", "dilation_rates": "1,2"},
    "backend_dashboard": {"seq_len": 64, "num_heads": 2, "head_dim": 16, "segment_lengths": "16,32", "repeats": 1},
}

SMALL_REPORTS = {
    "benchmark": {"seq_lens": [128, 256], "modes": ["longnet"], "orderings": ["identity", "hilbert"],
                  "backends": ["auto"], "segment_lengths": [64, 128], "dilation_rates": [1, 2], "num_heads": 2,
                  "head_dim": 16, "repeats": 2, "warmup": 1, "case_timeout_s": 120.0, "save_png": False},
    "locality": {"grid_shapes": [[8, 8]], "box_sizes": [2], "segment_lengths": [16], "dilated_configs": [[256, 64, 2]],
                 "tile_size": 16, "cache_lines": [8, 32]},
    "claims": {"max_tokens": 1024, "repeats": 1, "save_png": False},
    "training": {"cpu_train_steps": 20},
    "serialization": {"grids": [[16, 16]], "point_clouds": {"uniform 3D": 512}, "settings": [[[16], [1]], [[64], [1]]],
                      "orderings": ["rowmajor", "hilbert"], "timing_grid": [],
                      "window_examples": [[8, "rowmajor", 16, 1], [8, "hilbert", 16, 1]]},
}


def _outputs(notebook) -> list:
    return [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]


# `make test` executes one notebook (the quickest); the others are slow (make test-all).
QUICK_NOTEBOOK = "curve_explorer"


@pytest.mark.parametrize("name", [name if name == QUICK_NOTEBOOK else pytest.param(name, marks=pytest.mark.slow)
                                  for name in sorted(INTERACTIVE)])
def test_interactive_notebook_executes(name, tmp_path):
    executed = tmp_path / f"{name}.ipynb"
    papermill.execute_notebook(str(NOTEBOOK_DIR / f"{name}.ipynb"), str(executed), parameters=INTERACTIVE[name],
                               cwd=str(tmp_path), progress_bar=False, execution_timeout=300)
    notebook = nbformat.read(executed, as_version=4)
    outputs = _outputs(notebook)
    assert not [o for o in outputs if o.output_type == "error"]
    widget_views = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert widget_views, f"{name} shows no widget"
    assert "papermill" in notebook.metadata and notebook.metadata.papermill["parameters"] == INTERACTIVE[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMALL_REPORTS))
def test_report_notebook_executes_with_artifacts(name, tmp_path):
    run_dir = run_report(name, SMALL_REPORTS[name], output_root=tmp_path, run_id="t", progress=False,
                         execution_timeout_s=600)
    assert run_dir == tmp_path / name / "t"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    env = json.loads((run_dir / "env.json").read_text())
    html = (run_dir / f"{name}.html").read_text()
    # plotly escapes "/" (as \u002f) inside its <script> JSON
    unescaped = html.replace("\\u002f", "/").replace("\\/", "/")
    assert metrics["report"] == name
    for key, value in SMALL_REPORTS[name].items():
        assert env["parameters"][key] == value and metrics["parameters"][key] == value
    assert page_loads_plotly_offline(run_dir / f"{name}.html")
    assert metrics["figures"], "a report without figures"
    # each recorded figure's traces are in the page (the benchmark, locality and training pages draw their own
    # figures from the tables: runs named by pattern, no chart of equal bars)
    for figure in metrics["figures"].values() if name not in ("benchmark", "locality", "training") else []:
        for trace in figure["traces"]:
            if trace:
                assert json.dumps(trace)[1:-1] in unescaped, trace
    assert metrics["tables"], "a report without tables"
    if name == "benchmark":
        rows = metrics["tables"]["results"]["rows"]
        assert len(rows) == 2 * 2 and all(row["status"] == "ok" for row in rows)
        assert all(row["min_ms"] <= row["median_ms"] <= row["max_ms"] for row in rows)
        pairs = metrics["tables"]["ordering_ab"]["rows"]  # interleaved identity / hilbert times per length
        assert [row["seq_len"] for row in pairs] == [128, 256]
        assert all(len(row["identity_times_ms"]) == len(row["ordered_times_ms"]) == 21 for row in pairs)
        assert all(row["max_abs_difference"] < 1e-5 for row in pairs)  # same attention in both layouts
        assert "auto / hilbert" in unescaped and "speed-up [95%]" in html
    if name == "claims":
        rows = metrics["tables"]["claims"]["rows"]
        assert {row["claim"] for row in rows} >= {f"C{index}" for index in range(1, 13)}
        assert all(row["verdict"] in ("confirmed", "refuted", "not reproducible here") for row in rows)
        assert all(row["why"] for row in rows)
    if name == "locality":
        rows = metrics["tables"]["compare_orderings"]["rows"]
        assert {row["ordering"] for row in rows} >= {"rowmajor", "hilbert", "identity"}
    if name == "training":
        rows = {row["run"]: row for row in metrics["tables"]["final_evals"]["rows"]}
        committed = {label for group in metrics["parameters"]["runs"].values() for label in group}
        assert set(rows) == committed | {"CPU cpu-tiny live"}  # one row per run, the live CPU run included
        assert len(metrics["tables"]["final_evals"]["rows"]) == len(committed) + 1
        assert rows["H100 32K curriculum"]["final_accuracy"] > 0.9
        assert rows["H100 no curriculum"]["final_accuracy"] < 0.1  # stays at chance without the curriculum
        assert rows["CPU cpu-tiny live"]["steps"] == 20 and 0 <= rows["CPU cpu-tiny live"]["final_accuracy"] <= 1
        assert all(abs(row["chance_accuracy"] - 1 / 64) < 1e-12 for label, row in rows.items() if label in committed)
        (ring,) = metrics["tables"]["ring_comparison"]["rows"]
        assert ring["against"] == "H200 1 GPU" and ring["recomputed_points"] == ring["points"] > 0
        assert ring["recomputed_max_rel_loss_difference"] < 1e-3
        assert {row["gradient_checkpointing"] for row in metrics["tables"]["throughput"]["rows"]} == {False, True}
        live_figures = [figure for key, figure in metrics["figures"].items() if key.startswith("loss_live_CPU")]
        assert len(live_figures) == 1 and "CPU cpu-tiny live eval" in live_figures[0]["traces"]
    if name == "serialization":
        assert len(metrics["tables"]["locality"]["rows"]) == 2 * 2 * 2  # data sets x settings x orderings
        devices = {row["source"]: row["device"] for row in metrics["tables"]["trained"]["rows"]}
        assert devices["GPU"] == "NVIDIA H100 80GB HBM3"  # the committed file's env block
        assert "Serialization: which curve ordering" in html and "no difference" in html
