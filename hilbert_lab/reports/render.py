"""Rebuild report pages from data: run directory (metrics.json + env.json) -> NAME.html, on any machine.

`render_run` is what `report run` calls after the notebook and what `hilbert-lab report render RUN_DIR`
calls alone; the page is a pure function of the two JSON files. Reports with a module renderer
(benchmark, claims, locality, training, ring, serialization, decoding) get figures and conclusions computed from
their tables; any other report gets its metrics, its tables and the figures its recorder stored. Every page of a
run folder loads one plotly.min.js from the run folder (written once, referenced relatively).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from hilbert_lab.io import JSON_KINDS, atomic_write, read_json_object
from hilbert_lab.reports.html import PLOTLY_FILE, index_html, page_html, write_plotly
from hilbert_lab.reports.page import Page, Section, device_label, fmt, is_gpu_env
from hilbert_lab.reports.repo_paths import REPO_ROOT

# metrics["report"] -> module with render(metrics, env) -> Page
RENDERERS = {
    "benchmark": "hilbert_lab.reports.benchmark_page",
    "claims": "hilbert_lab.reports.claims_page",
    "locality": "hilbert_lab.reports.locality",
    "training": "hilbert_lab.reports.training",
    "ring": "hilbert_lab.reports.ring",
    "serialization": "hilbert_lab.reports.serialization_page",
    "decoding": "hilbert_lab.reports.decoding",
}
MEASURED_HERE = "Measured by this run"
COMMITTED = "Committed GPU results (rendered from their data)"


# metrics["report"] -> the table its page is drawn from (a run that recorded none has no page)
REQUIRED_TABLES = {"benchmark": "results", "claims": "claims", "locality": "compare_orderings"}
MAX_RUN_FILE_BYTES = 256 << 20  # metrics.json of the largest committed run is a few MB
def check_metrics(metrics: dict[str, Any], path: str | Path) -> None:
    """ValueError naming `path` and the key, for metrics.json content no page can be drawn from: a field of
    the wrong kind (report: a string; parameters, metrics, tables, figures, parts: objects; each table an
    object whose rows are objects), or a report without the table its page needs (REQUIRED_TABLES)."""
    where = f"metrics.json {str(path)!r}"
    if "report" in metrics and not isinstance(metrics["report"], str):
        raise ValueError(f"{where}: key 'report' must be a string (the report's name), got "
                         f"{JSON_KINDS.get(type(metrics['report']), 'an object')}")
    for key in ("parameters", "metrics", "tables", "figures", "parts"):
        if metrics.get(key) is not None and not isinstance(metrics[key], dict):
            raise ValueError(f"{where}: key {key!r} must be an object, got {JSON_KINDS.get(type(metrics[key]))}")
    for name, table in (metrics.get("tables") or {}).items():
        rows = table.get("rows") if isinstance(table, dict) else None
        if not isinstance(table, dict) or not isinstance(rows, (list, type(None))) or not all(
                isinstance(row, dict) for row in rows or []):
            raise ValueError(f"{where}: tables.{name} must be an object whose 'rows' is an array of objects")
    required = REQUIRED_TABLES.get(metrics.get("report"))
    if required is not None and not ((metrics.get("tables") or {}).get(required) or {}).get("rows"):
        raise ValueError(f"{where} has no rows under key tables.{required}: this {metrics['report']} run recorded "
                         "no results, so there is no page to render (run the report again)")


def write_run(metrics: dict[str, Any], env: dict[str, Any], out_dir: str | Path) -> Path:
    """A report run directory from data made elsewhere (committed benchmark files): metrics.json and env.json in
    `out_dir` (created), as load_run reads them; returns out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=1), encoding="utf-8")
    (out_dir / "env.json").write_text(json.dumps(env, indent=1), encoding="utf-8")
    return out_dir


def files_run_main(argv: list[str] | None, prog: str, what: str,
                   make_run: Callable[[list[str]], tuple[dict[str, Any], dict[str, Any]]]) -> int:
    """The command line of a page drawn from committed benchmark files (`what`): PATHS... --out DIR writes the
    run directory of make_run(PATHS) (write_run) and prints it; a file it cannot read or take: exit 2, one line on
    stderr."""
    parser = argparse.ArgumentParser(prog=prog, description=f"{what} JSON files -> a report run directory")
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        print(write_run(*make_run(args.paths), args.out))
    except (OSError, ValueError) as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    return 0


def load_run(run_dir: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metrics, env) of a run directory; ValueError naming the file that is missing, not a JSON object,
    or (metrics.json) without what its page is drawn from (check_metrics)."""
    run_dir = Path(run_dir)
    metrics_path, env_path = run_dir / "metrics.json", run_dir / "env.json"
    if not metrics_path.is_file():
        raise ValueError(f"run_dir must hold metrics.json; {str(run_dir)!r} does not")
    metrics = read_json_object(metrics_path, "metrics.json", "the JSON object a report run writes (report, "
                               "parameters, metrics, tables, figures)", MAX_RUN_FILE_BYTES)
    check_metrics(metrics, metrics_path)
    env = read_json_object(env_path, "env.json", "the JSON object of the run's environment",
                           MAX_RUN_FILE_BYTES) \
        if env_path.is_file() else {}
    return metrics, env


def renderer_for(report: str | None) -> Callable[[dict, dict], Page]:
    module = RENDERERS.get(str(report))
    if module is None:
        return generic_page
    return importlib.import_module(module).render


def build_page(metrics: dict[str, Any], env: dict[str, Any]) -> Page:
    """The Page of a run (a suite's merged metrics have no page of their own)."""
    return renderer_for(metrics.get("report"))(metrics, env)


def generic_page(metrics: dict[str, Any], env: dict[str, Any]) -> Page:
    """Metrics as findings, tables as tables, the figures the recorder stored (plotly JSON)."""
    import pandas as pd
    import plotly.graph_objects as go

    name = str(metrics.get("report", "report"))
    lines = [f"{key}: {fmt(entry.get('value'))} {entry.get('unit', '')}".strip()
             + (f" ({entry['note']})" if entry.get("note") else "") + "."
             for key, entry in (metrics.get("metrics") or {}).items()]
    sections = []
    for key, entry in (metrics.get("figures") or {}).items():
        if entry.get("plotly"):
            fig = go.Figure(entry["plotly"])
            sections.append(Section(entry.get("title") or key, figure=fig))
    for key, entry in (metrics.get("tables") or {}).items():
        frame = pd.DataFrame(entry.get("rows") or [], columns=entry.get("columns"))
        sections.append(Section(key, table=frame, caption=entry.get("caption", ""), collapsed=len(frame) > 20))
    return Page(title=f"{name} report", findings=lines[:5] or [f"{len(sections)} sections recorded."],
                about=f"The {name} report's recorded numbers, tables and figures.", sections=sections)


def _relative(target: Path, start: Path) -> str:
    return Path(os.path.relpath(target, start)).as_posix()


def render_run(run_dir: str | Path, out_path: str | Path | None = None, *, name: str | None = None,
               index_href: str | None = None, plotly_path: str | Path | None = None) -> Path:
    """Write the HTML page of `run_dir` (default: run_dir/NAME.html, NAME = the report's name); returns it.
    Its figures load `plotly_path` (default: plotly.min.js beside the page, written when missing)."""
    run_dir = Path(run_dir)
    metrics, env = load_run(run_dir)
    name = name or (env.get("parameters") or {}).get("report") or metrics.get("report") or "report"
    return _write_page(build_page(metrics, env), env, run_dir, name, out_path, index_href=index_href,
                       plotly_path=plotly_path)


def _write_page(page: Page, env: dict[str, Any], run_dir: Path, name: str, out_path: str | Path | None, *,
                index_href: str | None, plotly_path: str | Path | None) -> Path:
    """Write `page` (the page of run `run_dir`, report `name`) as render_run does."""
    out_path = Path(out_path) if out_path is not None else run_dir / f"{name}.html"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    plotly_path = write_plotly(out_path.parent) if plotly_path is None else Path(plotly_path)
    notebook = f"{name}.ipynb" if (run_dir / f"{name}.ipynb").exists() else None
    atomic_write(out_path, page_html(page, env, notebook=notebook, index_href=index_href,
                                     plotly_src=_relative(plotly_path, out_path.parent)))
    return out_path


def committed_gpu_runs(root: str | Path | None = None) -> list[Path]:
    """Run directories under reports/<name>/<run>/ recorded on a GPU (env.json says so; suites left out), sorted."""
    root = Path(root) if root is not None else REPO_ROOT / "reports"
    runs = []
    for metrics_path in sorted(root.glob("*/*/metrics.json")):
        env_path = metrics_path.parent / "env.json"
        if "parts" in read_json_object(metrics_path, "metrics.json", "a report run's JSON object",
                                       MAX_RUN_FILE_BYTES):  # a suite
            continue
        if env_path.is_file() and is_gpu_env(read_json_object(env_path, "env.json", "a run's environment object",
                                                              MAX_RUN_FILE_BYTES)):
            runs.append(metrics_path.parent)
    return runs


def _card(page: Page, env: dict[str, Any], href: str, title: str, *, part: bool) -> dict[str, str]:
    """An index card: a part whose data this run made goes under MEASURED_HERE; a part whose findings come (also)
    from committed GPU runs, and a committed GPU run's own page, under COMMITTED with the device that made them."""
    here = part and page.measured_here and not page.sources
    device = page.device or device_label(env)
    return {"href": href, "title": title, "headline": page.headline, "device": device,
            "group": MEASURED_HERE if here else COMMITTED}


def render_suite_index(suite_dir: str | Path, parts: list[str], *, title: str,
                       gpu_runs: list[Path] | None = None) -> Path:
    """index.html of a suite run: a card per part (its headline) and per committed GPU run, each page
    rendered from its data (GPU pages go to suite_dir/gpu/<report>-<run>.html); one plotly.min.js in suite_dir."""
    suite_dir = Path(suite_dir)
    plotly_path = write_plotly(suite_dir)
    entries = []
    for part in parts:
        part_dir = suite_dir / part
        try:
            metrics, env = load_run(part_dir)
            page = build_page(metrics, env)
            _write_page(page, env, part_dir, part, part_dir / f"{part}.html", index_href="../index.html",
                        plotly_path=plotly_path)
            entries.append(_card(page, env, f"{part}/{part}.html", page.title, part=True))
        except Exception as error:  # one broken part must not hide the others
            entries.append({"href": f"{part}/{part}.html", "title": part, "device": "",
                            "headline": f"could not be rendered: {type(error).__name__}: {error}"[:300],
                            "group": MEASURED_HERE})
    for run_dir in gpu_runs if gpu_runs is not None else committed_gpu_runs():
        metrics, env = load_run(run_dir)
        target = f"gpu/{run_dir.parent.name}-{run_dir.name}.html"
        try:
            page = build_page(metrics, env)
            name = (env.get("parameters") or {}).get("report") or metrics.get("report") or "report"
            _write_page(page, env, run_dir, name, suite_dir / target, index_href="../index.html",
                        plotly_path=plotly_path)
            entries.append(_card(page, env, target, page.title, part=False))
        except Exception as error:
            entries.append({"href": target, "title": f"{run_dir.parent.name} ({run_dir.name})", "device": "",
                            "headline": f"could not be rendered: {type(error).__name__}: {error}"[:300],
                            "group": COMMITTED})
    here = device_label(load_run(suite_dir)[1]) if (suite_dir / "env.json").is_file() else "this machine"
    intro = (f"Each card gives a report's main finding; the page behind it leads with its findings, then the "
             f"figures, tables and where the data come from. '{MEASURED_HERE}' was measured on {here} by this "
             "run; the committed GPU results were measured elsewhere (device on each card) and are rendered from "
             "their committed data without re-running anything.")
    path = suite_dir / "index.html"
    path.write_text(index_html(title, intro, entries, groups=(MEASURED_HERE, COMMITTED)), encoding="utf-8")
    return path


__all__ = ["COMMITTED", "MEASURED_HERE", "PLOTLY_FILE", "REQUIRED_TABLES", "build_page", "check_metrics",
           "committed_gpu_runs", "files_run_main", "generic_page", "load_run", "render_run",
           "render_suite_index", "renderer_for", "write_run"]
