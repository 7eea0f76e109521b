"""The training page's scaling section: tokens/s per GPU at a fixed length per GPU on 1, 2 and 4 GPUs (data and
context parallel on a DeviceMesh), each setup's runs against one GPU (benchmarks/train_gpu.py runs, merged into one
JSON of {"runs": {setup: [report, ...]}})."""
from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from hilbert_lab.reports.repo_paths import load_committed_json

__all__ = ["SCALING_TARGET", "load_scaling", "scaling_sections", "scaling_table"]

SCALING_TARGET = 0.95  # tokens/s per GPU against one GPU, every run


def load_scaling(path: str) -> dict[str, Any] | None:
    """The scaling JSON at `path` (resolved against the repository root), or None when it is absent."""
    return load_committed_json(path, "runs", Mapping, "scaling", "{setup: [report, ...]}")


def _setup(report: Mapping[str, Any]) -> tuple[int, int, str]:
    config = report.get("config") or {}
    dp, cp = int(config.get("data_parallel", 1)), int(config.get("context_parallel", 1))
    if dp * cp == 1:
        return dp, cp, "1 GPU, FSDP2 on a mesh of one" if config.get("fsdp") else "1 GPU"
    layout = config.get("ring_layout", "contiguous")
    parts = [f"data parallel {dp}"] * (dp > 1) + [f"context parallel {cp} ({layout})"] * (cp > 1)
    return dp, cp, " x ".join(parts)


def scaling_table(data: Mapping[str, Any]):
    """One row per (setup, gradient checkpointing): setup, gpus, tokens_per_gpu (one step's tokens per GPU), the
    runs' tokens/s per GPU (runs, median, low, high = the slowest and fastest run), ratio_low / ratio / ratio_high
    (against the median of one GPU's runs with the same checkpointing: those of FSDP2 on a mesh of one, the program
    of a mesh rank, where the data hold them), peak_memory_gib, conditions, revision (the data's)."""
    import pandas as pd

    rows = []
    conditions = data.get("conditions") or {}
    for name, reports in data["runs"].items():
        dp, cp, label = _setup(reports[0])
        for checkpointing in (False, True):
            measured = [row for report in reports for row in report.get("throughput") or []
                        if bool(row["gradient_checkpointing"]) is checkpointing and "tokens_per_s_per_gpu" in row]
            if not measured:
                continue
            speeds = [float(row["tokens_per_s_per_gpu"]) for row in measured]
            rows.append({"setup": label, "gpus": dp * cp, "data_parallel": dp, "context_parallel": cp,
                         "revision": str(data.get("revision") or ""),
                         "tokens_per_gpu": measured[0]["seq_len"] // cp * (measured[0]["batch_size"] // dp),
                         "gradient_checkpointing": checkpointing, "runs": len(speeds), "tokens_per_s_per_gpu": speeds,
                         "median": statistics.median(speeds), "low": min(speeds), "high": max(speeds),
                         "peak_memory_gib": max(float(row.get("peak_memory_gib") or 0.0) for row in measured),
                         "conditions": conditions.get(name, "")})
    table = pd.DataFrame(rows)
    if not len(table):
        return table
    ones = table[table["gpus"] == 1]
    same_program = ones[ones["setup"].str.contains("FSDP2")]  # a mesh rank's program on one GPU, where measured
    one = (same_program if len(same_program) else ones).set_index("gradient_checkpointing")["median"].to_dict()
    for column, source in (("ratio_low", "low"), ("ratio", "median"), ("ratio_high", "high")):
        table[column] = [row[source] / one[row["gradient_checkpointing"]] if row["gradient_checkpointing"] in one
                         else float("nan") for row in table.to_dict(orient="records")]
    return table.sort_values(["gradient_checkpointing", "gpus", "context_parallel"]).reset_index(drop=True)


def scaling_sections(metrics: Mapping[str, Any]):
    """([Section], [finding]) of the recorded "scaling" table (nothing when it is absent or empty). Runs of a
    revision before provenance.TRAIN_STEP_CODE go under the older-code label and give no finding."""
    from hilbert_lab.reports.page import Section, fmt, metrics_table
    from hilbert_lab.reports.provenance import TRAIN_STEP_CODE, older_code_of_revision
    from hilbert_lab.viz.training import scaling_bars

    table = metrics_table(metrics, "scaling")
    if not len(table):
        return [], []
    revisions = [text for text in dict.fromkeys(table.get("revision", [])) if text and text != "nan"]
    older = next((label for label in (older_code_of_revision(text, since=TRAIN_STEP_CODE) for text in revisions)
                  if label), "")
    plain = table[~table["gradient_checkpointing"].astype(bool)]
    several = plain[plain["gpus"] > 1]
    verdicts = []
    for gpus in sorted(set(several["gpus"])):
        rows = several[several["gpus"] == gpus].to_dict(orient="records")
        met = all(row["ratio_low"] >= SCALING_TARGET for row in rows)
        verdicts.append(f"{gpus} GPUs: " + ", ".join(
            f"{row['setup']} {row['ratio_low']:.2f}-{row['ratio_high']:.2f}x" for row in rows)
            + (" (target met in every run)" if met else f" (below the {SCALING_TARGET:.2f} target)"))
    tokens = fmt(int(table["tokens_per_gpu"].iloc[0]))
    shared = len(set(plain["conditions"])) > 1
    finding = (f"Tokens/s per GPU against one GPU at {tokens} tokens per GPU per step, without gradient checkpointing, "
               f"slowest to fastest of {int(plain['runs'].min())} runs: " + "; ".join(verdicts) + "."
               + (" The setups ran under different conditions (see the scaling section)." if shared else ""))
    shown = table.assign(**{
        "tokens/s per GPU: median [slowest, fastest run]": [f"{fmt(r['median'])} [{fmt(r['low'])}, {fmt(r['high'])}]"
                                                            for r in table.to_dict("records")],
        "against one GPU's median": [f"{r['ratio']:.3f} [{r['ratio_low']:.3f}, {r['ratio_high']:.3f}]"
                            for r in table.to_dict("records")]})
    shown = shown[["setup", "gpus", "gradient_checkpointing", "tokens/s per GPU: median [slowest, fastest run]",
                   "against one GPU's median", "peak_memory_gib", "conditions"]].rename(
        columns={"gradient_checkpointing": "gradient checkpointing", "peak_memory_gib": "peak memory (GiB)"})
    text = ("Each setup trains the same model at the same tokens per GPU per step, so equal bars mean perfect "
            "scaling. The bar is the median run; the whiskers are the slowest and fastest runs. The dashed line is "
            f"the {SCALING_TARGET:.2f} target. The conditions column says which runs shared the machine with "
            "other work. A mesh rank trains under FSDP2's mixed precision (bf16 compute copies). One GPU trains "
            "under torch.autocast with float32 weights, a different program, unless its setup says FSDP2 on a mesh "
            "of one; where that setup was measured, the ratios are against it.")
    heading = "Scaling over GPUs: tokens/s per GPU" + (f": {older}" if older else "")
    if older:  # the step then made the host wait for its backward: a figure of the code before, quoted by no finding
        text = (f"{older[0].upper() + older[1:]}, before the training step stopped making the host wait for its "
                f"backward ({TRAIN_STEP_CODE[:7]}): {finding} " + text)
    return [Section(heading, text, figure=scaling_bars(table.to_dict("records"), target=SCALING_TARGET),
                    table=shown)], [] if older else [finding]
