"""Environment capture for env.json: package versions, git revision, device, driver, CPU, parameters."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

PACKAGES = (
    "hilbert-lab", "torch", "numpy", "numba", "pandas", "plotly", "ipywidgets", "anywidget",
    "papermill", "nbformat", "nbclient", "nbconvert", "ipykernel", "jupytext", "triton", "nvidia-ml-py",
)
REPO_ROOT = Path(__file__).resolve().parents[2]


def _run(command: list[str], cwd: Path | None = None) -> str | None:
    try:
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution (None when absent)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_revision(repo: Path = REPO_ROOT) -> dict[str, Any]:
    """HEAD commit and whether the working tree has uncommitted changes (None outside a git checkout)."""
    commit = _run(["git", "rev-parse", "HEAD"], cwd=repo)
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo)
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def cpu_info() -> dict[str, Any]:
    """CPU model, logical cores, cores usable by this process, machine architecture."""
    model = platform.processor() or None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"model": model, "logical_cores": os.cpu_count(), "usable_cores": usable, "machine": platform.machine()}


def device_info() -> dict[str, Any]:
    """Accelerator name, CUDA runtime, driver version (from nvidia-smi), torch threads."""
    import torch

    info: dict[str, Any] = {
        "cuda_available": torch.cuda.is_available(),
        "torch_cuda": torch.version.cuda,
        "torch_threads": torch.get_num_threads(),
        "device": "cpu",
        "driver": None,
    }
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["device_count"] = torch.cuda.device_count()
        info["capability"] = list(torch.cuda.get_device_capability(0))
        info["driver"] = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return info


def collect_environment(parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything env.json holds; `parameters` are the report's effective parameters."""
    return {
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": package_versions(),
        "git": git_revision(),
        "cpu": cpu_info(),
        "device": device_info(),
        "parameters": parameters or {},
    }
