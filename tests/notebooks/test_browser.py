"""Real browser: JupyterLab in headless Debian chromium runs each explorer notebook; one control change redraws it.

Screenshots of every notebook before and after the change are kept in test-artifacts/.

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
        deadline = time.monotonic() + 120
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
# every plotly plot in the outputs: its title, and per trace the name and the x / y / z values (as drawn:
# _fullData holds decoded arrays where data may hold plotly's base64 form)
PLOTS = """() => Array.from(document.querySelectorAll('.jp-OutputArea .js-plotly-plot')).map(plot => ({
  title: plot.layout && plot.layout.title ? (plot.layout.title.text || '') : '',
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


def _control(page, kind: str, label: str):
    """The widget of class `kind` (widget-slider, widget-text, widget-checkbox...) whose label is `label`."""
    return page.locator(f".{kind}", has=page.locator("label", has_text=label)).first


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
    animation = _wait_for_plot(page, "generalized Hilbert 12 x 8")
    assert sorted(set(animation["traces"][0]["x"])) == list(range(12))  # drawn in full before play


def _locality_explorer(page) -> None:
    title = "LRU misses of the K/V line trace"
    before = _wait_for_plot(page, title, lambda plot: "window 4" in plot["title"])
    yield
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


EXPLORERS = {"curve_explorer": _curve_explorer, "locality_explorer": _locality_explorer,
             "attention_explorer": _attention_explorer}


@pytest.mark.parametrize("name", sorted(EXPLORERS))
def test_explorer_notebook_in_jupyterlab(name, browser, jupyter_lab):
    """Run all cells in JupyterLab, check the first drawing, change one control, check the redraw."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    base, token = jupyter_lab
    # tall enough that every output is laid out and visible in the screenshots
    page = browser.new_page(viewport={"width": 1500, "height": 4200})
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
    steps = EXPLORERS[name](page)
    next(steps)  # first drawing checked
    page.wait_for_function(KERNEL_IDLE)
    page.wait_for_timeout(1000)  # let plotly finish laying out
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}_before.png"))
    next(steps, None)  # one control change and its redraw checked
    page.wait_for_timeout(1000)
    page.screenshot(path=str(ARTIFACTS / f"{name}_after.png"))
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    assert not errors.count(), errors.all_inner_texts()
    assert not page.locator(".jp-OutputArea div[style*='color:#b00020']").count(), "a panel shows an error"


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
