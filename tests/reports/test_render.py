"""Pages rebuilt from metrics.json + env.json: verdicts, intervals, committed GPU runs, the render CLI."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("plotly", reason="plotly (notebooks extra) draws the figures")

from hilbert_lab.reports import benchmark, benchmark_page, claims_page, claims_verdict  # noqa: E402
from hilbert_lab.reports.page import figure_axis_titles, fmt  # noqa: E402
from hilbert_lab.reports.render import build_page, committed_gpu_runs, load_run, render_run  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CPU_ENV = {"device": {"device": "cpu", "name": "test cpu"}, "cpu": {"model": "test", "usable_cores": 2},
           "git": {"commit": "0123456789abcdef"}, "packages": {"torch": "2.x"}, "parameters": {"output_dir": "/abs"}}


def _ab_metrics(identity, ordered):
    rows = [{"seq_len": 512, "mode": "longnet", "backend": "auto", "ordering": "hilbert",
             "identity_times_ms": list(identity), "ordered_times_ms": list(ordered), "max_abs_difference": 0.0}]
    results = [{"backend": "auto", "seq_len": 512, "mode": "longnet", "ordering": name, "pass": "forward",
                "status": "ok", "median_ms": float(np.median(times)), "times_ms": list(times), "tokens_per_s": 1.0,
                "useful_tflops": 1.0, "peak_mib": None, "error": ""} for name, times in
               (("identity", identity), ("hilbert", ordered))]
    return {"report": "benchmark", "parameters": {"device": "cpu", "repeats": len(identity)},
            "tables": {"ordering_ab": {"rows": rows}, "results": {"rows": results}}}


def test_benchmark_page_says_no_difference_only_for_a_narrow_interval_and_names_a_real_effect():
    rng = np.random.default_rng(0)
    noisy = _ab_metrics(rng.lognormal(0, 0.3, 21), rng.lognormal(0, 0.3, 21))
    table = benchmark.comparisons(noisy)
    assert table.iloc[0].verdict == "no difference" and table.iloc[0].timing == "interleaved"
    assert not table.iloc[0].settled  # the interval holds 1 but spans far more than 5% around it
    assert any("not settled in 1 of 1" in finding for finding in benchmark_page.render(noisy, CPU_ENV).findings)
    same = _ab_metrics(rng.normal(10, 0.1, 21), rng.normal(10, 0.1, 21))
    page = benchmark_page.render(same, CPU_ENV)
    assert any("no different in 1 of 1" in finding for finding in page.findings)
    assert any("indicative only" in note for note in page.notes)
    faster = _ab_metrics(rng.normal(10, 0.2, 21), rng.normal(5, 0.1, 21))
    assert benchmark.comparisons(faster).iloc[0].verdict == "hilbert faster"
    text = " ".join(page.findings + [section.conclusion for section in page.sections])
    # every ratio printed comes with its interval
    assert not re.search(r"\d\.\d+x(?! \[)", text), text
    for section in page.sections:
        if section.figure is not None:
            assert all(title for _axis, title in figure_axis_titles(section.figure)), section.heading


def test_claims_page_lists_every_claim_with_text_measured_and_verdict():
    metrics, env = load_run(REPO / "reports" / "claims" / "h200-gpu")
    page = claims_page.render(metrics, env)
    overview = next(section.table for section in page.sections if section.heading.startswith("Claimed vs measured"))
    assert [claim.split(":")[0] for claim in overview["claim"]] == [f"C{index}" for index in range(1, 13)]
    assert (overview["claim"].str.len() > 10).all() and (overview["reason"].str.len() > 0).all()
    assert set(overview["verdict"]) <= set(claims_verdict.CLAIM_VERDICTS)
    c12 = overview.set_index(overview["claim"].str[:3]).loc["C12"]
    assert "no interval recorded" in c12["measured"]  # an older run's bare ratio is marked, not shown as a finding
    assert c12["verdict"] == "inconclusive"  # ... and it settles nothing


def test_committed_gpu_runs_render_offline(tmp_path):
    runs = committed_gpu_runs()
    names = {run.parent.name for run in runs}
    assert {"benchmark", "claims", "ring"} <= names
    for run in runs:
        path = render_run(run, tmp_path / f"{run.parent.name}.html")
        html = path.read_text()
        # the only script a page loads is the run folder's plotly.min.js, by a relative path
        assert re.findall(r"<script[^>]*\ssrc='([^']*)'", html) == ["plotly.min.js"], run
        assert (tmp_path / "plotly.min.js").is_file() and not re.search(r"<link[^>]*href=", html), run
        markup = re.sub(r"<script.*?</script>", "", html, flags=re.DOTALL)  # plotly.js itself names URLs
        assert not re.search(r"""(src|href)=["']?https?://""", markup), run
        assert "unpkg.com" not in html and "<title>Notebook</title>" not in html
        assert "output_dir" not in html and "&lt;NA&gt;" not in html
        page = build_page(*load_run(run))
        assert page.headline and page.findings and page.about
        for section in page.sections:
            if section.figure is not None:
                assert all(title for _axis, title in figure_axis_titles(section.figure)), (run, section.heading)


def test_ring_converter_reads_every_gpu_count(tmp_path):
    from hilbert_lab.reports.ring import ring_run, write_ring_run

    paths = [REPO / "reports" / "results" / f"ring_{n}gpu_h200.json" for n in (1, 2, 4)]
    metrics, env = ring_run(paths)
    gpus = sorted({row["gpus"] for row in metrics["tables"]["throughput"]["rows"]})
    assert gpus == [1, 2, 4] and env["device"]["device_count"] == 4 and env["git"]["commit"] == "f620cad"
    anchors = metrics["tables"]["anchors"]["rows"]
    assert {r["gpus"] for r in anchors if r["variant"].startswith("context_parallel")} == {2, 4}
    assert {r["gpus"] for r in anchors if r["section"] == "causal_layouts"} == {2}
    assert {r["gpus"] for r in metrics["tables"]["ratios"]["rows"]} == {2, 4}
    assert {r["gpus"] for r in metrics["tables"]["parallel_modes"]["rows"]} == {2, 4}
    assert metrics["tables"]["longest"]["rows"] == []  # the runs of this revision measured no longest sequence
    row = next(r for r in metrics["tables"]["throughput"]["rows"] if r["gpus"] == 2)
    assert row["tokens_per_s_total"] == pytest.approx(2 * row["tokens_per_s_per_gpu"])
    out = write_ring_run(paths, tmp_path / "ring")
    assert json.loads((out / "metrics.json").read_text()) == json.loads(json.dumps(metrics))
    with pytest.raises(ValueError, match="paths"):
        ring_run([tmp_path / "missing.json"])


def test_render_cli_rebuilds_a_page_and_refuses_a_bad_dir(tmp_path, capsys):
    import argparse

    from hilbert_lab.reports.cli import register_cli

    parser = argparse.ArgumentParser(prog="hilbert-lab")
    register_cli(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "page.html"
    args = parser.parse_args(["report", "render", str(REPO / "reports" / "ring" / "h200-gpu"), "--out", str(out)])
    assert args.func(args) == 0 and out.exists() and "Ring attention" in out.read_text()
    args = parser.parse_args(["report", "render", str(tmp_path / "nothing")])
    assert args.func(args) == 2
    assert "run_dir must hold metrics.json" in capsys.readouterr().err


def test_fmt_keeps_tables_short():
    assert fmt(0.123456789) == "0.123" and fmt(1234567.89) == "1,234,568" and fmt(None) == "-"
    assert fmt(float("nan")) == "-" and fmt(3) == "3" and fmt(2.0) == "2" and fmt(1.5e-7) == "1.50e-07"


@pytest.mark.slow  # renders every page of the committed run
def test_committed_cpu_run_pages_have_conclusions_and_titled_axes():
    runs = sorted((REPO / "reports" / "default").glob("*/metrics.json"))
    if not runs:
        pytest.skip("no committed default run")
    suite = runs[-1].parent
    pages = {part: build_page(*load_run(suite / part)) for part in json.loads((suite / "metrics.json").read_text())["parts"]}
    assert set(pages) == {"benchmark-small", "locality", "claims-small", "training", "serialization-small"} or \
        set(pages) == {"benchmark-small", "locality", "claims-small", "training", "serialization"}
    for name, page in pages.items():
        figures = [section for section in page.sections if section.figure is not None]
        assert figures, name
        for section in figures:
            assert section.conclusion, (name, section.heading)
            assert all(title for _axis, title in figure_axis_titles(section.figure)), (name, section.heading)
    # the training curves come from the recorded history alone: one accuracy and one loss figure per group
    # (32K on one H100, 128K on one H100, ring vs one GPU)
    curves = [s for s in pages["training"].sections if s.heading.endswith((": accuracy", ": loss"))]
    assert len(curves) == 6


def test_page_figures_are_drawn_with_the_page_template():
    """figure_div puts PAGE_TEMPLATE's JSON into every figure it writes, whatever template the figure had."""
    import plotly.graph_objects as go
    import plotly.io as pio

    from hilbert_lab.reports.html import PAGE_TEMPLATE, figure_div

    expected = pio.templates[PAGE_TEMPLATE].to_plotly_json()
    for fig in (go.Figure(go.Scatter(x=[1, 2], y=[3, 5])), go.Figure(go.Bar(x=["a"], y=[1]), layout={"template": "ggplot2"})):
        div = figure_div(fig)
        payload = json.loads(re.search(r"Plotly\.newPlot\(\s*\"[^\"]+\",\s*(\[.*?\]),\s*(\{.*\}),\s*\{\"displaylogo", div,
                                       re.S).group(2))
        assert payload["template"] == json.loads(json.dumps(expected)), payload.get("template", {}).keys()
        assert payload["template"]["layout"]["plot_bgcolor"] == "white"


def test_separate_runs_with_a_wide_interval_are_not_settled():
    rng = np.random.default_rng(1)
    metrics = _ab_metrics(rng.lognormal(0, 0.3, 21), rng.lognormal(0, 0.3, 21))
    del metrics["tables"]["ordering_ab"]  # an older run: only the cases timed in separate processes
    table = benchmark.comparisons(metrics)
    assert table.iloc[0].timing == "separate runs" and not table.iloc[0].settled
    page = benchmark_page.render(metrics, CPU_ENV)
    assert any("not settled in 1 of 1" in finding and "after 21 repeats" in finding for finding in page.findings)
    assert "within 5% of 1 reads 'no difference'" in page.about
