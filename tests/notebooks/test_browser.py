"""Real browser: JupyterLab in headless Debian chromium runs each explorer notebook and changes its controls.

Each explorer's steps check the first drawing, change controls as a user would and check the redraw, and
check what a reader sees: axis titles that fit their figure and do not overlap, counts printed as integers,
readable log-axis ticks, sentences instead of raw dicts, results marked out of date when the controls change.
In a 1280 x 800 window (a laptop, the file browser open) the controls, plots and tables must stay usable too:
slider tracks wide enough to drag, every subplot of a row of heatmaps in view, table labels on one line.
Screenshots of every stage are kept in test-artifacts/ (NAME_STAGE.png).

Also opens an exported report page with every network request blocked: the plots must still render.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
pytestmark = pytest.mark.browser  # the `browser` fixture (tests/conftest.py) skips without chromium


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def jupyter_lab(tmp_path):
    """A JupyterLab server on 127.0.0.1 with a token, serving copies of the explorer notebooks."""
    root = tmp_path / "root"
    root.mkdir()
    for name in EXPLORERS:
        shutil.copy(REPO / "notebooks" / f"{name}.ipynb", root / f"{name}.ipynb")
    settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false",
                                                                          "checkForUpdates": False}))
    token, port = secrets.token_hex(16), _free_port()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    log = open(tmp_path / "jupyter.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0",
         "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        + (["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600  # wide: JupyterLab starts in seconds here when idle, a busy machine is slower
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"jupyter lab did not start:\n{(tmp_path / 'jupyter.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield base, token
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


KERNEL_IDLE = """() => {
  const widget = window.jupyterapp.shell.currentWidget;
  const kernel = widget && widget.sessionContext && widget.sessionContext.session
    && widget.sessionContext.session.kernel;
  return kernel && kernel.status === 'idle';
}"""
# every plotly plot in the outputs: its title as drawn, and per trace the name and the x / y / z values (as drawn:
# _fullData holds decoded arrays where data may hold plotly's base64 form)
PLOTS = """() => Array.from(document.querySelectorAll('.jp-OutputArea .js-plotly-plot')).map(plot => ({
  title: ((plot._fullLayout || plot.layout || {}).title || {}).text || '',
  traces: (plot._fullData || []).map(trace => ({name: trace.name || '', x: trace.x ? Array.from(trace.x) : [],
    y: trace.y ? Array.from(trace.y) : [], z: trace.z ? Array.from(trace.z).map(row => Array.from(row)) : []}))
}))"""


def _plot(page, title_part: str) -> dict | None:
    """The first plot whose title contains `title_part`, or None."""
    return next((plot for plot in page.evaluate(PLOTS) if title_part in plot["title"]), None)


def _wait_for_plot(page, title_part: str, check=lambda plot: True, timeout_s: float = 180) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        plot = _plot(page, title_part)
        if plot is not None and plot["traces"] and check(plot):  # no traces yet: a redraw in progress
            return plot
        if time.monotonic() > deadline:
            titles = [plot["title"] for plot in page.evaluate(PLOTS)]
            messages = page.locator(".jp-OutputArea .widget-html").all_inner_texts()
            pytest.fail(f"no plot titled {title_part!r} in the expected state; plots: {titles}; "
                        f"panel messages: {[text for text in messages if text.strip()]}; "
                        f"browser errors: {getattr(page, 'errors', [])[-5:]}")
        time.sleep(0.5)


# the drawn geometry of the plot whose title contains the argument: the figure's svg, its x / y axis titles,
# its x tick labels and its annotations (subplot titles included), as the browser laid them out
GEOMETRY = """(titlePart) => {
  const plot = Array.from(document.querySelectorAll('.jp-OutputArea .js-plotly-plot'))
    .find(p => (((p._fullLayout || p.layout || {}).title || {}).text || '').includes(titlePart));
  if (!plot) return null;
  const box = e => { const r = e.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, text: e.textContent}; };
  const title = plot.querySelector('.infolayer .gtitle');
  return {svg: box(plot.querySelector('.main-svg')), title: title ? box(title) : null,
          xtitles: Array.from(plot.querySelectorAll('.infolayer g[class^="g-x"][class$="title"] text')).map(box),
          ytitles: Array.from(plot.querySelectorAll('.infolayer g[class^="g-y"][class$="title"] text')).map(box),
          xticks: Array.from(plot.querySelectorAll('.xaxislayer-above .xtick text')).map(e => e.textContent),
          annotations: ((plot._fullLayout || {}).annotations || []).map(a => a.text || '')};
}"""
# rows of every table in the outputs: the cell texts of each row (header rows included)
TABLES = """() => Array.from(document.querySelectorAll('.jp-OutputArea table')).map(table =>
  Array.from(table.querySelectorAll('tr')).map(row => Array.from(row.querySelectorAll('th, td')).map(cell =>
    cell.innerText.trim())))"""


def _geometry(page, title_part: str) -> dict:
    geometry = page.evaluate(GEOMETRY, title_part)
    assert geometry is not None, f"no plot titled {title_part!r}"
    return geometry


def _check(page, condition: bool, problem: str) -> None:
    """Record a problem a reader would see; the test fails at the end with all of them."""
    if not condition:
        page.problems.append(problem)


def _inside(inner: dict, outer: dict, slack: float = 1.0) -> bool:
    return (inner["left"] >= outer["left"] - slack and inner["right"] <= outer["right"] + slack
            and inner["top"] >= outer["top"] - slack and inner["bottom"] <= outer["bottom"] + slack)


def _overlapping(boxes: list[dict]) -> list[tuple[str, str]]:
    """Pairs of boxes (by text) that overlap horizontally and vertically."""
    return [(a["text"], b["text"]) for index, a in enumerate(boxes) for b in boxes[index + 1:]
            if a["left"] < b["right"] - 1 and b["left"] < a["right"] - 1
            and a["top"] < b["bottom"] - 1 and b["top"] < a["bottom"] - 1]


def _column(page, header: str) -> list[str]:
    """The values under the first column headed `header` in a table's <thead> (a pandas table's columns)."""
    columns = page.evaluate("""(header) => {
      for (const table of document.querySelectorAll('.jp-OutputArea table')) {
        const heads = Array.from(table.querySelectorAll('thead tr:last-child th')).map(cell => cell.innerText.trim());
        const index = heads.indexOf(header);
        if (index >= 0) return Array.from(table.querySelectorAll('tbody tr')).map(row =>
          (row.querySelectorAll('th, td')[index] || {innerText: ''}).innerText.trim());
      }
      return [];
    }""", header)
    return columns


def _row(page, label: str) -> list[str]:
    """The cells of the first table row whose first cell is `label`."""
    return next((row for rows in page.evaluate(TABLES) for row in rows if row and row[0] == label), [])


def _control(page, kind: str, label: str):
    """The widget of class `kind` (widget-slider, widget-text, widget-checkbox...) whose label is `label`."""
    return page.locator(f".{kind}", has=page.locator("label", has_text=label)).first


# the window of most checks (tall enough that every output is laid out and visible in the screenshots), and a
# laptop's, where the notebook column is narrower
WIDE = {"width": 1500, "height": 4200}
NARROW = {"width": 1280, "height": 800}
# every slider in the outputs: its label and the width of its track as drawn
SLIDERS = """() => Array.from(document.querySelectorAll('.jp-OutputArea .widget-slider')).map(slider => {
  const label = slider.querySelector('label'), track = slider.querySelector('.noUi-target, .slider');
  return {label: label ? label.textContent.trim() : '', width: track ? track.getBoundingClientRect().width : 0};
})"""
# the plot whose title contains the argument, scrolled into view: its figure, the part of it its output shows
# (the output area clipped by the window and by every ancestor that hides overflow) and the plot area of each
# subplot (from plotly's laid-out axes)
PLOT_AREAS = """(titlePart) => {
  const plot = Array.from(document.querySelectorAll('.jp-OutputArea .js-plotly-plot'))
    .find(p => (((p._fullLayout || p.layout || {}).title || {}).text || '').includes(titlePart));
  if (!plot) return null;
  plot.scrollIntoView({block: 'center'});
  const svg = plot.querySelector('.main-svg').getBoundingClientRect();
  let visible = {left: 0, top: 0, right: window.innerWidth, bottom: window.innerHeight};
  for (let node = plot.parentElement; node; node = node.parentElement) {
    const style = getComputedStyle(node);
    if (style.overflowX === 'visible' && style.overflowY === 'visible'
        && !node.classList.contains('jp-OutputArea-output')) continue;
    const r = node.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;  // no box of its own (display: contents, an empty holder)
    visible = {left: Math.max(visible.left, r.left), top: Math.max(visible.top, r.top),
               right: Math.min(visible.right, r.right), bottom: Math.min(visible.bottom, r.bottom)};
  }
  const areas = Object.entries(plot._fullLayout._plots || {}).map(([id, sub]) => ({text: id,
    left: svg.left + sub.xaxis._offset, right: svg.left + sub.xaxis._offset + sub.xaxis._length,
    top: svg.top + sub.yaxis._offset, bottom: svg.top + sub.yaxis._offset + sub.yaxis._length}));
  return {svg: {left: svg.left, right: svg.right, top: svg.top, bottom: svg.bottom}, visible, areas};
}"""
# the first-column cells of the HTML panel whose text starts with the argument, scrolled into view: the text,
# the lines it is drawn on, its content height in line heights and whether its row ends inside the output
LABEL_LINES = """(heading) => {
  const panel = Array.from(document.querySelectorAll('.jp-OutputArea .widget-html'))
    .find(e => e.querySelector('table') && e.innerText.trim().startsWith(heading));
  if (!panel) return null;
  panel.scrollIntoView({block: 'center'});
  const output = panel.closest('.jp-OutputArea-output').getBoundingClientRect();
  return Array.from(panel.querySelectorAll('tr')).map(row => row.querySelector('th, td')).filter(Boolean)
    .map(cell => {
      const range = document.createRange();
      range.selectNodeContents(cell);
      const tops = new Set(Array.from(range.getClientRects()).filter(r => r.width > 0).map(r => Math.round(r.top)));
      const style = getComputedStyle(cell);
      const line = parseFloat(style.lineHeight) || 1.2 * parseFloat(style.fontSize);
      const height = cell.getBoundingClientRect().height - parseFloat(style.paddingTop)
        - parseFloat(style.paddingBottom);
      return {text: cell.innerText.trim(), lines: tops.size, heights: height / line,
              inside: cell.parentElement.getBoundingClientRect().right <= Math.min(output.right, window.innerWidth) + 1};
    });
}"""


def _window(page, size: dict) -> None:
    """Resize the browser window and let JupyterLab and plotly lay out again."""
    page.set_viewport_size(size)
    page.wait_for_timeout(1500)


def _check_sliders(page, min_track: float = 120) -> None:
    """Every slider keeps a track a user can drag."""
    sliders = page.evaluate(SLIDERS)
    narrow = [(slider["label"], round(slider["width"])) for slider in sliders if slider["width"] < min_track]
    _check(page, sliders and not narrow, f"slider tracks narrower than {min_track} px at "
           f"{page.viewport_size['width']} px: {narrow}")


def _check_plot_areas(page, title_part: str, count: int) -> None:
    """Each of the `count` subplots of a plot is drawn in full inside its figure and the visible output."""
    drawn = page.evaluate(PLOT_AREAS, title_part)
    assert drawn is not None, f"no plot titled {title_part!r}"
    cut = [(area["text"], *(round(area[side]) for side in ("left", "right", "top", "bottom")))
           for area in drawn["areas"] if not (_inside(area, drawn["visible"]) and _inside(area, drawn["svg"]))]
    _check(page, len(drawn["areas"]) == count and not cut,
           f"{title_part!r} at {page.viewport_size['width']} px: {len(drawn['areas'])} of {count} subplots, cut off "
           f"(subplot, left, right, top, bottom): {cut}; visible "
           f"{ {side: round(value) for side, value in drawn['visible'].items()} }, "
           f"figure { {side: round(value) for side, value in drawn['svg'].items()} }")


def _check_one_line_labels(page, heading: str) -> None:
    """The labels of the table in the HTML panel starting with `heading` are drawn on one line each, and its rows
    inside the output."""
    cells = page.evaluate(LABEL_LINES, heading)
    assert cells, f"no table under {heading!r}"
    wrapped = [(cell["text"], cell["lines"]) for cell in cells if cell["lines"] != 1 or cell["heights"] > 1.5]
    _check(page, not wrapped, f"labels of the {heading!r} table wrap at {page.viewport_size['width']} px "
           f"(label, lines): {wrapped}")
    _check(page, all(cell["inside"] for cell in cells), f"the {heading!r} table leaves the output at "
           f"{page.viewport_size['width']} px")


def _curve_explorer(page) -> None:
    # the explorer starts at Hilbert order 3: 64 cells; one step of the order slider: 256 cells
    before = _wait_for_plot(page, "Hilbert", lambda plot: len(plot["traces"][0]["x"]) == 64)
    assert sorted(set(before["traces"][0]["x"])) == list(range(8))  # every column of the 8x8 grid
    yield
    handle = _control(page, "widget-slider", "order").locator(".noUi-handle").first
    handle.focus()
    handle.press("ArrowRight")  # a real user interaction on the noUiSlider handle
    after = _wait_for_plot(page, "Hilbert", lambda plot: len(plot["traces"][0]["x"]) == 256)
    assert sorted(set(after["traces"][0]["x"])) == list(range(16))
    yield "after"
    animation = _wait_for_plot(page, "generalized Hilbert 12 x 8")
    assert sorted(set(animation["traces"][0]["x"])) == list(range(12))  # drawn in full before play
    # counts are integers: the panel's locality table and the side-by-side table ("cells 64.000" before)
    cells = _row(page, "cells")
    _check(page, cells[1:2] == ["256"], f"the curve panel shows its cell count as {cells[1:2]}, not 256")
    counts = _column(page, "cells")
    _check(page, counts and all(value.isdigit() for value in counts), f"the side-by-side table shows cells as {counts}")
    # the serialization panel compares an ordering with row-major: row-major itself is one column
    _control(page, "widget-dropdown", "ordering").locator("select").select_option("rowmajor")
    _wait_for_plot(page, "rowmajor: ")
    page.wait_for_timeout(500)
    headers = next((rows[0] for rows in page.evaluate(TABLES) if rows and "rowmajor" in rows[0]), [])
    _check(page, headers.count("rowmajor") == 1, f"the serialization table's header reads {headers}")
    yield "rowmajor"
    # a laptop window: the curve's locality table keeps each label on one line, inside the output
    _window(page, NARROW)
    _check_one_line_labels(page, "locality")
    yield "1280"
    _window(page, WIDE)


def _locality_explorer(page) -> None:
    title = "LRU misses of the K/V line trace"
    before = _wait_for_plot(page, title, lambda plot: "window 4" in plot["title"])
    yield
    # a laptop window: all four orderings' heatmaps are drawn in full
    _window(page, NARROW)
    _check_plot_areas(page, "access order: 16x16 grid", 4)
    yield "1280"
    _window(page, WIDE)
    box = _control(page, "widget-text", "box / segment").locator("input")
    box.fill("5")
    box.press("Enter")
    after = _wait_for_plot(page, title, lambda plot: "window 5" in plot["title"])
    assert [trace["y"] for trace in after["traces"]] != [trace["y"] for trace in before["traces"]]
    # the table of misses under the curves follows the change: every plotted value is in it
    table = page.locator(".jp-OutputArea table", has_text="capacity (lines)").last
    page.wait_for_function("(text) => document.body.innerText.includes(text)", arg="window 5")
    cells = {text.strip() for text in table.locator("td").all_inner_texts()}
    for trace in after["traces"]:
        assert {str(int(value)) for value in trace["y"]} <= cells, trace["name"]
    yield "after"
    # the capacity axis is logarithmic: its ticks are the capacities, not "4 5 6 7 8 9 10 2 3"
    capacities = {str(int(value)) for value in after["traces"][0]["x"]}
    ticks = _geometry(page, title)["xticks"]
    _check(page, ticks and set(ticks) <= capacities, f"the miss curves' capacity ticks read {ticks}")
    # the 1D study: five orderings side by side, each axis title readable (they overlapped)
    page.locator(".widget-toggle-buttons button", has_text="1D sequence").click()
    _wait_for_plot(page, "access order: 1024 tokens")
    page.wait_for_timeout(1000)
    heatmaps = _geometry(page, "access order: 1024 tokens")
    _check(page, any("position in segment" in text for text in heatmaps["xtitles"] + heatmaps["annotations"]),
           "the 1D heatmaps have no x axis title")
    titles = heatmaps["xtitles"] + heatmaps["ytitles"]
    _check(page, not _overlapping(titles), f"axis titles overlap in the 1D study: {_overlapping(titles)}")
    _check(page, all(_inside(box, heatmaps["svg"]) for box in titles),
           f"an axis title leaves its figure: {[box['text'] for box in titles if not _inside(box, heatmaps['svg'])]}")
    yield "sequence"
    _window(page, NARROW)
    _check_plot_areas(page, "access order: 1024 tokens", 5)
    yield "sequence_1280"
    _window(page, WIDE)


def _attention_explorer(page) -> None:
    title = "per-head merged masks"
    before = _wait_for_plot(page, title, lambda plot: "causal=False" in plot["title"])
    assert any(row[key] for trace in before["traces"] for index, row in enumerate(trace["z"])
               for key in range(index + 1, len(row)))  # keys after the query are attended
    yield
    _control(page, "widget-checkbox", "causal").locator("input").check()
    after = _wait_for_plot(page, title, lambda plot: "causal=True" in plot["title"])
    assert not any(row[key] for trace in after["traces"] for index, row in enumerate(trace["z"])
                   for key in range(index + 1, len(row)))  # causal: no key after its query
    yield "after"
    # the reference check reads as a sentence, in the panel and in the notebook's last cell (raw dicts before)
    page.locator(".widget-button", has_text="compare with reference").click()
    page.wait_for_function("() => document.body.innerText.includes('float64 reference')")
    page.wait_for_timeout(500)
    text = page.locator(".jp-OutputArea").all_inner_texts()
    _check(page, not any("max_abs_out_error" in part or "{'" in part for part in text),
           "the reference check is printed as a raw dict")
    _check(page, any("matches the float64 reference" in part and "largest output error" in part for part in text),
           "the reference check does not say in words what matched")
    # head_groups: a branch that does not run on the head shown is empty, and its panel says why
    _control(page, "widget-dropdown", "mode").locator("select").select_option("head_groups")
    branches = _wait_for_plot(page, "per-branch masks", lambda plot: "head_groups" in plot["title"])
    empty = [trace["name"] for trace in branches["traces"] if not any(any(row) for row in trace["z"])]
    notes = [text for text in _geometry(page, "per-branch masks")["annotations"] if "head 0" in text and "not" in text]
    _check(page, empty, "no branch panel is empty for head 0 in head_groups mode (the check needs one)")
    _check(page, len(notes) >= len(empty) > 0, f"empty branch panels {empty} do not say why (annotations: {notes})")
    yield "head_groups"


def _backend_dashboard(page) -> None:
    title = "forward time"
    before = _wait_for_plot(page, title, lambda plot: "1024 tokens" in plot["title"])
    # `auto` is timed too, and says which backend it ran
    bars = [str(name) for name in before["traces"][0]["x"]]
    _check(page, any(name.startswith("auto") and "(" in name for name in bars),
           f"auto is not timed (or does not say what it ran): bars {bars}")
    auto_row = next((row for rows in page.evaluate(TABLES) for row in rows if row and row[0].startswith("auto")), [])
    _check(page, bool(auto_row) and "runs " in auto_row[0], f"the table's auto row reads {auto_row}")
    # the y axis title fits its figure
    geometry = _geometry(page, title)
    _check(page, all(_inside(box, geometry["svg"]) for box in geometry["ytitles"]),
           f"the y axis title leaves its figure: {[box['text'] for box in geometry['ytitles']]}")
    yield "before"
    # a laptop window: the heads and repeats sliders keep a usable track
    _window(page, NARROW)
    _check_sliders(page)
    _control(page, "widget-slider", "repeats").scroll_into_view_if_needed()
    yield "1280"
    _window(page, WIDE)
    # a control change marks the timing as out of date, plot and table alike
    tokens = _control(page, "widget-text", "tokens").locator("input")
    tokens.fill("512")
    tokens.press("Enter")
    page.wait_for_timeout(1500)
    stale = _plot(page, title)
    _check(page, stale is not None and "out of date" in stale["title"], f"the plot is not marked out of date: "
           f"{stale and stale['title']!r}")
    _check(page, page.locator(".jp-OutputArea .widget-html", has_text="out of date").count() > 0,
           "the table is not marked out of date")
    marked = _geometry(page, title)["title"]
    _check(page, marked is not None and _inside(marked, _geometry(page, title)["svg"]),
           f"the out-of-date title leaves its figure: {marked and marked['text']!r}")
    yield "out_of_date"
    page.locator(".widget-button", has_text="time backends").click()
    after = _wait_for_plot(page, title, lambda plot: "512 tokens" in plot["title"])
    _check(page, "out of date" not in after["title"], "the new timing is still marked out of date")


EXPLORERS = {"curve_explorer": _curve_explorer, "locality_explorer": _locality_explorer,
             "attention_explorer": _attention_explorer, "backend_dashboard": _backend_dashboard}


@pytest.mark.slow  # JupyterLab and a kernel per notebook: about a minute each; the quick tier opens one report page
@pytest.mark.parametrize("name", sorted(EXPLORERS))
def test_explorer_notebook_in_jupyterlab(name, browser, jupyter_lab):
    """Run all cells in JupyterLab, check the first drawing, change one control, check the redraw."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    base, token = jupyter_lab
    page = browser.new_page(viewport=WIDE)
    page.set_default_timeout(120_000)
    page.errors = []  # shown when a redraw does not come
    page.on("console", lambda message: page.errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    page.goto(f"{base}/lab/tree/{name}.ipynb?token={token}")
    page.wait_for_function("() => window.jupyterapp && document.querySelector('.jp-Notebook')")
    # JupyterLab may ask which kernel to start: accept its (only) proposal, python3 of this venv
    try:
        page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept").click(timeout=20_000)
    except PlaywrightTimeout:
        pass
    page.wait_for_function(KERNEL_IDLE)
    # run every cell through JupyterLab's own command (not awaited: it resolves when all cells are done)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); return true; }")
    page.problems = []  # what a reader would see wrong, collected by _check
    ARTIFACTS.mkdir(exist_ok=True)
    # each step yields after checking a state (the first: the first drawing); a screenshot of every state
    for number, stage in enumerate(EXPLORERS[name](page)):
        if number == 0:
            page.wait_for_function(KERNEL_IDLE)
        page.wait_for_timeout(1000)  # let plotly finish laying out
        page.screenshot(path=str(ARTIFACTS / f"{name}_{stage or 'before'}.png"))
    page.wait_for_timeout(1000)
    page.screenshot(path=str(ARTIFACTS / f"{name}_end.png"))
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    assert not errors.count(), errors.all_inner_texts()
    assert not page.locator(".jp-OutputArea div[style*='color:#b00020']").count(), "a panel shows an error"
    assert not page.problems, "\n".join(page.problems)


def test_exported_report_renders_offline(browser, tmp_path, monkeypatch):
    pytest.importorskip("papermill", reason="papermill executes the report")
    import importlib.util

    from hilbert_lab.reports.runner import execute_report

    spec = importlib.util.spec_from_file_location("report_runner_tests", REPO / "tests" / "reports" / "test_runner.py")
    runner_tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner_tests)
    _tiny_report = runner_tests._tiny_report

    monkeypatch.setattr("hilbert_lab.reports.runner.report_parameters",
                        lambda name: {"scale": 2.0, "labels": ["a", "b", "c"], "output_dir": "."})
    run_dir = tmp_path / "run"
    execute_report(_tiny_report(tmp_path), {}, run_dir, progress=False, kernel_name=None, execution_timeout_s=300)
    page = browser.new_page()
    requested: list[str] = []

    def block_network(route):
        requested.append(route.request.url)
        route.abort()

    page.route("http*://**/*", block_network)
    page.goto((run_dir / "tiny.html").as_uri())
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)
    bars = page.evaluate("() => document.querySelector('.js-plotly-plot').data[0].y")
    assert list(bars) == [2.5, 7.0, 15.5]
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "report_offline.png"), full_page=True)
    assert requested == [], f"the page tried to load {requested}"
