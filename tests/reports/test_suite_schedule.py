"""A suite runs the parts that measure speed alone, the others side by side, and indexes them in declared order."""
from __future__ import annotations

import json
import threading
import time

import pytest

from hilbert_lab.reports import registry, runner
from hilbert_lab.reports.registry import ReportSpec

PARTS = {"timed-a": True, "plain-b": False, "timed-c": True, "plain-d": False, "plain-e": False}


@pytest.fixture
def fake_suite(monkeypatch, tmp_path):
    """Registers a suite of PARTS whose runs record when they start and end, and fail where asked."""
    specs = {name: ReportSpec(name, f"part {name}", tmp_path / f"{name}.ipynb", measures_speed=timed)
             for name, timed in PARTS.items()}
    specs["suite"] = ReportSpec("suite", "a suite", parts=tuple(PARTS))
    monkeypatch.setattr(registry, "REPORTS", {**registry.REPORTS, **specs})
    monkeypatch.setattr(runner, "report_parameters",
                        lambda name: {part: {"x": 1} for part in PARTS} if name == "suite" else {"x": 1})
    monkeypatch.setattr(runner, "render_suite_index", lambda *args, **kwargs: None)
    spans: dict[str, tuple[float, float]] = {}
    failing: set[str] = set()
    lock = threading.Lock()

    def fake_execute(spec, overrides, run_dir, **kwargs):
        start = time.monotonic()
        time.sleep(0.3)
        with lock:
            spans[spec.name] = (start, time.monotonic())
        if spec.name in failing:
            raise RuntimeError(f"{spec.name} failed")
        return {"report": spec.name, "parameters": overrides, "metrics": {"m": {"value": spec.name}}}

    monkeypatch.setattr(runner, "execute_report", fake_execute)
    return spans, failing, tmp_path


def _overlap(first: tuple[float, float], second: tuple[float, float]) -> bool:
    return first[0] < second[1] and second[0] < first[1]


def test_parts_that_measure_speed_run_alone_and_the_others_side_by_side(fake_suite, monkeypatch):
    spans, _, tmp_path = fake_suite
    monkeypatch.setattr(runner, "side_by_side", lambda: 2)
    assert runner.run_order(tuple(PARTS)) == ["plain-b", "plain-d", "plain-e", "timed-a", "timed-c"]
    run_dir = runner.run_report("suite", output_root=tmp_path / "out", run_id="r", progress=False)
    assert set(spans) == set(PARTS)
    for timed in ("timed-a", "timed-c"):
        assert not any(_overlap(spans[timed], spans[other]) for other in PARTS if other != timed), spans
    assert _overlap(spans["plain-b"], spans["plain-d"])  # two lanes
    assert not _overlap(spans["plain-e"], spans["plain-b"]) or not _overlap(spans["plain-e"], spans["plain-d"])
    merged = json.loads((run_dir / "metrics.json").read_text())
    assert list(merged["parts"]) == list(PARTS)  # indexed in the suite's own order
    assert [part["metrics"]["m"]["value"] for part in merged["parts"].values()] == list(PARTS)


def test_one_lane_runs_every_part_alone(fake_suite, monkeypatch):
    spans, _, tmp_path = fake_suite
    monkeypatch.setattr(runner, "side_by_side", lambda: 1)
    runner.run_report("suite", output_root=tmp_path / "out", run_id="r", progress=False)
    names = list(PARTS)
    assert not any(_overlap(spans[a], spans[b]) for a in names for b in names if a < b), spans


def test_a_failing_part_lets_the_part_beside_it_finish(fake_suite, monkeypatch):
    spans, failing, tmp_path = fake_suite
    monkeypatch.setattr(runner, "side_by_side", lambda: 2)
    failing.add("plain-b")
    with pytest.raises(RuntimeError, match="plain-b failed"):
        runner.run_report("suite", output_root=tmp_path / "out", run_id="r", progress=False)
    assert {"plain-d", "plain-e"} <= set(spans)  # ran (and finished) although plain-b failed first


def test_side_by_side_is_one_or_two():
    assert runner.side_by_side() in (1, 2)
