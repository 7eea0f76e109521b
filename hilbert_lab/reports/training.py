"""The training report's data: committed training-run JSONs (reports/results/), tables, a live CPU run.

Paths given to the report are resolved against the repository root (papermill runs a notebook in its
run folder, so a relative path would otherwise miss the committed files).
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]

__all__ = [
    "REPO_ROOT",
    "cpu_training_report",
    "final_evals_table",
    "group_chance",
    "histories",
    "load_runs",
    "loss_agreement",
    "resolve_repo_path",
    "results_dir",
    "ring_comparison_table",
    "run_phases",
    "throughput_table",
]


def results_dir() -> Path:
    """The repository's reports/results folder (resolved from the package location, not the cwd)."""
    return REPO_ROOT / "reports" / "results"


def resolve_repo_path(path: str | os.PathLike) -> Path:
    """`path` itself when absolute, else `path` under the repository root."""
    path = Path(path).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


def load_runs(runs: Mapping[str, Mapping[str, str | os.PathLike]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{group: {label: path}} -> {group: {label: report}} via read_training_report; each report gets
    "source" (the resolved path). Labels must be unique over all groups (ValueError otherwise)."""
    from hilbert_lab.models.train import read_training_report

    loaded: dict[str, dict[str, dict[str, Any]]] = {}
    seen: set[str] = set()
    for group, paths in runs.items():
        if not isinstance(paths, Mapping):
            raise ValueError(f"runs must map group -> {{label: path}}; group {group!r} maps to {paths!r}")
        loaded[group] = {}
        for label, path in paths.items():
            if label in seen:
                raise ValueError(f"run labels must be unique over all groups; {label!r} appears twice")
            seen.add(label)
            resolved = resolve_repo_path(path)
            loaded[group][label] = {**read_training_report(resolved), "source": str(resolved)}
    return loaded


def _last_step(report: Mapping[str, Any]) -> int:
    return max((int(record["step"]) for record in report["training"]["history"]), default=0)


def run_phases(report: Mapping[str, Any]) -> list[tuple[int, int, int]]:
    """(start_step, end_step, seq_len) of the run's length curriculum, up to its last logged step.

    From config["curriculum"] and config["seq_len"] when the config has a curriculum (so a phase
    shorter than log_every still shows), else from the train records' seq_len changes.
    """
    from hilbert_lab.viz.training import curriculum_phases

    config = report.get("config") or {}
    curriculum = config.get("curriculum") or []
    last = _last_step(report)
    if not curriculum or "seq_len" not in config:
        return curriculum_phases(report["training"]["history"])
    phases, start = [], 0
    for length, until in [*curriculum, [config["seq_len"], max(last, curriculum[-1][1])]]:
        if start >= last:
            break
        phases.append((int(start), int(min(until, last)), int(length)))
        start = until
    return phases


def histories(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """{label: report} -> {label: training.history}, the input of viz.training.training_curves."""
    return {label: report["training"]["history"] for label, report in reports.items()}


def group_chance(reports: Mapping[str, Mapping[str, Any]], metric: str = "loss") -> float | None:
    """The chance loss / accuracy the runs of a group share (None when they differ or none is given)."""
    if metric not in ("loss", "accuracy"):
        raise ValueError(f"metric must be one of ('loss', 'accuracy'), got {metric!r}")
    values = {report["training"].get(f"chance_{metric}") for report in reports.values()}
    return values.pop() if len(values) == 1 else None


def _device_name(report: Mapping[str, Any]) -> str | None:
    device = (report.get("environment") or {}).get("device")
    return device.get("name") if isinstance(device, dict) else device


def final_evals_table(groups: Mapping[str, Mapping[str, Mapping[str, Any]]]):
    """One row per run: group, run, steps (last logged), seq_len (of the evals), final eval loss and
    accuracy, chance loss and accuracy, wall_s, attention backend, world size, device."""
    import pandas as pd

    rows = []
    for group, reports in groups.items():
        for label, report in reports.items():
            training = report["training"]
            final = training.get("final_eval") or next(
                (r for r in reversed(training["history"]) if r["kind"] == "eval"), {})
            rows.append({
                "group": group, "run": label, "steps": _last_step(report),
                "seq_len": (report.get("config") or {}).get("seq_len"),
                "final_loss": final.get("loss"), "final_accuracy": final.get("accuracy"),
                "chance_loss": training.get("chance_loss"), "chance_accuracy": training.get("chance_accuracy"),
                "wall_s": training.get("wall_s"), "attention_backend": report.get("attention_backend"),
                "world_size": report.get("world_size", 1), "device": _device_name(report),
            })
    return pd.DataFrame(rows)


def throughput_table(groups: Mapping[str, Mapping[str, Mapping[str, Any]]]):
    """One row per throughput measurement of any run (runs without "throughput" give none): run,
    gradient_checkpointing, seq_len, batch_size, tokens_per_s, peak_memory_gib."""
    import pandas as pd

    columns = ["run", "gradient_checkpointing", "seq_len", "batch_size", "tokens_per_s", "peak_memory_gib"]
    rows = [
        {"run": label, **{key: row.get(key) for key in columns[1:]}}
        for reports in groups.values() for label, report in reports.items()
        for row in report.get("throughput") or []
    ]
    return pd.DataFrame(rows, columns=columns)


def loss_agreement(records: list[Mapping[str, Any]], reference: list[Mapping[str, Any]]):
    """Losses of the (kind, step) points both logs have: kind, step, loss, reference_loss, abs and
    relative (to the reference) difference."""
    import pandas as pd

    mine = {(r["kind"], int(r["step"])): float(r["loss"]) for r in records if r.get("loss") is not None}
    rows = []
    for r in reference:
        key = (r["kind"], int(r["step"]))
        if key in mine and r.get("loss") is not None:
            reference_loss = float(r["loss"])
            difference = abs(mine[key] - reference_loss)
            rows.append({"kind": key[0], "step": key[1], "loss": mine[key], "reference_loss": reference_loss,
                         "abs_difference": difference, "rel_difference": difference / max(abs(reference_loss), 1e-12)})
    return pd.DataFrame(rows, columns=["kind", "step", "loss", "reference_loss", "abs_difference", "rel_difference"])


def ring_comparison_table(groups: Mapping[str, Mapping[str, Mapping[str, Any]]]):
    """One row per run whose report has a "comparison" block (a ring run against its 1-GPU twin): the
    recorded points and max abs/rel loss differences, and the same recomputed from both histories when
    the compared-against file (matched by file name) is among the loaded runs."""
    import pandas as pd

    everything = {label: report for reports in groups.values() for label, report in reports.items()}
    rows = []
    for label, report in everything.items():
        comparison = report.get("comparison")
        if not comparison:
            continue
        against = Path(str(comparison.get("against", ""))).name
        twin = next((other for other, candidate in everything.items()
                     if other != label and Path(candidate.get("source", "")).name == against), None)
        row = {"run": label, "against": twin or against, "world_size": report.get("world_size"),
               "points": comparison.get("points"),
               "max_abs_loss_difference": comparison.get("max_abs_loss_difference"),
               "max_rel_loss_difference": comparison.get("max_rel_loss_difference"),
               "recomputed_points": None, "recomputed_max_rel_loss_difference": None}
        if twin is not None:
            agreement = loss_agreement(report["training"]["history"], everything[twin]["training"]["history"])
            row["recomputed_points"] = len(agreement)
            if len(agreement):
                row["recomputed_max_rel_loss_difference"] = float(agreement["rel_difference"].max())
        rows.append(row)
    return pd.DataFrame(rows, columns=["run", "against", "world_size", "points", "max_abs_loss_difference",
                                       "max_rel_loss_difference", "recomputed_points",
                                       "recomputed_max_rel_loss_difference"])


def cpu_training_report(steps: int, preset: str = "cpu-tiny") -> dict[str, Any]:
    """Train PRESETS[preset] on the CPU for `steps` steps (no files written); returns a report shaped
    like the committed JSONs (command, config, attention_backend, world_size, training{history,
    final_eval, chance_loss, chance_accuracy, wall_s})."""
    import torch

    from hilbert_lab.attention.selection import select_backend
    from hilbert_lab.models.train import DTYPES, PRESETS, TrainConfig, train

    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    config = TrainConfig(**{**PRESETS[preset], "steps": steps, "progress": False})
    if torch.device(config.device).type != "cpu":
        raise ValueError(f"preset {preset!r} is not a CPU preset (device {config.device!r})")
    backend = config.backend if config.backend != "auto" else select_backend(
        config.device, DTYPES[config.dtype], mode=config.mode)
    start = time.perf_counter()
    result = train(config)
    task = config.task()
    return {
        "command": f"hilbert_lab.reports.training.cpu_training_report(steps={steps}, preset={preset!r})",
        "world_size": 1, "environment": {"device": {"name": "cpu"}}, "config": config.to_dict(),
        "attention_backend": backend,
        "training": {"wall_s": time.perf_counter() - start, "final_eval": result.final_eval,
                     "chance_accuracy": task.chance_accuracy, "chance_loss": task.chance_loss,
                     "history": result.history},
        "source": "live",
    }
