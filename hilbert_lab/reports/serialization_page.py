"""The serialization page: a pure function of a serialization run's metrics.json and env.json
(reports.render): trained ranking with intervals, the attention windows, exact locality per ordering and
setting, which ordering to use. Its data and verdicts come from reports.serialization.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hilbert_lab.reports.serialization import (
    KEY_METRICS, MEANINGFUL, METRIC_NAMES, _locality_line, _names, _setting, _trained_verdicts, conclusion_paragraphs,
    locality_verdicts, losses,
)


def _table(metrics: Mapping[str, Any], name: str):
    from hilbert_lab.reports.page import metrics_table

    return metrics_table(metrics, name)


def _pivot(table: Any, metric: str):
    """Rows (data, ordering by its display name), columns = settings in table order, cells = metric rounded to 3
    decimals."""
    from hilbert_lab.viz.style import ordering_name

    frame = table.assign(setting=[_setting(s, r) for s, r in zip(table["segment_lengths"], table["dilation_rates"])],
                         ordering=table["ordering"].map(ordering_name))
    settings = list(dict.fromkeys(frame["setting"]))
    pivot = frame.pivot_table(index=["data", "ordering"], columns="setting", values=metric, sort=False)
    pivot = pivot[settings].round(3).reset_index()
    pivot.columns.name = None
    return pivot


def _windows_section(parameters: Mapping[str, Any]):
    import numpy as np

    from hilbert_lab.reports.page import Section, fmt
    from hilbert_lab.viz.serialization import setting_label, window_groups, windows_grid_figure
    from hilbert_lab.viz.style import ordering_name

    examples = parameters.get("window_examples") or []
    if not examples:
        return None
    lines = []
    for side, ordering, segment, dilation in examples:
        groups = window_groups((side, side), ordering, segment, dilation)
        extents, diameters = [], []
        for group in np.unique(groups):
            ys, xs = np.nonzero(groups == group)
            extents.append((ys.max() - ys.min() + 1, xs.max() - xs.min() + 1))
            diameters.append(float(np.sqrt(((ys[:, None] - ys) ** 2 + (xs[:, None] - xs) ** 2).max())))
        height, width = max(set(extents), key=extents.count)
        lines.append(f"{ordering_name(ordering)} {setting_label([segment], [dilation])}: mostly {height} x {width} boxes, "
                     f"diameter {fmt(float(np.mean(diameters)))} cells")
    side = examples[0][0]
    conclusion = f"Attention groups on a {side} x {side} grid: " + "; ".join(lines) + "."
    figure = windows_grid_figure(examples)
    return Section("The attention windows on the grid", conclusion, figure=figure,
                   text=["Each colour is one attention group (a segment, and within it one dilation offset); the grey "
                         "line is the serialization. Groups are drawn by their bounding box height x width."])


def _by_data(verdicts: Sequence[Mapping[str, Any]], key: str, short: bool = False) -> str:
    """'2D 48x48 image, window 64: V; window 256: V; 3D ..., window 64: V' (the data named once per run of tasks)."""
    parts, previous = [], None
    for verdict in verdicts:
        text = verdict[key]
        if short:
            text = text.split(" (95%")[0].split(" (all 95%")[0]
            text = "no difference" if text.startswith("no difference") else text
        window = f"window {verdict['window']}" if verdict["window"] else verdict["task"]
        parts.append((window if verdict["data"] == previous else f"{verdict['data']}, {window}") + ": " + text)
        previous = verdict["data"]
    return "; ".join(parts)


def _sources(runs: Any) -> list[dict[str, str]]:
    """Where the trained results come from (provenance.SOURCE_FIELDS), from the trained_runs table (older runs
    recorded git / created instead of revision / recorded)."""
    from hilbert_lab.reports.provenance import NOT_RECORDED, strip_paths

    sources = []
    for row in runs.to_dict(orient="records"):
        def text(*keys: str) -> str:
            value = next((row[k] for k in keys if k in row and row[k] == row[k] and row[k]), None)
            return str(value) if value else NOT_RECORDED
        file = Path(strip_paths(row.get("file", ""))).name
        written = re.search(r"--out\s+(\S+)", str(row.get("command") or ""))
        renamed = (f"; its command wrote {Path(written.group(1)).name}, committed as {file}"
                   if written and file and Path(written.group(1)).name != file else "")
        sources.append({"what": f"trained {row.get('source')} results ({file}{renamed})",
                        "device": text("device"), "revision": text("revision", "git"),
                        "recorded": text("recorded", "created (UTC)"), "command": strip_paths(text("command"))})
    return sources


def _locality_findings(locality: Any) -> list[str]:
    """The largest exact 8-NN recall gap to rowmajor, and where no ordering matters."""
    from hilbert_lab.reports.page import fmt

    verdicts = [v for v in locality_verdicts(locality, "recall@8") if v["rowmajor"] is not None]
    if not verdicts:
        return []
    top = max(verdicts, key=lambda v: v["best_value"] - v["rowmajor"])
    lines = [f"Exactly (no training), {_names(top['best'])} windows keep {fmt(top['best_value'])} of each token's 8 "
             f"nearest neighbours in its attention group against {fmt(top['rowmajor'])} for row-major ({top['data']}, "
             f"{top['setting']}), the largest gap of {len(verdicts)} settings."]
    lost = [v for v in verdicts if v["worse"]]
    if lost:
        lines.append(f"On {len(lost)} of {len(verdicts)} settings some ordering keeps {100 * MEANINGFUL:.0f}% or more "
                     "fewer of the 8 nearest neighbours than row-major (e.g. " + "; ".join(losses(v) for v in lost[:3])
                     + "): there that ordering loses.")
    small = [v for v in verdicts if not v["meaningful"] and not v["worse"]]
    if small:
        lines.append(f"On {len(small)} of {len(verdicts)} settings every ordering is within {100 * MEANINGFUL:.0f}% of "
                     "row-major's 8-NN recall (e.g. " + "; ".join(f"{v['data']} {v['setting']}" for v in small[:3])
                     + "): there the ordering does not matter.")
    return lines


def render(metrics: Mapping[str, Any], env: Mapping[str, Any]):
    """Serialization page: findings (trained differences with intervals, the exact locality gap, where it does
    not matter), the trained comparison, the windows, exact locality per metric, which ordering to use."""
    import pandas as pd

    from hilbert_lab.reports.page import Page, Section, fmt, style_axes
    from hilbert_lab.viz.serialization import METRIC_AXES, accuracy_figure, locality_figure
    from hilbert_lab.viz.style import ordering_name

    locality, trained = _table(metrics, "locality"), _table(metrics, "trained")
    values = {key: entry.get("value") for key, entry in (metrics.get("metrics") or {}).items()}
    parameters = metrics.get("parameters") or {}
    sections, notes, findings = [], [], []
    verdicts = _trained_verdicts(trained) if len(trained) else []
    chance = values.get("chance_accuracy")
    chance_note = ((metrics.get("metrics") or {}).get("chance_accuracy") or {}).get("note")
    runs_table = _table(metrics, "trained_runs")
    revisions = {row["source"]: f", rev {str(row['revision']).split(' (')[0]}" for row in
                 runs_table.to_dict(orient="records") if row.get("revision") and row["revision"] == row["revision"]
                 and not str(row["revision"]).startswith("not recorded")} if "revision" in runs_table else {}
    primary = next((v for v in verdicts if not str(v["device"]).startswith("CPU")), verdicts[0] if verdicts else None)
    for verdict in verdicts:
        if primary is not None and verdict["source"] == primary["source"] and verdict["separated"]:
            seeds = sorted({int(n) for n in verdict["rows"].get("seeds", []) if n == n})
            findings.append(f"Trained on {verdict['device']} ({_names([str(n) for n in seeds]) if seeds else 'several'} "
                            f"seeds{revisions.get(verdict['source'], '')}), {verdict['label']}: " + verdict["numbers"].replace(
                                "; the other pairs overlap: no difference between them", "") + ".")
    flat = [v for v in verdicts if primary is not None and v["source"] == primary["source"] and not v["separated"]]
    if flat:
        findings.append("No trained difference (all 95% intervals overlap) on " + "; ".join(
            f"{v['label']} ({v['numbers'].split('(')[1].split(',')[0]})" for v in flat) + ".")
    findings += _locality_findings(locality) if len(locality) else []
    for source in dict.fromkeys(v["source"] for v in verdicts):
        mine = [v for v in verdicts if v["source"] == source]
        device = mine[0]["device"]
        order = {name: index for index, name in enumerate(sorted(set(trained["ordering"]),
                                                                 key=lambda n: (n.count("/"), n)))}
        tasks = [{"name": v["label"].replace(" image, ", " image<br>").replace("), ", ")<br>"),
                  "summary": sorted(v["rows"].to_dict(orient="records"), key=lambda r: order[r["ordering"]])}
                 for v in mine]
        figure = accuracy_figure(tasks, chance=chance, title=f"{device}: eval accuracy per ordering, "
                                 "mean and 95% t interval over seeds")
        style_axes(figure, "task (data, window)", "eval accuracy (fraction of tokens, higher is better)")
        figure.update_layout(height=440)
        seeds = sorted({int(s) for s in mine[0]["rows"]["seeds"].dropna()}) if "seeds" in trained else []
        table = trained[trained["source"] == source].assign(
            accuracy=lambda f: [f"{m:.3f} [{lo:.3f}, {hi:.3f}]" for m, lo, hi in zip(f["mean"], f["low"], f["high"])])
        table = table.assign(task=[f"{d}, w={w}" for d, w in zip(table["data"], table["window"])],
                             ordering=table["ordering"].map(ordering_name))
        columns = [c for c in ("task", "ordering", "accuracy", "recall@8", "unmet_adjacent") if c in table.columns]
        shown = table[columns].rename(columns={"task": "task (data, window)", "accuracy": "eval accuracy [95%]",
                                               "recall@8": "8-NN recall (exact)",
                                               "unmet_adjacent": "adjacent pairs never meeting (exact)"})
        neighbourhoods = "; ".join(dict.fromkeys(f"{d}: {n}" for d, n in zip(table["data"], table["neighbourhood"])))
        chance_text = ([f"The dashed line at {fmt(chance)} is chance: {chance_note}."] if chance is not None and
                       chance_note else [f"The dashed line at {fmt(chance)} is chance."] if chance is not None else [])
        sections.append(Section(f"Trained comparison on {device}", _by_data(mine, "verdict") + ".", figure=figure,
                                text=chance_text + ["Rankings by mean accuracy: '>' where the neighbours' 95% intervals "
                                                    "are disjoint, '~' where they overlap (no difference)."]
                                + [f"Ranking, {v['label']}: {v['ranking']}." for v in mine]))
        sections.append(Section(f"Trained comparison on {device}: every task and ordering", table=shown, collapsed=True,
                                caption=f"accuracy per task and ordering, mean [95% Student t interval] over "
                                        f"{_names([str(s) for s in seeds]) if seeds else 'the'} seeds; "
                                        f"neighbourhood to vote over: {neighbourhoods}"))
    windows = _windows_section(parameters)
    if windows is not None:
        sections.append(windows)
    for metric, (_direction, heading, meaning) in KEY_METRICS.items():
        if metric not in locality.columns or not len(locality):
            continue
        figure = locality_figure(locality, metric)
        figure.update_layout(margin=dict(l=100, r=20, t=80, b=60))
        line = _locality_line(locality, metric)
        sections.append(Section(heading, line[0].upper() + line[1:], figure=figure, text=[meaning],
                                collapsed=metric != "recall@8"))
        sections.append(Section(f"{heading}: every data set, ordering and setting", table=_pivot(locality, metric),
                                collapsed=True,
                                caption=f"{METRIC_NAMES.get(metric, metric)} per data set and ordering (rows) and "
                                        f"attention setting (columns: segment length w, dilation r), exact; "
                                        f"{METRIC_AXES.get(metric, '')}"))
    conclusion = conclusion_paragraphs(locality, trained)
    if conclusion:
        sections.append(Section("Which ordering to use, and when it makes no difference",
                                "Use the ordering whose attention groups hold the data's neighbourhoods: computed "
                                "below per data set and window from the exact metrics and the trained runs.",
                                text=conclusion))
    timings = [(key, value) for key, value in values.items() if key.startswith(("seconds_", "locality_seconds"))]
    if timings:
        rows = [{"measurement": (metrics["metrics"][key].get("note") or key.replace("_", " ")), "seconds": value}
                for key, value in timings]
        grid = " x ".join(map(str, parameters.get("timing_grid") or [])) or "the timing grid"
        fast = [value for key, value in timings if key.startswith("seconds_1M")]
        line = (f"All exact metrics of one ordering on {grid} take {fmt(max(fast))} s at most on this CPU."
                if fast else f"The locality table took {fmt(timings[0][1])} s on this CPU.")
        sections.append(Section("Speed of the exact metrics (CPU)", line + " Single wall-clock runs, possibly with "
                                "another report beside this one (a suite runs the reports that compare no timings "
                                "side by side): no interval, and no conclusion rests on them.",
                                table=pd.DataFrame(rows), collapsed=True))
    missing = [f"{key[len('missing_'):]}: {value}" for key, value in values.items() if key.startswith("missing_")]
    if missing:
        notes.append("Trained results not found (skipped): " + "; ".join(missing) + ".")
    runs = _table(metrics, "trained_runs")
    datasets = list(dict.fromkeys(locality["data"])) if len(locality) else []
    settings = (locality.groupby("data").size().iloc[0] // max(locality["ordering"].nunique(), 1)
                if len(locality) else 0)
    about = ("An image, a video or a point cloud must be serialized before segment (window) and dilated attention "
             "decide which spatial neighbours each token sees; the ordering decides which neighbours share a window. "
             "Trained accuracies (committed runs, read here) come with 95% intervals over seeds; the locality metrics "
             f"of {locality['ordering'].nunique() if len(locality) else 0} orderings on {len(datasets)} data sets x "
             f"{settings} attention settings are exact and computed by this run.")
    devices = list(dict.fromkeys(v["device"] for v in verdicts))
    device = "trained: " + ", ".join(devices) + "; exact locality: this run" if devices else ""
    return Page(title="Serialization: which curve ordering keeps spatial neighbours together", findings=findings[:5],
                about=about, sections=sections, notes=notes, device=device,
                sources=_sources(runs) if len(runs) else [])
