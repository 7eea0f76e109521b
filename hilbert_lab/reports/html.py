"""Pages as HTML: findings first, sections (reference material in closed <details>), where the data come
from, one shared plotly.js per run folder (referenced relatively: no network, no copy per page)."""
from __future__ import annotations

import functools
import html
import re
from pathlib import Path
from typing import Any, Sequence

from hilbert_lab.io import atomic_write
from hilbert_lab.reports.page import Page, env_rows, fmt, parameter_rows
from hilbert_lab.reports.provenance import NOT_RECORDED, SOURCE_FIELDS, env_source, strip_paths

PLOTLY_FILE = "plotly.min.js"
_NAN = re.compile(r"(?<![\w.])nan(?:x)?(?![\w])", re.IGNORECASE)

_STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
main{max-width:1100px;margin:0 auto;padding:24px 28px 48px;background:#fff;min-height:100vh;box-shadow:0 0 12px #0001}
h1{font-size:1.7em;margin:.2em 0 .1em}h2{font-size:1.25em;margin:1.6em 0 .3em;border-bottom:1px solid #e3e6ea;padding-bottom:.2em}
.meta{color:#5b6473;font-size:.92em;margin:0 0 1em}.nav{font-size:.9em}.nav a{color:#2458b3}
.summary{background:#f0f4fb;border-left:4px solid #2458b3;padding:10px 16px;margin:12px 0}
.summary h2{border:0;margin:.2em 0;font-size:1.05em}.summary ul{margin:.3em 0 .2em 1.1em;padding:0}
.summary li{margin:.25em 0}.about{color:#3a4352;font-size:.95em}
.note{background:#fff7e0;border-left:4px solid #d9a400;padding:8px 14px;margin:10px 0;font-size:.93em}
.conclusion{font-weight:600;margin:.3em 0 .6em}
.table-wrap{overflow-x:auto;margin:.4em 0 1em}table{border-collapse:collapse;font-size:.85em;width:100%}
caption{text-align:left;color:#5b6473;padding:4px 0;caption-side:top}
th{background:#eef1f5;text-align:left;padding:4px 6px;border-bottom:2px solid #d5dae1;vertical-align:bottom}
td{padding:3px 6px;border-bottom:1px solid #eceef2;vertical-align:top;white-space:pre-line;overflow-wrap:break-word}
td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}tr:hover td{background:#fafbfd}
table.kv th{width:11em;vertical-align:top}
details{margin:1.2em 0;border:1px solid #e3e6ea;border-radius:6px;padding:4px 12px}
details>summary{cursor:pointer;font-weight:600;font-size:1.05em;padding:4px 0}
.figure{margin:.2em 0 1.2em}.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(320px,1fr));gap:14px}
.card{border:1px solid #dfe3e8;border-radius:8px;padding:12px 14px}.card h3{margin:0 0 .3em;font-size:1.05em}
.card p{margin:.3em 0;font-size:.92em}.tag{display:inline-block;font-size:.78em;background:#eef1f5;border-radius:4px;
padding:1px 6px;margin-right:4px;color:#3a4352}footer{margin-top:2.5em;color:#5b6473;font-size:.85em}
code{background:#f1f2f4;padding:1px 4px;border-radius:3px}
"""


def clean(text: Any) -> str:
    """Text as a page shows it: no absolute path of any machine, no 'nan' as a value."""
    return _NAN.sub("not measured", strip_paths(text))


def text_html(text: Any) -> str:
    """Escaped, cleaned text; a quotation of someone else's words written «...» becomes <q>...</q>."""
    return html.escape(clean(text)).replace("«", "<q>").replace("»", "</q>")


def table_html(frame: Any, caption: str = "") -> str:
    """A DataFrame as an HTML table with formatted cells (text wraps, headers wrap, nothing truncated);
    each cell carries its column name in data-col."""
    head = "".join(f"<th>{html.escape(str(column))}</th>" for column in frame.columns)
    names = [html.escape(str(column), quote=True) for column in frame.columns]
    rows = []
    for record in frame.itertuples(index=False):
        cells = []
        for name, value in zip(names, record):
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            cells.append(f"<td class='{'num' if numeric else 'txt'}' data-col=\"{name}\">{text_html(fmt(value))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption>{text_html(caption)}</caption>" if caption else ""
    return f"<div class='table-wrap'><table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"


def _kv_table(rows: Sequence[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{text_html(v)}</td></tr>" for k, v in rows)
    return f"<div class='table-wrap'><table class='kv'>{body}</table></div>"


def write_plotly(folder: str | Path) -> Path:
    """plotly.min.js in `folder` (written once; the same bundle plotly.py ships, no network)."""
    from plotly.offline import get_plotlyjs

    path = Path(folder) / PLOTLY_FILE
    bundle = get_plotlyjs()
    if not path.is_file() or path.stat().st_size != len(bundle.encode("utf-8")):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, bundle)
    return path


# Every page figure is drawn with this plotly template, put into its JSON as the page is written (validating a
# template into each figure object costs tens of milliseconds a figure; a page run draws hundreds).
PAGE_TEMPLATE = "plotly_white"


@functools.lru_cache(maxsize=1)
def _page_template() -> dict[str, Any]:
    import plotly.io as pio

    return pio.templates[PAGE_TEMPLATE].to_plotly_json()


def figure_div(fig: Any) -> str:
    """The figure as an HTML div (plotly.js loaded by the page), drawn with PAGE_TEMPLATE."""
    import plotly.io as pio

    from hilbert_lab.viz.style import readable_log_axes, separate_overlapping

    separate_overlapping(readable_log_axes(fig))
    data = dict(fig.to_plotly_json())
    data["layout"] = {**data.get("layout", {}), "template": _page_template()}
    return pio.to_html(data, full_html=False, include_plotlyjs=False, include_mathjax=False, validate=False,
                       config={"displaylogo": False, "responsive": True})


def html_document(title: str, body: str, plotly_src: str | None) -> str:
    """A whole page; `plotly_src`: the relative path of the run's shared plotly.min.js (None: no figure)."""
    script = f"<script src='{html.escape(plotly_src)}'></script>" if plotly_src else ""
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><meta name='viewport' "
            f"content='width=device-width, initial-scale=1'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style>{script}</head><body><main>{body}</main></body></html>")


def _sources_table(sources: Sequence[dict[str, str]]) -> str:
    import pandas as pd

    frame = pd.DataFrame([{field: source.get(field, "") for field in SOURCE_FIELDS} for source in sources])
    return table_html(frame.rename(columns={"what": "data", "revision": "git revision"}))


def _sources_meta(sources: Sequence[dict[str, str]]) -> list[str]:
    """The header's revision and date of data from other runs: each distinct value of the sources, in order."""
    revisions = list(dict.fromkeys(str(source.get("revision") or NOT_RECORDED) for source in sources))
    dates = list(dict.fromkeys(str(source.get("recorded") or NOT_RECORDED) for source in sources))
    meta = [f"git {', '.join(revisions)}"] if revisions else []
    if dates:
        meta.append(("date " if dates[0].startswith(NOT_RECORDED) else "recorded ") + ", ".join(dates))
    return meta


def page_html(page: Page, env: dict[str, Any], *, notebook: str | None = None, index_href: str | None = None,
              plotly_src: str = PLOTLY_FILE) -> str:
    """The page as one HTML document (no external requests; figures need `plotly_src` beside it)."""
    parts = []
    if index_href:
        parts.append(f"<p class='nav'><a href='{html.escape(index_href)}'>&larr; all reports</a></p>")
    parts.append(f"<h1>{html.escape(page.title)}</h1>")
    if page.measured_here:
        source = env_source(env)
        meta = [page.device or source["device"], f"git {source['revision']}", f"recorded {source['recorded']}"]
    else:
        meta = [page.device] + _sources_meta(page.sources)
    parts.append(f"<p class='meta'>{' &middot; '.join(text_html(item) for item in meta)}</p>")
    findings = "".join(f"<li>{text_html(item)}</li>" for item in page.findings)
    parts.append(f"<div class='summary'><h2>Findings</h2><ul>{findings}</ul>"
                 + (f"<p class='about'>{text_html(page.about)}</p>" if page.about else "") + "</div>")
    parts += [f"<p class='note'>{text_html(note)}</p>" for note in page.notes]
    has_figure = False
    for section in page.sections:
        block = []
        if section.conclusion:
            block.append(f"<p class='conclusion'>{text_html(section.conclusion)}</p>")
        block += [f"<p>{text_html(paragraph)}</p>" for paragraph in section.text]
        if section.figure is not None:
            has_figure = True
            block.append(f"<div class='figure'>{figure_div(section.figure)}</div>")
        if section.table is not None:
            block.append(table_html(section.table, section.caption))
        if section.collapsed:
            parts.append(f"<details><summary>{text_html(section.heading)}</summary>{''.join(block)}</details>")
        else:
            parts.append(f"<h2>{text_html(section.heading)}</h2>{''.join(block)}")
    origin = []
    if page.sources:
        origin.append(f"<h2>Where the data come from</h2>{_sources_table(page.sources)}")
    if page.measured_here:
        origin.append(f"<h2>Environment of the run that made these data</h2>{_kv_table(env_rows(env))}")
        parameters = parameter_rows(env.get("parameters") or {})
        if parameters:
            origin.append(f"<details><summary>Parameters</summary>{_kv_table(parameters)}</details>")
    parts += origin
    footer = ("Figures and tables are computed from this run's metrics.json and env.json (rebuild with "
              "<code>hilbert-lab report render RUN_FOLDER</code>).")
    if notebook:
        footer += f" The code is in the executed notebook <code>{html.escape(notebook)}</code>."
    parts.append(f"<footer>{footer}</footer>")
    return html_document(page.title, "".join(parts), plotly_src if has_figure else None)


def index_html(title: str, intro: str, entries: Sequence[dict[str, Any]], groups: Sequence[str] = ()) -> str:
    """The index page: one card per report (title, device, headline, link); entries have keys
    href, title, headline, device, group (cards are grouped in `groups` order)."""
    parts = [f"<h1>{html.escape(title)}</h1>", f"<div class='summary'><p>{text_html(intro)}</p></div>"]
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
                         f"</a></h3><p><span class='tag'>{text_html(entry.get('device', ''))}</span></p>"
                         f"<p>{text_html(entry.get('headline', ''))}</p></div>")
        parts.append(f"<div class='cards'>{''.join(cards)}</div>")
    return html_document(title, "".join(parts), None)
