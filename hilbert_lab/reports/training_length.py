"""The training report's longest-trainable-length probe (benchmarks/train_gpu.py --probe-lengths): its table
and the page's section (peak memory and tokens/s against sequence length)."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["device_name", "longest_trainable_sections", "longest_trainable_table", "probe_label"]


def device_name(report: Mapping[str, Any]) -> str | None:
    """The device name in a training report's environment (or None)."""
    device = (report.get("environment") or {}).get("device")
    return device.get("name") if isinstance(device, dict) else device


def longest_trainable_table(groups: Mapping[str, Mapping[str, Mapping[str, Any]]]):
    """One row per probed length of any run with a "longest_trainable" probe (benchmarks/train_gpu.py
    --probe-lengths): run (whose JSON holds it), device, seq_len, pattern, tokens_per_s, peak_memory_gib,
    device_memory_gib, error, and the probe's own command and revision (a probe stored in another run's JSON
    under "longest_trainable_command" ran separately: its revision is not recorded)."""
    import pandas as pd

    from hilbert_lab.reports.provenance import NOT_RECORDED, document_source, strip_paths

    columns = ["run", "device", "seq_len", "pattern", "tokens_per_s", "peak_memory_gib", "device_memory_gib", "error",
               "command", "revision", "stored_in"]
    rows = []
    for reports in groups.values():
        for label, report in reports.items():
            if not report.get("longest_trainable"):
                continue
            source = report.get("source")
            separate = report.get("longest_trainable_command")
            command = strip_paths(separate) if separate else document_source(report, None, label)["command"]
            revision = NOT_RECORDED if separate else document_source(report, None, label)["revision"]
            for row in report["longest_trainable"]:
                rows.append({"run": label, "device": device_name(report), "seq_len": row["seq_len"],
                             "pattern": f"{','.join(map(str, row['segment_lengths']))} / "
                                        f"{','.join(map(str, row['dilation_rates']))}",
                             **{key: row.get(key) for key in columns[4:8]}, "command": command,
                             "revision": revision, "stored_in": Path(str(source)).name if source else None})
    return pd.DataFrame(rows, columns=columns)


def probe_label(row: Mapping[str, Any]) -> str:
    """A probe's series label: what it is, its device and the revision that made it ('length probe, NVIDIA H100
    80GB HBM3, rev unrecorded'), not the run whose JSON it was stored in."""
    from hilbert_lab.reports.provenance import NOT_RECORDED

    revision = str(row.get("revision") or "")
    recorded = revision and not revision.startswith(NOT_RECORDED) and revision not in ("nan", "None", "-")
    return (f"length probe, {row.get('device') or 'GPU'}, "
            + (f"rev {revision.split(' (')[0]}" if recorded else "rev unrecorded"))


def longest_trainable_sections(metrics: Mapping[str, Any]):
    """The section (figure, table, conclusion) and findings of the "longest_trainable" table, if any."""
    from hilbert_lab.reports.page import Section, fmt, fmt_count, metrics_table, out_of_memory, tokens
    from hilbert_lab.reports.provenance import older_code_of_revision
    from hilbert_lab.viz.training import memory_by_length

    sections, findings = [], []
    probes = metrics_table(metrics, "longest_trainable")
    if len(probes):
        lines, labels = [], []
        for run in dict.fromkeys(probes["run"]):
            mine = probes[probes["run"] == run].sort_values("seq_len").to_dict(orient="records")
            first = mine[0]
            labels.append(older_code_of_revision(first.get("revision")))
            name = f"{first.get('device') or 'GPU'} length probe (stored in {first.get('stored_in') or run})"
            done = [r for r in mine if not (isinstance(r.get("error"), str) and r["error"])]
            failed = [r for r in mine if isinstance(r.get("error"), str) and r["error"]]
            if not done:
                lines.append(f"{name}: no probed length trained ({out_of_memory(failed[0]['error'])})")
                continue
            last = done[-1]
            line = (f"{name} trains {tokens(last['seq_len'])} tokens (batch 1, gradient "
                    f"checkpointing): peak {fmt(last['peak_memory_gib'])} GiB, {fmt_count(last['tokens_per_s'])} "
                    f"tokens/s, {fmt(last['peak_memory_gib'] / last['seq_len'] * 2**20)} GiB per 1M tokens")
            if failed:
                line += f"; {tokens(failed[0]['seq_len'])} tokens: {out_of_memory(failed[0]['error'])}"
            lines.append(line)
        commands = sorted({str(c) for c in probes.get("command", []) if c and c == c})
        made_by = (" Made by: " + "; ".join(commands) + "." if commands else "")
        if any(Path(str(c).split("--out ")[-1].split()[0]).name not in set(probes.get("stored_in", []))
               for c in commands if "--out " in str(c)):
            made_by += (" The file that command names is not in the repository: its rows were stored in the JSON "
                        "named above.")
        capacity = probes["device_memory_gib"].dropna()
        fig = memory_by_length([{**row, "run": probe_label(row)} for row in probes.to_dict(orient="records")],
                               capacity_gib=float(capacity.iloc[0]) if len(capacity) else None)
        fig.update_xaxes(title_text="sequence length (tokens, log scale)")
        fig.update_yaxes(title_text="peak memory (GiB, lower is better)", row=1, col=1)
        fig.update_yaxes(title_text="tokens/s (higher is better)", row=1, col=2)
        fig.update_layout(height=400)
        table = probes.assign(seq_len=[tokens(n) for n in probes["seq_len"]],
                              tokens_per_s=[fmt_count(v) for v in probes["tokens_per_s"]],
                              error=[out_of_memory(e) if isinstance(e, str) and e else "" for e in probes["error"]])
        table = table.drop(columns=["run", "device", "command", "revision", "stored_in"] +
                           [c for c in ("device_memory_gib",) if probes[c].isna().all()], errors="ignore")
        if not table["error"].astype(bool).any():
            table = table.drop(columns=["error"])
        older = next((label for label in labels if label), "")
        sections.append(Section("Longest trainable sequence" + (f": {older}" if older else ""),
                                "; ".join(lines) + ". Each length is 3 training "
                                "steps with the pattern extended by segments four times longer at 4096 keys per query "
                                "until one spans the sequence; single measurements, no interval." + made_by, figure=fig,
                                table=table.rename(columns={"seq_len": "tokens", "tokens_per_s": "tokens/s",
                                                            "peak_memory_gib": "peak memory (GiB)",
                                                            "device_memory_gib": "device memory (GiB)",
                                                            "pattern": "segments / dilations", "error": "failure"})))
        if not older:
            findings += [line + " (single measurements)." for line in lines]
    return sections, findings
