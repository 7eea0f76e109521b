"""Papermill runner + export: a tiny report notebook executes into a run directory with every artifact."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hilbert_lab.reports.export import html_has_inline_plotly, page_loads_plotly_offline
from hilbert_lab.reports.registry import ReportSpec
from hilbert_lab.reports.runner import execute_report

pytest.importorskip("papermill", reason="papermill (notebooks extra) runs the reports")
nbformat = pytest.importorskip("nbformat", reason="nbformat (notebooks extra) writes the notebooks")
REPO = str(Path(__file__).resolve().parents[2])

TINY_SOURCE = [
    ("parameters", "scale = 2.0\nlabels = ['a', 'b', 'c']\noutput_dir = '.'"),
    ("", "import pandas as pd\nimport plotly.graph_objects as go\n"
         "from hilbert_lab.reports.recorder import ReportRecorder\n"
         "recorder = ReportRecorder(output_dir, 'tiny', {'scale': scale, 'labels': labels})"),
    ("", "values = [scale * 1.25, scale * 3.5, scale * 7.75]\n"
         "recorder.table('values', pd.DataFrame({'label': labels, 'value': values}))\n"
         "recorder.metric('total', sum(values), unit='units')\n"
         "recorder.figure('bars', go.Figure(go.Bar(x=labels, y=values, name='tiny-bars')))"),
]


def _tiny_report(tmp_path: Path, fail: bool = False) -> ReportSpec:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for tag, source in TINY_SOURCE + ([("", "raise RuntimeError('deliberate failure 4321')")] if fail else []):
        cell = nbformat.v4.new_code_cell(source)
        if tag:
            cell.metadata["tags"] = [tag]
        notebook.cells.append(cell)
    path = tmp_path / "tiny.ipynb"
    nbformat.write(notebook, path)
    return ReportSpec("tiny", "test report", path)


@pytest.mark.slow  # a notebook run in a kernel; make test keeps one
def test_report_run_writes_every_artifact(tmp_path, monkeypatch):
    spec = _tiny_report(tmp_path)
    monkeypatch.setattr("hilbert_lab.reports.runner.report_parameters",
                        lambda name: {"scale": 2.0, "labels": ["a", "b", "c"], "output_dir": "."})
    run_dir = tmp_path / "out" / "tiny" / "run1"
    metrics = execute_report(spec, {"scale": 4.0}, run_dir, progress=False, kernel_name=None,
                             execution_timeout_s=300)
    # metrics.json: the overridden parameter took effect and every shown number is there
    assert metrics["parameters"]["scale"] == 4.0
    assert [row["value"] for row in metrics["tables"]["values"]["rows"]] == [5.0, 14.0, 31.0]
    assert metrics["metrics"]["total"]["value"] == pytest.approx(50.0)
    assert metrics["figures"]["bars"]["traces"] == ["tiny-bars"]
    # env.json: versions, git, cpu, device and the effective parameters
    env = json.loads((run_dir / "env.json").read_text())
    assert env["parameters"]["scale"] == 4.0 and env["parameters"]["output_dir"] == "."
    assert env["packages"]["torch"] and env["packages"]["papermill"]
    assert env["cpu"]["logical_cores"] >= 1 and env["device"]["device"]
    # executed notebook (figures as plotly JSON, no plotly.js copy: small) + HTML that loads the run's one
    # plotly.min.js beside it, with the figure's data
    executed = nbformat.read(run_dir / "tiny.ipynb", as_version=4)
    assert any(cell.get("outputs") for cell in executed.cells)
    assert (run_dir / "tiny.ipynb").stat().st_size < 200_000
    html = (run_dir / "tiny.html").read_text()
    assert not html_has_inline_plotly(html) and page_loads_plotly_offline(run_dir / "tiny.html")
    assert "tiny-bars" in html and re.search(r"5\.0,\s*14\.0,\s*31\.0", html)
    assert not re.search(r'<script[^>]+src="https?://', html), "the page must not load scripts from the network"


@pytest.mark.slow  # 7-15 s of CPU: make test-all
def test_failed_report_still_exports_html(tmp_path, monkeypatch):
    import papermill

    spec = _tiny_report(tmp_path, fail=True)
    monkeypatch.setattr("hilbert_lab.reports.runner.report_parameters",
                        lambda name: {"scale": 2.0, "labels": ["a", "b", "c"], "output_dir": "."})
    run_dir = tmp_path / "failed"
    with pytest.raises(papermill.PapermillExecutionError, match="deliberate failure 4321"):
        execute_report(spec, {}, run_dir, progress=False, kernel_name=None, execution_timeout_s=300)
    assert "deliberate failure 4321" in (run_dir / "tiny.html").read_text()
    assert json.loads((run_dir / "metrics.json").read_text())["metrics"]["total"]["value"] == pytest.approx(25.0)


def test_unknown_override_is_refused(tmp_path, monkeypatch):
    spec = _tiny_report(tmp_path)
    monkeypatch.setattr("hilbert_lab.reports.runner.report_parameters", lambda name: {"scale": 2.0})
    with pytest.raises(ValueError, match=r"not parameters of report 'tiny'.*scale"):
        execute_report(spec, {"scael": 3.0}, tmp_path / "x", progress=False, kernel_name=None,
                       execution_timeout_s=60)



# `hilbert-lab report run tiny --quiet` in a fresh process, with the tiny report registered in it
_CLI_RUN = """
import sys
from pathlib import Path
from hilbert_lab import cli
from hilbert_lab.reports import registry
registry.REPORTS["tiny"] = registry.ReportSpec("tiny", "test report", Path(sys.argv[1]))
sys.exit(cli.main(sys.argv[2:]))
"""


@pytest.mark.slow  # 7-15 s of CPU: make test-all
def test_quiet_report_run_prints_only_the_page_path(tmp_path):
    """The kernel's own log lines reach the terminal (it inherits stderr): it runs over IPC sockets (no
    "running over TCP without encryption" warning) and is not sent SIGINT when it is shut down idle
    (a SIGINT inside its event loop logs "KeyboardInterrupt caught in kernel" on a run that succeeded)."""
    spec = _tiny_report(tmp_path)
    marker = tmp_path / "sigint-received"
    notebook = nbformat.read(spec.notebook, as_version=4)
    # after this cell the kernel's SIGINT handler (restored after each request) records the signal in a file
    notebook.cells.append(nbformat.v4.new_code_cell(
        "def _record(signum, frame):\n"
        f"    open({str(marker)!r}, 'w').write('SIGINT')\n"
        "get_ipython().kernel.saved_sigint_handler = _record"))
    nbformat.write(notebook, spec.notebook)
    root = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", _CLI_RUN, str(spec.notebook), "report", "run", "tiny", "--quiet",
                           "--output-root", str(root), "--run-id", "r1"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": REPO})
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{root}/tiny/r1/tiny.html\n"
    assert "IPKernelApp" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr
    assert done.stderr == ""
    assert not marker.exists(), "the idle kernel was sent SIGINT at shutdown"
    metrics = json.loads((root / "tiny" / "r1" / "metrics.json").read_text())
    assert metrics["metrics"]["total"]["value"] == pytest.approx(25.0)


@pytest.mark.slow  # two kernels: make test-all
def test_two_reports_side_by_side_each_write_into_their_own_folder(tmp_path, monkeypatch):
    """Kernels start in their run folder (not by changing this process's folder, which threads share): two tiny
    reports run at once from a relative output root each find their own parameters and files."""
    from concurrent.futures import ThreadPoolExecutor

    spec = _tiny_report(tmp_path)
    monkeypatch.setattr("hilbert_lab.reports.runner.report_parameters",
                        lambda name: {"scale": 2.0, "labels": ["a", "b", "c"], "output_dir": "."})
    monkeypatch.chdir(tmp_path)
    scales = {"left": 3.0, "right": 5.0}
    with ThreadPoolExecutor(2) as pool:
        futures = {side: pool.submit(execute_report, spec, {"scale": scale}, Path("out") / side, progress=False,
                                     kernel_name=None, execution_timeout_s=300)
                   for side, scale in scales.items()}
        results = {side: future.result() for side, future in futures.items()}
    assert Path.cwd() == tmp_path
    for side, scale in scales.items():
        written = json.loads((tmp_path / "out" / side / "metrics.json").read_text())
        assert written["parameters"]["scale"] == results[side]["parameters"]["scale"] == scale
        assert written["metrics"]["total"]["value"] == pytest.approx(12.5 * scale)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out", "tiny.ipynb"]  # nothing written beside
