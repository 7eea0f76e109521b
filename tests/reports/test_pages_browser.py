"""Every report page in headless Debian chromium with the network blocked: it loads, logs no console
error, requests nothing outside file://, every plotly figure has titled axes, log axes with labelled ticks and
no series hidden under an identical one, every table fits the page's column, and no ratio goes without its
interval. A full-page screenshot of each page goes to test-artifacts/pages/.

The pages are the latest committed `make report` run (reports/default/<run>/) re-rendered from its
data, with the committed GPU runs; HILBERT_REPORT_DIR=<suite run dir> checks a fresh `make report`
output instead (as written, without re-rendering).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "pages"  # a full-page screenshot of every page, to look at

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # `browser` (tests/conftest.py) skips without chromium

# JS: per plotly figure, the x/y axes whose title is empty
UNTITLED_AXES = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => {
  const layout = gd._fullLayout || gd.layout || {};
  return Object.keys(layout).filter(k => /^[xy]axis\\d*$/.test(k))
    .filter(k => !(layout[k].title && String(layout[k].title.text || '').trim()));
})"""
# JS: tables wider than the page's column (every <details> opened first)
WIDE_TABLES = """() => { document.querySelectorAll('details').forEach(d => d.open = true);
  return Array.from(document.querySelectorAll('.table-wrap')).filter(w => w.scrollWidth > w.clientWidth + 1)
    .map(w => (w.querySelector('caption') || w.previousElementSibling || w).textContent.slice(0, 60) + ': '
         + w.scrollWidth + 'px'); }"""
# JS: per plotly figure, log axes left to plotly's default ticks (minor ticks labelled '2 3 4 5'), and pairs of
# scatter traces drawn on top of each other in the same style (one hides the other)
PLOT_PROBLEMS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(gd => {
  const layout = gd._fullLayout, title = (layout.title && layout.title.text) || '';
  const bad = Object.keys(layout).filter(k => /^[xy]axis\\d*$/.test(k) && layout[k].type === 'log'
    && !(layout[k].tickvals && layout[k].tickvals.length)).map(k => title + ': ' + k + ' has default log ticks');
  const traces = gd._fullData.filter(t => t.type === 'scatter' && t.visible === true);
  const same = (a, b) => a.length === b.length && a.every((v, i) => v === b[i]);
  for (let i = 0; i < traces.length; i++) for (let j = i + 1; j < traces.length; j++) {
    const a = traces[i], b = traces[j];
    if (a.xaxis === b.xaxis && a.yaxis === b.yaxis && same(Array.from(a.x), Array.from(b.x))
        && same(Array.from(a.y), Array.from(b.y)) && (a.line || {}).dash === (b.line || {}).dash
        && (a.marker || {}).symbol === (b.marker || {}).symbol)
      bad.push(title + ': ' + a.name + ' hides ' + b.name);
  }
  return bad;
})"""
# JS: text of the page outside quotations of claims (<q>, the claimed / claim text columns) and scripts
OWN_TEXT = """() => {
  const clone = document.body.cloneNode(true);
  clone.querySelectorAll('q, script, style, .js-plotly-plot, td[data-col="claimed"], td[data-col="claim text"]')
    .forEach(node => node.remove());
  return clone.innerText;
}"""


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory) -> Path:
    fresh = os.environ.get("HILBERT_REPORT_DIR")
    if fresh:
        return Path(fresh)
    pytest.importorskip("plotly", reason="plotly renders the pages")
    from hilbert_lab.reports.render import render_suite_index

    runs = sorted((REPO / "reports" / "default").glob("*/metrics.json"))
    if not runs:
        pytest.skip("no committed reports/default run to render")
    source = runs[-1].parent
    target = tmp_path_factory.mktemp("pages") / source.name
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("*.html", "*.ipynb", "*.js"))
    import json

    parts = list(json.loads((target / "metrics.json").read_text())["parts"])
    render_suite_index(target, parts, title="hilbert_lab reports (default)")
    return target


def test_every_page_offline_without_errors_with_titled_axes(browser, suite_dir):
    import re

    pages = sorted(suite_dir.rglob("*.html"))
    names = {page.relative_to(suite_dir).as_posix() for page in pages}
    assert "index.html" in names and any(name.startswith("gpu/") for name in names), names
    assert {f"{part}/{part}.html" for part in ("benchmark-small", "locality", "claims-small", "training")} <= names
    problems: list[str] = []
    figures = 0
    for path in pages:
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        errors: list[str] = []
        requests: list[str] = []
        page.on("console", lambda message, errors=errors: errors.append(message.text)
                if message.type == "error" else None)
        page.on("pageerror", lambda error, errors=errors: errors.append(str(error)))

        def route(route, requests=requests):
            if route.request.url.startswith("file://"):
                route.continue_()
            else:
                requests.append(route.request.url)
                route.abort()

        page.route("**/*", route)
        page.goto(path.as_uri(), wait_until="load")
        count = page.locator(".js-plotly-plot").count()
        if count:
            page.wait_for_function(f"() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= {count}",
                                   timeout=60_000)
        figures += count
        name = path.relative_to(suite_dir).as_posix()
        untitled = [axes for axes in page.evaluate(UNTITLED_AXES) if axes]
        plots = page.evaluate(PLOT_PROBLEMS)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / (name.replace("/", "__")[:-5] + ".png")), full_page=True)
        wide = page.evaluate(WIDE_TABLES)
        text = page.evaluate(OWN_TEXT)
        bare = re.findall(r"\b\d+(?:\.\d+)?x(?![\w\[])(?!\s+\[)(?! \(no interval)", text)
        title = page.title()
        page.close()
        if errors:
            problems.append(f"{name}: console errors {errors[:3]}")
        if requests:
            problems.append(f"{name}: network requests {requests[:3]}")
        if untitled:
            problems.append(f"{name}: figures with untitled axes {untitled[:3]}")
        if plots:
            problems.append(f"{name}: {plots[:3]}")
        if wide:
            problems.append(f"{name}: tables wider than the 1,100 px column {wide[:3]}")
        if bare:
            problems.append(f"{name}: ratios without an interval {bare[:5]}")
        if title in ("", "Notebook"):
            problems.append(f"{name}: page title {title!r}")
        if "could not be rendered" in text:
            problems.append(f"{name}: a report could not be rendered")
        if "<NA>" in text or "output_dir" in text:
            problems.append(f"{name}: raw notebook residue (<NA> / output_dir)")
    assert figures > 10
    assert not problems, "\n".join(problems)
