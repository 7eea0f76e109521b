"""Plotly figures of training runs: loss/accuracy curves with curriculum phases, throughput bars, peak memory
against sequence length (the longest trainable length), scaling over GPUs, and the retrieval grid (accuracy against
attention FLOPs, accuracy per needle distance)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hilbert_lab.viz.style import PALETTE, check_rows, readable_log_axes, run_colours

__all__ = [
    "METRICS",
    "accuracy_by_distance",
    "accuracy_vs_flops",
    "curriculum_phases",
    "memory_by_length",
    "scaling_bars",
    "throughput_bars",
    "training_curves",
]

METRICS = ("loss", "accuracy")
# plotly's default qualitative palette, so each run keeps one colour across its traces and phase marks
_COLORS = PALETTE

Phase = tuple[int, int, int]  # (start_step, end_step, seq_len)


def _tokens(seq_len: int) -> str:
    """1024 -> '1K', 32768 -> '32K', 4194304 -> '4M', 64 -> '64'."""
    if seq_len >= 2**20 and seq_len % 2**20 == 0:
        return f"{seq_len >> 20}M"
    return f"{seq_len // 1024}K" if seq_len >= 1024 and seq_len % 1024 == 0 else str(seq_len)


def curriculum_phases(records: Sequence[Mapping[str, Any]]) -> list[Phase]:
    """(start_step, end_step, seq_len) of each run of consecutive train records with one seq_len.

    A phase starts where the previous one's last logged step is (0 for the first) and ends at its own
    last logged step. Records without seq_len (runs logged before curricula) give no phases.
    """
    phases: list[Phase] = []
    for record in records:
        if record.get("kind") != "train" or record.get("seq_len") is None:
            continue
        step, length = int(record["step"]), int(record["seq_len"])
        if phases and phases[-1][2] == length:
            phases[-1] = (phases[-1][0], step, length)
        else:
            phases.append((phases[-1][1] if phases else 0, step, length))
    return phases


def training_curves(
    runs: Mapping[str, Sequence[Mapping[str, Any]]],
    metric: str = "loss",
    chance: float | None = None,
    *,
    phases: Mapping[str, Sequence[Phase]] | None = None,
    title: str | None = None,
):
    """`metric` ("loss" or "accuracy") against step for each run's log records (kind "train"/"eval").

    Per run, in one colour: trace "<run> train" (thin line, omitted without train records) and trace
    "<run> eval" (markers + line, omitted without eval records). `chance` draws a dashed horizontal
    line. A run with two or more curriculum phases (`phases[run]`, else curriculum_phases(records)) gets
    a dotted vertical line at each phase boundary and an annotation (name "phase") naming each phase's
    training length at its start step; runs with the same phases share one set of marks (grey).
    """
    import plotly.graph_objects as go

    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    figure = go.Figure()
    phase_rows = 0
    drawn: list[list[Phase]] = []
    every = {label: list(phases[label]) if phases is not None and label in phases else curriculum_phases(records)
             for label, records in runs.items()}
    for index, (label, records) in enumerate(runs.items()):
        color = _COLORS[index % len(_COLORS)]
        for kind, style in (("train", dict(mode="lines", line={"color": color, "width": 1}, opacity=0.55)),
                            ("eval", dict(mode="lines+markers", line={"color": color, "width": 2},
                                          marker={"color": color, "size": 7}))):
            points = [r for r in records if r.get("kind") == kind and r.get(metric) is not None]
            if not points:
                continue
            lengths = [r.get("seq_len") for r in points]
            figure.add_trace(go.Scatter(
                x=[int(r["step"]) for r in points], y=[float(r[metric]) for r in points], name=f"{label} {kind}",
                legendgroup=label, customdata=lengths if kind == "train" else None,
                hovertemplate=(f"{label} {kind}<br>step %{{x}}<br>{metric} %{{y:.4g}}"
                               + ("<br>seq_len %{customdata}" if kind == "train" else "") + "<extra></extra>"),
                **style,
            ))
        run_phases = every[label]
        if len(run_phases) < 2 or run_phases in drawn:  # runs with the same curriculum share one set of marks
            continue
        drawn.append(run_phases)
        shared = [other for other, other_phases in every.items() if other_phases == run_phases]
        if len(shared) > 1:
            color, label = "#555", " and ".join(shared)
        label_y = 1.0 - 0.06 * phase_rows
        phase_rows += 1
        for number, (start, _end, length) in enumerate(run_phases):
            if number > 0:
                figure.add_vline(x=start, line={"color": color, "width": 1, "dash": "dot"})
            figure.add_annotation(x=start, y=label_y, xref="x", yref="paper", yanchor="top", xanchor="left",
                                  text=_tokens(length), showarrow=False, font={"color": color, "size": 11},
                                  name="phase", hovertext=f"{label}: trains at {length} tokens from step {start}")
    if chance is not None:
        figure.add_hline(y=chance, line={"color": "gray", "dash": "dash", "width": 1},
                         annotation_text=f"chance {100 * chance:.3g}%" if metric == "accuracy" else
                         f"chance {chance:.3g} nats", annotation_position="top left")
    figure.update_layout(
        title=title or f"{metric} vs step (train: thin lines, eval at full length: markers)",
        xaxis_title="step", yaxis_title=metric, legend={"groupclick": "togglegroup"},
    )
    if metric == "accuracy":
        figure.update_yaxes(range=[-0.02, 1.02])
    return figure


def throughput_bars(rows: Sequence[Mapping[str, Any]], *, title: str = "training throughput and peak memory"):
    """Bars of tokens/s (left) and peak memory in GiB (right) per run, with/without gradient checkpointing.

    `rows` need keys run, gradient_checkpointing, tokens_per_s, peak_memory_gib. Traces come in pairs
    per checkpointing setting (tokens/s, then memory), named "with/without gradient checkpointing".
    """
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    if not rows:
        raise ValueError("rows must hold at least one throughput row")
    needed = ("run", "gradient_checkpointing", "tokens_per_s", "peak_memory_gib")
    for row in rows:
        missing = [key for key in needed if key not in row]
        if missing:
            raise ValueError(f"throughput rows need keys {needed}; a row lacks {missing}: {dict(row)!r}")
    figure = make_subplots(rows=1, cols=2, subplot_titles=("tokens/s", "peak memory (GiB)"))
    for checkpointing, color in ((False, _COLORS[0]), (True, _COLORS[1])):
        chosen = [row for row in rows if bool(row["gradient_checkpointing"]) is checkpointing]
        if not chosen:
            continue
        name = ("with" if checkpointing else "without") + " gradient checkpointing"
        runs = [str(row["run"]) for row in chosen]
        figure.add_trace(go.Bar(x=runs, y=[float(row["tokens_per_s"]) for row in chosen], name=name,
                                legendgroup=name, marker_color=color), row=1, col=1)
        figure.add_trace(go.Bar(x=runs, y=[float(row["peak_memory_gib"]) for row in chosen], name=name,
                                legendgroup=name, marker_color=color, showlegend=False), row=1, col=2)
    figure.update_layout(title=title, barmode="group")
    figure.update_yaxes(title_text="tokens/s", row=1, col=1)
    figure.update_yaxes(title_text="GiB", row=1, col=2)
    return figure


def scaling_bars(rows: Sequence[Mapping[str, Any]], *, target: float | None = None,
                 title: str = "tokens/s per GPU against one GPU"):
    """Bars of each setup's median tokens/s per GPU over one GPU's (whiskers: its slowest and fastest run), with and
    without gradient checkpointing; a dashed line at `target`. `rows` need keys setup, gradient_checkpointing,
    ratio, ratio_low, ratio_high."""
    import plotly.graph_objects as go

    check_rows(rows, ("setup", "gradient_checkpointing", "ratio", "ratio_low", "ratio_high"), "scaling")
    figure = go.Figure()
    for checkpointing, color in ((False, _COLORS[0]), (True, _COLORS[1])):
        chosen = [row for row in rows if bool(row["gradient_checkpointing"]) is checkpointing]
        if not chosen:
            continue
        ratios = [float(row["ratio"]) for row in chosen]
        figure.add_trace(go.Bar(
            x=[str(row["setup"]) for row in chosen], y=ratios, marker_color=color,
            name=("with" if checkpointing else "without") + " gradient checkpointing",
            error_y=dict(type="data", symmetric=False,
                         array=[float(r["ratio_high"]) - m for r, m in zip(chosen, ratios)],
                         arrayminus=[m - float(r["ratio_low"]) for r, m in zip(chosen, ratios)])))
    if target is not None:
        figure.add_hline(y=target, line_dash="dash", annotation_text=f"target {target:g}")
    figure.update_layout(title=title, barmode="group", height=420, xaxis_title="setup",
                         yaxis_title="tokens/s per GPU / one GPU's (higher is better)")
    figure.update_yaxes(rangemode="tozero")
    return figure


def accuracy_vs_flops(rows: Sequence[Mapping[str, Any]], *, chance: float | None = None,
                      title: str = "retrieval accuracy against attention FLOPs per token",
                      colours: Mapping[str, str] | None = None):
    """One point per grid row: x = attention FLOPs per token (log axis), y = pooled accuracy with its
    95% interval as asymmetric error bars. `rows` need row, flops_per_token, accuracy, accuracy_low,
    accuracy_high (optional: seeds, count, run_accuracies). One trace per row (named by it), then, with two
    or more run_accuracies, a trace "<row> seeds" of open markers, one per seed; `chance` draws a dashed line.
    colours: {row: colour} (viz.style.run_colours), so a row keeps its colour in accuracy_by_distance too."""
    import plotly.graph_objects as go

    check_rows(rows, ("row", "flops_per_token", "accuracy", "accuracy_low", "accuracy_high"), "grid")
    colours = run_colours([str(row["row"]) for row in rows], colours)
    figure = go.Figure()
    for row in rows:
        accuracy = float(row["accuracy"])
        figure.add_trace(go.Scatter(
            x=[float(row["flops_per_token"])], y=[accuracy], mode="markers", name=str(row["row"]),
            legendgroup=str(row["row"]),
            marker={"color": colours[str(row["row"])], "size": 11},
            error_y={"type": "data", "symmetric": False, "array": [float(row["accuracy_high"]) - accuracy],
                     "arrayminus": [accuracy - float(row["accuracy_low"])], "thickness": 1.5, "width": 6},
            hovertemplate=(f"{row['row']}<br>%{{x:.3g}} attention FLOPs/token<br>accuracy %{{y:.3f}} "
                           f"[{float(row['accuracy_low']):.3f}, {float(row['accuracy_high']):.3f}]"
                           f"<br>{row.get('seeds', '?')} seeds, {row.get('count', '?')} answers<extra></extra>"),
        ))
        seeds = [float(a) for a in row.get("run_accuracies") or []]
        if len(seeds) > 1:
            figure.add_trace(go.Scatter(
                x=[float(row["flops_per_token"])] * len(seeds), y=seeds, mode="markers", name=f"{row['row']} seeds",
                legendgroup=str(row["row"]), showlegend=False,
                marker={"color": colours[str(row["row"])], "size": 6, "symbol": "circle-open"},
                hovertemplate=f"{row['row']}: one seed, accuracy %{{y:.3f}}<extra></extra>"))
    if chance is not None:
        figure.add_hline(y=chance, line={"color": "gray", "dash": "dash", "width": 1},
                         annotation_text=f"chance {100 * chance:.3g}%", annotation_position="top left")
    figure.update_layout(title=title, xaxis_title="attention FLOPs per token (forward, all layers)",
                         yaxis_title="accuracy")
    figure.update_xaxes(type="log")
    figure.update_yaxes(range=[-0.02, 1.05])
    return readable_log_axes(figure)


def _bucket(low: int, high: int) -> str:
    return f"{_tokens(low)}-{_tokens(high)}"


def accuracy_by_distance(rows: Sequence[Mapping[str, Any]], *, chance: float | None = None,
                         title: str = "retrieval accuracy per needle-to-query distance",
                         colours: Mapping[str, str] | None = None):
    """Accuracy per distance bucket [distance_low, distance_high) for each grid row, with 95% interval error
    bars: the buckets are categories ('8K-16K') in distance order, each row's point offset within its bucket
    (one trace per row, colour from `colours` or viz.style.run_colours). `rows` need row, distance_low,
    distance_high, count, accuracy, accuracy_low, accuracy_high."""
    import plotly.graph_objects as go

    check_rows(rows, ("row", "distance_low", "distance_high", "count", "accuracy", "accuracy_low", "accuracy_high"),
                "distance")
    names = list(dict.fromkeys(str(row["row"]) for row in rows))
    colours = run_colours(names, colours)
    buckets = sorted({(int(row["distance_low"]), int(row["distance_high"])) for row in rows})
    figure = go.Figure()
    for name in names:
        points = sorted((row for row in rows if str(row["row"]) == name), key=lambda row: row["distance_low"])
        accuracy = [float(row["accuracy"]) for row in points]
        figure.add_trace(go.Scatter(
            x=[_bucket(int(row["distance_low"]), int(row["distance_high"])) for row in points], y=accuracy,
            mode="markers" if len(buckets) < 3 else "lines+markers", name=name, offsetgroup=name,
            marker={"color": colours[name], "size": 9}, line={"color": colours[name]},
            customdata=[int(row["count"]) for row in points],
            error_y={"type": "data", "symmetric": False,
                     "array": [float(row["accuracy_high"]) - a for row, a in zip(points, accuracy)],
                     "arrayminus": [a - float(row["accuracy_low"]) for row, a in zip(points, accuracy)]},
            hovertemplate=f"{name}<br>distance %{{x}}<br>accuracy %{{y:.3f}}<br>%{{customdata}} answers<extra></extra>",
        ))
    if chance is not None:
        figure.add_hline(y=chance, line={"color": "gray", "dash": "dash", "width": 1},
                         annotation_text=f"chance {100 * chance:.3g}%", annotation_position="top left")
    figure.update_layout(title=title, xaxis_title="needle-to-query distance (tokens)", yaxis_title="accuracy",
                         scattermode="group")
    figure.update_xaxes(type="category", categoryorder="array", categoryarray=[_bucket(*b) for b in buckets])
    figure.update_yaxes(range=[-0.02, 1.05])
    return figure


def memory_by_length(rows: Sequence[Mapping[str, Any]], *, capacity_gib: float | None = None,
                     title: str = "training step: peak memory and tokens/s against sequence length"):
    """Peak memory (left) and tokens/s (right) of a training step against sequence length (log 2 axes), one
    trace per run; a length that failed (a row with ``error``) is an "x" at the top of the memory panel.

    `rows` need keys run, seq_len, peak_memory_gib, tokens_per_s (None where the length failed) and may
    hold error; ``capacity_gib`` draws the device's memory as a dashed line.
    """
    from plotly.subplots import make_subplots
    import plotly.graph_objects as go

    check_rows(rows, ("run", "seq_len", "peak_memory_gib", "tokens_per_s"), "length probe")
    figure = make_subplots(rows=1, cols=2, subplot_titles=("peak memory (GiB)", "tokens/s"))
    top = max([float(r["peak_memory_gib"]) for r in rows if r.get("peak_memory_gib") is not None] + [capacity_gib or 1])
    for index, run in enumerate(dict.fromkeys(str(r["run"]) for r in rows)):
        mine = sorted((r for r in rows if str(r["run"]) == run), key=lambda r: r["seq_len"])
        failed = [r for r in mine if isinstance(r.get("error"), str) and r["error"]]  # NaN from a table: none
        done = [r for r in mine if r not in failed and r.get("peak_memory_gib") is not None]
        color = _COLORS[index % len(_COLORS)]
        lengths = [_tokens(int(r["seq_len"])) for r in done]
        figure.add_trace(go.Scatter(x=[r["seq_len"] for r in done], y=[r["peak_memory_gib"] for r in done],
                                    mode="lines+markers", name=run, legendgroup=run, marker_color=color,
                                    text=lengths, hovertemplate="%{text}: %{y:.1f} GiB<extra></extra>"), row=1, col=1)
        figure.add_trace(go.Scatter(x=[r["seq_len"] for r in done], y=[r["tokens_per_s"] for r in done],
                                    mode="lines+markers", name=run, legendgroup=run, marker_color=color,
                                    showlegend=False), row=1, col=2)
        if failed:
            figure.add_trace(go.Scatter(x=[r["seq_len"] for r in failed], y=[top * 1.05] * len(failed),
                                        mode="markers+text", marker=dict(symbol="x", size=12, color=color),
                                        text=["failed"] * len(failed), textposition="bottom center",
                                        name=f"{run}: failed", legendgroup=run,
                                        hovertext=[str(r["error"])[:120] for r in failed]), row=1, col=1)
    if capacity_gib:
        figure.add_hline(y=capacity_gib, line_dash="dash", line_color="grey", row=1, col=1,
                         annotation_text=f"device memory {capacity_gib:.0f} GiB", annotation_position="bottom right")
    lengths = sorted({int(r["seq_len"]) for r in rows})
    figure.update_xaxes(type="log", tickvals=lengths, ticktext=[_tokens(length) for length in lengths])
    figure.update_layout(title=title)
    return figure
