"""The retrieval grids of the training report (benchmarks/train_retrieval_grid.py JSON): loading, tables, and
the page's sections (accuracy against attention FLOPs, accuracy per needle distance, the table)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from hilbert_lab.reports.repo_paths import resolve_repo_path

__all__ = ["TARGET_ACCURACY", "TARGET_FRACTION", "TARGET_KEYS", "TARGET_LENGTH", "grid_buckets_table",
           "grid_rows_table", "grid_sections", "load_grids", "main_result", "row_names"]


def load_grids(grids: Mapping[str, str | os.PathLike]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """{label: path} of retrieval-grid JSONs (benchmarks/train_retrieval_grid.py) -> ({label: grid}, missing),
    where missing lists "label (path)" of the files that do not exist yet (the GPU grid comes later).
    ValueError naming the path for a file that exists but is not such a grid."""
    import json

    loaded, missing = {}, []
    for label, path in grids.items():
        resolved = resolve_repo_path(path)
        if not resolved.is_file():
            missing.append(f"{label} ({path})")
            continue
        try:
            grid = json.loads(resolved.read_text())
        except json.JSONDecodeError as error:
            raise ValueError(f"retrieval grid {str(resolved)!r} is not JSON: {error}") from None
        if not isinstance(grid, dict) or grid.get("kind") != "retrieval_grid" or not isinstance(grid.get("rows"), dict):
            raise ValueError(f"retrieval grid {str(resolved)!r} must be a JSON object with kind 'retrieval_grid' and rows")
        loaded[label] = {**grid, "source": str(resolved)}
    return loaded, missing


def grid_rows_table(grids: Mapping[str, Mapping[str, Any]]):
    """One row per (grid, row): pattern, heads, attention FLOPs per token (and relative to the grid's reference
    config, run or not, else to its most expensive row), curriculum (seq_len:until_step, ...), largest keys per
    query (w/r), pooled accuracy with its Wilson 95% interval, the accuracy of each seed (run_accuracies), seeds,
    answers, chance, tokens/s, and where the grid ran (device, revision, recorded, command)."""
    import pandas as pd

    from hilbert_lab.reports.provenance import document_source

    columns = ["grid", "row", "segment_lengths", "dilation_rates", "num_heads", "seq_len", "steps", "curriculum",
               "flops_per_token", "flops_fraction", "max_keys_per_query", "spans_sequence", "accuracy",
               "accuracy_low", "accuracy_high", "run_accuracies", "seeds", "count", "chance_accuracy", "tokens_per_s",
               "device", "revision", "recorded", "command"]
    rows = []
    for label, grid in grids.items():
        origin = document_source(grid, grid.get("source"), label)
        top = max((row["attention"]["flops_per_token"] for row in grid["rows"].values()), default=None)
        top = grid.get("reference", {}).get("attention", {}).get("flops_per_token", top)
        for name, row in grid["rows"].items():
            attention, pooled = row["attention"], row["pooled"]
            rows.append({
                "grid": label, "row": name, "segment_lengths": ",".join(map(str, row["segment_lengths"])),
                "dilation_rates": ",".join(map(str, row["dilation_rates"])), "num_heads": row["num_heads"],
                "seq_len": row["seq_len"], "steps": row["steps"],
                "curriculum": ", ".join(f"{length}:{until}" for length, until in row.get("curriculum") or []),
                "flops_per_token": attention["flops_per_token"],
                "flops_fraction": attention["flops_per_token"] / top if top else None,
                "max_keys_per_query": attention["max_keys_per_query"],
                "spans_sequence": any(b["spans_sequence"] for b in attention["branches"]),
                "accuracy": pooled["accuracy"], "accuracy_low": pooled["accuracy_low"],
                "accuracy_high": pooled["accuracy_high"], "run_accuracies": list(pooled.get("run_accuracies") or []),
                "seeds": pooled["runs"], "count": pooled["count"],
                "chance_accuracy": row["chance_accuracy"], "tokens_per_s": row.get("tokens_per_s"),
                **{key: origin[key] for key in ("device", "revision", "recorded", "command")},
            })
    return pd.DataFrame(rows, columns=columns)


def grid_buckets_table(grids: Mapping[str, Mapping[str, Any]]):
    """Pooled accuracy per needle-distance bucket of every (grid, row): grid, row, distance_low,
    distance_high, count, accuracy, accuracy_low, accuracy_high."""
    import pandas as pd

    columns = ["grid", "row", "distance_low", "distance_high", "count", "accuracy", "accuracy_low", "accuracy_high"]
    rows = [{"grid": label, "row": name, **{key: bucket[key] for key in columns[2:]}}
            for label, grid in grids.items() for name, row in grid["rows"].items()
            for bucket in row.get("pooled_by_distance") or []]
    return pd.DataFrame(rows, columns=columns)


TARGET_ACCURACY, TARGET_KEYS, TARGET_FRACTION, TARGET_LENGTH = 0.9, 4096, 1 / 8, 32768


def row_names(rows: Any) -> dict[str, str]:
    """{row id: name} of a grid's rows, named by their pattern: 'dilated r=8, 32K', 'dense top, 32K', 'local
    only, 32K'; rows of one pattern are told apart by their first curriculum phase ('1K phase to step 1600')."""
    from hilbert_lab.reports.page import tokens

    def pattern(row: Mapping[str, Any]) -> str:
        rate = int(str(row["dilation_rates"]).split(",")[-1])
        kind = ("local only" if not row["spans_sequence"] else "dense top" if rate == 1 else f"dilated r={rate}")
        return f"{kind}, {tokens(row['seq_len'])}"

    def phase(row: Mapping[str, Any]) -> str:
        first = str(row.get("curriculum") or "").split(",")[0].strip()
        if ":" not in first:
            return "no curriculum"
        length, until = first.split(":")
        return f"{tokens(int(length))} phase to step {int(until):,}"

    records = rows.to_dict(orient="records") if hasattr(rows, "to_dict") else list(rows)
    names = {row["row"]: pattern(row) for row in records}
    for name in set(names.values()):
        same = [row for row in records if names[row["row"]] == name]
        if len(same) > 1:
            for row in same:
                names[row["row"]] = f"{name} ({phase(row)})"
    return names


def _reached(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["accuracy_low"] >= TARGET_ACCURACY and r["max_keys_per_query"] <= TARGET_KEYS
            and r["flops_fraction"] <= TARGET_FRACTION and r["seq_len"] >= TARGET_LENGTH]


def main_result(rows: Any) -> dict[str, Any] | None:
    """The grid row that meets the target (95% lower bound >= 90% at >= 32K tokens with w/r <= 4096 and at most
    1/8 of the dense-top config's attention FLOPs) with the highest lower bound, or None."""
    reached = _reached(rows.to_dict(orient="records")) if len(rows) else []
    return max(reached, key=lambda r: r["accuracy_low"]) if reached else None


def _revision(row: Mapping[str, Any]) -> str:
    """', trained at rev 8043871 + uncommitted changes' from a grid row's revision (nothing when not recorded)."""
    text = str(row.get("revision") or "").split(" (")[0]
    return f", trained at rev {text}" if text and not text.startswith(("not recorded", "nan", "None")) else ""


def _seed_spread(row: Mapping[str, Any]) -> str:
    runs = list(row.get("run_accuracies") or [])
    return f", seeds {100 * min(runs):.1f}-{100 * max(runs):.1f}%" if len(runs) > 1 and min(runs) < max(runs) else ""


def seed_contrast(high: Mapping[str, Any], low: Mapping[str, Any]) -> str | None:
    """A sentence when the pooled contrast 'high ahead of low' rests on at most one seed: the seeds of `low` below
    every seed of `high` are what carries it (rows: row, accuracy, accuracy_low, accuracy_high, run_accuracies)."""
    from hilbert_lab.reports.page import percent_interval

    highs, lows = list(high.get("run_accuracies") or []), list(low.get("run_accuracies") or [])
    if len(lows) < 2 or not highs or high["accuracy_low"] <= low["accuracy_high"]:
        return None
    below = [a for a in lows if a < min(highs)]
    if len(below) > 1:
        return None
    seeds = ", ".join(f"{100 * a:.1f}" for a in lows)
    mine = ", ".join(f"{100 * a:.1f}" for a in highs)
    carried = (f"only through one {low['row']} seed ({100 * below[0]:.1f}%)" if below
               else "through no single seed: none of its seeds is below all of the dilated row's")
    return (f"Against {low['row']}: pooled {percent_interval(low['accuracy'], low['accuracy_low'], low['accuracy_high'])}"
            f" with seeds {seeds}%, so {high['row']} (seeds {mine}%) is ahead {carried}; the contrast rests on "
            f"{'one seed' if len(below) == 1 else 'no seed'}.")


def grid_sections(metrics: Mapping[str, Any]):
    """Sections and findings of the retrieval grids: accuracy against attention FLOPs, per distance, the
    table (rows named by pattern, one colour per row in both figures). The first finding of a grid with a
    row meeting the target is its main result."""
    from hilbert_lab.reports.page import Section, fmt, fmt_count, metrics_table, percent_interval, style_axes
    from hilbert_lab.viz.style import run_colours
    from hilbert_lab.viz.training import accuracy_by_distance, accuracy_vs_flops

    rows, buckets, missing = (metrics_table(metrics, name) for name in ("grid_rows", "grid_buckets", "grids_missing"))
    sections, findings = [], []
    for entry in missing.to_dict(orient="records"):
        sections.append(Section(f"Retrieval grid: {entry['grid']}",
                                f"Not run yet: {entry['path']} is absent (benchmarks/train_retrieval_grid.py writes it)."))
    for grid in dict.fromkeys(rows["grid"]) if len(rows) else []:
        mine = rows[rows["grid"] == grid].sort_values("flops_per_token", ascending=False)
        names = row_names(mine)
        records = [{**r, "row": names[r["row"]]} for r in mine.to_dict(orient="records")]
        colours = run_colours([r["row"] for r in records])
        chance = records[0]["chance_accuracy"]
        fig = accuracy_vs_flops(records, chance=chance, colours=colours,
                                title=f"{grid}: accuracy (pooled over seeds, 95% interval) vs attention FLOPs per token")
        style_axes(fig, "attention FLOPs per token (causal forward, all layers; log scale)",
                   "answer accuracy (fraction; higher is better)")
        fig.update_layout(height=440)
        best = max(records, key=lambda r: r["accuracy"])
        reached = _reached(records)
        controls = [r for r in records if not r["spans_sequence"]]
        text = (f"Best: {best['row']} at {percent_interval(best['accuracy'], best['accuracy_low'], best['accuracy_high'])}"
                f" over {fmt(best['count'])} answers{_seed_spread(best)}, with {fmt_count(best['flops_per_token'])} "
                f"attention FLOPs per token ({100 * best['flops_fraction']:.1f}% of the dense-top config's). ")
        if reached:
            top = max(reached, key=lambda r: r["accuracy_low"])
            findings.append(f"Main result: {top['row']} retrieves the needle at "
                            f"{percent_interval(top['accuracy'], top['accuracy_low'], top['accuracy_high'])} over "
                            f"{fmt(top['count'])} answers ({int(top['seeds'])} seeds{_seed_spread(top)}) with "
                            f"{100 * top['flops_fraction']:.1f}% of the dense-top config's attention FLOPs and at most "
                            f"{fmt(top['max_keys_per_query'])} keys per query ({grid}{_revision(top)}).")
            dense = [r for r in records if r["flops_fraction"] >= 0.999 and r is not top]
            contrast = seed_contrast(top, dense[0]) if dense else None
            if contrast:
                findings.append(contrast)
                text += contrast + " "
            text += ("Target met (95% lower bound >= 90%, w/r <= 4096, <= 1/8 of the dense-top config's FLOPs) by "
                     + ", ".join(r["row"] for r in reached) + ". ")
        elif min(r["seq_len"] for r in records) >= TARGET_LENGTH:
            text += ("No row meets the target (95% lower bound >= 90% with w/r <= 4096 at <= 1/8 of the dense-top "
                     "config's FLOPs). ")
        spread = [r for r in records if len(r["run_accuracies"]) > 1
                  and max(r["run_accuracies"]) - min(r["run_accuracies"]) > r["accuracy_high"] - r["accuracy_low"]]
        if spread:
            text += ("Seeds disagree by more than the pooled interval for " + ", ".join(
                f"{r['row']} ({100 * min(r['run_accuracies']):.1f}-{100 * max(r['run_accuracies']):.1f}%)"
                for r in spread) + "; the interval counts answers, not seeds. ")
        if controls:
            control = "; ".join(f"{r['row']} {percent_interval(r['accuracy'], r['accuracy_low'], r['accuracy_high'])}"
                                for r in controls)
            text += f"Without a whole-sequence branch: {control} (chance {100 * chance:.1f}%)."
            if reached:
                findings.append(f"The control without a whole-sequence branch stays at chance: {control} against "
                                f"{100 * chance:.1f}% ({grid}).")
        if not reached:
            findings.append(f"{grid}: " + text.split(". ")[0] + ".")
        sections.append(Section(f"{grid}: accuracy against attention compute", text.strip(), figure=fig))
        mine_buckets = buckets[buckets["grid"] == grid] if len(buckets) else buckets
        if len(mine_buckets):
            named = [{**b, "row": names.get(b["row"], b["row"])} for b in mine_buckets.to_dict(orient="records")]
            fig = accuracy_by_distance(named, chance=chance, colours=colours,
                                       title=f"{grid}: accuracy per needle-to-query distance (pooled over seeds)")
            style_axes(fig, "needle-to-query distance (tokens)", "answer accuracy (fraction; higher is better)")
            fig.update_layout(height=420)
            far = sorted(named, key=lambda b: b["distance_low"])
            farthest = far[-1]["distance_low"]
            last = sorted((b for b in far if b["distance_low"] == farthest), key=lambda b: -b["accuracy"])
            conclusion = (f"At the farthest distances ({fmt(farthest)} tokens or more): " + ", ".join(
                f"{b['row']} {percent_interval(b['accuracy'], b['accuracy_low'], b['accuracy_high'])}"
                for b in last[:4]) + (f"; {len(last) - 4} more rows in the figure" if len(last) > 4 else "") + ".")
            sections.append(Section(f"{grid}: accuracy per needle distance", conclusion, figure=fig, collapsed=True))
        steps, lengths = sorted(set(mine["steps"])), sorted(set(mine["seq_len"]))
        shown = mine.assign(
            pattern=[names[r] for r in mine["row"]],
            curriculum=[", ".join(f"{p.split(':')[0]} to {p.split(':')[1]}" for p in str(c).split(", ") if ":" in p)
                        for c in mine["curriculum"]],
            flops=[fmt_count(v) for v in mine["flops_per_token"]],
            share=[f"{100 * v:.1f}%" for v in mine["flops_fraction"]],
            accuracy_text=[percent_interval(a, lo, hi) for a, lo, hi in
                           zip(mine["accuracy"], mine["accuracy_low"], mine["accuracy_high"])],
            seeds_text=[", ".join(f"{100 * a:.1f}" for a in runs) for runs in mine["run_accuracies"]],
            speed=[fmt_count(v) for v in mine["tokens_per_s"]])
        shown = shown[["pattern", "segment_lengths", "dilation_rates", "num_heads", "curriculum", "flops", "share",
                       "accuracy_text", "seeds_text", "count", "speed"]].rename(columns={
            "segment_lengths": "segments", "dilation_rates": "dilations", "num_heads": "heads",
            "curriculum": "curriculum (length to step)", "flops": "attention FLOPs/token", "share": "of dense top",
            "accuracy_text": "accuracy [95%]", "seeds_text": "per seed (%)", "count": "answers", "speed": "tokens/s"})
        sections.append(Section(f"{grid}: every row", table=shown, collapsed=True,
                                caption=f"{'/'.join(map(fmt, lengths))} tokens, {'/'.join(map(fmt, steps))} steps, "
                                        f"chance {100 * chance:.1f}%; accuracy pooled over the seeds' final evals "
                                        "(Wilson 95% interval over all answers: it does not include the spread between "
                                        "seeds, shown per seed); attention FLOPs per token = depth x 4 x head_dim x "
                                        "causal query-key pairs of the plan / N"))
    return sections, findings
