"""Verdicts of the claims report: a measured row settled against what it records (`settle_row`) and the one
verdict of a claim with its reason (`claim_verdict`), built together so that they cannot disagree.

Row verdicts: confirmed, refuted, inconclusive (a ratio recorded without its interval), not reproducible
here. A claim's verdict comes from its kinds of measurement (rows that differ only by size count as one kind,
so ten sequence lengths do not outvote one other aspect): all measured kinds agree -> confirmed / refuted;
one side at least twice the other -> mostly confirmed / mostly refuted; else partly confirmed. Its reason
states the count behind the verdict and names the rows that disagree with it.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

ROW_VERDICTS = ("confirmed", "refuted", "inconclusive", "not reproducible here")
CLAIM_VERDICTS = ("confirmed", "mostly confirmed", "partly confirmed", "mostly refuted", "refuted", "inconclusive",
                  "not reproducible here")
# names a committed run cites that the package has since moved
RENAMED = {"hilbert_lab.safety.estimate_memory": "hilbert_lab.attention.memory.estimate_memory"}
_RATIO = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?x|nanx)(?![\w\[]|\s+\[)")
_NAN = re.compile(r"(?<![\w.])nan(?![\w])")
_NEGATIVE_LOWER = re.compile(r"-(\d+(?:\.\d+)?)% lower")
_SIZE = re.compile(r",? (?:N=|at |L=)\d[\d,]*$")
_NUMBER = re.compile(r"[-+]?\d[\d,.]*%?")
_CLAUSE = re.compile(r"(?<=[.;])\s+(?=[A-Za-z0-9'(])")
_MEMORY_CHANGE = re.compile(r"\d+(?:\.\d+)?% (?:higher|lower) \(([\d,.]+) -> ([\d,.]+) MiB\)")
_INTERVAL = re.compile(r"(\d+(?:\.\d+)?)x \[(\d+(?:\.\d+)?), (\d+(?:\.\d+)?)\]")

__all__ = ["CLAIM_VERDICTS", "RENAMED", "ROW_VERDICTS", "claim_verdict", "device_reason", "quote_claimed_ratios",
           "settle_row"]


def quote_claimed_ratios(text: str) -> str:
    """Text with its bare ratios (the claim's own numbers it cites) marked as quotations «...»."""
    return _RATIO.sub(lambda match: f"«{match.group(1)}»", str(text))


def _renamed(text: str) -> str:
    for old, new in RENAMED.items():
        text = text.replace(old, new)
    return text


def _is_absolute_rate(row: Mapping[str, Any]) -> bool:
    """A claimed absolute throughput ('304,000' tokens/s): bound to the hardware it was measured on."""
    return "tokens/s" in str(row.get("aspect", "")) and bool(re.fullmatch(r"[\d,]+", str(row.get("claimed", ""))))


def _memory_within_resolution(row: Mapping[str, Any], measured: str) -> str:
    """A recorded peak-memory change ('4.5% higher (268 -> 280 MiB)') below the measurement's resolution restated
    as no difference (page.memory_change); a larger one as recorded."""
    from hilbert_lab.reports.page import memory_change, memory_resolution_mib

    match = _MEMORY_CHANGE.fullmatch(measured)
    if not match or not str(row.get("aspect", "")).startswith("peak memory"):
        return measured
    device = "cuda" if "cuda" in str(row.get("configuration", "")) else "cpu"
    before, after = (float(match.group(i).replace(",", "")) for i in (1, 2))
    resolution = memory_resolution_mib(device)
    return memory_change(before, after, resolution) if abs(after - before) < resolution else measured


def _is_estimate(row: Mapping[str, Any]) -> bool:
    """A row computed from a model ('model estimate'), not measured: it cannot confirm or refute a claim."""
    return "estimate" in str(row.get("configuration", "")).lower()


def device_reason(device: str) -> str:
    """C12's reason for the device its row was measured on."""
    if str(device).startswith("cuda"):
        return "the claim is about modern GPUs; measured on the GPU with the flash SDPA path against manual"
    return "the claim is about modern GPUs; on a CPU the fused SDPA path is measured against manual instead"


def _device_reason(row: Mapping[str, Any], why: str) -> str:
    """A reason written for a CPU run ('on a CPU the fused SDPA path ...') restated for the GPU where the row's
    configuration says it was measured on one (runs before the reason followed the device)."""
    if "cuda" in str(row.get("configuration", "")):
        return why.replace(device_reason("cpu"), device_reason("cuda"))
    return why


def _inconclusive_cause(row: Mapping[str, Any]) -> str:
    """Why a row is inconclusive, in the words of settle_row."""
    if _is_estimate(row):
        return "a model estimate, not a measurement"
    return "no interval recorded" if "(no interval recorded)" in str(row.get("measured", "")) else ""


def settle_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row as the page states it: 'nan' -> 'not measured', a negative reduction written as an increase,
    renamed package names updated; its verdict made to follow from what it records: a ratio without an
    interval or a model estimate cannot confirm or refute (inconclusive), a claimed absolute throughput on other hardware is not
    reproducible here, a row that measured nothing is not reproducible here."""
    measured = _NEGATIVE_LOWER.sub(lambda m: f"{m.group(1)}% higher", _NAN.sub("not measured", str(row["measured"])))
    bare = [ratio for ratio in _RATIO.findall(measured) if ratio != "nanx"]
    measured = _RATIO.sub(lambda m: "not measured" if m.group(1) == "nanx" else f"{m.group(1)} (no interval recorded)",
                          measured)
    measured = _INTERVAL.sub(lambda m: m.group(0) + (" (the estimate sits at an end of its interval: few repeats)"
                                                     if m.group(1) in (m.group(2), m.group(3)) and m.group(2) != m.group(3)
                                                     else ""), measured)
    measured = _memory_within_resolution(row, measured)
    verdict, why = row["verdict"], _device_reason(row, _renamed(str(row.get("why") or "")))
    if verdict in ("confirmed", "refuted"):
        if _is_estimate(row):
            verdict, why = "inconclusive", f"A model estimate, not a measurement of what the claim states, settles nothing. {why}"
        elif bare:
            verdict, why = "inconclusive", f"{', '.join(bare)} was recorded without an interval, so it settles nothing. {why}"
        elif _is_absolute_rate(row):
            verdict = "not reproducible here"
        elif measured.startswith(("not run", "not measured")):
            verdict = "not reproducible here"
    return {**row, "measured": measured, "verdict": verdict, "why": why}


def _short(configuration: str) -> str:
    """The first three parts of a configuration ('1D dilated, N=65536, r=16')."""
    return ", ".join(str(configuration).split(", ")[:3])


def _kind(aspect: str) -> str:
    """The kind of measurement: the aspect without its trailing size ('..., N=1024', '... at 2048')."""
    return _SIZE.sub("", str(aspect)).strip()


def _tally(confirmed: int, refuted: int) -> str:
    if not confirmed and not refuted:
        return ""
    if not refuted:
        return "confirmed"
    if not confirmed:
        return "refuted"
    if confirmed >= 2 * refuted:
        return "mostly confirmed"
    return "mostly refuted" if refuted >= 2 * confirmed else "partly confirmed"


def _clauses(rows: Sequence[Mapping[str, Any]], limit: int = 3) -> list[str]:
    """The rows' reasons split into clauses, each said once: a clause whose numbers differ from row to row is
    row-specific (the per-claim table gives it) and left out."""
    seen: dict[str, set[str]] = {}
    order: list[str] = []
    for row in rows:
        for clause in _CLAUSE.split(str(row.get("why") or "")):
            clause = clause.strip().rstrip(".;")
            if not clause:
                continue
            key = _NUMBER.sub("#", clause)
            if key not in seen:
                seen[key] = set()
                order.append(key)
            seen[key].add(clause)
    kept = [next(iter(seen[key])) for key in order if len(seen[key]) == 1]
    # a clause that opens with a symbol ('p=1 runs ...') keeps its case
    return [clause if re.match(r"\w+=", clause) else clause[0].upper() + clause[1:] for clause in kept[:limit]]


def claim_verdict(rows: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """(verdict, reason) of one claim from its settled rows (settle_row); CLAIM_VERDICTS."""
    if not rows:
        return "not reproducible here", "no experiment covers this claim"
    kinds: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        kinds.setdefault(_kind(row["aspect"]), []).append(row)
    parts, kind_verdicts = [], []
    for kind, members in kinds.items():
        verdicts = [row["verdict"] for row in members]
        confirmed, refuted = verdicts.count("confirmed"), verdicts.count("refuted")
        verdict = _tally(confirmed, refuted)
        if not verdict:
            continue
        kind_verdicts.append(verdict)
        measured = confirmed + refuted
        text = f"{kind}: {verdict}" + (f" ({max(confirmed, refuted)} of {measured} rows)" if measured > 1 else "")
        minority = "confirmed" if refuted > confirmed else "refuted"
        exceptions = [row for row in members if row["verdict"] == minority and verdict.startswith(("mostly", "partly"))]
        if exceptions:
            text += "; " + minority + " where " + ", ".join(
                f"{_short(row.get('configuration') or row['aspect'])} gives {row['measured']}" for row in exceptions[:2])
        parts.append(text)
    ups = sum(1 for v in kind_verdicts if v in ("confirmed", "mostly confirmed"))
    downs = sum(1 for v in kind_verdicts if v in ("refuted", "mostly refuted"))
    verdict = "partly confirmed" if "partly confirmed" in kind_verdicts else _tally(ups, downs)
    if verdict in ("confirmed", "refuted") and any(v.startswith("mostly") for v in kind_verdicts):
        verdict = "mostly " + verdict
    causes: dict[str, int] = {}
    for row in rows:
        if row["verdict"] == "inconclusive":
            cause = _inconclusive_cause(row)
            label = f"inconclusive ({cause})" if cause else "inconclusive"
            causes[label] = causes.get(label, 0) + 1
    unmeasured = sum(1 for row in rows if row["verdict"] == "not reproducible here")
    if not verdict:
        verdict = "inconclusive" if causes else "not reproducible here"
    counts = [f"{n} row{'s' if n > 1 else ''} {label}" for label, n in
              [*causes.items(), ("not reproducible here", unmeasured)] if n]
    clauses = _clauses([row for row in rows if row["verdict"] != "not reproducible here"] or rows)
    reason = "; ".join(parts + counts)
    reason = (reason[0].upper() + reason[1:] + ". " if reason else "") + ". ".join(clauses) + ("." if clauses else "")
    return verdict, reason
