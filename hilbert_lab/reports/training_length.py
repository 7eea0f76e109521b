"""The training report's longest-trainable-length probe (benchmarks/train_gpu.py --probe-lengths): its table
and the page's section (peak memory and tokens/s against sequence length)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["device_name", "longest_trainable_sections", "longest_trainable_table"]


def device_name(report: Mapping[str, Any]) -> str | None:
    """The device name in a training report's environment (or None)."""
    device = (report.get("environment") or {}).get("device")
    return device.get("name") if isinstance(device, dict) else device


def longest_trainable_table(groups: Mapping[str, Mapping[str, Mapping[str, Any]]]):
    """One row per probed length of any run with a "longest_trainable" probe (benchmarks/train_gpu.py
    --probe-lengths): run (whose JSON holds it), device, seq_len, pattern, tokens_per_s, peak_memory_gib,
    device_memory_gib, error."""
    import pandas as pd

    columns = ["run", "device", "seq_len", "pattern", "tokens_per_s", "peak_memory_gib", "device_memory_gib", "error"]
    rows = [
        {"run": label, "device": device_name(report), "seq_len": row["seq_len"],
         "pattern": f"{','.join(map(str, row['segment_lengths']))} / {','.join(map(str, row['dilation_rates']))}",
         **{key: row.get(key) for key in columns[4:]}}
        for reports in groups.values() for label, report in reports.items()
        for row in report.get("longest_trainable") or []
    ]
    return pd.DataFrame(rows, columns=columns)


def longest_trainable_sections(metrics: Mapping[str, Any]):
    """The section (figure, table, conclusion) and findings of the "longest_trainable" table, if any."""
    from hilbert_lab.reports.page import Section, fmt, fmt_count, metrics_table, out_of_memory, tokens
    from hilbert_lab.viz.training import memory_by_length

    sections, findings = [], []
    probes = metrics_table(metrics, "longest_trainable")
    if len(probes):
        lines = []
        for run in dict.fromkeys(probes["run"]):
            mine = probes[probes["run"] == run].sort_values("seq_len").to_dict(orient="records")
            done = [r for r in mine if not (isinstance(r.get("error"), str) and r["error"])]
            failed = [r for r in mine if isinstance(r.get("error"), str) and r["error"]]
            if not done:
                lines.append(f"{run}: no probed length trained ({out_of_memory(failed[0]['error'])})")
                continue
            last = done[-1]
            line = (f"{last.get('device') or run} trains {tokens(last['seq_len'])} tokens (batch 1, gradient "
                    f"checkpointing): peak {fmt(last['peak_memory_gib'])} GiB, {fmt_count(last['tokens_per_s'])} "
                    f"tokens/s, {fmt(last['peak_memory_gib'] / last['seq_len'] * 2**20)} GiB per 1M tokens")
            if failed:
                line += f"; {tokens(failed[0]['seq_len'])} tokens: {out_of_memory(failed[0]['error'])}"
            lines.append(line)
        capacity = probes["device_memory_gib"].dropna()
        fig = memory_by_length(probes.to_dict(orient="records"),
                               capacity_gib=float(capacity.iloc[0]) if len(capacity) else None)
        fig.update_xaxes(title_text="sequence length (tokens, log scale)")
        fig.update_yaxes(title_text="peak memory (GiB, lower is better)", row=1, col=1)
        fig.update_yaxes(title_text="tokens/s (higher is better)", row=1, col=2)
        fig.update_layout(template="plotly_white", height=400)
        table = probes.assign(seq_len=[tokens(n) for n in probes["seq_len"]],
                              tokens_per_s=[fmt_count(v) for v in probes["tokens_per_s"]],
                              error=[out_of_memory(e) if isinstance(e, str) and e else "" for e in probes["error"]])
        table = table.drop(columns=["run", "device"] + [c for c in ("device_memory_gib",) if probes[c].isna().all()])
        if not table["error"].astype(bool).any():
            table = table.drop(columns=["error"])
        sections.append(Section("Longest trainable sequence", "; ".join(lines) + ". Each length is 3 training "
                                "steps with the pattern extended by segments four times longer at 4096 keys per query "
                                "until one spans the sequence; single measurements, no interval.", figure=fig,
                                table=table.rename(columns={"seq_len": "tokens", "tokens_per_s": "tokens/s",
                                                            "peak_memory_gib": "peak memory (GiB)",
                                                            "device_memory_gib": "device memory (GiB)",
                                                            "pattern": "segments / dilations", "error": "failure"})))
        findings += [line + " (single measurements)." for line in lines]
    return sections, findings
