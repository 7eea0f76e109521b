"""Training checkpoints and logs: atomic writes, checkpoint save/load with a configuration check,
and the readers of a run's log.jsonl and of a training report JSON."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import torch

from hilbert_lab.io import atomic_write

from .config import RUN_CONTROL_FIELDS, TrainConfig

CHECKPOINT_NAME = "checkpoint.pt"
LOG_NAME = "log.jsonl"
SUMMARY_NAME = "summary.json"
CHECKPOINT_FORMAT = 1


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save ``obj`` to ``path`` atomically (hilbert_lab.io.atomic_write): ``path`` holds either the
    previous complete file or the new complete file, never a partial one."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write(path, buffer.getvalue())


def _atomic_write_text(text: str, path: Path) -> None:
    atomic_write(path, text)


def config_differences(saved: dict[str, Any], requested: dict[str, Any]) -> list[str]:
    """'field: checkpoint X, requested Y' for every loss-curve-defining field that differs."""
    defaults = TrainConfig().to_dict()  # a field newer than the checkpoint reads as its default there
    differences = []
    for name in sorted(set(saved) | set(requested)):
        if name in RUN_CONTROL_FIELDS:
            continue
        before, after = saved.get(name, defaults.get(name)), requested.get(name, defaults.get(name))
        if before != after:
            differences.append(f"{name}: checkpoint {before!r}, requested {after!r}")
    return differences


def load_checkpoint(path: str | os.PathLike, config: TrainConfig | None = None) -> dict[str, Any]:
    """Load a checkpoint; with ``config``, ValueError listing every field that differs from it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint must be an existing file, got {str(path)!r}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated, foreign or corrupted file
        raise ValueError(f"checkpoint {str(path)!r} cannot be read ({type(error).__name__}: {error})") from error
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {str(path)!r} is not a hilbert_lab training checkpoint (format {CHECKPOINT_FORMAT})")
    if config is not None:
        differences = config_differences(state["config"], config.to_dict())
        if differences:
            raise ValueError(
                f"cannot resume from {str(path)!r}: it was written with a different configuration ("
                + "; ".join(differences) + "). Use the same configuration or another out_dir."
            )
    return state


def read_log(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of ``run_dir/log.jsonl`` (dicts with kind "train" or "eval", step, loss, accuracy...)."""
    path = Path(run_dir) / LOG_NAME
    if not path.is_file():
        raise ValueError(f"run_dir must hold a {LOG_NAME} written by train(), got {str(run_dir)!r}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_training_report(path: str | os.PathLike) -> dict[str, Any]:
    """A training report JSON (benchmarks/train_gpu.py --out): command, config, training.history, ...

    ``training.history`` holds the records of read_log(); ValueError naming ``path`` when the file is
    missing, not JSON, or has no such list of records (each a dict with kind and step).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path must name a training report JSON file, got {str(path)!r}")
    try:
        report = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"training report {str(path)!r} is not JSON: {error}") from None
    training = report.get("training") if isinstance(report, dict) else None
    history = training.get("history") if isinstance(training, dict) else None
    if not isinstance(history, list) or not all(
        isinstance(record, dict) and "kind" in record and "step" in record for record in history
    ):
        raise ValueError(
            f"training report {str(path)!r} has no training.history (a list of log records with kind and step)"
        )
    return report
