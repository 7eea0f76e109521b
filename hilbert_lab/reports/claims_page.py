"""The claims page: a pure function of a claims run's metrics.json and env.json (reports.render)."""
from __future__ import annotations

import re
from typing import Any, Sequence

from hilbert_lab.reports.claims import PACKAGE_CLAIMS, parse_claims
from hilbert_lab.reports.claims_measure import VERDICTS

_BARE_RATIO = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?x|nanx)(?![\w\[]|\s+\[)")


def mark_bare_ratios(text: str) -> str:
    """Measured text with every ratio that has no interval marked as such (older runs recorded some)."""
    return _BARE_RATIO.sub(lambda match: "n/a" if match.group(1) == "nanx"
                           else f"{match.group(1)} (no interval recorded)", str(text))


def quote_claimed_ratios(text: str) -> str:
    """Reason text with its bare ratios (the claim's own numbers it cites) marked as quotations «...»."""
    return _BARE_RATIO.sub(lambda match: f"«{match.group(1)}»", str(text))


def claim_verdict(verdicts: Sequence[str]) -> str:
    """One verdict for a claim from its rows: 'confirmed' / 'refuted' when all measured rows agree,
    'partly confirmed' when they disagree, 'not reproducible here' when no row could be measured."""
    measured = {verdict for verdict in verdicts if verdict != "not reproducible here"}
    if not measured:
        return "not reproducible here"
    return measured.pop() if len(measured) == 1 else "partly confirmed"


def render(metrics: dict[str, Any], env: dict[str, Any]) -> Any:
    """Claims page: overview (claim text, measured values with intervals, verdict, reason) and one section
    per claim with its rows."""
    import pandas as pd
    import plotly.graph_objects as go

    from hilbert_lab.reports.page import CPU_TIMING_NOTE, Page, Section, is_gpu_env, style_axes
    from hilbert_lab.viz.claims import VERDICT_COLOURS

    tables = metrics.get("tables") or {}
    rows = list((tables.get("claims") or {}).get("rows") or [])
    texts = {row["claim"]: row.get("text") or "" for row in (tables.get("summary") or {}).get("rows") or []}
    packaged = {claim["id"]: claim for claim in parse_claims(PACKAGE_CLAIMS.read_text(encoding="utf-8"))}
    order = sorted({row["claim"] for row in rows} | set(packaged), key=lambda c: int(c[1:]) if c[1:].isdigit() else 99)
    parameters = metrics.get("parameters") or {}
    overview, sections, verdicts = [], [], {}
    for claim in order:
        claim_rows = [row for row in rows if row["claim"] == claim]
        text = (texts.get(claim) or packaged.get(claim, {}).get("claim", "")).strip().replace('"', "'")
        verdict = claim_verdict([row["verdict"] for row in claim_rows]) if claim_rows else "not reproducible here"
        verdicts[claim] = verdict
        measured = "\n".join(f"{quote_claimed_ratios(row['aspect'])}: {mark_bare_ratios(row['measured'])}"
                             for row in claim_rows) or "not run"
        reasons = list(dict.fromkeys(quote_claimed_ratios(row["why"]) for row in claim_rows if row.get("why")))
        overview.append({"claim": claim, "claim text": text, "measured": measured, "verdict": verdict,
                         "reason": " / ".join(reasons) or "no experiment covers this claim"})
        counts = pd.Series([row["verdict"] for row in claim_rows]).value_counts()
        conclusion = (f"Verdict: {verdict} ("
                      + ", ".join(f"{int(counts.get(v, 0))} {v}" for v in VERDICTS if counts.get(v, 0)) + ")")
        hardware = packaged.get(claim, {}).get("hardware", "")
        detail = pd.DataFrame([{"aspect": quote_claimed_ratios(row["aspect"]), "configuration": row["configuration"],
                                "claimed": row["claimed"], "measured": mark_bare_ratios(row["measured"]),
                                "verdict": row["verdict"], "why": quote_claimed_ratios(row["why"])}
                               for row in claim_rows])
        sections.append(Section(f"{claim}: «{text}»" if text else claim, conclusion,
                                text=[f"Claimed on: {hardware}."] if hardware else [],
                                table=detail if len(detail) else None))
    summary_counts = pd.Series(list(verdicts.values())).value_counts()
    fig = go.Figure()
    for verdict, colour in VERDICT_COLOURS.items():
        fig.add_trace(go.Bar(name=verdict, x=order, marker_color=colour,
                             y=[sum(1 for row in rows if row["claim"] == claim and row["verdict"] == verdict)
                                for claim in order]))
    style_axes(fig, "claim", "experiments (rows of the table, count)")
    fig.update_layout(barmode="stack", title="verdict of each experiment, per claim", height=380)
    refuted = [claim for claim, verdict in verdicts.items() if verdict == "refuted"]
    confirmed = [claim for claim, verdict in verdicts.items() if verdict == "confirmed"]
    figure_conclusion = (f"Confirmed: {', '.join(confirmed) or 'none'}; refuted: {', '.join(refuted) or 'none'}; "
                         f"the rest partly confirmed or not reproducible on this hardware.")
    device = parameters.get("device", "cpu")
    summary = (f"Each of the predecessor's {len(order)} claims re-measured with hilbert_lab's exact attention on "
               f"{device} (max {parameters.get('max_tokens', '?'):,} tokens, {parameters.get('repeats', '?')} "
               f"repeats per timing, ratios with 95% bootstrap intervals). "
               + ", ".join(f"{int(count)} {verdict}" for verdict, count in summary_counts.items()) + ".")
    bullets = [f"{row['claim']} ({row['verdict']}): «{row['claim text']}»" for row in overview]
    headline = ", ".join(f"{int(count)} {verdict}" for verdict, count in summary_counts.items()) + \
        f" of {len(order)} claims" + ("" if is_gpu_env(env) else " (CPU; GPU timing claims not reproducible here)")
    notes = [] if is_gpu_env(env) else [CPU_TIMING_NOTE]
    head = [Section("All claims at a glance", figure_conclusion, figure=fig),
            Section("Claimed vs measured, per claim", table=pd.DataFrame(overview),
                    caption="measured values with their intervals; the per-claim sections below give every row")]
    return Page(title="Claims: the predecessor's results re-measured", summary=summary, headline=headline,
                sections=head + sections, notes=notes, bullets=bullets)
