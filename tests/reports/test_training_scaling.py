"""The training page's scaling section: tokens/s per GPU per setup against one GPU, from the merged runs."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("pandas", reason="pandas (notebooks extra) holds the tables")
pytest.importorskip("plotly", reason="plotly draws the figures")

from hilbert_lab.reports.training_scaling import load_scaling, scaling_sections, scaling_table  # noqa: E402


def _report(dp, cp, speeds, checkpointed_speeds):
    config = {"data_parallel": dp, "context_parallel": cp, "ring_layout": "zigzag"} if dp * cp > 1 else {}
    return {"world_size": dp * cp, "config": config, "throughput": [
        {"gradient_checkpointing": False, "seq_len": 1024 * cp, "batch_size": 4 * dp, "tokens_per_s_per_gpu": speeds,
         "peak_memory_gib": 2.0},
        {"gradient_checkpointing": True, "seq_len": 1024 * cp, "batch_size": 4 * dp,
         "tokens_per_s_per_gpu": checkpointed_speeds, "peak_memory_gib": 1.0}]}


def _data():
    return {"runs": {"gpu1": [_report(1, 1, s, s / 2) for s in (100.0, 110.0, 90.0)],
                     "cp2": [_report(1, 2, s, s / 2) for s in (99.0, 96.0, 97.0)],
                     "dp4": [_report(4, 1, s, s / 2) for s in (80.0, 70.0, 90.0)]},
            "conditions": {"gpu1": "alone", "cp2": "alone", "dp4": "alone"}}


def test_ratios_are_each_run_against_the_median_of_one_gpu():
    table = scaling_table(_data()).set_index(["setup", "gradient_checkpointing"])
    cp2 = table.loc[("context parallel 2 (zigzag)", False)]
    assert (cp2["ratio_low"], cp2["ratio"], cp2["ratio_high"]) == pytest.approx((0.96, 0.97, 0.99))
    assert table.loc[("data parallel 4", True)]["ratio"] == pytest.approx(0.8)
    assert table.loc[("1 GPU", False)]["tokens_per_gpu"] == 4096 and cp2["tokens_per_gpu"] == 4096
    assert list(table.loc[("data parallel 4", False)]["tokens_per_s_per_gpu"]) == [80.0, 70.0, 90.0]


def test_ratios_are_against_one_gpu_on_a_mesh_of_one_where_it_was_measured():
    data = _data()
    fsdp = [_report(1, 1, s, s / 4) for s in (120.0, 118.0, 121.0)]
    for report in fsdp:
        report["config"] = {"data_parallel": 1, "context_parallel": 1, "fsdp": True}
    data["runs"]["gpu1_fsdp"] = fsdp
    table = scaling_table(data).set_index(["setup", "gradient_checkpointing"])
    assert table.loc[("1 GPU, FSDP2 on a mesh of one", False)]["ratio"] == pytest.approx(1.0)
    assert table.loc[("1 GPU", False)]["ratio"] == pytest.approx(100.0 / 120.0)
    assert table.loc[("context parallel 2 (zigzag)", False)]["ratio"] == pytest.approx(97.0 / 120.0)
    assert table.loc[("data parallel 4", True)]["ratio"] == pytest.approx(40.0 / 30.0)


def test_the_finding_names_each_setup_against_the_target():
    metrics = {"tables": {"scaling": {"rows": scaling_table(_data()).to_dict(orient="records")}}}
    sections, findings = scaling_sections(metrics)
    assert findings == ["Tokens/s per GPU against one GPU at 4,096 tokens per GPU per step, without gradient "
                        "checkpointing, slowest to fastest of 3 runs: 2 GPUs: context parallel 2 (zigzag) 0.96-0.99x "
                        "(target met in every run); 4 GPUs: data parallel 4 0.70-0.90x (below the 0.95 target)."]
    assert [section.heading for section in sections] == ["Scaling over GPUs: tokens/s per GPU"]
    assert scaling_sections({"tables": {}}) == ([], [])


def test_the_committed_runs_load(tmp_path):
    data = load_scaling("reports/results/train_mesh/scaling_h200.json")
    table = scaling_table(data).set_index(["setup", "gradient_checkpointing"])
    one = sorted(report["throughput"][0]["tokens_per_s_per_gpu"] for report in data["runs"]["gpu1"])[1]
    slowest_cp4 = min(report["throughput"][0]["tokens_per_s_per_gpu"] for report in data["runs"]["cp4"])
    assert table.loc[("context parallel 4 (zigzag)", False)]["ratio_low"] == pytest.approx(slowest_cp4 / one)
    assert load_scaling(str(tmp_path / "absent.json")) is None
    (tmp_path / "bad.json").write_text(json.dumps({"runs": []}))
    with pytest.raises(ValueError, match="must hold 'runs'"):
        load_scaling(str(tmp_path / "bad.json"))


def test_runs_before_the_training_step_change_are_labelled_and_give_no_finding():
    from hilbert_lab.reports.provenance import TRAIN_STEP_CODE

    data = load_scaling("reports/results/train_mesh/scaling_h200.json")  # rev d093f1e
    sections, findings = scaling_sections({"tables": {"scaling": {"rows": scaling_table(data).to_dict("records")}}})
    assert findings == []
    assert sections[0].heading == "Scaling over GPUs: tokens/s per GPU: measured with older code (rev d093f1e)"
    assert sections[0].conclusion.startswith("Measured with older code (rev d093f1e), before the training step stopped "
                                             f"making the host wait for its backward ({TRAIN_STEP_CODE[:7]}): "
                                             "Tokens/s per GPU against one GPU")
    data["revision"] = TRAIN_STEP_CODE
    sections, findings = scaling_sections({"tables": {"scaling": {"rows": scaling_table(data).to_dict("records")}}})
    assert len(findings) == 1 and sections[0].heading == "Scaling over GPUs: tokens/s per GPU"
