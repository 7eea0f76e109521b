"""Papermill runner: execute a registered report into reports/<name>/<run-id>/ and export it."""
from __future__ import annotations

import json
import os
import queue
import secrets
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from hilbert_lab.bench.env import git_revision
from hilbert_lab.reports.environment import collect_environment
from hilbert_lab.reports.export import export_html
from hilbert_lab.reports.html import write_plotly
from hilbert_lab.reports.recorder import to_jsonable
from hilbert_lab.reports.registry import ReportSpec, get_report, report_parameters
from hilbert_lab.reports.render import committed_gpu_runs, render_run, render_suite_index


def new_run_id() -> str:
    """UTC timestamp + short git commit + 4 random hex digits, e.g. 20261122T054500Z-cc37417-a1b2."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    commit = (git_revision().get("commit") or "nogit")[:7]
    return f"{stamp}-{commit}-{secrets.token_hex(2)}"


def report_command(name: str, overrides: dict[str, Any]) -> str:
    """The command that runs report `name` with `overrides`: 'hilbert-lab report run NAME -p key=value ...'."""
    def value(item: Any) -> str:
        return json.dumps(item, separators=(",", ":")) if isinstance(item, (list, dict)) else \
            str(item).lower() if isinstance(item, bool) else str(item)

    return " ".join([f"hilbert-lab report run {name}", *(f"-p {key}={value(item)}" for key, item in overrides.items())])


def _check_overrides(name: str, defaults: dict[str, Any], overrides: dict[str, Any]) -> None:
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise ValueError(f"parameters {unknown} are not parameters of report {name!r}; allowed: {sorted(defaults)}")


def _kernel_manager_class(cwd: Path) -> type:
    """The kernel manager of report runs: jupyter_client's, except that
    - the kernel starts in `cwd` (the run folder). papermill's own `cwd` changes this whole process's folder while
      the kernel starts, which parts of a suite running side by side must not do;
    - shutting down a kernel sends it no SIGINT first (the kernel is idle by then; an interrupt arriving inside its
      event loop makes it log "KeyboardInterrupt caught in kernel" on a run that succeeded). A timed-out cell is
      still interrupted."""
    from jupyter_client.manager import AsyncKernelManager

    class ReportKernelManager(AsyncKernelManager):
        async def _async_start_kernel(self, **kw: Any) -> None:
            kw.setdefault("cwd", str(cwd))
            await super()._async_start_kernel(**kw)

        start_kernel = _async_start_kernel

        async def _async_interrupt_kernel(self) -> None:
            if not self.shutting_down:
                await super()._async_interrupt_kernel()

    return ReportKernelManager


def _kernel_config(socket_dir: str):
    """Kernel sockets as local files in `socket_dir` (IPC transport): no TCP ports, nothing for ipykernel to
    warn about ("Kernel is running over TCP without encryption")."""
    from traitlets.config import Config

    return Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(socket_dir, "kernel")}})


def execute_report(spec: ReportSpec, overrides: dict[str, Any], run_dir: Path, *, progress: bool,
                   kernel_name: str | None, execution_timeout_s: int | None, plotly_path: Path | None = None,
                   command: str | None = None, label: str | None = None, bar_position: int = 0) -> dict[str, Any]:
    """Run one notebook report into `run_dir`; returns its metrics.json content. The page loads `plotly_path`
    (a suite's one plotly.min.js; default: one beside the page); env.json records `command` (default: the
    `hilbert-lab report run` command of this report and its overrides); progress: a bar of the executed
    cells on stderr, named `label` (default: the report's name), on line `bar_position` of the bars shown."""
    import papermill

    assert spec.notebook is not None
    defaults = report_parameters(spec.name)
    _check_overrides(spec.name, defaults, overrides)
    parameters = {**defaults, **overrides}
    run_dir.mkdir(parents=True, exist_ok=True)
    if "output_dir" in parameters:  # the notebook runs in run_dir: its files go there, and no absolute path is recorded
        parameters["output_dir"] = "."
    environment = collect_environment({"report": spec.name, **parameters})
    environment["command"] = command or report_command(spec.name, overrides)
    (run_dir / "env.json").write_text(json.dumps(to_jsonable(environment), indent=1), encoding="utf-8")
    executed = run_dir / f"{spec.name}.ipynb"
    html_path = run_dir / f"{spec.name}.html"
    try:
        with tempfile.TemporaryDirectory(prefix="hilbert-lab-kernel-") as socket_dir:
            papermill.execute_notebook(
                str(spec.notebook), str(executed), parameters=parameters,
                progress_bar={"desc": label or spec.name, "position": bar_position} if progress else False, kernel_name=kernel_name,
                execution_timeout=execution_timeout_s, report_mode=False,
                kernel_manager_class=_kernel_manager_class(run_dir.resolve()), config=_kernel_config(socket_dir),
            )
    except BaseException:
        if executed.exists():  # a failed run still gets its HTML: the notebook, with the traceback in it
            export_html(executed, html_path)
        raise
    # the page is rebuilt from metrics.json + env.json alone (as `report render` does)
    try:
        render_run(run_dir, html_path, name=spec.name, plotly_path=plotly_path)
    except Exception:
        export_html(executed, html_path)  # the executed notebook still gets a page
        raise
    metrics_path = run_dir / "metrics.json"
    return json.loads(metrics_path.read_text(encoding="utf-8")) if metrics_path.exists() else {}


def run_report(name: str, parameters: dict[str, Any] | None = None, *, output_root: str | Path = "reports",
               run_id: str | None = None, progress: bool = True, kernel_name: str | None = None,
               execution_timeout_s: int | None = None) -> Path:
    """Execute report `name` with `parameters` overriding its defaults; returns the run directory.

    The run directory `output_root/name/run_id/` holds NAME.ipynb (executed, with the code), NAME.html (the
    page, rebuilt from the data: no code, no network), the plotly.min.js its figures load, metrics.json and
    env.json. A suite puts each part in a sub-directory and writes index.html (each part's headline, and the
    committed GPU runs rendered into gpu/) plus metrics.json (each part's metrics and the names of its tables
    and figures) and env.json, with one plotly.min.js for all its pages; a suite's overrides apply to every
    part that has the parameter. A suite runs the parts that time nothing first, side by side, then those that
    measure speed, each alone (run_order, side_by_side).
    """
    spec = get_report(name)
    overrides = dict(parameters or {})
    run_dir = Path(output_root) / name / (run_id or new_run_id())
    if not spec.is_suite:
        _announce(progress, f"{name}: {spec.description}")
        execute_report(spec, overrides, run_dir, progress=progress, kernel_name=kernel_name,
                       execution_timeout_s=execution_timeout_s)
        return run_dir
    defaults = report_parameters(name)
    known = set().union(*(set(part_defaults) for part_defaults in defaults.values()))
    _check_overrides(name, dict.fromkeys(known), overrides)
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    plotly_path = write_plotly(run_dir)
    order = run_order(spec.parts)
    lanes: queue.Queue[int] = queue.Queue()
    for lane in range(side_by_side()):
        lanes.put(lane)

    def run_part(number: int, part: str) -> dict[str, Any]:
        lane = lanes.get()
        try:
            part_overrides = {key: value for key, value in overrides.items() if key in defaults[part]}
            step = f"[{number}/{len(order)}] {part}"
            _announce(progress, f"{step}: {get_report(part).description}")
            part_metrics = execute_report(get_report(part), part_overrides, run_dir / part, progress=progress,
                                          kernel_name=kernel_name, execution_timeout_s=execution_timeout_s,
                                          plotly_path=plotly_path, command=report_command(name, overrides),
                                          label=step, bar_position=lane)
            page = run_dir / part / f"{part}.html"
            _announce(progress, f"{step}: done ({time.monotonic() - started:.0f} s since the start) -> {page}")
            return part_metrics
        finally:
            lanes.put(lane)

    finished: dict[str, dict[str, Any]] = {}
    with ThreadPoolExecutor(max_workers=lanes.qsize()) as pool:
        running: dict[str, Future] = {}
        for number, part in enumerate(order, start=1):
            if get_report(part).measures_speed:  # alone: the parts beside it finish first
                _collect(running, finished)
                finished[part] = run_part(number, part)
            else:
                running[part] = pool.submit(run_part, number, part)
        _collect(running, finished)
    # the suite's file indexes its parts (their numbers; tables and figures stay in the part's own file)
    merged: dict[str, Any] = {"report": name, "parts": {}}
    for part in spec.parts:
        part_metrics = finished[part]
        merged["parts"][part] = {"report": part_metrics.get("report"), "parameters": part_metrics.get("parameters"),
                                 "metrics": part_metrics.get("metrics", {}),
                                 "tables": sorted(part_metrics.get("tables") or {}),
                                 "figures": sorted(part_metrics.get("figures") or {})}
    (run_dir / "metrics.json").write_text(json.dumps(merged, indent=1), encoding="utf-8")
    environment = collect_environment({"report": name, "overrides": overrides})
    environment["command"] = report_command(name, overrides)
    (run_dir / "env.json").write_text(json.dumps(to_jsonable(environment), indent=1), encoding="utf-8")
    _announce(progress, "index: every page above and the committed GPU runs, rendered from their data")
    render_suite_index(run_dir, list(spec.parts), title=f"hilbert_lab reports ({name})",
                       gpu_runs=committed_gpu_runs() if name == "default" else [])
    return run_dir


def side_by_side() -> int:
    """How many parts of a suite that time nothing run at once: one per core this process may use, two at most."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(2, cores))


def run_order(parts: Sequence[str]) -> list[str]:
    """The order a suite runs `parts` in: those that time nothing first, side by side (they also compile the Numba
    kernels into their cache, which the others then load), then those that measure speed, each alone."""
    return ([part for part in parts if not get_report(part).measures_speed]
            + [part for part in parts if get_report(part).measures_speed])


def _collect(running: dict[str, Future], finished: dict[str, dict[str, Any]]) -> None:
    """Wait for every part in `running`; their metrics into `finished`. A failed part raises once all have ended
    (the others' pages are kept)."""
    wait(running.values())
    for part, future in running.items():
        finished[part] = future.result()
    running.clear()


def report_page(run_dir: str | Path, name: str) -> Path:
    """The page to open for a run of report `name`: a suite's index.html, else NAME.html."""
    return Path(run_dir) / ("index.html" if get_report(name).is_suite else f"{name}.html")


def _announce(progress: bool, line: str) -> None:
    """One progress line on stderr (beside the bars), when progress is shown."""
    if progress:
        print(line, file=sys.stderr, flush=True)
