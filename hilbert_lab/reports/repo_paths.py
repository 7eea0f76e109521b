"""The repository the reports read and write: its root (from the package location, not the cwd), the committed
results folder, and a path given to a report resolved against the root (papermill runs a notebook in its run
folder, so a relative path would otherwise miss the committed files)."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

__all__ = ["REPO_ROOT", "resolve_repo_path", "results_dir"]


def results_dir() -> Path:
    """The repository's reports/results folder (resolved from the package location, not the cwd)."""
    return REPO_ROOT / "reports" / "results"


def resolve_repo_path(path: str | os.PathLike) -> Path:
    """`path` itself when absolute, else `path` under the repository root."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path
