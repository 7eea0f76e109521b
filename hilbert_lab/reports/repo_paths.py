"""The repository the reports read and write: its root (from the package location, not the cwd), the committed
results folder, and a path given to a report resolved against the root (papermill runs a notebook in its run
folder, so a relative path would otherwise miss the committed files)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]

__all__ = ["REPO_ROOT", "load_committed_json", "resolve_repo_path", "results_dir"]


def results_dir() -> Path:
    """The repository's reports/results folder (resolved from the package location, not the cwd)."""
    return REPO_ROOT / "reports" / "results"


def resolve_repo_path(path: str | os.PathLike) -> Path:
    """`path` itself when absolute, else `path` under the repository root."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


def load_committed_json(path: str | os.PathLike, key: str, kind: type, what: str, shape: str) -> dict[str, Any] | None:
    """The JSON object at `path` (resolved against the repository root), or None when there is no such file;
    ValueError naming the file unless the object holds `key` of type `kind` (`what` names the file's kind,
    `shape` what `key` should hold)."""
    resolved = resolve_repo_path(path)
    if not resolved.is_file():
        return None
    data = json.loads(resolved.read_text())
    if not isinstance(data, dict) or not isinstance(data.get(key), kind):
        raise ValueError(f"{what} file {str(path)!r} must hold {key!r}: {shape}")
    return data
