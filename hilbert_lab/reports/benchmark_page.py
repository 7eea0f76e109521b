"""The benchmark page: a pure function of a benchmark run's metrics.json + env.json (reports.render).

Two kinds of timing feed it: one isolated process per case (the results table: scaling, throughput, memory,
backends against each other) and the orderings timed against the identity layout alternately in one process
(the ordering_ab table). Ordering effects are stated from the second, which cancels the drift between
processes; the page says how far the separate runs agree with it.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from hilbert_lab.reports.auto_check import auto_check_sections
from hilbert_lab.reports.benchmark import _rows, comparisons
from hilbert_lab.viz.style import ordering_name, ordering_trace

# the backend that ran -> what it is
EXECUTORS = {"triton": "the fused Triton kernel", "sdpa": "PyTorch SDPA per block", "manual": "eager attention per block",
             "flash": "flash-attn per block", "flex": "FlexAttention", "xformers": "xFormers per block",
             "sdpa_flash": "SDPA's flash kernel per block", "sdpa_cudnn": "SDPA's cuDNN kernel per block",
             "sdpa_efficient": "SDPA's memory-efficient kernel per block", "sdpa_math": "SDPA's math kernel per block"}


def _label(row: dict[str, Any]) -> str:
    return f"{row['backend']} / {ordering_name(row['ordering'])}" + (f" / {row['mode']}" if row.get("mode") != "longnet" else "") \
        + ("" if row.get("pass", "forward") == "forward" else " / fwd+bwd")


def _style(row: dict[str, Any], variants: dict[tuple[Any, ...], int]) -> dict[str, Any]:
    """A series' line and marker: its ordering's colour on every figure, a dash per (backend, mode, pass)."""
    key = (row["backend"], row.get("mode"), row.get("pass", "forward"))
    return ordering_trace(row["ordering"], variants.setdefault(key, len(variants)))


def _backend(row: dict[str, Any]) -> str:
    """'auto (chose sdpa)' for auto with a recorded choice, else the backend's name."""
    used = row.get("backend_used")
    return f"auto (chose {used})" if row["backend"] == "auto" and used else row["backend"]


def _slope(group: list[dict[str, Any]], resamples: int = 400) -> tuple[float, float, float] | None:
    """Exponent of time ~ N^k over the group's lengths with a 95% bootstrap interval (repeats resampled)."""
    group = [row for row in sorted(group, key=lambda r: r["seq_len"]) if row.get("times_ms")]
    if len({row["seq_len"] for row in group}) < 2:
        return None
    x = np.log([row["seq_len"] for row in group])
    fit = float(np.polyfit(x, np.log([row["median"] for row in group]), 1)[0])
    rng = np.random.default_rng(0)
    slopes = [np.polyfit(x, np.log([np.median(rng.choice(row["times_ms"], len(row["times_ms"]))) for row in group]),
                         1)[0] for _ in range(resamples)]
    low, high = np.quantile(slopes, [0.025, 0.975])
    return fit, float(min(low, fit)), float(max(high, fit))


def _ratio(compared: dict[str, Any]) -> str:
    """'0.90x [0.89, 0.92]', with a word when the estimate sits at an end of its interval (few repeats)."""
    from hilbert_lab.bench.stats import format_ratio

    text = format_ratio(compared["speedup"], compared["speedup_low"], compared["speedup_high"])
    if min(abs(compared["speedup"] - compared["speedup_low"]), abs(compared["speedup_high"] - compared["speedup"])) \
            < 1e-9 and compared["speedup_low"] < compared["speedup_high"]:
        text += f" (interval from {compared['samples']} repeats: the estimate lies at its end)"
    return text


def _time_figure(lines: dict[str, list[dict[str, Any]]], ticks: list[int], variants: dict[tuple[Any, ...], int]) -> Any:
    import plotly.graph_objects as go

    from hilbert_lab.reports.page import style_axes

    fig = go.Figure()
    for label, group in lines.items():
        group = sorted(group, key=lambda r: r["seq_len"])
        fig.add_trace(go.Scatter(
            x=[r["seq_len"] for r in group], y=[r["median"] for r in group], name=label, mode="lines+markers",
            **_style(group[0], variants),
            error_y=dict(type="data", symmetric=False, array=[r["high"] - r["median"] for r in group],
                         arrayminus=[r["median"] - r["low"] for r in group])))
    style_axes(fig, "sequence length (tokens, log scale)", "time per call (ms, log scale; lower is better)", ticks)
    fig.update_layout(title="median time per call, one process per case (bars: 95% interval of the median)",
                      xaxis_type="log", yaxis_type="log", height=430)
    return fig


def _backend_finding(ok: list[dict[str, Any]]) -> str | None:
    """The fastest backend at the longest length (identity layout) against every other, ratios from the
    separate runs' repeats (unpaired)."""
    from hilbert_lab.bench.stats import compare
    from hilbert_lab.reports.page import fmt_interval

    longest = max(row["seq_len"] for row in ok)
    rows = [row for row in ok if row["seq_len"] == longest and row["ordering"] == "identity" and row.get("times_ms")
            and row.get("pass", "forward") == "forward" and row.get("mode") == ok[0].get("mode")]
    if len({row["backend"] for row in rows}) < 2:
        return None
    best = min(rows, key=lambda r: r["median"])
    others = []
    for row in sorted((r for r in rows if r is not best), key=lambda r: r["median"]):
        compared = compare(best["times_ms"], row["times_ms"], best["backend"], row["backend"], paired=False)
        word = "faster than" if compared["verdict"] == f"{best['backend']} faster" else "level with"
        others.append(f"{_ratio(compared)} {word} {_backend(row)}")
    return (f"At {longest:,} tokens {_backend(best)} is the fastest backend, "
            f"{fmt_interval(best['median'], best['low'], best['high'], 'ms')} per call: " + "; ".join(others) + ".")


def unsettled(metrics: dict[str, Any], table: Any) -> dict[tuple[Any, ...], str]:
    """{(backend, seq_len, ordering): why} of the comparisons this run could not settle: an interval that still spans
    1 by more than the margin after its last round (bench.stats.settled), or, for an interleaved comparison, a verdict
    that the same cases timed in separate processes contradict (one says slower or faster, the other something
    else)."""
    from hilbert_lab.bench.stats import NO_DIFFERENCE_MARGIN, compare

    if not len(table):
        return {}
    interleaved = table["timing"].iloc[0] == "interleaved"
    out = {(row.backend, row.seq_len, row.ordering): (f"its interval still spans 1 by more than "
                                                      f"{100 * NO_DIFFERENCE_MARGIN:.0f}% after {int(row.samples)} "
                                                      f"{'rounds' if interleaved else 'repeats'}")
           for row in table.itertuples() if getattr(row, "settled", True) is False}
    if not interleaved:
        return out
    cases = {(r["backend"], r["seq_len"], r["ordering"]): r for r in _rows(metrics, "results")
             if r.get("status") == "ok" and r.get("times_ms") and r.get("pass", "forward") == "forward"}
    for row in table.itertuples():
        key = (row.backend, row.seq_len, row.ordering)
        if key in out:
            continue
        ordered, identity = cases.get(key), cases.get((row.backend, row.seq_len, "identity"))
        if ordered and identity:
            separate = compare(ordered["times_ms"], identity["times_ms"], row.ordering, "identity", paired=False)
            if separate["verdict"] != row.verdict:
                out[key] = f"{_ratio(separate)} in separate runs"
    return out


def _ordering_findings(table: Any, open_cases: dict[tuple[Any, ...], str] | None = None) -> tuple[str, str]:
    """(finding, conclusion) of the ordering comparisons; `open_cases` (unsettled) are counted as not settled,
    never as faster or slower."""
    open_cases = open_cases or {}
    settled = [(r.backend, r.seq_len, r.ordering) not in open_cases for r in table.itertuples()]
    counts = table[settled]["verdict"].value_counts()
    slower = int(counts.get("identity faster", 0))
    same = int(counts.get("no difference", 0))
    faster = int(sum(settled)) - slower - same
    unknown = len(table) - int(sum(settled))
    timing = table["timing"].iloc[0]
    orderings = ", ".join(dict.fromkeys(map(ordering_name, table["ordering"])))
    by_length = table.sort_values(["seq_len", "backend"])
    shown = by_length if len(by_length) <= 4 else by_length.iloc[[0, -1]]
    def said(r: Any) -> str:
        key = (r.backend, r.seq_len, r.ordering)
        if key in open_cases:
            return (f"not settled at {int(r.seq_len):,} tokens ({r.backend}): {_ratio(r._asdict())} interleaved, but "
                    f"{open_cases[key]}")
        return f"{_ratio(r._asdict())} at {int(r.seq_len):,} tokens ({r.backend})"

    spread = ("; " if len(shown) > 2 else " and ").join(said(r) for r in shown.itertuples())
    tally = ", ".join(f"{word} in {count}" for word, count in (("faster", faster), ("slower", slower),
                                                               ("no different", same), ("not settled", unknown))
                      if count)
    finding = (f"The {orderings} layout against identity (the same attention, only the memory order differs; "
               f"{'timed alternately in one process' if timing == 'interleaved' else 'timed in separate processes'}):"
               f" {tally} of {len(table)} comparisons, speed-up {spread}.")
    conclusion = (f"Speed-up = identity time / ordered time (above 1: the ordering is faster); {len(table)} "
                  f"comparisons, {timing}: faster in {faster}, slower in {slower}, no difference in {same}"
                  + (f", not settled in {unknown} (an interval still wide around 1 after its last round, or the same "
                     "cases timed in separate processes give another verdict: this run cannot tell)" if unknown else "")
                  + ".")
    return finding, conclusion


def _agreement(metrics: dict[str, Any], ok: list[dict[str, Any]], table: Any) -> str:
    """How the separate runs' ordering ratios compare with the interleaved ones (same cases)."""
    from hilbert_lab.bench.stats import compare

    if not len(table) or table["timing"].iloc[0] != "interleaved":
        return "The ordering comparisons on this page come from these separate runs."
    cases = {(r["backend"], r["seq_len"], r["ordering"]): r for r in ok if r.get("pass", "forward") == "forward"}
    parameters = metrics.get("parameters") or {}
    patterns = {tuple(r.get("segment_lengths") or ()) for r in _rows(metrics, "ordering_ab")}
    lines, disagree = [], []
    for row in table.itertuples():
        ordered, identity = cases.get((row.backend, row.seq_len, row.ordering)), cases.get((row.backend, row.seq_len,
                                                                                              "identity"))
        if not (ordered and identity and ordered.get("times_ms") and identity.get("times_ms")):
            continue
        separate = compare(ordered["times_ms"], identity["times_ms"], paired=False)
        overlap = separate["speedup_low"] <= row.speedup_high and row.speedup_low <= separate["speedup_high"]
        text = f"{int(row.seq_len):,} tokens: {_ratio(separate)} separate vs {_ratio(row._asdict())} interleaved"
        (lines if overlap else disagree).append(text)
    text = ("Each case ran in its own process: these times give scaling, throughput and memory. Ordering effects "
            "are stated from the interleaved comparison, which alternates both layouts in one process; the ratios of "
            "these separate runs ")
    if disagree:
        text += (f"disagree with it at {'; '.join(disagree)} (drift between processes; the interleaved figure is "
                 "the one this page states)" + (f" and agree at {'; '.join(lines)}" if lines else "") + ".")
    else:
        text += f"agree with it (95% intervals overlap): {'; '.join(lines)}." if lines else "were not comparable."
    if patterns and patterns != {tuple(parameters.get("segment_lengths") or ())}:
        text += (" The interleaved comparison of this run clipped the pattern to segments no longer than the "
                 "sequence, so at the shortest lengths it timed fewer branches than the separate runs.")
    return text


def render(metrics: dict[str, Any], env: dict[str, Any]) -> Any:
    """Benchmark page: findings (orderings, backends, scaling, memory), the time and ordering figures with
    intervals, memory and throughput, every case behind a closed section."""
    import pandas as pd
    import plotly.graph_objects as go

    from hilbert_lab.bench.stats import bootstrap_median_ci
    from hilbert_lab.reports.page import (CPU_TIMING_NOTE, Page, Section, fmt, fmt_count, fmt_interval, is_gpu_env,
                                          memory_change, memory_resolution_mib, older_code_page, out_of_memory,
                                          style_axes)
    from hilbert_lab.reports.provenance import older_code

    gpu = is_gpu_env(env)
    parameters = metrics.get("parameters") or {}
    results = _rows(metrics, "results")
    ok = [row for row in results if row.get("status") == "ok"]
    for row in ok:
        row["median"], row["low"], row["high"] = bootstrap_median_ci(row.get("times_ms") or [row["median_ms"]])
    lines: dict[str, list[dict]] = {}
    for row in ok:
        lines.setdefault(_label(row), []).append(row)
    ticks = sorted({row["seq_len"] for row in ok})
    variants: dict[tuple[Any, ...], int] = {}
    findings, sections = [], []
    table = comparisons(metrics)
    if len(table):
        finding, conclusion = _ordering_findings(table, unsettled(metrics, table))
        findings.append(finding)
    backend_line = _backend_finding(ok) if ok else None
    if backend_line:
        findings.append(backend_line)
    chosen = sorted({row.get("backend_used") for row in ok if row["backend"] == "auto" and row.get("backend_used")})
    if chosen:
        findings.append(f"auto ran {', '.join(f'{name} ({EXECUTORS.get(name, name)})' for name in chosen)} in "
                        f"{'every cell' if len(chosen) == 1 else 'the cells named in the table of every case'} "
                        f"({parameters.get('dtype', '')} on {'the GPU' if gpu else 'the CPU'}).")
    if ok:
        fastest = min((r for r in ok if r["seq_len"] == max(ticks)), key=lambda r: r["median"])
        slope = _slope(lines[_label(fastest)])
        time_conclusion = (f"At {max(ticks):,} tokens the fastest case is {_label(fastest)}: "
                           f"{fmt_interval(fastest['median'], fastest['low'], fastest['high'], 'ms')}.")
        if slope:
            scaling = (f"Time grows like N^{slope[0]:.2f} [{slope[1]:.2f}, {slope[2]:.2f}] from {min(ticks):,} to "
                       f"{max(ticks):,} tokens for {_label(fastest)} (1 = linear, as the dilated pattern's work is).")
            time_conclusion += " " + scaling
            findings.append(scaling)
        sections.append(Section("Time per call", time_conclusion, figure=_time_figure(lines, ticks, variants)))
    if len(table):
        fig = go.Figure()
        for (backend, mode, ordering), group in table.groupby(["backend", "mode", "ordering"], sort=False):
            group = group.sort_values("seq_len")
            fig.add_trace(go.Scatter(
                x=group["seq_len"].tolist(), y=group["speedup"].tolist(), mode="lines+markers",
                name=f"{backend} / {ordering_name(ordering)}" + ("" if mode == "longnet" else f" / {mode}"),
                **_style({"backend": backend, "mode": mode, "ordering": ordering}, variants),
                error_y=dict(type="data", symmetric=False, array=(group["speedup_high"] - group["speedup"]).tolist(),
                             arrayminus=(group["speedup"] - group["speedup_low"]).tolist())))
        fig.add_hline(y=1.0, line_dash="dash", line_color="#888", annotation_text="no difference",
                      annotation_position="top left")
        style_axes(fig, "sequence length (tokens, log scale)", "speed-up over identity (above 1: ordering faster)",
                   ticks)
        fig.update_layout(title=f"ordering vs identity: time ratio with 95% bootstrap interval ({table['timing'].iloc[0]})",
                          xaxis_type="log", height=400)
        shown = pd.DataFrame({
            "backend": table["backend"], "tokens": table["seq_len"], "ordering": table["ordering"].map(ordering_name),
            "identity ms [95%]": [fmt_interval(r.b_median, r.b_low, r.b_high) for r in table.itertuples()],
            "ordered ms [95%]": [fmt_interval(r.a_median, r.a_low, r.a_high) for r in table.itertuples()],
            "speed-up [95%]": [_ratio(r._asdict()) for r in table.itertuples()], "verdict": table["verdict"]})
        sections.append(Section("Token orderings against the identity layout", conclusion, figure=fig, table=shown,
                                text=["An ordering only moves tokens in memory (per segment, after dilation): the "
                                      "attention computed is the same, so any difference is layout alone."
                                      + (" The fused Triton kernel addresses tokens by their original position, so "
                                         "an ordering is not even materialised there: its rows differ by noise "
                                         "alone." if "triton" in set(table["backend"]) else "")],
                                caption=f"{int(table['samples'].iloc[0])} repeats per side; verdict 'no difference' "
                                        "when the interval contains 1"))
    peaks = [row for row in ok if row.get("peak_mib") is not None and row.get("peak_mib") == row.get("peak_mib")]
    if peaks:
        fig = go.Figure()
        for label, group in lines.items():
            group = sorted((r for r in group if r in peaks), key=lambda r: r["seq_len"])
            fig.add_trace(go.Scatter(x=[r["seq_len"] for r in group], y=[r["peak_mib"] for r in group],
                                     name=label, mode="lines+markers", **_style(lines[label][0], variants)))
        positive = all(r["peak_mib"] > 0 for r in peaks)  # an RSS growth of 0 has no place on a log axis
        style_axes(fig, "sequence length (tokens, log scale)", f"peak above inputs (MiB{', log' if positive else ''}; "
                   "lower is better)", ticks)
        fig.update_layout(title="peak memory vs sequence length (one measurement per case)", xaxis_type="log",
                          yaxis_type="log" if positive else "linear", height=400)
        longest = [row for row in peaks if row["seq_len"] == max(r["seq_len"] for r in peaks)]
        method = next((row.get("peak_method") for row in peaks if row.get("peak_method")), "the runner")
        memory = (f"Peak memory above the inputs at {longest[0]['seq_len']:,} tokens: " + ", ".join(
            f"{_label(r)} {fmt(r['peak_mib'])} MiB" for r in sorted(longest, key=lambda r: r["peak_mib"]))
            + f" (one measurement per case: {method.split(' (')[0]}).")
        resolution = memory_resolution_mib(method if method != "the runner" else parameters.get("device", "cpu"))
        by_case = {(r["backend"], r.get("mode"), r.get("pass", "forward"), r["ordering"]): r for r in longest}
        layouts = [f"{ordering_name(r['ordering'])} against identity ({r['backend']}): {memory_change(base['peak_mib'], r['peak_mib'], resolution)}"
                   for key, r in by_case.items() if key[3] != "identity"
                   for base in [by_case.get((*key[:3], "identity"))] if base is not None]
        if layouts:
            memory += " Layouts: " + "; ".join(layouts) + "."
        sections.append(Section("Peak memory", memory, figure=fig))
        if len(findings) < 5:
            findings.append(memory)
    if ok:
        fig = go.Figure()
        for label, group in lines.items():
            group = sorted(group, key=lambda r: r["seq_len"])
            fig.add_trace(go.Scatter(x=[r["seq_len"] for r in group], y=[r["useful_tflops"] for r in group],
                                     name=label, mode="lines+markers", **_style(group[0], variants)))
        style_axes(fig, "sequence length (tokens, log scale)", "useful TFLOP/s (higher is better)", ticks)
        fig.update_layout(title="useful TFLOP/s: FLOPs of the query-key pairs the pattern computes, per second",
                          xaxis_type="log", height=380)
        top = max(ok, key=lambda r: r["useful_tflops"])
        sections.append(Section("Useful throughput", f"Highest: {fmt(top['useful_tflops'])} TFLOP/s ({_label(top)} "
                                f"at {top['seq_len']:,} tokens).", figure=fig, collapsed=True))
    modes = sorted({row["mode"] for row in results})
    passes = sorted({row.get("pass", "forward") for row in results})
    cases = pd.DataFrame([{
        "backend": _backend(row), "tokens": row["seq_len"], "ordering": ordering_name(row["ordering"]),
        **({"mode": row["mode"]} if len(modes) > 1 else {}), **({"pass": row["pass"]} if len(passes) > 1 else {}),
        "median ms [95%]": fmt_interval(row["median"], row["low"], row["high"]) if row in ok else row["status"],
        "tokens/s": fmt_count(row.get("tokens_per_s")), "useful TFLOP/s": row.get("useful_tflops"),
        "peak MiB": row.get("peak_mib"), "error": out_of_memory(row.get("error"))} for row in results])
    if not cases["error"].astype(bool).any():
        cases = cases.drop(columns=["error"])
    auto_sections, auto_findings, auto_sources = auto_check_sections(metrics)
    sections += auto_sections
    findings += auto_findings[:max(0, 5 - len(findings))]
    sections.append(Section("Every case", _agreement(metrics, ok, table), table=cases, collapsed=True,
                            caption=f"{len(ok)} of {len(results)} cases finished; mode {', '.join(modes)}, "
                                    f"{', '.join(passes)} pass; {parameters.get('repeats', '?')} repeats per case, "
                                    "intervals from the per-repeat times"))
    lengths = sorted({row["seq_len"] for row in results})
    about = (f"Dilated attention (segments {parameters.get('segment_lengths')}, dilations "
             f"{parameters.get('dilation_rates')}, {parameters.get('num_heads')} heads of {parameters.get('head_dim')}, "
             f"{parameters.get('dtype')}) timed at {', '.join(f'{n:,}' for n in lengths)} tokens, backends "
             f"{', '.join(sorted({row['backend'] for row in results}))}, orderings "
             f"{', '.join(sorted({ordering_name(row['ordering']) for row in results}))}; {len(ok)} of {len(results)} cases finished. "
             "Times are medians with 95% bootstrap intervals; a ratio whose interval lies within 5% of 1 reads 'no "
             "difference', and one whose interval still spans 1 more widely after its last round 'not settled'.")
    page = Page(title="Benchmark: dilated attention time, throughput and memory", findings=findings[:5], about=about,
                sections=sections, notes=[] if gpu else [CPU_TIMING_NOTE],
                sources=auto_sources)
    return older_code_page(page, older_code(env.get("git")) if gpu else "")
