"""The training report's ring runs against their 1-GPU twins: the loss agreement, its table and the page's
section (labelled with the revision when the runs predate the current code)."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["loss_agreement", "ring_comparison_sections", "ring_comparison_table"]


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


def ring_comparison_sections(metrics: Mapping[str, Any], finals: Any) -> tuple[list[Any], list[str]]:
    """The section and findings of the "ring_comparison" table: how far the losses agree; runs that never left
    chance say so (they show the ring computes the same steps, not that it trains the same); runs of older code
    go under their revision and give no finding."""
    from hilbert_lab.reports.page import Section, fmt, is_missing, metrics_table
    from hilbert_lab.reports.provenance import older_code_of_revision

    sections: list[Any] = []
    findings: list[str] = []
    comparison = metrics_table(metrics, "ring_comparison")
    if len(comparison):
        lines, labels = [], []
        by_run = {row["run"]: row for row in finals.to_dict(orient="records")} if len(finals) else {}
        for row in comparison.to_dict(orient="records"):
            value = row.get("recomputed_max_rel_loss_difference")
            value = value if value is not None and value == value else row.get("max_rel_loss_difference")
            pair = [by_run[name] for name in (row["run"], row["against"]) if name in by_run]
            line = (f"{row['run']} against {row['against']}: the losses agree to {100 * float(value):.2f}% "
                    f"(largest relative difference over {fmt(row.get('recomputed_points') or row.get('points'))} "
                    "logged points)")
            if pair and all(not is_missing(r.get("chance_loss")) and r["final_loss"] >= r["chance_loss"] for r in pair):
                line += (f", over {fmt(max(r['steps'] for r in pair))} steps in which neither run learned (final loss "
                         f"{' and '.join(fmt(r['final_loss']) for r in pair)}, chance {fmt(pair[0]['chance_loss'])}): "
                         "the ring computes the same steps as one GPU; whether it trains the same cannot be told "
                         "from runs that never left chance")
            labels += [older_code_of_revision(r.get("revision")) for r in pair]
            lines.append(line)
        older = next((label for label in labels if label), "")
        sections.append(Section("Ring attention against one GPU" + (f": {older}" if older else ""),
                                "; ".join(lines) + ".", table=comparison.rename(
            columns={"max_abs_loss_difference": "max abs loss diff", "max_rel_loss_difference": "max rel loss diff",
                     "recomputed_points": "points (recomputed)", "world_size": "GPUs",
                     "recomputed_max_rel_loss_difference": "max rel loss diff (recomputed)"}), collapsed=True))
        if not older:
            findings.append("; ".join(lines) + ".")
    return sections, findings
