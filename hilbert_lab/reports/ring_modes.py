"""The ring page's comparison of context-parallel modes (bench_ring.py's parallel_modes section): the ring,
head-parallel (Ulysses) and the hybrid mesh timed on the same shards in interleaved rounds. Rows of the
run's `parallel_modes` table, its section (table and figure) and its finding; a mode that could not run on a
GPU count is a row with the reason it was skipped.
"""
from __future__ import annotations

from typing import Any, Mapping

from hilbert_lab.bench.stats import verdict_sentence
from hilbert_lab.distributed.modules import PARALLEL_MODES

MODE_NAMES = {"ring": "ring", "ulysses": "head-parallel (Ulysses)", "hybrid": "hybrid"}
PARALLEL_MODES_COLUMNS = ["gpus", "config", "mode", "seq_len", "median_ms", "low_ms", "high_ms", "speed_vs_ring",
                          "speed_low", "speed_high", "verdict", "bytes_sent_max_rank", "mesh", "skipped"]


def mode_name(mode: str, mesh: Any = None) -> str:
    """'head-parallel (Ulysses)', 'hybrid (ring 2 x Ulysses 2)': a mode as the page names it."""
    if mode == "hybrid" and isinstance(mesh, (list, tuple)) and len(mesh) == 2:
        return f"hybrid (ring {mesh[0]} x Ulysses {mesh[1]})"
    return MODE_NAMES.get(mode, mode)


def parallel_modes_rows(data: Mapping[str, Any], gpus: int) -> list[dict[str, Any]]:
    """PARALLEL_MODES_COLUMNS rows of one bench_ring.py file's parallel_modes section: per config, a row per
    mode that ran (median and interval of its step, its speed against the ring with interval and verdict, the
    bytes its largest rank sent) or was skipped (the reason)."""
    rows = []
    for config, block in (data.get("parallel_modes") or {}).items():
        if not isinstance(block, Mapping):
            continue
        skipped = block.get("skipped") or {}
        listed = [m for m in PARALLEL_MODES if m in block or m in skipped]
        for mode in listed + [m for m in skipped if m not in PARALLEL_MODES]:
            entry = block.get(mode) if isinstance(block.get(mode), Mapping) else {}
            versus = entry.get("speed_vs_ring") or {}
            low_ms, high_ms = entry.get("ci_ms") or [None, None]
            low, high = versus.get("ci") or [None, None]
            rows.append({"gpus": gpus, "config": config, "mode": mode, "seq_len": block.get("seq_len"),
                         "median_ms": entry.get("median_ms"), "low_ms": low_ms, "high_ms": high_ms,
                         "speed_vs_ring": versus.get("ratio"), "speed_low": low, "speed_high": high,
                         "verdict": versus.get("verdict"), "bytes_sent_max_rank": entry.get("bytes_sent_max_rank"),
                         "mesh": entry.get("mesh"), "skipped": skipped.get(mode) if mode not in block else None})
    return rows


def _present(value: Any) -> bool:
    return value is not None and value == value


def _ratio(row: Any) -> str:
    return f"{row.speed_vs_ring:.3f} [{row.speed_low:.3f}, {row.speed_high:.3f}]"


def _gib(value: Any) -> str:
    from hilbert_lab.reports.page import fmt

    return f"{fmt(float(value) / 2**30)} GiB" if value >= 2**30 else f"{fmt(float(value) / 2**20)} MiB"


def modes_finding(frame: Any, sends: set[str]) -> tuple[str, str]:
    """(finding, headline): per config (the one whose ring sends keys/values first) and GPU count, which mode is
    fastest and each other mode's speed against the ring with its interval, then the skipped modes with their
    reason; the headline is the first config's part alone."""
    from hilbert_lab.reports.page import tokens

    ran = frame[frame["median_ms"].notna()]
    parts, reasons = [], {}
    for config in sorted(set(ran["config"]), key=lambda name: (name not in sends, name)):
        by_config = ran[ran.config == config]
        counts = []
        for gpus in sorted(set(by_config.gpus)):
            group = by_config[by_config.gpus == gpus]
            others = group[(group["mode"] != "ring") & group["speed_vs_ring"].notna()]
            if not len(others):
                continue
            faster = [mode_name(r.mode, r.mesh) for r in others.itertuples() if r.verdict == "B faster"]
            if (others["verdict"] == "A faster").all():
                lead = "the ring is fastest"
            elif faster:
                lead = f"{' and '.join(faster)} {'is' if len(faster) == 1 else 'are'} faster than the ring"
            else:
                lead = "no mode is faster than the ring"
            ring = group[group["mode"] == "ring"]
            sent = ("the ring sends nothing; " if len(ring) and not ring.bytes_sent_max_rank.iloc[0] else
                    f"the ring sends {_gib(ring.bytes_sent_max_rank.iloc[0])} per rank; " if len(ring) else "")
            speeds = ", ".join(f"{mode_name(r.mode, r.mesh)} {_ratio(r)}" for r in others.itertuples())
            counts.append(f"on {int(gpus)} GPUs {lead} ({sent}{speeds})")
        if counts:
            parts.append(f"{config} at {tokens(by_config.seq_len.iloc[0])} tokens: " + "; ".join(counts))
    for row in frame[frame["skipped"].notna()].itertuples():
        reasons.setdefault((row.mode, row.skipped), set()).add(int(row.gpus))
    skipped = "".join(f" The {mode_name(mode)} did not run on {', '.join(map(str, sorted(gpus)))} GPUs "
                      f"({reason.split(': ', 1)[-1]})." for (mode, reason), gpus in reasons.items())
    lead = "Context-parallel modes, forward+backward step on the same shards in interleaved rounds"
    finding = (f"{lead} (speed against the ring = time(ring) / time(mode), 95% intervals): " + "; ".join(parts)
               + "." + skipped)
    headline = f"{lead}, speed against the ring [95% interval]: {parts[0]}." if parts else finding
    return finding, headline


def modes_table(frame: Any) -> Any:
    """The parallel_modes rows labelled for reading."""
    import pandas as pd

    from hilbert_lab.reports.page import fmt, fmt_interval

    return pd.DataFrame({
        "GPUs": frame["gpus"], "config": frame["config"],
        "mode": [mode_name(r.mode, r.mesh) for r in frame.itertuples()], "tokens": frame["seq_len"],
        "step ms [95%]": [fmt_interval(r.median_ms, r.low_ms, r.high_ms) for r in frame.itertuples()],
        "speed vs ring [95%]": [_ratio(r) if _present(r.speed_vs_ring) else ("reference" if r.mode == "ring" and
                                _present(r.median_ms) else "-") for r in frame.itertuples()],
        # bench_ring's ratio is time(ring) / time(mode): its verdict words the mode against the ring
        "verdict": [verdict_sentence(r.verdict, "the ring") if _present(r.verdict) else "-"
                    for r in frame.itertuples()],
        "sent per rank (MiB)": [fmt(r.bytes_sent_max_rank / 2**20) if _present(r.bytes_sent_max_rank) else "-"
                                for r in frame.itertuples()],
        "mesh (ring x Ulysses)": [f"{r.mesh[0]} x {r.mesh[1]}" if isinstance(r.mesh, (list, tuple)) else "-"
                                  for r in frame.itertuples()],
        "skipped because": [r.skipped if _present(r.skipped) else "-" for r in frame.itertuples()]})


def modes_section(frame: Any, sends: set[str]) -> tuple[Any, str, str]:
    """(Section, finding, headline) of the parallel_modes table: step time per mode with intervals, grouped by
    config and GPU count, from zero."""
    import plotly.graph_objects as go

    from hilbert_lab.reports.page import Section, style_axes

    finding, headline = modes_finding(frame, sends)
    ran = frame[frame["median_ms"].notna()]
    fig = go.Figure()
    for mode in [m for m in PARALLEL_MODES if m in set(ran["mode"])]:
        group = ran[ran["mode"] == mode]
        fig.add_trace(go.Bar(
            x=[f"{r.config}, {int(r.gpus)} GPUs" for r in group.itertuples()], y=group["median_ms"].tolist(),
            name=mode_name(mode, group["mesh"].dropna().iloc[0] if group["mesh"].notna().any() else None),
            error_y=dict(type="data", symmetric=False, array=(group["high_ms"] - group["median_ms"]).tolist(),
                         arrayminus=(group["median_ms"] - group["low_ms"]).tolist())))
    style_axes(fig, "config, GPUs", "forward+backward step (ms, lower is better)")
    fig.update_layout(title="context-parallel modes on the same shards (medians, 95% intervals)", barmode="group",
                      height=420, yaxis_rangemode="tozero")
    return Section("Ring, head-parallel and hybrid", finding, figure=fig, table=modes_table(frame)), finding, headline


__all__ = ["MODE_NAMES", "PARALLEL_MODES_COLUMNS", "mode_name", "modes_finding", "modes_section", "modes_table",
           "parallel_modes_rows"]
