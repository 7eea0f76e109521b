"""Real browser: JupyterLab in headless Debian chromium runs the curve explorer; a slider redraws the figure.

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

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (make browser installs it)"),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package drives chromium")
    with sync_api.sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield instance
        finally:
            instance.close()


@pytest.fixture
def jupyter_lab(tmp_path):
    """A JupyterLab server on 127.0.0.1 with a token, serving a copy of the curve explorer."""
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(REPO / "notebooks" / "curve_explorer.ipynb", root / "curve_explorer.ipynb")
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
FIRST_PLOT_POINTS = """() => {
  const plot = document.querySelector('.jp-OutputArea .js-plotly-plot');
  return plot && plot.data && plot.data.length ? plot.data[0].x.length : -1;
}"""


def test_curve_explorer_in_jupyterlab(browser, jupyter_lab):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    base, token = jupyter_lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(120_000)
    page.goto(f"{base}/lab/tree/curve_explorer.ipynb?token={token}")
    page.wait_for_function("() => window.jupyterapp && document.querySelector('.jp-Notebook')")
    # JupyterLab may ask which kernel to start: accept its (only) proposal, python3 of this venv
    try:
        page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept").click(timeout=20_000)
    except PlaywrightTimeout:
        pass
    page.wait_for_function(KERNEL_IDLE)
    # run every cell through JupyterLab's own command (not awaited: it resolves when all cells are done)
    page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); return true; }")
    # the explorer starts at Hilbert order 3: 64 cells drawn
    page.wait_for_function(f"() => ({FIRST_PLOT_POINTS})() === 64")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "curve_explorer_before.png"))
    # move the order slider one step with the keyboard (a real user interaction on the noUiSlider handle)
    slider = page.locator(".widget-slider", has=page.locator("label", has_text="order")).first
    handle = slider.locator(".noUi-handle").first
    handle.focus()
    handle.press("ArrowRight")
    page.wait_for_function(f"() => ({FIRST_PLOT_POINTS})() === 256")
    page.screenshot(path=str(ARTIFACTS / "curve_explorer_after.png"))
    assert page.evaluate(FIRST_PLOT_POINTS) == 256
    assert not page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']").count()


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
