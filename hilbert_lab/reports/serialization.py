"""The serialization report's data: trained results (train_serialization JSONs) as table rows, and the
verdicts drawn from them and from the exact locality table (the page is reports.serialization_page).

A trained comparison is read with its 95% intervals: one ordering is "ahead of" another only when its
interval lies wholly above the other's; where intervals overlap the page says "no difference".
Locality metrics are exact (no interval): orderings within `TIE` (relative) of each other read "no difference".
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

TIE = 0.02  # exact locality values within 2% (relative) of each other: no difference
MEANINGFUL = 0.10  # the best ordering must beat rowmajor by 10% (relative) before a page recommends it
# metric -> (direction: +1 higher is better, -1 lower is better; heading; what it measures)
KEY_METRICS = {
    "recall@8": (1, "8-NN recall: share of each token's 8 nearest neighbours it attends to",
                 "Share of each token's 8 nearest spatial neighbours that share an attention group with it "
                 "(segment and dilation offset) in some branch. 1 = every neighbour is seen."),
    "unmet_adjacent": (-1, "Adjacent pairs that never meet",
                       "Share of adjacent pairs (grid: face neighbours; points: each point's 2d nearest) that "
                       "share no attention group in any branch. 0 = every adjacent pair is seen."),
    "diameter_mean": (-1, "Mean group diameter",
                      "Largest distance between two tokens of one attention group of the first branch, averaged "
                      "over groups (grid cells, or unit-cube units for the point clouds)."),
}
METRIC_NAMES = {"recall@4": "4-NN recall", "recall@8": "8-NN recall", "recall@26": "26-NN recall",
                "unmet_adjacent": "share of adjacent pairs that never meet", "diameter_mean": "mean group diameter"}
TRAINED_COLUMNS = ["source", "device", "task", "data", "neighbourhood", "window", "ordering", "mean", "low", "high",
                   "seeds", "steps", "recall@8", "unmet_adjacent", "diameter_mean"]

__all__ = ["KEY_METRICS", "MEANINGFUL", "METRIC_NAMES", "TIE", "conclusion_paragraphs", "locality_verdicts", "losses", "ranking_verdict", "trained_rows",
           "trained_run_row"]


# ----------------------------------------------------------------------------------------------- data
def _task_data(task: Mapping[str, Any]) -> str:
    spec = task.get("task") or {}
    if spec.get("kind") == "grid":
        shape = spec.get("grid_shape") or []
        return f"{len(shape)}D {'x'.join(map(str, shape))} image"
    if spec.get("kind") == "points":
        return f"{spec.get('ndim')}D point cloud ({spec.get('num_points')} points)"
    return str(task.get("name"))


def _neighbourhood(task: Mapping[str, Any]) -> str:
    spec = task.get("task") or {}
    if spec.get("kind") == "grid":
        return f"disk of radius {spec.get('radius')}"
    if spec.get("kind") == "points":
        return f"{spec.get('neighbours')} nearest points"
    return ""


def trained_rows(document: Mapping[str, Any], source: str) -> list[dict[str, Any]]:
    """A train_serialization JSON -> one row per (task, ordering): TRAINED_COLUMNS; device = the name in
    the file's env block (the machine that trained), else its "device" field."""
    if not isinstance(document, Mapping) or "tasks" not in document:
        raise ValueError(f"document must be a train_serialization result with 'tasks', got keys "
                         f"{sorted(document) if isinstance(document, Mapping) else type(document).__name__}")
    env_device = ((document.get("env") or {}).get("device") or {})
    device = env_device.get("name") or document.get("device") or "unknown"
    if str(env_device.get("device", document.get("device", ""))).startswith("cpu"):
        device = f"CPU ({device})" if device != "cpu" else "CPU"
    rows = []
    for task in document["tasks"]:
        config = task.get("config") or {}
        segments = config.get("segment_lengths") or []
        for row in task["summary"]:
            locality = row.get("locality") or {}
            rows.append({"source": source, "device": str(device), "task": task["name"], "data": _task_data(task),
                         "neighbourhood": _neighbourhood(task),
                         "window": ",".join(map(str, segments)), "ordering": row["ordering"], "mean": row["mean"],
                         "low": row["low"], "high": row["high"], "seeds": row.get("n"), "steps": config.get("steps"),
                         **{key: locality.get(key) for key in TRAINED_COLUMNS[-3:]}})
    return rows


def trained_run_row(document: Mapping[str, Any], source: str, path: str) -> dict[str, Any]:
    """Where and how a train_serialization JSON was made: source, device, driver, CUDA, torch, revision (git,
    or the commit that committed it), recorded (date), seconds, command and file name (no folders)."""
    from hilbert_lab.reports.provenance import document_source

    env = document.get("env") or {}
    device = env.get("device") or {}
    origin = document_source(document, path, f"trained {source} results ({Path(path).name})")
    return {"source": source, "device": origin["device"], "driver": device.get("driver"), "CUDA": device.get("cuda"),
            "torch": (env.get("packages") or {}).get("torch"), "revision": origin["revision"],
            "recorded": origin["recorded"], "seconds": document.get("seconds"), "command": origin["command"],
            "file": Path(path).name}


# ------------------------------------------------------------------------------------------- verdicts
def _names(items: Sequence[str]) -> str:
    """'a', 'a and b', 'a, b and c', orderings by their display names (viz.style.ordering_name)."""
    from hilbert_lab.viz.style import ordering_name

    items = [ordering_name(item) for item in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def ranking_verdict(rows: Sequence[Mapping[str, Any]], numbers: bool = False) -> tuple[str, str, bool]:
    """(ranking, verdict, separated) of one trained task's rows (ordering, mean, low, high).

    ranking: 'a 0.888 [0.837, 0.939] ~ b ... > c ...' by mean, '>' only between neighbours whose 95% intervals
    are disjoint ('~' where they overlap); orderings by their display names; verdict: which orderings are ahead of which (their
    95% intervals disjoint), grouped, or 'no difference (all 95% intervals overlap)'. numbers=True adds
    each ordering's mean [interval] at its first mention.
    """
    from hilbert_lab.viz.style import ordering_name

    ranked = sorted(rows, key=lambda row: -float(row["mean"]))
    quoted = {row["ordering"]: f"{ordering_name(row['ordering'])} {float(row['mean']):.3f} [{float(row['low']):.3f}, "
                               f"{float(row['high']):.3f}]" for row in ranked}
    ranking = quoted[ranked[0]["ordering"]] if ranked else ""
    for above, below in zip(ranked, ranked[1:]):
        ranking += (" > " if float(above["low"]) > float(below["high"]) else " ~ ") + quoted[below["ordering"]]
    groups: list[tuple[list[str], tuple[str, ...]]] = []
    for row in ranked:
        beaten = tuple(other["ordering"] for other in ranked if float(row["low"]) > float(other["high"]))
        if not beaten:
            continue
        if groups and groups[-1][1] == beaten:
            groups[-1][0].append(row["ordering"])
        else:
            groups.append(([row["ordering"]], beaten))
    if not groups:
        means = [float(row["mean"]) for row in ranked]
        spread = f"means {min(means):.3f} to {max(means):.3f}, " if numbers and ranked else ""
        return ranking, f"no difference ({spread}all 95% intervals overlap)", False
    seen: set[str] = set()

    def name(ordering: str) -> str:
        if not numbers or ordering in seen:
            return ordering_name(ordering)
        seen.add(ordering)
        return quoted[ordering]

    verdict = "; ".join(f"{_names([name(a) for a in ahead])} ahead of {_names([name(b) for b in beaten])}"
                        for ahead, beaten in groups)
    pairs = sum(len(ahead) * len(beaten) for ahead, beaten in groups)
    total = len(ranked) * (len(ranked) - 1) // 2
    verdict += " (95% intervals disjoint)"
    if pairs < total:
        verdict += "; the other pairs overlap: no difference between them"
    return ranking, verdict, True


def _setting(segments: Any, rates: Any) -> str:
    from hilbert_lab.viz.serialization import setting_label

    return setting_label(segments, rates)


def locality_verdicts(table: Any, metric: str) -> list[dict[str, Any]]:
    """Per (data, setting) of the locality table: best orderings (ties exact), best and rowmajor values, the
    best's relative gap to rowmajor and whether it is MEANINGFUL, and whether all orderings are within TIE
    (relative) of each other ("no difference")."""
    direction = KEY_METRICS.get(metric, (1,))[0]
    out = []
    frame = table.assign(setting=[_setting(s, r) for s, r in zip(table["segment_lengths"], table["dilation_rates"])])
    for (data, setting), rows in frame.groupby(["data", "setting"], sort=False):
        values = dict(zip(rows["ordering"], rows[metric].astype(float)))
        best_value = max(values.values()) if direction > 0 else min(values.values())
        spread = max(values.values()) - min(values.values())
        scale = max(abs(v) for v in values.values()) or 1.0
        base = values.get("rowmajor")
        gap = abs(best_value - base) / max(abs(best_value), abs(base), 1e-12) if base is not None else spread / scale
        # every ordering against rowmajor: those MEANINGFUL (relative) worse than it, worst first
        worse = [] if base is None else sorted(
            (k for k, v in values.items() if direction * (base - v) / max(abs(v), abs(base), 1e-12) >= MEANINGFUL),
            key=lambda k: direction * values[k])
        out.append({"data": data, "setting": setting, "best": [k for k, v in values.items() if v == best_value],
                    "near": [k for k, v in values.items() if abs(v - best_value) <= TIE * scale],
                    "best_value": best_value, "rowmajor": base, "gap": gap, "meaningful": gap >= MEANINGFUL,
                    "worse": worse, "same": spread <= TIE * scale, "values": values})
    return out


def losses(verdict: Mapping[str, Any], with_setting: bool = True) -> str:
    """Where orderings lose to rowmajor by MEANINGFUL or more: '64 x 64 w=256 r=4: Morton (either orientation) 0,
    Hilbert (either orientation) 0.162 vs row-major 0.193' (orderings of one printed value named together)."""
    from hilbert_lab.reports.page import fmt

    groups: dict[str, list[str]] = {}
    for name in verdict["worse"]:
        groups.setdefault(fmt(verdict["values"][name]), []).append(name)
    text = ", ".join(f"{_family(names)} {value}" for value, names in groups.items())
    text += f" vs row-major {fmt(verdict['rowmajor'])}"
    return (f"{verdict['data']} {verdict['setting']}: " if with_setting else "") + text


def _locality_line(table: Any, metric: str) -> str:
    """One sentence: which orderings are best where the gap to rowmajor is meaningful, the largest gap, and on
    how many settings the orderings differ by less than MEANINGFUL (no finding there). Starts lower-case."""
    from hilbert_lab.reports.page import fmt

    verdicts = locality_verdicts(table, metric)
    if not verdicts:
        return ""
    label = METRIC_NAMES.get(metric, metric)
    differing = [v for v in verdicts if v["meaningful"]]
    wins: dict[str, int] = {}
    for verdict in differing:
        for name in verdict["best"]:
            wins[name] = wins.get(name, 0) + 1
    parts = []
    if wins:
        ranked = sorted(wins.items(), key=lambda item: -item[1])
        parts.append(f"where the best ordering beats row-major by {100 * MEANINGFUL:.0f}% or more ({len(differing)} of "
                     f"{len(verdicts)} settings), the best {label} comes from " + ", ".join(
                         f"{_names([name])} on {count}" for name, count in ranked[:4]) + " (ties counted for each)")
    gaps = [v for v in differing if v["rowmajor"] is not None]
    if gaps:
        top = max(gaps, key=lambda v: abs(v["best_value"] - v["rowmajor"]))
        parts.append(f"the largest gap: {top['data']}, {top['setting']}: {_names(top['best'])} "
                     f"{fmt(top['best_value'])} vs row-major {fmt(top['rowmajor'])}")
    lost = [v for v in verdicts if v["worse"]]
    if lost:
        parts.append(f"some ordering is {100 * MEANINGFUL:.0f}% or more worse than row-major on {len(lost)} of "
                     f"{len(verdicts)} settings (" + "; ".join(losses(v) for v in lost[:3])
                     + ("; ..." if len(lost) > 3 else "") + ")")
    small = [v for v in verdicts if not v["meaningful"] and not v["worse"]]
    if small:
        parts.append(f"on the other {len(small)} settings every ordering is within {100 * MEANINGFUL:.0f}% of "
                     "row-major (no finding)")
    return "; ".join(parts) + "."


def _family(names: Sequence[str]) -> str:
    """['hilbert', 'morton', 'hilbert-trans', 'morton-trans'] -> 'hilbert or morton (either orientation)'."""
    bases = list(dict.fromkeys(name.removesuffix("-trans") for name in names))
    both = all(base in names and f"{base}-trans" in names for base in bases)
    if both:
        return _names(bases).replace(" and ", " or ") + " (either orientation)"
    return _names(list(names)).replace(" and ", " or ")


def _identical_pairs(table: Any) -> list[str]:
    """'snake = rowmajor on 7/30 settings' for ordering pairs whose metrics agree exactly on some settings."""
    metrics = [m for m in ("recall@4", "recall@8", "recall@26", "unmet_adjacent", "diameter_mean")
               if m in table.columns]
    frame = table.assign(setting=[_setting(s, r) for s, r in zip(table["segment_lengths"], table["dilation_rates"])])
    groups = list(frame.groupby(["data", "setting"], sort=False))
    lines = []
    for first, second in (("snake", "rowmajor"), ("morton", "hilbert")):
        count = 0
        for _key, rows in groups:
            a, b = rows[rows["ordering"] == first], rows[rows["ordering"] == second]
            if len(a) and len(b) and all(abs(float(a[m].iloc[0]) - float(b[m].iloc[0])) < 1e-9 for m in metrics):
                count += 1
        if count:
            lines.append(f"{_names([first])} = {_names([second])} on {count}/{len(groups)} settings")
    return lines


def _task_label(rows: Any) -> str:
    row = rows.iloc[0]
    return f"{row['data']}, window {row['window']}" if row.get("data") else str(row["task"])


def _trained_verdicts(trained: Any) -> list[dict[str, Any]]:
    out = []
    for (source, task), rows in trained.groupby(["source", "task"], sort=False):
        records = rows.to_dict(orient="records")
        ranking, verdict, separated = ranking_verdict(records)
        first = records[0]
        out.append({"source": source, "device": first.get("device") or source, "task": task,
                    "label": _task_label(rows), "data": first.get("data") or task,
                    "window": first.get("window") or "", "ranking": ranking, "verdict": verdict,
                    "numbers": ranking_verdict(records, numbers=True)[1], "separated": separated, "rows": rows})
    return out


def conclusion_paragraphs(locality: Any, trained: Any, metric: str = "recall@8") -> list[str]:
    """Which ordering to use for which data and window, and when it makes no difference: from the exact
    locality table and the trained rows (TRAINED_COLUMNS)."""
    from hilbert_lab.reports.page import fmt

    paragraphs = []
    verdicts = locality_verdicts(locality, metric) if len(locality) else []
    label = METRIC_NAMES.get(metric, metric)

    def span(values: list[float]) -> str:
        low, high = min(values), max(values)
        return fmt(low) if fmt(low) == fmt(high) else f"{fmt(low)}-{fmt(high)}"

    for data in dict.fromkeys(v["data"] for v in verdicts):
        mine = [v for v in verdicts if v["data"] == data]
        groups: dict[str, list[dict[str, Any]]] = {}
        for verdict in mine:
            if verdict["meaningful"]:
                groups.setdefault(_family(verdict["near"]), []).append(verdict)
        use = []
        for family, members in groups.items():
            settings = ", ".join(v["setting"] for v in members)
            text = f"{family} at {settings} ({label} {span([v['best_value'] for v in members])}"
            bases = [v["rowmajor"] for v in members if v["rowmajor"] is not None]
            if bases and not all("rowmajor" in v["near"] for v in members):
                text += f" vs row-major {span(bases)}"
            use.append(text + ")")
        same = [v["setting"] for v in mine if not v["meaningful"] and not v["worse"]]
        text = f"{data}: " + (("use " + "; ".join(use)) if use else
                              f"no ordering beats row-major by {100 * MEANINGFUL:.0f}% at any setting")
        lost = [v for v in mine if v["worse"]]
        if lost:
            text += (f"; {100 * MEANINGFUL:.0f}% or more worse than row-major: "
                     + "; ".join(f"at {v['setting']}, " + losses(v, with_setting=False) for v in lost))
        if (use or lost) and same:
            text += f"; every ordering within {100 * MEANINGFUL:.0f}% of row-major (no finding) at {', '.join(same)}"
        paragraphs.append(text + ".")
    if paragraphs:
        paragraphs.insert(0, f"From the exact locality ({label}; an ordering is recommended where the best beats "
                             f"row-major by {100 * MEANINGFUL:.0f}% or more, and every ordering within {100 * TIE:.0f}% "
                             "of the best is listed):")
    identical = _identical_pairs(locality) if len(locality) else []
    if identical:
        paragraphs.append("Exact ties: " + "; ".join(identical) + " (same groups, so the same model when there is "
                          "no causal mask or position encoding).")
    for verdict in _trained_verdicts(trained) if len(trained) else []:
        text = f"Trained on {verdict['device']}, {verdict['label']}: {verdict['verdict']}"
        if verdict["separated"] and metric in verdict["rows"]:
            rows = verdict["rows"].sort_values("mean", ascending=False)
            text += (f"; the 8-NN recall of the setting runs from {fmt(float(rows[metric].iloc[0]))} (first) to "
                     f"{fmt(float(rows[metric].iloc[-1]))} (last)")
        paragraphs.append(text + ".")
    return paragraphs
