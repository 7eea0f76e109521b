"""A report page: title, summary, sections (conclusion + figure or table), environment; one styled,
self-contained HTML file (plotly.js inlined once, no external URL, no code).

Report modules build a `Page` from their metrics.json + env.json; `page_html` writes it.
"""
from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

CPU_TIMING_NOTE = ("Absolute CPU timings on a shared 2-core machine are indicative only; comparisons use "
                   "medians with 95% bootstrap intervals, and an interval containing 1 reads 'no difference'.")


@dataclass
class Section:
    """One block of a page: heading, a one-line conclusion computed from the data, then a plotly figure,
    a table (pandas DataFrame, already labelled) or text paragraphs."""

    heading: str
    conclusion: str = ""
    figure: Any = None
    table: Any = None
    text: Sequence[str] = ()
    caption: str = ""


@dataclass
class Page:
    """A report page. `headline` is the one line the index shows; `summary` the opening paragraph."""

    title: str
    summary: str
    headline: str
    sections: list[Section] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    bullets: list[str] = field(default_factory=list)
    device: str = ""  # where the data was measured, when not the machine in env.json (e.g. logs of GPU runs)


def is_missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN and pandas NA
    except (TypeError, ValueError):
        return False


def fmt(value: Any, digits: int = 3) -> str:
    """A cell as text: '-' for missing, thousands separators, ~3 significant digits, no long decimals."""
    if is_missing(value):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) or (hasattr(value, "dtype") and getattr(value.dtype, "kind", "") in "iu"):
        return f"{int(value):,}"
    if isinstance(value, float) or hasattr(value, "dtype"):
        number = float(value)
        if not math.isfinite(number):
            return "-"
        if number == int(number) and abs(number) < 1e15:
            return f"{int(number):,}"
        size = abs(number)
        if size >= 1e10 or size < 1e-3:
            return f"{number:.{digits - 1}e}"
        if size >= 100:
            return f"{number:,.0f}"
        return f"{number:.{digits}g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(item, digits) for item in value)
    if isinstance(value, dict):
        return ", ".join(f"{key}={fmt(item, digits)}" for key, item in value.items())
    return str(value)


def metrics_table(metrics: Any, name: str) -> Any:
    """Table `name` of a run's metrics.json as a pandas DataFrame (empty with no rows)."""
    import pandas as pd

    entry = (metrics.get("tables") or {}).get(name) or {}
    return pd.DataFrame(entry.get("rows") or [], columns=entry.get("columns"))


def fmt_interval(median: float, low: float, high: float, unit: str = "") -> str:
    """'12.3 ms [11.9, 13.0]'."""
    if is_missing(median):
        return "-"
    suffix = f" {unit}" if unit else ""
    return f"{fmt(median)}{suffix} [{fmt(low)}, {fmt(high)}]"


def style_axes(fig: Any, x: str, y: str, x_ticks: Sequence[Any] | None = None) -> Any:
    """Axis titles with units and direction, a readable layout (x ticks at `x_ticks`); returns `fig`."""
    if x_ticks:
        fig.update_xaxes(tickvals=list(x_ticks), ticktext=[fmt(tick) for tick in x_ticks])
    fig.update_layout(xaxis_title=x, yaxis_title=y, template="plotly_white", margin=dict(l=70, r=20, t=60, b=60),
                      legend=dict(font=dict(size=11)), font=dict(size=13))
    return fig


def figure_axis_titles(fig: Any) -> list[tuple[str, str]]:
    """(axis name, title) of every x/y axis the figure has (a missing title gives '')."""
    layout = fig.to_plotly_json().get("layout", {})
    axes = [name for name in layout if name.startswith(("xaxis", "yaxis"))] or ["xaxis", "yaxis"]
    titles = []
    for name in sorted(axes):
        title = (layout.get(name) or {}).get("title") or {}
        titles.append((name, title.get("text", "") if isinstance(title, dict) else str(title)))
    return titles


def text_html(text: str) -> str:
    """Escaped text; a quotation of someone else's words written «...» becomes <q>...</q>."""
    return html.escape(str(text)).replace("«", "<q>").replace("»", "</q>")


def table_html(frame: Any, caption: str = "") -> str:
    """A DataFrame as an HTML table with formatted cells (text wraps, nothing truncated); each cell
    carries its column name in data-col."""
    head = "".join(f"<th>{html.escape(str(column))}</th>" for column in frame.columns)
    names = [html.escape(str(column), quote=True) for column in frame.columns]
    rows = []
    for record in frame.itertuples(index=False):
        cells = []
        for name, value in zip(names, record):
            text = fmt(value)
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            cells.append(f"<td class='{'num' if numeric else 'txt'}' data-col=\"{name}\">{text_html(text)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<div class='table-wrap'><table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"


def env_rows(env: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of the environment: device, driver, CUDA, versions, git revision, CPU, time."""
    device = env.get("device") or {}
    packages = env.get("packages") or {}
    git = env.get("git") or {}
    cpu = env.get("cpu") or {}
    name = device.get("name") or device.get("device") or "-"
    if device.get("device_count"):
        name = f"{name} x{device['device_count']}"
    driver = str(device.get("driver") or "-").splitlines()[0] if device.get("driver") else "-"
    commit = git.get("commit")
    revision = (commit[:12] + (" (uncommitted changes)" if git.get("dirty") else "")) if commit else "not recorded"
    rows = [("device", str(name)), ("driver", driver),
            ("CUDA (torch build)", str(device.get("torch_cuda") or device.get("cuda") or "-")),
            ("torch", str(packages.get("torch") or "-")), ("triton", str(packages.get("triton") or "-")),
            ("python", str(env.get("python") or packages.get("python") or "-")),
            ("git revision", revision),
            ("CPU", f"{cpu.get('model', '-')}, {cpu.get('usable_cores', cpu.get('logical_cores', '-'))} usable cores"),
            ("recorded (UTC)", str(env.get("created_utc") or "-"))]
    if env.get("source"):
        rows.append(("source", str(env["source"])))
    return rows


def parameter_rows(parameters: dict[str, Any]) -> list[tuple[str, str]]:
    """Report parameters as (name, value) rows; run-specific paths (output_dir) left out."""
    rows = []
    for key, value in (parameters or {}).items():
        if key in ("output_dir", "report"):
            continue
        text = json.dumps(value) if isinstance(value, (dict, list)) else fmt(value)
        rows.append((key, text if len(text) <= 300 else text[:297] + "..."))
    return rows


def is_gpu_env(env: dict[str, Any]) -> bool:
    device = env.get("device") or {}
    if "cuda_available" in device:
        return bool(device["cuda_available"])
    return str(device.get("device", "cpu")).startswith("cuda")


def device_label(env: dict[str, Any]) -> str:
    device = env.get("device") or {}
    if is_gpu_env(env):
        name = str(device.get("name") if str(device.get("device", "")).startswith("cuda") else device.get("device"))
        return name or "GPU"
    return f"CPU ({(env.get('cpu') or {}).get('model', 'unknown')})"


_STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
main{max-width:1100px;margin:0 auto;padding:24px 28px 48px;background:#fff;min-height:100vh;box-shadow:0 0 12px #0001}
h1{font-size:1.7em;margin:.2em 0 .1em}h2{font-size:1.25em;margin:1.6em 0 .3em;border-bottom:1px solid #e3e6ea;padding-bottom:.2em}
.meta{color:#5b6473;font-size:.92em;margin:0 0 1em}.nav{font-size:.9em}.nav a{color:#2458b3}
.summary{background:#f0f4fb;border-left:4px solid #2458b3;padding:12px 16px;margin:12px 0}
.summary ul{margin:.4em 0 0 1.1em;padding:0}.note{background:#fff7e0;border-left:4px solid #d9a400;padding:8px 14px;
margin:10px 0;font-size:.93em}.conclusion{font-weight:600;margin:.3em 0 .6em}
.table-wrap{overflow-x:auto;margin:.4em 0 1em}table{border-collapse:collapse;font-size:.88em;width:100%}
caption{text-align:left;color:#5b6473;padding:4px 0;caption-side:top}
th{background:#eef1f5;text-align:left;padding:5px 8px;border-bottom:2px solid #d5dae1;white-space:nowrap}
td{padding:4px 8px;border-bottom:1px solid #eceef2;vertical-align:top;white-space:pre-line}td.num{text-align:right;white-space:nowrap;
font-variant-numeric:tabular-nums}tr:hover td{background:#fafbfd}
.verdict-confirmed,.verdict-faster{color:#1b7a2f;font-weight:600}.verdict-refuted{color:#b3261e;font-weight:600}
.figure{margin:.2em 0 1.2em}.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(320px,1fr));gap:14px}
.card{border:1px solid #dfe3e8;border-radius:8px;padding:12px 14px}.card h3{margin:0 0 .3em;font-size:1.05em}
.card p{margin:.3em 0;font-size:.92em}.tag{display:inline-block;font-size:.78em;background:#eef1f5;border-radius:4px;
padding:1px 6px;margin-right:4px;color:#3a4352}footer{margin-top:2.5em;color:#5b6473;font-size:.85em}
code{background:#f1f2f4;padding:1px 4px;border-radius:3px}
"""


def _plotly_bundle() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def figure_div(fig: Any) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False,
                       config={"displaylogo": False, "responsive": True})


def html_document(title: str, body: str, with_plotly: bool) -> str:
    script = f"<script type='text/javascript'>{_plotly_bundle()}</script>" if with_plotly else ""
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><meta name='viewport' "
            f"content='width=device-width, initial-scale=1'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style>{script}</head><body><main>{body}</main></body></html>")


def page_html(page: Page, env: dict[str, Any], *, notebook: str | None = None, index_href: str | None = None,
              rebuild_hint: str = "") -> str:
    """The page as one HTML document (no external requests)."""
    parts = []
    if index_href:
        parts.append(f"<p class='nav'><a href='{html.escape(index_href)}'>&larr; all reports</a></p>")
    parts.append(f"<h1>{html.escape(page.title)}</h1>")
    commit = (env.get("git") or {}).get("commit")
    dirty = " with uncommitted changes" if (env.get("git") or {}).get("dirty") else ""
    meta = [page.device or device_label(env), f"git {commit[:7]}{dirty}" if commit else "git revision not recorded"]
    if env.get("created_utc"):
        meta.append(f"recorded {env['created_utc']}")
    parts.append(f"<p class='meta'>{' &middot; '.join(html.escape(item) for item in meta)}</p>")
    bullets = "".join(f"<li>{text_html(item)}</li>" for item in page.bullets)
    parts.append(f"<div class='summary'><p>{text_html(page.summary)}</p>"
                 + (f"<ul>{bullets}</ul>" if bullets else "") + "</div>")
    parts += [f"<p class='note'>{html.escape(note)}</p>" for note in page.notes]
    has_figure = False
    for section in page.sections:
        parts.append(f"<h2>{text_html(section.heading)}</h2>")
        if section.conclusion:
            parts.append(f"<p class='conclusion'>{text_html(section.conclusion)}</p>")
        parts += [f"<p>{text_html(paragraph)}</p>" for paragraph in section.text]
        if section.figure is not None:
            has_figure = True
            parts.append(f"<div class='figure'>{figure_div(section.figure)}</div>")
        if section.table is not None:
            parts.append(table_html(section.table, section.caption))
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in env_rows(env))
    parts.append(f"<h2>Environment</h2><div class='table-wrap'><table>{rows}</table></div>")
    parameters = parameter_rows(env.get("parameters") or {})
    if parameters:
        rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in parameters)
        parts.append(f"<h2>Parameters</h2><div class='table-wrap'><table>{rows}</table></div>")
    footer = "Figures and tables are computed from this run's metrics.json and env.json"
    footer += f" ({html.escape(rebuild_hint)})." if rebuild_hint else "."
    if notebook:
        footer += f" The code is in the executed notebook <code>{html.escape(notebook)}</code>."
    parts.append(f"<footer>{footer}</footer>")
    return html_document(page.title, "".join(parts), has_figure)


def index_html(title: str, intro: str, entries: Sequence[dict[str, Any]], groups: Sequence[str] = ()) -> str:
    """The index page: one card per report (title, device, headline, link); entries have keys
    href, title, headline, device, group (cards are grouped in `groups` order)."""
    parts = [f"<h1>{html.escape(title)}</h1>", f"<div class='summary'><p>{html.escape(intro)}</p></div>"]
    order = list(groups) or list(dict.fromkeys(entry.get("group", "") for entry in entries))
    for group in order:
        members = [entry for entry in entries if entry.get("group", "") == group]
        if not members:
            continue
        if group:
            parts.append(f"<h2>{html.escape(group)}</h2>")
        cards = []
        for entry in members:
            cards.append(f"<div class='card'><h3><a href='{html.escape(entry['href'])}'>{html.escape(entry['title'])}"
                         f"</a></h3><p><span class='tag'>{html.escape(entry.get('device', ''))}</span></p>"
                         f"<p>{text_html(entry.get('headline', ''))}</p></div>")
        parts.append(f"<div class='cards'>{''.join(cards)}</div>")
    return html_document(title, "".join(parts), with_plotly=False)
