"""The benchmark page's section on `auto`'s measured table: per cell of a committed check
(benchmarks/bench_auto_table.py: bench.auto_table.check_auto_table on a GPU), the executor auto picked, its time
by name over the fastest executor's (the choice), and auto's own time over it (the choice and its host time)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hilbert_lab.reports.repo_paths import load_committed_json, resolve_repo_path

__all__ = ["AUTO_TOLERANCE", "auto_check_sections", "auto_check_source", "auto_check_table", "load_auto_check"]

AUTO_TOLERANCE = 1.03  # auto within 3% of the fastest executor


def load_auto_check(path: str) -> dict[str, Any] | None:
    """The check JSON at `path` (resolved against the repository root), or None when it is absent."""
    return load_committed_json(path, "rows", list, "auto check",
                               "[row, ...] (bench.auto_table.check_auto_table)")


def auto_check_table(data: Mapping[str, Any]):
    """One row per cell: mode, causal, batch, seq_len, head_dim, training, ragged, auto_picks, fastest, picked_ms,
    fastest_ms, auto_ms, picked_over_fastest, auto_over_fastest."""
    import pandas as pd

    rows = []
    for row in data["rows"]:
        times = {name: float(value) for name, value in row["times_ms"].items() if name != "auto"}
        if not times or row["auto_picks"] not in times or "auto" not in row["times_ms"]:
            continue
        fastest = min(times, key=times.get)
        rows.append({key: row[key] for key in ("mode", "causal", "seq_len", "head_dim", "training", "ragged",
                                               "auto_picks")}
                    | {"batch": int(row.get("batch", 1)), "fastest": fastest, "picked_ms": times[row["auto_picks"]], "fastest_ms": times[fastest],
                       "auto_ms": float(row["times_ms"]["auto"]),
                       "picked_over_fastest": times[row["auto_picks"]] / times[fastest],
                       "auto_over_fastest": float(row["times_ms"]["auto"]) / times[fastest]})
    return pd.DataFrame(rows)


def auto_check_source(data: Mapping[str, Any], path: str) -> dict[str, str]:
    """The page's source row (provenance.SOURCE_FIELDS) of the committed check."""
    from hilbert_lab.reports.provenance import document_source

    return document_source(data, resolve_repo_path(path), "auto's measured table, checked (bench_auto_table.py)")


def auto_check_sections(metrics: Mapping[str, Any]):
    """([Section], [finding], [source row]) of the recorded "auto_check" table and its "auto_check_source"
    (nothing when absent)."""
    from hilbert_lab.reports.page import Section, metrics_table
    from hilbert_lab.viz.backends import auto_choice_heatmap

    table = metrics_table(metrics, "auto_check")
    if not len(table):
        return [], [], []
    sources = metrics_table(metrics, "auto_check_source").to_dict("records")
    source = (sources or [{}])[0]
    where = f"{source.get('device', 'a GPU')}, rev {source.get('revision', '?')}"
    picked, auto = table["picked_over_fastest"], table["auto_over_fastest"]
    worst = table.loc[picked.idxmax()]
    worst_text = "every pick the fastest of its cell" if picked.max() <= 1.0 else (
        f"worst {picked.max():.2f}x: {worst['mode']} {'causal' if worst['causal'] else 'full'} B{int(worst['batch'])} "
        f"D{int(worst['head_dim'])} {'fwd+bwd' if worst['training'] else 'fwd'} at N {int(worst['seq_len']):,}")
    finding = (f"auto's measured table ({where}): its pick, timed by name, is within "
               f"{(AUTO_TOLERANCE - 1) * 100:.0f}% of the fastest executor in {int((picked <= AUTO_TOLERANCE).sum())} "
               f"of {len(table)} cells ({worst_text}); auto itself, the host time of its choice included, in "
               f"{int((auto <= AUTO_TOLERANCE).sum())} (median {auto.median():.2f}x).")
    batches = " and ".join(str(b) for b in sorted(set(table["batch"])))
    text = (f"Each cell times auto beside every executor it can pick, round-robin in one process (B {batches}, H 12, "
            "bf16, w [2048, 4096, 8192], r [1, 2, 4]). The colour is the time of the executor auto picked, called by name, "
            "over the fastest executor's: the quality of the choice alone. Where executors are within noise of each "
            "other the fastest changes from run to run.")
    shown = table.assign(direction=["fwd+bwd" if value else "fwd" for value in table["training"]])[
        ["mode", "causal", "batch", "seq_len", "head_dim", "direction", "ragged", "auto_picks", "fastest", "picked_ms",
         "fastest_ms", "auto_ms", "picked_over_fastest", "auto_over_fastest"]].rename(columns={
            "batch": "B", "seq_len": "N", "head_dim": "D", "auto_picks": "auto picks", "picked_ms": "pick (ms)",
            "fastest_ms": "fastest (ms)", "auto_ms": "auto (ms)", "picked_over_fastest": "pick / fastest",
            "auto_over_fastest": "auto / fastest"})
    return [Section("auto's measured table: its pick against the fastest executor", finding,
                    figure=auto_choice_heatmap(table.to_dict("records")), text=[text]),
            Section("auto's measured table: every cell", "", table=shown, collapsed=True)], [finding], sources
