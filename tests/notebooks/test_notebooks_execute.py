"""Every notebook executes top to bottom on the CPU with small parameters (papermill)."""
from __future__ import annotations

import base64
import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

papermill = pytest.importorskip("papermill", reason="papermill (notebooks extra) executes the notebooks")
nbformat = pytest.importorskip("nbformat", reason="nbformat (notebooks extra) reads the notebooks")

from hilbert_lab.reports.export import page_loads_plotly_offline  # noqa: E402
from hilbert_lab.reports.claims_verdict import ROW_VERDICTS  # noqa: E402
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
                      "window_examples": [[8, "rowmajor", 16, 1], [8, "hilbert", 16, 1]], "save_png": False},
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
    VALUE_CHECKS[name](notebook, outputs)


def _widget_states(notebook) -> list[dict]:
    widgets = notebook.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    return [widget["state"] for widget in widgets.values()]


def _widget_figures(notebook) -> dict[str, dict]:
    """Plotly figures shown in the notebook's output widgets, by title (up to the first '<')."""
    figures = {}
    for state in _widget_states(notebook):
        for output in state.get("outputs", []):
            figure = output.get("data", {}).get("application/vnd.plotly.v1+json")
            if figure:
                figures[figure["layout"].get("title", {}).get("text", "").split("<")[0]] = figure
    return figures


def _array(value) -> np.ndarray:
    """A plotly array, plain or binary ({'bdata', 'dtype', 'shape'})."""
    if not isinstance(value, dict):
        return np.asarray(value)
    array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
    return array.reshape([int(n) for n in str(value.get("shape", array.size)).split(",")])


def _html_rows(markup: str) -> dict[str, list[str]]:
    """First cell -> the other cells of each body row of an HTML table."""
    body = markup.split("<tbody>", 1)[1]
    rows = [re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row, re.DOTALL)
            for row in re.findall(r"<tr>(.*?)</tr>", body, re.DOTALL)]
    return {cells[0].strip(): [cell.strip() for cell in cells[1:]] for cells in rows}


def _check_curve_explorer(notebook, outputs) -> None:
    """The traversal table of the 16 x 16 curves: unit steps for hilbert, gilbert and snake; row-major and
    Morton recomputed from their definitions (row-major: 15 jumps back across a row; Morton: bits interleaved)."""
    (table,) = [o.data["text/html"] for o in outputs if "mean step" in o.get("data", {}).get("text/html", "")]
    rows = _html_rows(table)
    side = 16
    index = np.arange(side * side)
    walks = {
        "rowmajor": np.stack([index % side, index // side], 1),
        "morton": np.stack([sum(((index >> (2 * b)) & 1) << b for b in range(4)),
                            sum(((index >> (2 * b + 1)) & 1) << b for b in range(4))], 1),
    }
    for name in ("hilbert", "gilbert", "snake"):
        assert rows[name][:4] == ["256", "1.000", "1.000", "1.000"], (name, rows[name])
    for name, cells in walks.items():
        steps = np.linalg.norm(np.diff(cells, axis=0), axis=1)
        expected = [str(side * side), f"{steps.mean():.3f}", f"{steps.max():.3f}", f"{np.mean(steps == 1):.3f}"]
        assert rows[name][:4] == expected, (name, rows[name], expected)


def _check_attention_explorer(notebook, outputs) -> None:
    """The multiplicity and keys-per-query heatmaps equal the brute-force pattern of tests/attention/_oracle.py;
    the reference check shows errors within its tolerance."""
    spec = importlib.util.spec_from_file_location("_oracle", NOTEBOOK_DIR.parent / "tests" / "attention" / "_oracle.py")
    oracle = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(oracle)
    parameters = INTERACTIVE["attention_explorer"]
    segments, rates = ([int(n) for n in parameters[key].split(",")] for key in ("segment_lengths", "dilation_rates"))
    mult = oracle.brute_multiplicity(segments, rates, "longnet", False, parameters["seq_len"], 2)
    figures = _widget_figures(notebook)
    (shown,) = figures["multiplicity (max 2)"]["data"]  # the selected head
    np.testing.assert_array_equal(_array(shown["z"]), mult[int(shown["name"].split()[-1])])
    masks = figures["per-head merged masks (N=16, mode=longnet, causal=False)"]["data"]
    assert [trace["name"] for trace in masks] == ["head 0", "head 1"]
    for head, trace in enumerate(masks):
        np.testing.assert_array_equal(_array(trace["z"]), (mult[head] > 0).astype(int))
    coverage = figures["token coverage: keys per query (queries covered per head: 100%, 100%)"]["data"][0]
    np.testing.assert_array_equal(_array(coverage["z"]), (mult > 0).sum(-1))
    (check,) = [o.data["text/html"] for o in outputs if "float64 reference" in o.get("data", {}).get("text/html", "")]
    errors = re.search(r"largest output error ([\d.e+-]+), largest log-sum-exp error ([\d.e+-]+) "
                       r"\(tolerance ([\d.e+-]+)\)", check).groups()
    assert float(errors[2]) == 1e-10 and max(float(errors[0]), float(errors[1])) < 1e-10


def _check_backend_dashboard(notebook, outputs) -> None:
    """Every backend's output agrees with the reference backend's (the first row) to float32 rounding."""
    (table,) = [state["value"] for state in _widget_states(notebook) if "max |diff| vs first" in str(state.get("value"))]
    header = re.findall(r"<th>(.*?)</th>", table.split("<tbody>")[0])
    rows = _html_rows(table)
    column = header.index("max |diff| vs first") - 1
    assert next(iter(rows)) == "reference" and rows["reference"][column] == "0.0e+00"
    assert len(rows) >= 4 and all(cells[header.index("error") - 1] == "" for cells in rows.values()), rows
    assert all(float(cells[column]) < 1e-5 for cells in rows.values()), rows


def _check_locality_explorer(notebook, outputs) -> None:
    """Access order of the 8 x 8 grid: row-major is y * 8 + x, snake and Hilbert visit every cell once in unit
    steps, Morton interleaves the bits of (x, y); LRU misses: one 64-query tile reads each of the 64 K and 64 V rows
    (64 dims x 2 bytes = one 128-byte line) once, so 128 misses at every capacity for every ordering."""
    figures = _widget_figures(notebook)
    access = figures["access order: 8x8 grid, window 3"]
    names = [a["text"] for a in access["layout"]["annotations"]][:4]
    slots = dict(zip(names, (_array(trace["z"]) for trace in access["data"] if trace["type"] == "heatmap")))
    assert names == ["rowmajor", "snake", "hilbert", "morton"]
    np.testing.assert_array_equal(slots["rowmajor"], np.arange(64).reshape(8, 8))
    for name in ("snake", "hilbert"):
        cells = np.argwhere(slots[name] == np.arange(64)[:, None, None])[:, 1:]  # (y, x) of slot 0, 1, ...
        assert len(cells) == 64 and (np.abs(np.diff(cells, axis=0)).sum(1) == 1).all(), name
    y, x = np.mgrid[:8, :8]
    morton = sum(((y >> b) & 1) << (2 * b) | ((x >> b) & 1) << (2 * b + 1) for b in range(3))  # x's bit above y's
    np.testing.assert_array_equal(slots["morton"], morton)
    (table,) = [state["value"] for state in _widget_states(notebook)
                if "LRU misses at each capacity" in str(state.get("value"))]
    rows = _html_rows(table)
    assert list(rows) == ["4", "8", "16", "32"] and all(cells == ["128"] * 4 for cells in rows.values()), rows
    misses = figures["LRU misses of the K/V line trace: 8x8 grid, window 3"]["data"]
    assert all(list(_array(trace["y"])) == [128] * 4 for trace in misses)


VALUE_CHECKS = {"curve_explorer": _check_curve_explorer, "attention_explorer": _check_attention_explorer,
                "backend_dashboard": _check_backend_dashboard, "locality_explorer": _check_locality_explorer}


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
        # 21 interleaved rounds at a time, until the interval settles or 4 x 21 are spent
        assert all(len(row["identity_times_ms"]) == len(row["ordered_times_ms"]) == row["rounds"] for row in pairs)
        assert all(row["rounds"] in (21, 42, 63, 84) and (row["settled"] or row["rounds"] == 84) for row in pairs)
        assert all(row["max_abs_difference"] < 1e-5 for row in pairs)  # same attention in both layouts
        assert "auto / Hilbert" in unescaped and "speed-up [95%]" in html
    if name == "claims":
        rows = metrics["tables"]["claims"]["rows"]
        assert {row["claim"] for row in rows} >= {f"C{index}" for index in range(1, 13)}
        assert all(row["verdict"] in ROW_VERDICTS for row in rows)
        assert all(row["why"] for row in rows)
    if name == "locality":
        rows = metrics["tables"]["compare_orderings"]["rows"]
        assert {row["ordering"] for row in rows} >= {"rowmajor", "hilbert", "identity"}
        # known answers on the 8 x 8 grid: Hilbert and snake move one cell per step; row-major 56 unit steps
        # and 7 jumps of sqrt(7^2 + 1) back to the next row's start
        steps = {(row["ordering"], row["metric"]): row["value"] for row in rows
                 if row["family"] == "grid2d" and row["configuration"] == "8x8"}
        assert steps[("hilbert", "step_mean")] == steps[("snake", "step_mean")] == steps[("hilbert", "step_max")] == 1.0
        assert steps[("rowmajor", "step_mean")] == pytest.approx((56 + 7 * 50**0.5) / 63, rel=1e-12)
        assert steps[("rowmajor", "step_max")] == pytest.approx(50**0.5, rel=1e-12)
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
