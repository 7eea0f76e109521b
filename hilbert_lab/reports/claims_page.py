"""The claims page: a pure function of a claims run's metrics.json and env.json (reports.render). Rows are
settled and each claim's verdict and reason come from reports.claims_verdict.claim_verdict."""
from __future__ import annotations

from typing import Any

from hilbert_lab.reports.claims import PACKAGE_CLAIMS, parse_claims
from hilbert_lab.reports.claims_verdict import claim_verdict, quote_claimed_ratios, settle_row

# claim verdict -> group of the findings
_HOLDS = ("confirmed", "mostly confirmed")
_FAILS = ("refuted", "mostly refuted")
_RATIO_MARK = "["  # a measured value with an interval


def _finding(claim: str, verdict: str, rows: list[dict[str, Any]]) -> str:
    """'C6 refuted: peak memory, forward+backward 21.5% higher (372 -> 452 MiB); claimed 15-30% lower.'"""
    wanted = "confirmed" if verdict in _HOLDS else "refuted"
    chosen = [row for row in rows if row["verdict"] == wanted] or rows
    row = next((r for r in chosen if _RATIO_MARK in r["measured"] and "end of its interval" not in r["measured"]),
               next((r for r in chosen if _RATIO_MARK in r["measured"]), chosen[0]))
    return (f"{claim} {verdict}: {quote_claimed_ratios(row['aspect'])} measured {row['measured']} against a claimed "
            f"«{row['claimed']}».")


def render(metrics: dict[str, Any], env: dict[str, Any]) -> Any:
    """Claims page: findings (verdict counts, the decisive claims with their numbers), the verdict figure,
    the overview (claim, measured, verdict, reason), every claim's rows behind a closed section."""
    import pandas as pd
    import plotly.graph_objects as go

    from hilbert_lab.reports.page import CPU_TIMING_NOTE, Page, Section, is_gpu_env, older_code_page, style_axes
    from hilbert_lab.reports.provenance import older_code
    from hilbert_lab.viz.claims import VERDICT_COLOURS

    tables = metrics.get("tables") or {}
    rows = [settle_row(row) for row in (tables.get("claims") or {}).get("rows") or []]
    texts = {row["claim"]: row.get("text") or "" for row in (tables.get("summary") or {}).get("rows") or []}
    packaged = {claim["id"]: claim for claim in parse_claims(PACKAGE_CLAIMS.read_text(encoding="utf-8"))}
    order = sorted({row["claim"] for row in rows} | set(packaged), key=lambda c: int(c[1:]) if c[1:].isdigit() else 99)
    parameters = metrics.get("parameters") or {}
    gpu = is_gpu_env(env)
    overview, sections, verdicts, decisive = [], [], {}, []
    for claim in order:
        claim_rows = [row for row in rows if row["claim"] == claim]
        text = (texts.get(claim) or packaged.get(claim, {}).get("claim", "")).strip().replace('"', "'")
        verdict, reason = claim_verdict(claim_rows)
        verdicts[claim] = verdict
        measured = [f"{quote_claimed_ratios(row['aspect'])}: {row['measured']}" for row in claim_rows
                    if row["verdict"] != "not reproducible here" or not row["measured"].startswith("not run")]
        shown = "\n".join(measured[:3]) + (f"\n(+{len(measured) - 3} more in the {claim} section)"
                                             if len(measured) > 3 else "")
        overview.append({"claim": f"{claim}: «{text}»" if text else claim, "verdict": verdict,
                         "measured": shown or "not run here", "reason": quote_claimed_ratios(reason)})
        if verdict in _HOLDS + _FAILS:
            decisive.append(_finding(claim, verdict, claim_rows))
        detail = pd.DataFrame([{"aspect": quote_claimed_ratios(row["aspect"]), "configuration": row["configuration"],
                                "claimed": row["claimed"], "measured": row["measured"], "verdict": row["verdict"],
                                "why": quote_claimed_ratios(row["why"])} for row in claim_rows])
        hardware = packaged.get(claim, {}).get("hardware", "")
        sections.append(Section(f"{claim}: «{text}»" if text else claim, f"Verdict: {verdict}. {quote_claimed_ratios(reason)}",
                                text=[f"Claimed on: {hardware}."] if hardware else [],
                                table=detail if len(detail) else None, collapsed=True))
    counts = pd.Series(list(verdicts.values())).value_counts()
    groups = {"hold": [c for c, v in verdicts.items() if v in _HOLDS],
              "fail": [c for c, v in verdicts.items() if v in _FAILS],
              "part": [c for c, v in verdicts.items() if v == "partly confirmed"],
              "open": [c for c, v in verdicts.items() if v in ("inconclusive", "not reproducible here")]}
    device = "the GPU" if gpu else "this CPU"
    first = (f"Of the predecessor's {len(order)} claims, {len(groups['hold'])} "
             f"{'holds' if len(groups['hold']) == 1 else 'hold'} "
             f"({', '.join(groups['hold']) or 'none'}), {len(groups['fail'])} are refuted "
             f"({', '.join(groups['fail']) or 'none'}), {len(groups['part'])} "
             f"{'holds' if len(groups['part']) == 1 else 'hold'} in part "
             f"({', '.join(groups['part']) or 'none'}) and {len(groups['open'])} could not be settled on {device} "
             f"({', '.join(groups['open']) or 'none'}).")
    findings = [first] + decisive[:4]
    fig = go.Figure()
    for verdict, colour in VERDICT_COLOURS.items():
        fig.add_trace(go.Bar(name=verdict, x=order, marker_color=colour,
                             y=[sum(1 for row in rows if row["claim"] == claim and row["verdict"] == verdict)
                                for claim in order]))
    style_axes(fig, "claim", "experiments (rows of the table, count)")
    fig.update_layout(barmode="stack", title="verdict of each experiment, per claim", height=360)
    summary = (f"Each of the predecessor's {len(order)} claims (claims.md) re-measured with hilbert_lab's exact "
               f"attention on {parameters.get('device', 'cpu')} (up to {parameters.get('max_tokens', '?'):,} tokens, "
               f"{parameters.get('repeats', '?')} repeats per timing, ratios with 95% bootstrap intervals). Claim "
               "verdicts: " + ", ".join(f"{int(n)} {v}" for v, n in counts.items()) + ". A ratio recorded without "
               "an interval settles nothing (inconclusive); timings bound to a GPU this machine lacks are 'not "
               "reproducible here'.")
    head = [Section("Claimed vs measured", table=pd.DataFrame(overview),
                    caption="measured values with their 95% intervals; each claim's section below lists every row"),
            Section("All claims at a glance", f"Hold: {', '.join(groups['hold']) or 'none'}; refuted: "
                    f"{', '.join(groups['fail']) or 'none'}; in part: {', '.join(groups['part']) or 'none'}.",
                    figure=fig)]
    headline = (f"{len(groups['hold'])} of {len(order)} claims hold, {len(groups['fail'])} refuted, "
                f"{len(groups['part'])} in part, {len(groups['open'])} not settled on {device}.")
    page = Page(title="Claims: the predecessor's results re-measured", findings=findings, about=summary,
                headline=headline, sections=head + sections, notes=[] if gpu else [CPU_TIMING_NOTE + " An interval containing 1 reads 'no difference'."])
    return older_code_page(page, older_code(env.get("git")) if gpu else "")
