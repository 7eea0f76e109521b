"""Export an executed notebook to one self-contained HTML page (plotly.js inlined, no CDN needed)."""
from __future__ import annotations

import re
from pathlib import Path

# The inlined plotly.js bundle starts with this banner; figure outputs call Plotly.newPlot.
PLOTLY_BUNDLE_MARKER = re.compile(r"plotly\.js v\d+\.\d+\.\d+")
# nbconvert's templates pull require.js / MathJax from a CDN; offline they only fail to load and
# plotly's inlined bundle falls back to window.Plotly, but we drop them so the page makes no requests.
_CDN_SCRIPT = re.compile(r'<script[^>]+src="https?://[^"]+"[^>]*>\s*</script>', re.IGNORECASE)


def export_html(notebook_path: str | Path, html_path: str | Path | None = None) -> Path:
    """Write `notebook_path` as HTML (input code shown, outputs as executed); returns the HTML path."""
    import nbformat
    from nbconvert import HTMLExporter

    notebook_path = Path(notebook_path)
    html_path = Path(html_path) if html_path is not None else notebook_path.with_suffix(".html")
    notebook = nbformat.read(notebook_path, as_version=4)
    exporter = HTMLExporter(template_name="lab")
    body, _resources = exporter.from_notebook_node(notebook)
    body = _CDN_SCRIPT.sub("", body)
    html_path.write_text(body, encoding="utf-8")
    return html_path


def html_has_inline_plotly(html: str) -> bool:
    """True when the page carries the plotly.js bundle itself (so it renders offline)."""
    return bool(PLOTLY_BUNDLE_MARKER.search(html)) and "Plotly.newPlot" in html


def page_loads_plotly_offline(html_path: str | Path) -> bool:
    """True when the page draws its figures without a network: plotly.js inlined, or loaded from a relative
    script path whose file exists beside the page (the run's shared plotly.min.js)."""
    html_path = Path(html_path)
    html = html_path.read_text(encoding="utf-8")
    if html_has_inline_plotly(html):
        return True
    sources = re.findall(r"<script[^>]*\ssrc=['\"]([^'\"]+)['\"]", html)
    return "Plotly.newPlot" in html and any(
        not re.match(r"[a-z]+:", src) and (html_path.parent / src).is_file()
        and PLOTLY_BUNDLE_MARKER.search((html_path.parent / src).read_text(encoding="utf-8")[:2000])
        for src in sources)
