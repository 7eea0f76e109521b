"""env.json for a report run: the benchmark environment block, the notebook stack and the parameters."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from hilbert_lab.bench import env as bench_env

NOTEBOOK_PACKAGES = ("pandas", "plotly", "ipywidgets", "anywidget", "papermill", "nbformat", "nbclient",
                     "nbconvert", "ipykernel", "jupytext")


def collect_environment(parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """Versions, git revision, CPU, device and driver (as every benchmark records them) plus the report's
    notebook packages and its effective `parameters`."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    env = dict(bench_env.collect_environment(device))
    env["packages"] = {**env["packages"], **bench_env.package_versions(NOTEBOOK_PACKAGES)}
    env["created_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    env["parameters"] = parameters or {}
    return env
