"""The training report's data: committed training-run JSONs (reports/results/), tables, a live CPU run.

Paths given to the report are resolved against the repository root (papermill runs a notebook in its
run folder, so a relative path would otherwise miss the committed files).
"""
from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from hilbert_lab.reports.repo_paths import REPO_ROOT, resolve_repo_path, results_dir
from hilbert_lab.reports.training_grid import grid_buckets_table, grid_rows_table, grid_sections, load_grids
from hilbert_lab.reports.training_length import device_name, longest_trainable_sections, longest_trainable_table
from hilbert_lab.reports.training_ring import loss_agreement, ring_comparison_sections, ring_comparison_table
from hilbert_lab.reports.training_scaling import load_scaling, scaling_sections, scaling_table

__all__ = [
    "REPO_ROOT",
    "cpu_training_report",
    "final_evals_table",
    "grid_buckets_table",
    "grid_rows_table",
    "load_grids",
    "longest_trainable_table",
    "group_chance",
    "histories",
    "history_table",
    "phases_table",
    "render",
    "load_runs",
    "load_scaling",
    "loss_agreement",
    "resolve_repo_path",
    "results_dir",
    "ring_comparison_table",
    "run_phases",
    "scaling_table",
    "throughput_table",
]


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


def final_evals_table(groups: Mapping[str, Mapping[str, Mapping[str, Any]]]):
    """One row per run: group, run, steps (last logged), seq_len (of the evals), final eval loss and
    accuracy (with its Wilson 95% interval and answer count where the eval recorded them), chance loss and
    accuracy, wall_s, attention backend, world size, device, and where it ran (revision, recorded, command)."""
    import pandas as pd

    from hilbert_lab.reports.provenance import document_source

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
                "accuracy_low": final.get("accuracy_low"), "accuracy_high": final.get("accuracy_high"),
                "answers": final.get("count"),
                "chance_loss": training.get("chance_loss"), "chance_accuracy": training.get("chance_accuracy"),
                "wall_s": training.get("wall_s"), "attention_backend": report.get("attention_backend"),
                "world_size": report.get("world_size", 1), "device": device_name(report),
                **{key: value for key, value in document_source(report, report.get("source")
                                                                if report.get("source") != "live" else None,
                                                                label).items() if key in ("revision", "recorded",
                                                                                          "command")},
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


def history_table(groups: Mapping[str, Mapping[str, Mapping[str, Any]]]):
    """Every logged point of every run (the curves' data): group, run, kind, step, seq_len, loss, accuracy."""
    import pandas as pd

    columns = ["group", "run", "kind", "step", "seq_len", "loss", "accuracy"]
    rows = [{"group": group, "run": label, **{key: record.get(key) for key in columns[2:]}}
            for group, reports in groups.items() for label, report in reports.items()
            for record in report["training"]["history"]]
    return pd.DataFrame(rows, columns=columns)


def phases_table(groups: Mapping[str, Mapping[str, Mapping[str, Any]]]):
    """The length-curriculum phases of every run (run_phases): group, run, start_step, end_step, seq_len."""
    import pandas as pd

    rows = [{"group": group, "run": label, "start_step": start, "end_step": end, "seq_len": length}
            for group, reports in groups.items() for label, report in reports.items()
            for start, end, length in run_phases(report)]
    return pd.DataFrame(rows, columns=["group", "run", "start_step", "end_step", "seq_len"])


# ---------------------------------------------------------------------------------------------------
# the page (a pure function of metrics.json + env.json)

def _curves(group: str, group_finals: Any, history: Any, phases: Any) -> list[Any]:
    """The accuracy and loss figures of one group of runs, with conclusions that say where chance lies."""
    from hilbert_lab.reports.page import Section, fmt, style_axes
    from hilbert_lab.viz.training import training_curves

    records = history[history["group"] == group]
    runs = {label: [{k: v for k, v in record.items() if v is not None and v == v}
                    for record in records[records["run"] == label].to_dict(orient="records")]
            for label in group_finals["run"]}
    run_phases = {label: [(int(r["start_step"]), int(r["end_step"]), int(r["seq_len"]))
                          for r in phases[(phases["group"] == group) & (phases["run"] == label)]
                          .to_dict(orient="records")] for label in runs} if len(phases) else None
    if not any(runs.values()):
        return []
    sections = []
    ranked = group_finals.sort_values("final_accuracy", ascending=False)
    chance, chance_loss = ranked["chance_accuracy"].iloc[0], ranked["chance_loss"].iloc[0]
    for metric, axis in (("accuracy", "answer accuracy (fraction; higher is better)"),
                         ("loss", "answer loss (nats; lower is better)")):
        fig = training_curves(runs, metric, chance if metric == "accuracy" else chance_loss, phases=run_phases,
                              title=f"{group}: {metric} (thin: train batches; markers: evals at full length)")
        style_axes(fig, "training step", axis)
        fig.update_layout(height=420)
        best, low = ranked.iloc[0], group_finals.sort_values("final_loss").iloc[0]
        if metric == "accuracy":
            if chance and best["final_accuracy"] < 3 * chance:
                conclusion = (f"No run rises clearly above chance: the best final accuracy is "
                              f"{100 * best['final_accuracy']:.1f}% ({best['run']}) against {100 * chance:.1f}%.")
            else:
                conclusion = (f"{best['run']} ends highest, {100 * best['final_accuracy']:.1f}%; "
                              + ", ".join(f"{r['run']} {100 * r['final_accuracy']:.1f}%" for r in
                                          ranked.iloc[1:].to_dict(orient="records")) + f" (chance {100 * chance:.1f}%).")
        elif chance_loss and low["final_loss"] >= chance_loss:
            conclusion = (f"No run's final eval loss is below chance ({fmt(chance_loss)} nats): "
                          + ", ".join(f"{r['run']} {fmt(r['final_loss'])}" for r in group_finals.to_dict(orient="records"))
                          + ".")
        else:
            conclusion = f"Lowest final eval loss: {low['run']} ({fmt(low['final_loss'])} nats; chance {fmt(chance_loss)})."
        revisions = [text for text in dict.fromkeys(str(r).split(" (")[0] for r in group_finals.get("revision", []))
                     if text and not text.startswith(("not recorded", "nan", "None"))]
        if revisions:
            conclusion += f" Trained at rev {' and '.join(revisions)}."
        at_chance = bool(chance) and best["final_accuracy"] < 3 * chance  # then the loss is the curve to look at
        sections.append(Section(f"{group}: {metric}", conclusion, figure=fig,
                                collapsed=(metric == "loss") != at_chance))
    return sections


def _sources(finals: Any, grid_rows: Any, probes: Any) -> list[dict[str, str]]:
    from hilbert_lab.reports.provenance import NOT_RECORDED

    def field(row: dict, key: str) -> str:
        value = row.get(key)
        return str(value) if value is not None and value == value and value != "" else NOT_RECORDED

    sources = [{"what": row["run"], "device": f"{row.get('device') or '?'}, {int(row.get('world_size') or 1)} GPU"
                + ("s" if (row.get("world_size") or 1) > 1 else ""), "revision": field(row, "revision"),
                "recorded": field(row, "recorded"), "command": field(row, "command")}
               for row in finals.to_dict(orient="records")]
    if len(grid_rows) and "revision" in grid_rows:
        for row in grid_rows.drop_duplicates("grid").to_dict(orient="records"):
            sources.append({"what": row["grid"], **{key: field(row, key) for key in ("device", "revision", "recorded",
                                                                                      "command")}})
    if len(probes) and "command" in probes:
        for row in probes.drop_duplicates(["run", "command"]).to_dict(orient="records"):
            sources.append({"what": f"length probe (stored in {row.get('stored_in') or row['run']})",
                            "device": f"{row.get('device') or '?'}, 1 GPU", "revision": field(row, "revision"),
                            "recorded": NOT_RECORDED, "command": field(row, "command")})
    return sources


def render(metrics: Mapping[str, Any], env: Mapping[str, Any]):
    """Training page: findings (the retrieval grid's main result, its control, the 128K fine-tunes, the ring
    against one GPU, scaling over GPUs, the longest trainable length), the grids, curves per group, tables behind closed sections."""
    from hilbert_lab.reports.page import Page, Section, fmt, is_missing, metrics_table, percent_interval
    from hilbert_lab.reports.provenance import TRAIN_STEP_CODE, older_code_of_revision
    from hilbert_lab.viz.training import throughput_bars

    finals, history, phases = (metrics_table(metrics, name) for name in ("final_evals", "history", "phases"))
    grid_parts, grid_findings = grid_sections(metrics)
    sections = list(grid_parts)
    findings = [line for line in grid_findings if line.startswith(("Main result", "Against", "The control"))]
    with_interval = finals[finals["accuracy_low"].notna()] if len(finals) else finals
    if len(with_interval):
        findings.append("Runs evaluated with answer counts: " + "; ".join(
            f"{row['run']} {percent_interval(row['final_accuracy'], row['accuracy_low'], row['accuracy_high'])} over "
            f"{fmt(row['answers'])} answers at {fmt(row['seq_len'])} tokens" for row in with_interval.to_dict(orient="records"))
            + f" (chance {100 * with_interval['chance_accuracy'].iloc[0]:.1f}%" + "".join(
                f"; trained at rev {text}" for text in dict.fromkeys(str(r).split(" (")[0] for r in
                                                                     with_interval.get("revision", []))
                if text and not text.startswith(("not recorded", "nan", "None"))) + ").")
    groups = list(dict.fromkeys(finals["group"])) if len(finals) and len(history) else []
    if len(finals) and not len(history):
        sections.append(Section("Curves", "This run recorded no history table (an older run): no curves."))
    for group in groups:
        sections += _curves(group, finals[finals["group"] == group], history, phases)
    ring_sections, ring_findings = ring_comparison_sections(metrics, finals)
    sections += ring_sections
    findings += ring_findings
    scaling_parts, scaling_findings = scaling_sections(metrics)
    sections += scaling_parts
    findings += scaling_findings
    probe_sections, probe_findings = longest_trainable_sections(metrics)
    sections += probe_sections
    findings += probe_findings + [line for line in grid_findings if line not in findings]
    throughput = metrics_table(metrics, "throughput")
    if len(throughput):
        fig = throughput_bars(throughput.to_dict(orient="records"))
        fig.update_xaxes(title_text="run")
        fig.update_yaxes(title_text="tokens/s (higher is better)", row=1, col=1)
        fig.update_yaxes(title_text="peak memory (GiB, lower is better)", row=1, col=2)
        fig.update_layout(height=400)
        top = throughput.sort_values("tokens_per_s", ascending=False).iloc[0]
        revisions = finals.set_index("run")["revision"].to_dict() if "revision" in finals else {}
        older = next((label for label in (older_code_of_revision(revisions.get(run), since=TRAIN_STEP_CODE)
                                          for run in dict.fromkeys(throughput["run"])) if label), "")
        sections.append(Section("Training throughput and memory" + (f": {older}" if older else ""),
                                f"Fastest: {top['run']} at {fmt(top['tokens_per_s'])} tokens/s "
                                f"({'with' if top['gradient_checkpointing'] else 'without'} gradient checkpointing, "
                                f"{fmt(top['peak_memory_gib'])} GiB peak); single measurements, no interval.",
                                figure=fig, collapsed=True, table=throughput.rename(columns={
                                    "gradient_checkpointing": "gradient checkpointing", "seq_len": "tokens",
                                    "batch_size": "batch", "tokens_per_s": "tokens/s",
                                    "peak_memory_gib": "peak memory (GiB)"})))
    if len(finals):
        shown = finals.assign(accuracy=[
            percent_interval(r["final_accuracy"], r["accuracy_low"], r["accuracy_high"])
            + f" ({fmt(r['answers'])} answers)" if not is_missing(r.get("accuracy_low"))
            else f"{100 * r['final_accuracy']:.1f}% (no interval recorded)" for r in finals.to_dict(orient="records")],
            chance=[f"{100 * c:.1f}%" for c in finals["chance_accuracy"]])
        shown = shown[["run", "steps", "seq_len", "final_loss", "accuracy", "chance", "wall_s", "attention_backend",
                       "world_size"]].rename(columns={
            "seq_len": "tokens", "final_loss": "final loss (nats)", "accuracy": "final accuracy", "wall_s": "wall time (s)",
            "attention_backend": "attention backend", "world_size": "GPUs"})
        sections.append(Section("Final evaluation of every run", table=shown, collapsed=True,
                                caption="last eval at the full sequence length; steps = last logged step"))
    about = (f"{len(finals)} LongNet training runs on the needle-retrieval task (the answer's loss and accuracy only) "
             "and the retrieval grids (accuracy pooled over seeds with its 95% interval, against attention FLOPs per "
             "token and needle distance). The runs were trained on GPUs and committed as JSON; this page draws them "
             "without re-training.")
    devices = sorted({str(device) for device in finals.get("device", []) if device}) if len(finals) else []
    live = any(str(device).lower() == "cpu" for device in finals.get("device", [])) if len(finals) else False
    return Page(title="Training: LongNet on 32K- and 128K-token needle retrieval", findings=findings[:5], about=about,
                sections=sections, device="committed runs trained on " + ", ".join(devices) if devices else "",
                sources=_sources(finals, metrics_table(metrics, "grid_rows"),
                                                 metrics_table(metrics, "longest_trainable")), measured_here=live)
