"""Rebuild report pages from data: run directory (metrics.json + env.json) -> NAME.html, on any machine.

`render_run` is what `report run` calls after the notebook and what `hilbert-lab report render RUN_DIR`
calls alone; the page is a pure function of the two JSON files. Reports with a module renderer
(benchmark, claims, locality, training, ring, serialization) get figures and conclusions computed from their tables;
any other report gets its metrics, its tables and the figures its recorder stored.
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, Callable

from hilbert_lab.reports.page import Page, Section, device_label, fmt, index_html, is_gpu_env, page_html

REPO_ROOT = Path(__file__).resolve().parents[2]
# metrics["report"] -> module with render(metrics, env) -> Page
RENDERERS = {
    "benchmark": "hilbert_lab.reports.benchmark",
    "claims": "hilbert_lab.reports.claims_page",
    "locality": "hilbert_lab.reports.locality",
    "training": "hilbert_lab.reports.training",
    "ring": "hilbert_lab.reports.ring",
    "serialization": "hilbert_lab.reports.serialization_page",
}


def load_run(run_dir: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metrics, env) of a run directory; ValueError naming the missing file."""
    run_dir = Path(run_dir)
    metrics_path, env_path = run_dir / "metrics.json", run_dir / "env.json"
    if not metrics_path.is_file():
        raise ValueError(f"run_dir must hold metrics.json; {str(run_dir)!r} does not")
    metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
    env = json.loads(env_path.read_text(encoding="utf-8")) if env_path.is_file() else {}
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
    """Metrics as bullets, tables as tables, the figures the recorder stored (plotly JSON)."""
    import pandas as pd
    import plotly.graph_objects as go

    name = str(metrics.get("report", "report"))
    bullets = [f"{key}: {fmt(entry.get('value'))} {entry.get('unit', '')}".strip()
               + (f" ({entry['note']})" if entry.get("note") else "")
               for key, entry in (metrics.get("metrics") or {}).items()]
    sections = []
    for key, entry in (metrics.get("figures") or {}).items():
        if entry.get("plotly"):
            fig = go.Figure(entry["plotly"])
            sections.append(Section(entry.get("title") or key, figure=fig))
    for key, entry in (metrics.get("tables") or {}).items():
        frame = pd.DataFrame(entry.get("rows") or [], columns=entry.get("columns"))
        sections.append(Section(key, table=frame, caption=entry.get("caption", "")))
    headline = "; ".join(bullets[:3]) or f"{len(sections)} sections"
    return Page(title=f"{name} report", summary=f"The {name} report's recorded numbers, tables and figures.",
                headline=headline, sections=sections, bullets=bullets)


def render_run(run_dir: str | Path, out_path: str | Path | None = None, *, name: str | None = None,
               index_href: str | None = None) -> Path:
    """Write the HTML page of `run_dir` (default: run_dir/NAME.html, NAME = the report's name); returns it."""
    run_dir = Path(run_dir)
    metrics, env = load_run(run_dir)
    name = name or (env.get("parameters") or {}).get("report") or metrics.get("report") or "report"
    page = build_page(metrics, env)
    out_path = Path(out_path) if out_path is not None else run_dir / f"{name}.html"
    notebook = f"{name}.ipynb" if (run_dir / f"{name}.ipynb").exists() else None
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(page_html(page, env, notebook=notebook, index_href=index_href,
                                  rebuild_hint=f"rebuild with: hilbert-lab report render {run_dir}"),
                        encoding="utf-8")
    return out_path


def committed_gpu_runs(root: str | Path | None = None) -> list[Path]:
    """Run directories under reports/<name>/<run>/ recorded on a GPU (env.json says so; suites left out), sorted."""
    root = Path(root) if root is not None else REPO_ROOT / "reports"
    runs = []
    for metrics_path in sorted(root.glob("*/*/metrics.json")):
        env_path = metrics_path.parent / "env.json"
        if "parts" in json.loads(metrics_path.read_text(encoding="utf-8")):  # a suite, not one report
            continue
        if env_path.is_file() and is_gpu_env(json.loads(env_path.read_text(encoding="utf-8"))):
            runs.append(metrics_path.parent)
    return runs


def render_suite_index(suite_dir: str | Path, parts: list[str], *, title: str,
                       gpu_runs: list[Path] | None = None) -> Path:
    """index.html of a suite run: a card per part (its headline) and per committed GPU run, each page
    rendered from its data (GPU pages go to suite_dir/gpu/<report>-<run>.html)."""
    suite_dir = Path(suite_dir)
    entries = []
    for part in parts:
        part_dir = suite_dir / part
        try:
            metrics, env = load_run(part_dir)
            page = build_page(metrics, env)
            render_run(part_dir, part_dir / f"{part}.html", name=part, index_href="../index.html")
            entries.append({"href": f"{part}/{part}.html", "title": page.title, "headline": page.headline,
                            "device": page.device or device_label(env), "group": "This run (CPU)"
                            if not is_gpu_env(env) else "This run (GPU)"})
        except Exception as error:  # one broken part must not hide the others
            entries.append({"href": f"{part}/{part}.html", "title": part, "device": "",
                            "headline": f"could not be rendered: {type(error).__name__}: {error}"[:300],
                            "group": "This run (CPU)"})
    for run_dir in gpu_runs if gpu_runs is not None else committed_gpu_runs():
        metrics, env = load_run(run_dir)
        target = f"gpu/{run_dir.parent.name}-{run_dir.name}.html"
        try:
            page = build_page(metrics, env)
            render_run(run_dir, suite_dir / target, index_href="../index.html")
            headline = page.headline
        except Exception as error:
            headline = f"could not be rendered: {type(error).__name__}: {error}"[:300]
            page = Page(title=f"{run_dir.parent.name} ({run_dir.name})", summary="", headline=headline)
        entries.append({"href": target, "title": f"{page.title} ({run_dir.name})", "headline": headline,
                        "device": device_label(env), "group": "Committed GPU runs (rendered from their data)"})
    intro = ("Each card gives a report's headline; the page behind it has the figures, the conclusions "
             "computed from the data, the tables and the environment. The GPU runs were measured elsewhere "
             "and committed as metrics.json + env.json; they are rendered here without re-running anything.")
    path = suite_dir / "index.html"
    path.write_text(index_html(title, intro, entries), encoding="utf-8")
    return path
