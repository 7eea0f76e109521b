"""Training-run figures (curves, curriculum phases, throughput bars) and the training-report loaders."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("plotly", reason="plotly (notebooks extra) draws the figures")

from hilbert_lab.models.train import read_training_report  # noqa: E402
from hilbert_lab.reports.training import (  # noqa: E402
    REPO_ROOT,
    final_evals_table,
    load_runs,
    loss_agreement,
    resolve_repo_path,
    results_dir,
    ring_comparison_table,
    run_phases,
)
from hilbert_lab.viz.training import curriculum_phases, throughput_bars, training_curves  # noqa: E402


def _history(lengths_until: list[tuple[int, int]], steps: int, *, log_every: int = 10, eval_every: int = 20):
    """Log records of a run with a curriculum [(seq_len, until_step), ...] then 512 tokens."""
    records = []
    for step in range(1, steps + 1):
        length = next((length for length, until in lengths_until if step - 1 < until), 512)
        if step % log_every == 0:
            records.append({"kind": "train", "step": step, "seq_len": length, "loss": 5.0 - step / 100,
                            "accuracy": step / (2 * steps)})
        if step % eval_every == 0:
            records.append({"kind": "eval", "step": step, "loss": 4.0 - step / 100, "accuracy": step / steps})
    return records


def _phase_annotations(figure):
    return [annotation for annotation in figure.layout.annotations if annotation.name == "phase"]


def test_curriculum_phases_from_train_records():
    records = _history([(64, 30), (128, 60)], 100)
    assert curriculum_phases(records) == [(0, 30, 64), (30, 60, 128), (60, 100, 512)]
    # records without seq_len (no curriculum logged) and evals give no phases
    assert curriculum_phases([{"kind": "train", "step": 10, "loss": 1.0}, {"kind": "eval", "step": 10}]) == []


def test_training_curves_traces_per_run_and_eval_markers():
    runs = {"curriculum": _history([(64, 30), (128, 60)], 100), "plain": _history([], 60)}
    figure = training_curves(runs, "accuracy")
    assert [trace.name for trace in figure.data] == ["curriculum train", "curriculum eval", "plain train", "plain eval"]
    evals = {trace.name: trace for trace in figure.data if trace.name.endswith("eval")}
    assert list(evals["curriculum eval"].x) == [20, 40, 60, 80, 100]
    assert list(evals["curriculum eval"].y) == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert "markers" in evals["plain eval"].mode and list(evals["plain eval"].x) == [20, 40, 60]
    trains = {trace.name: trace for trace in figure.data if trace.name.endswith("train")}
    assert "markers" not in trains["plain train"].mode and list(trains["plain train"].x) == [10, 20, 30, 40, 50, 60]
    # one colour per run over its traces, different runs differ
    colors = [trace.line.color for trace in figure.data]
    assert colors[0] == colors[1] != colors[2] == colors[3]
    assert list(figure.layout.yaxis.range) == [-0.02, 1.02]


def test_a_run_without_train_records_has_only_its_eval_trace():
    runs = {"evals only": [{"kind": "eval", "step": 5, "loss": 2.0, "accuracy": 0.5}]}
    figure = training_curves(runs, "loss")
    assert [trace.name for trace in figure.data] == ["evals only eval"] and list(figure.data[0].y) == [2.0]


def test_chance_line_is_dashed_at_the_chance_value():
    figure = training_curves({"run": _history([], 40)}, "loss", chance=4.1588830833596715)
    (line,) = [shape for shape in figure.layout.shapes if shape.line.dash == "dash"]
    assert line.y0 == line.y1 == pytest.approx(4.1588830833596715)
    assert line.xref == "x domain" and (line.x0, line.x1) == (0, 1)
    assert not training_curves({"run": _history([], 40)}, "loss").layout.shapes  # no chance, no phases: no lines


def test_phase_boundaries_and_labels_at_the_curriculum_steps():
    records = _history([(64, 30), (128, 60)], 100)
    figure = training_curves({"curriculum": records, "plain": _history([], 60)}, "loss")
    labels = _phase_annotations(figure)
    assert [(annotation.x, annotation.text) for annotation in labels] == [(0, "64"), (30, "128"), (60, "512")]
    boundaries = [shape.x0 for shape in figure.layout.shapes if shape.line.dash == "dot"]
    assert boundaries == [30, 60]
    # explicit phases (e.g. from the config, for a phase shorter than log_every) replace the derived ones
    figure = training_curves({"run": records}, "loss", phases={"run": [(0, 5, 1024), (5, 100, 32768)]})
    assert [(annotation.x, annotation.text) for annotation in _phase_annotations(figure)] == [(0, "1K"), (5, "32K")]
    assert [shape.x0 for shape in figure.layout.shapes if shape.line.dash == "dot"] == [5]


def test_bad_metric_names_the_allowed_ones():
    with pytest.raises(ValueError, match=r"metric must be one of \('loss', 'accuracy'\), got 'acc'"):
        training_curves({"run": _history([], 40)}, "acc")


def test_throughput_bars_split_by_checkpointing():
    rows = [{"run": "a", "gradient_checkpointing": False, "tokens_per_s": 700.0, "peak_memory_gib": 8.9},
            {"run": "a", "gradient_checkpointing": True, "tokens_per_s": 560.0, "peak_memory_gib": 3.5}]
    figure = throughput_bars(rows)
    assert [(trace.name, trace.xaxis, list(trace.y)) for trace in figure.data] == [
        ("without gradient checkpointing", "x", [700.0]), ("without gradient checkpointing", "x2", [8.9]),
        ("with gradient checkpointing", "x", [560.0]), ("with gradient checkpointing", "x2", [3.5]),
    ]
    with pytest.raises(ValueError, match="peak_memory_gib"):
        throughput_bars([{"run": "a", "gradient_checkpointing": False, "tokens_per_s": 1.0}])


# ------------------------------------------------------------------------------------------ loaders


def test_read_training_report_refuses_a_file_without_history(tmp_path):
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"config": {}, "training": {"final_eval": {"loss": 1.0}}}))
    with pytest.raises(ValueError, match=rf"{path.name}.*has no training.history"):
        read_training_report(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        read_training_report(path)
    with pytest.raises(ValueError, match="missing.json"):
        read_training_report(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"  # records without kind/step are not log records
    bad.write_text(json.dumps({"training": {"history": [{"loss": 1.0}]}}))
    with pytest.raises(ValueError, match="bad.json.*has no training.history"):
        load_runs({"group": {"run": str(bad)}})


def test_repo_paths_resolve_from_the_package_not_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert results_dir() == REPO_ROOT / "reports" / "results" and (REPO_ROOT / "hilbert_lab").is_dir()
    assert resolve_repo_path("reports/results/x.json") == results_dir() / "x.json"
    assert resolve_repo_path(tmp_path / "y.json") == tmp_path / "y.json"
    (tmp_path / "y.json").write_text(json.dumps({"training": {"history": [{"kind": "eval", "step": 1}]}}))
    loaded = load_runs({"a": {"run": str(tmp_path / "y.json")}})
    assert loaded["a"]["run"]["source"] == str(tmp_path / "y.json")
    with pytest.raises(ValueError, match=str(REPO_ROOT / "y.json")):  # relative: the repo's, not the cwd's
        load_runs({"a": {"run": "y.json"}})
    with pytest.raises(ValueError, match="unique"):
        load_runs({"a": {"run": str(tmp_path / "y.json")}, "b": {"run": str(tmp_path / "y.json")}})


def test_committed_runs_phases_finals_and_ring_agreement(tmp_path, monkeypatch):
    if not (results_dir() / "train_gpu_h100.json").exists():
        pytest.skip("the committed training logs are not in this checkout")
    monkeypatch.chdir(tmp_path)  # papermill runs notebooks elsewhere: relative paths still find the logs
    groups = load_runs({
        "32K": {"curriculum": "reports/results/train_gpu_h100.json",
                "none": "reports/results/train_gpu_h100_no_curriculum.json"},
        "ring": {"1 GPU": "reports/results/train_h200_1gpu_60steps.json",
                 "ring": "reports/results/train_h200_ring2_60steps.json"},
    })
    assert run_phases(groups["32K"]["curriculum"]) == [(0, 1200, 1024), (1200, 1500, 4096), (1500, 1700, 16384),
                                                       (1700, 2400, 32768)]
    # the 20-step 1K phase is shorter than log_every=25: it comes from the config, not the records
    assert run_phases(groups["ring"]["ring"]) == [(0, 20, 1024), (20, 60, 32768)]
    assert curriculum_phases(groups["ring"]["ring"]["training"]["history"]) == [(0, 60, 32768)]
    finals = final_evals_table(groups).set_index("run")
    assert finals.loc["curriculum", "final_accuracy"] > 0.9 and finals.loc["curriculum", "steps"] == 2400
    assert finals.loc["none", "final_accuracy"] <= 2 * finals.loc["none", "chance_accuracy"]
    assert finals.loc["ring", "world_size"] == 2 and finals.loc["ring", "steps"] == 60
    (row,) = ring_comparison_table(groups).to_dict(orient="records")
    assert row["against"] == "1 GPU" and row["recomputed_points"] == row["points"] == 6
    assert row["recomputed_max_rel_loss_difference"] == pytest.approx(row["max_rel_loss_difference"], rel=1e-9)
    assert row["recomputed_max_rel_loss_difference"] < 1e-3


def test_loss_agreement_matches_kind_and_step():
    mine = [{"kind": "train", "step": 10, "loss": 2.2}, {"kind": "eval", "step": 10, "loss": 3.0},
            {"kind": "train", "step": 20, "loss": 1.0}]
    reference = [{"kind": "train", "step": 10, "loss": 2.0}, {"kind": "eval", "step": 10, "loss": 3.0}]
    agreement = loss_agreement(mine, reference)
    assert list(zip(agreement["kind"], agreement["step"])) == [("train", 10), ("eval", 10)]
    assert list(agreement["rel_difference"]) == pytest.approx([0.1, 0.0])


def _grid_rows():
    return [{"row": "dense", "flops_per_token": 2e5, "accuracy": 0.9, "accuracy_low": 0.85, "accuracy_high": 0.93},
            {"row": "dilated", "flops_per_token": 2e4, "accuracy": 0.5, "accuracy_low": 0.4, "accuracy_high": 0.6}]


def test_accuracy_vs_flops_error_bars_are_the_intervals():
    from hilbert_lab.viz.training import accuracy_vs_flops

    figure = accuracy_vs_flops(_grid_rows(), chance=0.125)
    assert [trace.name for trace in figure.data] == ["dense", "dilated"]
    dilated = figure.data[1]
    assert dilated.x == (2e4,) and dilated.y == (0.5,)
    assert dilated.error_y.array[0] == pytest.approx(0.1) and dilated.error_y.arrayminus[0] == pytest.approx(0.1)
    assert figure.data[0].error_y.array[0] == pytest.approx(0.03) and figure.data[0].error_y.arrayminus[0] == pytest.approx(0.05)
    assert figure.layout.xaxis.type == "log"
    with pytest.raises(ValueError, match="accuracy_low"):
        accuracy_vs_flops([{"row": "x", "flops_per_token": 1.0, "accuracy": 0.5}])
    with pytest.raises(ValueError, match="at least one"):
        accuracy_vs_flops([])


def test_accuracy_by_distance_one_sorted_trace_per_row():
    from hilbert_lab.viz.training import accuracy_by_distance

    rows = [{"row": r, "distance_low": low, "distance_high": 2 * low, "count": 10, "accuracy": acc,
             "accuracy_low": acc - 0.1, "accuracy_high": acc + 0.05}
            for r, low, acc in (("a", 256, 0.2), ("a", 128, 0.9), ("b", 128, 0.1))]
    figure = accuracy_by_distance(rows, chance=0.125)
    assert [trace.name for trace in figure.data] == ["a", "b"]
    # buckets are categories in distance order ([128, 256) before [256, 512)), labelled by their range
    assert figure.data[0].x == ("128-256", "256-512") and figure.data[0].y == (0.9, 0.2)
    assert list(figure.layout.xaxis.categoryarray) == ["128-256", "256-512"] and figure.layout.scattermode == "group"
    assert figure.data[0].error_y.arrayminus == pytest.approx((0.1, 0.1))


def test_scaling_bars_draw_each_setups_ratio_with_its_slowest_and_fastest_run():
    from hilbert_lab.viz.training import scaling_bars

    rows = [{"setup": "1 GPU", "gradient_checkpointing": False, "ratio": 1.0, "ratio_low": 0.98, "ratio_high": 1.01},
            {"setup": "context parallel 4", "gradient_checkpointing": False, "ratio": 0.8, "ratio_low": 0.7,
             "ratio_high": 0.85},
            {"setup": "1 GPU", "gradient_checkpointing": True, "ratio": 1.0, "ratio_low": 0.9, "ratio_high": 1.0}]
    figure = scaling_bars(rows, target=0.95)
    plain, checkpointed = figure.data
    assert list(plain.x) == ["1 GPU", "context parallel 4"] and list(plain.y) == [1.0, 0.8]
    assert list(plain.error_y.array) == pytest.approx([0.01, 0.05])
    assert list(plain.error_y.arrayminus) == pytest.approx([0.02, 0.1])
    assert list(checkpointed.y) == [1.0] and figure.layout.shapes[0].y0 == 0.95
    with pytest.raises(ValueError, match="scaling rows need keys"):
        scaling_bars([{"setup": "1 GPU"}])
