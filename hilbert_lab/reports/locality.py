"""The locality report's page: figures and conclusions rebuilt from its compare_orderings table."""
from __future__ import annotations

from typing import Any

# metric -> (axis title with unit and direction, what it measures, short name, parameter name)
METRICS = {
    "step_mean": ("grid steps (lower is better)", "Mean distance on the grid between cells that are consecutive "
                  "in the ordering.", "mean step", ""),
    "clustering_mean": ("runs per box (lower is better)", "Contiguous runs of sequence indices a square query "
                        "box splits into (fewer runs = fewer separate memory ranges).", "runs per box", "box"),
    "lines_per_box_mean": ("cache lines (lower is better)", "Cache lines of K/V rows touched by one query box.",
                           "lines per box", "box"),
    "tile_nonempty_share": ("share of tiles (lower is better)", "Share of attention tiles (query x key blocks) "
                            "holding any allowed pair: tiles a block-sparse kernel must visit.",
                            "non-empty tile share", "tile"),
}
BASELINES = ("rowmajor", "identity")


def _baseline(orderings: list[str]) -> str | None:
    return next((name for name in BASELINES if name in orderings), None)


def _best_line(frame: Any, label: str) -> str:
    """'<configuration>: hilbert lowest (1.02 vs rowmajor 1.91, 47% lower)' for each configuration."""
    from hilbert_lab.reports.page import fmt

    parts = []
    for configuration, group in frame.groupby("configuration", sort=False):
        values = dict(zip(group["ordering"], group["value"].astype(float)))
        low = min(values.values())
        if len(set(values.values())) == 1:
            parts.append(f"{configuration}: all orderings equal ({fmt(low)})")
            continue
        winners = [name for name, value in values.items() if value == low]
        best = winners[0]
        base = _baseline(list(values))
        text = f"{configuration}: {' = '.join(winners)} lowest ({fmt(values[best])}"
        if base and base not in winners and values[base]:
            text += f" vs {base} {fmt(values[base])}, {100 * (1 - values[best] / values[base]):.0f}% lower"
        elif base in winners:
            text += f"; the {base} baseline is among the lowest"
        parts.append(text + ")")
    return f"{label}: " + "; ".join(parts) + "."


def render(metrics: dict[str, Any], env: dict[str, Any]) -> Any:
    """Locality page: bars per metric (one figure per box / tile size), miss curves per trace."""
    import pandas as pd

    from hilbert_lab.reports.page import Page, Section, style_axes
    from hilbert_lab.viz.locality import metric_bars, miss_curves_from_table

    entry = (metrics.get("tables") or {}).get("compare_orderings") or {}
    table = pd.DataFrame(entry.get("rows") or [], columns=entry.get("columns"))
    sections, bullets = [], []
    for metric, (axis, meaning, short, parameter_name) in METRICS.items():
        rows = table[table["metric"] == metric]
        if rows.empty:
            continue
        parameters = [None] if rows["parameter"].isna().all() else sorted(int(p) for p in rows["parameter"].dropna().unique())
        for parameter in parameters:
            subset = rows if parameter is None else rows[rows["parameter"] == parameter]
            suffix = "" if parameter is None else f", {parameter_name} {parameter}"
            fig = metric_bars(table, metric, parameter=parameter, title=f"{short} per ordering{suffix}")
            style_axes(fig, "ordering", axis)
            fig.update_layout(height=380)
            conclusion = _best_line(subset, f"{short}{suffix}")
            sections.append(Section(f"{short.capitalize()}{suffix}", conclusion, figure=fig, text=[meaning]))
            if len(bullets) < 3:
                bullets.append(conclusion)
    misses = table[table["metric"] == "misses"]
    for configuration in misses["configuration"].unique():
        rows = misses[misses["configuration"] == configuration]
        fig = miss_curves_from_table(table, configuration, title=f"LRU misses: {configuration}")
        style_axes(fig, "cache capacity (lines, log scale)", "LRU misses (lower is better)",
                   sorted(int(p) for p in rows["parameter"].unique()))
        fig.update_layout(height=380)
        capacities = sorted(int(p) for p in rows["parameter"].unique())
        lines = [_best_line(rows[rows["parameter"] == capacity], f"at {capacity:,} lines")
                 .replace(f"{configuration}: ", "", 1).rstrip(".") for capacity in capacities]
        conclusion = "; ".join(lines) + "."
        conclusion = conclusion[0].upper() + conclusion[1:]
        sections.append(Section(f"Miss curve: {configuration}", conclusion, figure=fig))
    orderings = list(dict.fromkeys(table["ordering"]))
    summary = (f"Geometric and cache locality of {len(orderings)} token orderings ({', '.join(orderings)}) over "
               f"{table['configuration'].nunique()} configurations: step lengths, index runs and cache lines per "
               "query box, tile density of dilated masks and LRU misses of flash-style K/V traces. An ordering "
               "only moves rows in memory: the attention computed is the same. Counts are exact (no timing).")
    display = table[["family", "configuration", "ordering", "metric", "parameter", "value"]]
    sections.append(Section("Every metric", table=display, caption="compare_orderings, tidy (one row per value)"))
    headline = bullets[0] if bullets else f"{len(table)} locality values"
    return Page(title="Locality: how token orderings place attention's work in memory", summary=summary,
                headline=headline, sections=sections, bullets=bullets)
