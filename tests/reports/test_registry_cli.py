"""Report registry, parameter parsing, the `report` CLI and suite layout (without running notebooks)."""
from __future__ import annotations

import argparse
import json

import pytest

from hilbert_lab.reports import registry
from hilbert_lab.reports.cli import register_cli
from hilbert_lab.reports.registry import (
    get_report,
    list_reports,
    notebook_parameters,
    parse_parameter_overrides,
    report_parameters,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hilbert-lab")
    register_cli(parser.add_subparsers(dest="command", required=True))
    return parser


def test_every_report_notebook_exists_and_has_output_dir():
    for spec in list_reports():
        if spec.is_suite:
            assert all(part in registry.REPORTS for part in spec.parts)
            continue
        assert spec.notebook.exists(), spec.notebook
        parameters = report_parameters(spec.name)
        assert "output_dir" in parameters
        assert set(spec.overrides) <= set(notebook_parameters(spec.notebook)), spec.name


def test_default_suite_runs_the_cpu_reports():
    spec = get_report("default")
    assert spec.parts == ("benchmark-small", "locality", "claims-small", "training", "serialization-small")
    assert report_parameters("default")["training"]["cpu_train_steps"] == 0  # no live training in `make report`
    assert report_parameters("default")["benchmark-small"]["device"] == "cpu"


def test_issue_parameters_present():
    benchmark = report_parameters("benchmark")
    for name in ("device", "dtype", "seq_lens", "segment_lengths", "dilation_rates", "orderings", "repeats",
                 "modes", "backends"):
        assert name in benchmark, name


def test_unknown_report_names_the_known_ones():
    with pytest.raises(ValueError, match=r"report name must be one of .*'claims'"):
        get_report("clams")


def test_parse_overrides_types():
    defaults = {"repeats": 3, "scale": 1.5, "seq_lens": [1, 2], "device": "cpu", "causal": False}
    parsed = parse_parameter_overrides(["repeats=5", "scale=2", "seq_lens=[256, 512]", "device=cuda",
                                        "causal=true"], defaults)
    assert parsed == {"repeats": 5, "scale": 2.0, "seq_lens": [256, 512], "device": "cuda", "causal": True}
    assert isinstance(parsed["scale"], float)
    assert parse_parameter_overrides(["seq_lens=1024"], defaults) == {"seq_lens": [1024]}


@pytest.mark.parametrize("assignment, message", [
    ("repeats", "key=value"),
    ("repeat=3", r"not one of \['causal', 'device', 'repeats', 'scale', 'seq_lens'\]"),
    ("repeats=many", "repeats must be of type int"),
    ("causal=3", "causal must be true or false"),
    ("seq_lens=[1, 2", "cannot parse"),
])
def test_parse_overrides_refuses(assignment, message):
    defaults = {"repeats": 3, "scale": 1.5, "seq_lens": [1, 2], "device": "cpu", "causal": False}
    with pytest.raises(ValueError, match=message):
        parse_parameter_overrides([assignment], defaults)


def test_cli_list_and_params(capsys):
    args = _parser().parse_args(["report", "list"])
    assert args.func(args) == 0
    listed = capsys.readouterr().out
    assert all(spec.name in listed for spec in list_reports())
    args = _parser().parse_args(["report", "params", "claims"])
    assert args.func(args) == 0
    assert json.loads(capsys.readouterr().out) == report_parameters("claims")


def test_cli_run_passes_typed_overrides(monkeypatch, tmp_path, capsys):
    calls = {}

    def fake_run(name, parameters, **kwargs):
        calls.update(name=name, parameters=parameters, **kwargs)
        return tmp_path / "run"

    monkeypatch.setattr("hilbert_lab.reports.runner.run_report", fake_run)
    args = _parser().parse_args(["report", "run", "benchmark", "-p", "repeats=2", "-p", "seq_lens=[128,256]",
                                 "--output-root", str(tmp_path), "--run-id", "r1", "--quiet"])
    assert args.func(args) == 0
    assert calls["parameters"] == {"repeats": 2, "seq_lens": [128, 256]}
    assert calls["run_id"] == "r1" and calls["output_root"] == str(tmp_path) and calls["progress"] is False
    assert capsys.readouterr().out.strip() == str(tmp_path / "run" / "benchmark.html")  # the page to open
    # a bad parameter is an error message and exit status 2, not a traceback
    args = _parser().parse_args(["report", "run", "benchmark", "-p", "repeats=lots"])
    assert args.func(args) == 2
    assert "repeats must be of type int" in capsys.readouterr().err


def test_suite_layout_and_merged_metrics(monkeypatch, tmp_path):
    from hilbert_lab.reports import runner

    seen = []

    parts = get_report("default").parts

    def fake_execute(spec, overrides, run_dir, **kwargs):
        seen.append((spec.name, overrides))
        run_dir.mkdir(parents=True)
        return {"report": spec.name, "metrics": {"x": {"value": parts.index(spec.name) + 1}}}

    monkeypatch.setattr(runner, "execute_report", fake_execute)
    run_dir = runner.run_report("default", {"device": "cpu", "repeats": 2}, output_root=tmp_path, run_id="rid",
                                progress=False)
    assert run_dir == tmp_path / "default" / "rid"
    # each part gets only the overrides it has (locality has neither device nor repeats); the parts that time
    # nothing run first (side by side: in any order), then those that measure speed, one at a time
    assert sorted(seen[:3]) == [("locality", {}), ("serialization-small", {}), ("training", {})]
    assert seen[3:] == [("benchmark-small", {"device": "cpu", "repeats": 2}),
                        ("claims-small", {"device": "cpu", "repeats": 2})]
    merged = json.loads((run_dir / "metrics.json").read_text())
    assert list(merged["parts"]) == list(parts)  # the index keeps the suite's order
    assert [merged["parts"][name]["metrics"]["x"]["value"] for name in parts] == [1, 2, 3, 4, 5]
    assert json.loads((run_dir / "env.json").read_text())["parameters"]["overrides"] == {"device": "cpu", "repeats": 2}
    index = (run_dir / "index.html").read_text()
    assert "href='locality/locality.html'" in index
    # the committed GPU runs are rendered from their data and linked
    assert "href='gpu/benchmark-h200-gpu.html'" in index and (run_dir / "gpu" / "benchmark-h200-gpu.html").exists()
    with pytest.raises(ValueError, match="not parameters of report 'default'"):
        runner.run_report("default", {"nonsense": 1}, output_root=tmp_path, progress=False)


def test_run_id_is_unique_and_sortable():
    from hilbert_lab.reports.runner import new_run_id

    first, second = new_run_id(), new_run_id()
    assert first != second and first[:8].isdigit() and first[8] == "T"


def test_report_run_without_the_notebooks_extra_names_it(capsys, monkeypatch, tmp_path):
    import importlib.util

    from hilbert_lab.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "papermill" else real(name, *a))
    code = main(["report", "run", "default", "--output-root", str(tmp_path / "reports")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert 'pip install "hilbert-lab[reports]"' in err and "papermill" in err
    assert not (tmp_path / "reports").exists()
    assert main(["report", "list"]) == 0 and "default" in capsys.readouterr().out  # listing needs no extra


def test_report_run_never_overwrites_a_run(capsys, tmp_path):
    from hilbert_lab.cli import main

    (tmp_path / "benchmark-small" / "taken").mkdir(parents=True)
    code = main(["report", "run", "benchmark-small", "--output-root", str(tmp_path), "--run-id", "taken"])
    err = capsys.readouterr().err
    assert code == 2 and "--run-id" in err and "never overwritten" in err
    assert list((tmp_path / "benchmark-small" / "taken").iterdir()) == []


@pytest.mark.parametrize("assignment, message", [
    ("repeats=-1", "parameter repeats must be an integer >= 1 (default 10), got -1"),
    ("repeats=0", "repeats must be an integer >= 1"),
    ("seq_lens=[]", "parameter seq_lens must be a non-empty list of integers >= 1"),
    ("seq_lens=[512, -4]", "seq_lens must be a non-empty list of integers >= 1"),
    ("seq_lens=[512, 1.5]", "seq_lens must be"),
    ("case_timeout_s=-3", "case_timeout_s must be a finite number > 0"),
    ("case_timeout_s=.inf", "case_timeout_s must be a finite number > 0"),
    ("repeats=1_0", "write numbers without '_'"),
])
def test_cli_run_refuses_values_outside_what_the_default_allows(monkeypatch, capsys, assignment, message):
    monkeypatch.setattr("hilbert_lab.reports.runner.run_report", lambda *a, **k: pytest.fail("ran"))
    args = _parser().parse_args(["report", "run", "benchmark-small", "-p", assignment])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_cli_run_keeps_accepting_what_the_defaults_allow(monkeypatch, tmp_path, capsys):
    """Every default that a range rule governs, passed back as -p key=value, runs the report with exactly those
    values; so do a count of 0 where the default is 0 and a list of mixed items like the default's (in a suite)."""
    from hilbert_lab.reports.cli import _allowed

    calls = []
    monkeypatch.setattr("hilbert_lab.reports.runner.run_report",
                        lambda name, parameters, **kwargs: calls.append((name, parameters)) or tmp_path / "run")

    def run(name, parameters):
        assignments = [item for key, value in parameters.items() for item in ("-p", f"{key}={json.dumps(value)}")]
        args = _parser().parse_args(["report", "run", name, *assignments, "--output-root", str(tmp_path), "--quiet"])
        assert args.func(args) == 0, capsys.readouterr().err
        assert calls.pop() == (name, parameters)

    for name in ("benchmark-small", "locality", "claims-small", "training", "serialization"):
        governed = {key: value for key, value in report_parameters(name).items() if _allowed(value) is not None}
        assert len(governed) >= 1, name
        run(name, governed)
    run("default", {"cpu_train_steps": 0, "window_examples": [[16, "snake", 32, 2]]})


def test_render_never_overwrites_another_page_unless_forced(tmp_path, capsys):
    from pathlib import Path

    run = Path(__file__).resolve().parents[2] / "reports" / "ring" / "h200-gpu"
    out = tmp_path / "page.html"
    out.write_text("my page")
    args = _parser().parse_args(["report", "render", str(run), "--out", str(out)])
    assert args.func(args) == 2 and out.read_text() == "my page"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err and "already exists" in err
    args = _parser().parse_args(["report", "render", str(run), "--out", str(out), "--force"])
    assert args.func(args) == 0 and "Ring attention" in out.read_text()

def test_report_run_names_each_report_and_ends_with_the_page_to_open(capsys, monkeypatch, tmp_path):
    """`make report` prints a named line per report (and names its cell bar), then the path of index.html."""
    from hilbert_lab.cli import main
    from hilbert_lab.reports import runner

    labels = []

    def fake_execute(spec, overrides, run_dir, **kwargs):
        labels.append(kwargs.get("label"))
        run_dir.mkdir(parents=True)
        return {"report": spec.name}

    monkeypatch.setattr(runner, "execute_report", fake_execute)
    monkeypatch.setattr(runner, "committed_gpu_runs", lambda: [])
    assert main(["report", "run", "default", "--output-root", str(tmp_path), "--run-id", "rid"]) == 0
    captured = capsys.readouterr()
    parts = runner.run_order(get_report("default").parts)
    assert sorted(labels) == [f"[{number}/{len(parts)}] {part}" for number, part in enumerate(parts, start=1)]
    for number, part in enumerate(parts, start=1):
        assert f"[{number}/{len(parts)}] {part}: {get_report(part).description}" in captured.err
    page = tmp_path / "default" / "rid" / "index.html"
    assert captured.out.strip().splitlines()[-1] == str(page) and page.exists()
    assert main(["report", "run", "locality", "--output-root", str(tmp_path), "--run-id", "one", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == str(tmp_path / "locality" / "one" / "locality.html") and captured.err == ""


def test_the_default_suite_writes_no_png():
    """kaleido starts a browser per PNG (seconds each); the suite's pages draw every figure from metrics.json."""
    from hilbert_lab.reports.registry import report_parameters

    parts = report_parameters("default")
    with_png = [part for part, defaults in parts.items() if "save_png" in defaults]
    assert sorted(with_png) == ["benchmark-small", "claims-small", "serialization-small"]
    assert all(parts[part]["save_png"] is False for part in with_png)
