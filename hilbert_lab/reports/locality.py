"""The locality report's page: findings and figures rebuilt from its compare_orderings table.

The counts are exact (no timing). The headline is the LRU miss count of window attention over 2D / 3D grids,
the effect a kernel would see; a metric on which every ordering is equal is said in one sentence instead of
a chart of equal bars.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# metric -> (axis title with unit and direction, what it measures, name, parameter name)
METRICS = {
    "clustering_mean": ("index runs per box (lower is better)", "Contiguous runs of sequence indices a square "
                        "query box splits into (fewer runs = fewer separate memory ranges).", "index runs per query box",
                        "box"),
    "lines_per_box_mean": ("cache lines (lower is better)", "Cache lines of K/V rows touched by one query box.",
                           "cache lines per query box", "box"),
    "tile_nonempty_share": ("share of tiles (lower is better)", "Share of attention tiles (query x key blocks) "
                            "holding any allowed pair: tiles a block-sparse kernel must visit.",
                            "non-empty attention tiles", "tile"),
    "step_mean": ("grid steps (lower is better)", "Mean distance on the grid between cells that are consecutive "
                  "in the ordering (1 for any curve that moves to a neighbour at each step).", "mean step", ""),
}
NAMES = {"step_mean": "mean step", "step_max": "largest step", "stretch_max": "worst-case stretch",
         "compactness_aligned": "neighbour pairs in one segment (aligned)",
         "compactness_shifted": "neighbour pairs in one segment (shifted)", "clustering_mean": "index runs per box",
         "clustering_max": "most index runs in a box", "lines_per_box_mean": "cache lines per box",
         "tiles_per_box_mean": "tiles per box", "tile_nonempty_share": "share of non-empty tiles",
         "tile_mean_density": "fill of non-empty tiles", "misses": "LRU misses", "line_accesses": "cache-line accesses",
         "distinct_lines": "distinct cache lines", "rows_needed": "K/V rows needed", "rows_loaded": "K/V rows loaded"}
BASELINES = ("rowmajor", "identity")


def _name(ordering: str) -> str:
    from hilbert_lab.viz.style import ordering_name

    return ordering_name(ordering)


def _baseline(orderings: list[str]) -> str | None:
    return next((name for name in BASELINES if name in orderings), None)


def _compare(values: dict[str, float]) -> dict[str, Any] | None:
    """Best orderings (ties), the baseline and the relative gap; None when every ordering is equal."""
    low = min(values.values())
    if len(set(values.values())) == 1:
        return None
    base = _baseline(list(values))
    winners = [name for name, value in values.items() if value == low]
    gap = 1 - low / values[base] if base and values[base] else None
    return {"best": winners, "low": low, "base": base, "base_value": values.get(base), "gap": gap}


def _line(frame: Any, label: str) -> tuple[str, bool]:
    """('<label>: <configuration>: hilbert lowest (1.02 vs row-major 1.91, 47% lower); ...', all equal)."""
    from hilbert_lab.reports.page import fmt

    parts, flat = [], True
    for configuration, group in frame.groupby("configuration", sort=False):
        values = dict(zip(group["ordering"], group["value"].astype(float)))
        found = _compare(values)
        if found is None:
            parts.append(f"{configuration}: every ordering {fmt(min(values.values()))}")
            continue
        flat = False
        text = f"{configuration}: {' = '.join(map(_name, found['best']))} lowest ({fmt(found['low'])}"
        if found["base"] and found["base"] not in found["best"]:
            text += f" vs {_name(found['base'])} {fmt(found['base_value'])}, {100 * found['gap']:.0f}% fewer"
        elif found["base"]:
            text += f"; {_name(found['base'])} among the lowest"
        parts.append(text + ")")
    return f"{label}: " + "; ".join(parts) + ".", flat


def miss_findings(table: Any) -> list[dict[str, Any]]:
    """Per (configuration, capacity) of the misses rows: best ordering vs the baseline, largest gap first."""
    out = []
    misses = table[table["metric"] == "misses"]
    for (configuration, capacity), rows in misses.groupby(["configuration", "parameter"], sort=False):
        found = _compare(dict(zip(rows["ordering"], rows["value"].astype(float))))
        if found and found["gap"] and found["base"] not in found["best"]:
            out.append({"configuration": configuration, "capacity": int(capacity),
                        "family": rows["family"].iloc[0], **found})
    return sorted(out, key=lambda item: -item["gap"])


def miss_losses(table: Any) -> list[dict[str, Any]]:
    """Per (configuration, capacity) of the misses rows: every ordering with more misses than the baseline there
    (ordering, value, base, base_value, excess = value / base_value - 1), largest excess first."""
    out = []
    misses = table[table["metric"] == "misses"]
    for (configuration, capacity), rows in misses.groupby(["configuration", "parameter"], sort=False):
        values = dict(zip(rows["ordering"], rows["value"].astype(float)))
        base = _baseline(list(values))
        if not base or not values[base]:
            continue
        for ordering, value in values.items():
            if ordering != base and value > values[base]:
                out.append({"configuration": configuration, "capacity": int(capacity), "ordering": ordering,
                            "value": value, "base": base, "base_value": values[base],
                            "excess": value / values[base] - 1, "family": rows["family"].iloc[0]})
    return sorted(out, key=lambda item: -item["excess"])


def _loss_sentence(losses: list[dict[str, Any]], total: int, winners: Sequence[str] = ()) -> str:
    """Where an ordering loses to the baseline: the largest loss of the first winner that has one (the ordering
    the page's first finding praises), else the largest of any, and at how many points it loses."""
    from hilbert_lab.reports.page import fmt

    mine = next(([item for item in losses if item["ordering"] == name] for name in winners
                 if any(item["ordering"] == name for item in losses)), losses)
    worst = mine[0]
    who = _name(worst["ordering"]) if mine is not losses else "an ordering"
    points = len({(item["configuration"], item["capacity"]) for item in mine})
    return (f"Where {who} loses: {_name(worst['ordering'])} has {100 * worst['excess']:.0f}% more LRU misses than "
            f"{_name(worst['base'])} ({fmt(worst['value'])} vs {fmt(worst['base_value'])}) for "
            f"{_configuration(worst['configuration'])} at a {worst['capacity']:,}-line cache; "
            f"{'it has' if mine is not losses else 'some ordering has'} more misses than {_name(worst['base'])} at "
            f"{points} of {total} (configuration, cache) points.")


def _configuration(text: str) -> str:
    """'32x32, window 8, tile 64, gather, 128 B rows' -> 'window-8 attention on a 32x32 grid (tile 64, gather,
    128 B rows)'; 'N=4096, w=1024, r=4, tile 64, ...' -> 'the dilated pattern N=4096, w=1024, r=4 (tile 64, ...)'."""
    parts = str(text).split(", ")
    if len(parts) > 2 and parts[1].startswith("window "):
        return f"window-{parts[1].split()[1]} attention on a {parts[0]} grid ({', '.join(parts[2:])})"
    if parts[0].startswith("N=") and len(parts) > 3:
        return f"the dilated pattern {', '.join(parts[:3])} ({', '.join(parts[3:])})"
    return str(text)


def _miss_sentence(item: dict[str, Any], note: str = "") -> str:
    from hilbert_lab.reports.page import fmt

    best = " = ".join(map(_name, item["best"]))
    return (f"{best[0].upper() + best[1:]} has {100 * item['gap']:.0f}% fewer LRU misses than "
            f"{_name(item['base'])} ({fmt(item['low'])} vs {fmt(item['base_value'])}) for "
            f"{_configuration(item['configuration'])} at a {item['capacity']:,}-line cache{note}.")


def render(metrics: dict[str, Any], env: dict[str, Any]) -> Any:
    """Locality page: findings (misses, index runs, what is equal), miss curves per trace, the metrics that
    differ as bar charts, every value behind a closed section with human names."""
    import pandas as pd

    from hilbert_lab.reports.page import Page, Section, style_axes
    from hilbert_lab.viz.locality import metric_bars, miss_curves_from_table

    entry = (metrics.get("tables") or {}).get("compare_orderings") or {}
    table = pd.DataFrame(entry.get("rows") or [], columns=entry.get("columns"))
    sections, findings, flat_lines = [], [], []
    grids = [item for item in miss_findings(table) if item["family"].startswith("grid")]
    sequences = [item for item in miss_findings(table) if not item["family"].startswith("grid")]
    if grids:
        findings.append(_miss_sentence(grids[0]))
    misses = table[table["metric"] == "misses"]
    losses = miss_losses(table)
    if losses:
        findings.append(_loss_sentence(losses, len(misses.groupby(["configuration", "parameter"])),
                                       grids[0]["best"] if grids else ()))
    if sequences:
        findings.append(_miss_sentence(sequences[0], " (a layout of the 1D pattern, not a curve)"))
    for configuration in misses["configuration"].unique():
        rows = misses[misses["configuration"] == configuration]
        capacities = sorted(int(p) for p in rows["parameter"].unique())
        fig = miss_curves_from_table(table, configuration, title=f"LRU misses: {configuration}")
        style_axes(fig, "cache capacity (lines, log scale)", "LRU misses (lower is better)", capacities)
        fig.update_layout(height=360)
        parts = [_line(rows[rows["parameter"] == capacity], f"at {capacity:,} lines")[0]
                 .replace(f"{configuration}: ", "", 1).rstrip(".") for capacity in capacities]
        conclusion = "; ".join(parts) + "."
        sections.append(Section(f"Miss curve: {configuration}", conclusion[0].upper() + conclusion[1:], figure=fig))
    for metric, (axis, meaning, short, parameter_name) in METRICS.items():
        rows = table[table["metric"] == metric]
        if rows.empty:
            continue
        parameters = [None] if rows["parameter"].isna().all() else sorted(int(p) for p in rows["parameter"].dropna().unique())
        for parameter in parameters:
            subset = rows if parameter is None else rows[rows["parameter"] == parameter]
            suffix = "" if parameter is None else f", {parameter_name} {parameter}"
            conclusion, flat = _line(subset, f"{short.capitalize()}{suffix}")
            if flat:
                flat_lines.append((short, parameter_name, parameter))
                continue
            fig = metric_bars(table, metric, parameter=parameter, title=f"{short} per ordering{suffix}")
            style_axes(fig, "ordering", axis)
            fig.update_layout(height=340)
            sections.append(Section(f"{short.capitalize()}{suffix}", conclusion, figure=fig, text=[meaning],
                                    collapsed=metric == "step_mean"))
            if metric == "clustering_mean" and len(findings) < 3:
                findings.append(conclusion)
    if flat_lines:
        named = []
        for short in dict.fromkeys(line[0] for line in flat_lines):
            values = [str(p) for s_, _n, p in flat_lines if s_ == short and p is not None]
            kind = next(n for s_, n, _p in flat_lines if s_ == short)
            named.append(short + (f" ({kind}{'es' if len(values) > 1 and kind == 'box' else ''} "
                                  f"{' and '.join(values)})" if values else ""))
        sentence = (f"Every ordering gives the same {' and '.join(named)} in every configuration (a box touches the "
                    "same rows whatever their order, and one K/V row fills one cache line here), so those counts do "
                    "not separate the orderings.")
        findings.append(sentence)
        sections.append(Section("What no ordering changes", sentence))
    equal_large = [f"{int(c):,}" for c in sorted(misses["parameter"].unique())
                   if all(_compare(dict(zip(g["ordering"], g["value"]))) is None
                          for _k, g in misses[misses["parameter"] == c].groupby("configuration"))]
    if equal_large:
        findings.append(f"At a {', '.join(equal_large)}-line cache every ordering has the same misses in every "
                        "configuration: each K/V line is loaded once, so layout only matters for smaller caches.")
    orderings = list(dict.fromkeys(table["ordering"]))
    about = (f"Exact cache and geometric locality of {len(orderings)} token orderings "
             f"({', '.join(map(_name, orderings))}) over {table['configuration'].nunique()} configurations: LRU misses "
             "of flash-style K/V traces, index runs and cache lines per query box, tile density of dilated masks. An "
             "ordering only moves rows in memory: the attention computed is the same. Counts, not timings.")
    display = table.assign(metric=table["metric"].map(lambda m: NAMES.get(m, m.replace("_", " "))),
                           ordering=table["ordering"].map(_name))[["configuration", "ordering", "metric", "parameter",
                                                                    "value"]]
    sections.append(Section("Every metric", table=display.rename(columns={"parameter": "box, tile or cache lines"}),
                            collapsed=True, caption=f"{len(display)} values: every metric, ordering and configuration"))
    return Page(title="Locality: how token orderings place attention's work in memory", findings=findings[:5],
                about=about, sections=sections)
