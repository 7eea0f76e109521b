"""The environment block stored with every result: versions, git revision, device, driver, CPU."""
from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from hilbert_lab.io import atomic_write, strip_paths

_PACKAGES = ("hilbert-lab", "torch", "numpy", "numba", "triton", "flash-attn", "xformers", "nvidia-ml-py")
# Settings read from the environment that change what a run measures (threads, visible GPUs, NCCL paths).
_VARIABLES = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "NCCL_NVLS_ENABLE",
              "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS", "MALLOC_MMAP_THRESHOLD_")
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def package_versions(names: tuple[str, ...] = _PACKAGES) -> dict[str, str | None]:
    """Installed version of each package that can change a result (None when not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


# A copy of a checkout sent to another machine (whose .git folder is missing or not the one it was copied from)
# names the commit it was copied from in this variable, with '+dirty' appended when the copy held uncommitted
# changes to tracked files; where set, it is the revision recorded.
REVISION_VARIABLE = "HILBERT_LAB_REVISION"


def git_revision(repo_root: str = _REPO_ROOT) -> dict[str, Any]:
    """{'commit': sha or None, 'dirty': bool or None} of the source tree hilbert_lab runs from (REVISION_VARIABLE
    where set, else git, else unknown)."""
    named = os.environ.get(REVISION_VARIABLE, "").strip()
    if named:
        commit, _, dirty = named.partition("+")
        return {"commit": commit, "dirty": dirty == "dirty"}
    try:
        commit = subprocess.run(["git", "-C", repo_root, "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", repo_root, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
        return {"commit": commit, "dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def cpu_description() -> dict[str, Any]:
    """CPU model name, logical core count and the CPUs this process may use."""
    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"model": model or platform.machine(), "logical_cores": os.cpu_count(), "usable_cores": usable,
            "machine": platform.machine()}


def _nvidia_driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
            return version.decode() if isinstance(version, bytes) else str(version)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return out.strip().splitlines()[0] if out.strip() else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def _nvidia_smi_name(index: int) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", f"--id={index}", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        return out.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def device_description(device: str = "cpu") -> dict[str, Any]:
    """Name, driver and libraries of `device` ('cpu' or 'cuda[:N]'): CUDA toolkit, cuDNN and NCCL versions.

    CUDA devices are described through nvidia-smi/NVML, so that the (parent) process creates no
    CUDA context of its own; the library versions are read without touching the device.
    """
    if not str(device).startswith("cuda"):
        return {"device": "cpu", "name": cpu_description()["model"], "driver": None}
    import torch

    index = int(str(device).split(":")[1]) if ":" in str(device) else 0
    return {"device": f"cuda:{index}", "name": _nvidia_smi_name(index), "driver": _nvidia_driver(),
            "cuda": torch.version.cuda, "cudnn": _library_version(torch.backends.cudnn.version),
            "nccl": _library_version(lambda: ".".join(map(str, torch.cuda.nccl.version())))}


def _library_version(read) -> str | None:
    try:
        version = read()
    except Exception:  # a library that is absent or fails to load: no version, never a failed run
        return None
    return None if version is None else str(version)


def environment_variables(names: tuple[str, ...] = _VARIABLES) -> dict[str, str]:
    """The variables of `names` that are set in this process."""
    return {name: os.environ[name] for name in names if name in os.environ}


@functools.lru_cache(maxsize=8)
def _environment_cached(device: str) -> tuple:
    env = {"packages": package_versions(), "git": git_revision(), "cpu": cpu_description(),
           "device": device_description(device), "variables": environment_variables(),
           "platform": platform.platform(),
           "hostname": platform.node(), "executable": os.path.basename(sys.executable)}  # no machine's folders
    return tuple(sorted(env.items()))


def collect_environment(device: str = "cpu") -> dict[str, Any]:
    """The environment block for results of cases run on `device` (cached per device per process)."""
    return dict(_environment_cached(str(device)))


def save_run(path: str | os.PathLike, device: str, **fields: Any) -> Path:
    """Write one benchmark run as JSON at `path` (folders made, atomically): {"environment": collect_environment(
    device), "command": this process's command line with no machine folders, **fields}; returns the path."""
    record = {"environment": collect_environment(device), "command": strip_paths(" ".join(sys.argv)), **fields}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(record, indent=1))
    return path
