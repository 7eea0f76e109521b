"""Backend dashboard: hardware info, what `auto` picks and why, a quick live timing of the backends."""
from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

import torch

from hilbert_lab.dtypes import DTYPES as FLOAT_DTYPES, torch_dtype
from hilbert_lab.viz.panels import Panel, clamp, show_message, slider_layout, wrapping_row

DTYPES = {name: torch_dtype(name) for name in FLOAT_DTYPES}
REFERENCE_MAX_TOKENS = 2048  # the float64 dense oracle is O(N^2) memory; not timed beyond this
MAX_DASHBOARD_TOKENS = {"cpu": 16384, "cuda": 1 << 20}


def hardware_summary(device: str = "cpu") -> dict[str, Any]:
    """torch version and threads, CPU model and cores, CUDA device description (selection.get_gpu_info)."""
    from hilbert_lab.attention.selection import get_gpu_info
    from hilbert_lab.bench.env import cpu_description

    return {"torch": torch.__version__, "torch_threads": torch.get_num_threads(), "cpu": cpu_description(),
            "gpu": get_gpu_info(device if str(device).startswith("cuda") else None)}


def hardware_html(hardware: dict[str, Any]) -> str:
    """hardware_summary as a small two-column HTML table (GPU fields flattened)."""
    rows = [("torch", hardware.get("torch")), ("torch CPU threads", hardware.get("torch_threads"))]
    cpu = hardware.get("cpu") or {}
    rows.append(("CPU", f"{cpu.get('model', '-')} ({cpu.get('usable_cores', cpu.get('logical_cores', '-'))} usable cores)"))
    gpu = hardware.get("gpu")
    if isinstance(gpu, dict):
        rows += [(f"GPU {key}", value) for key, value in gpu.items() if value not in (None, "", [], {})]
    elif gpu:
        rows.append(("GPU", gpu))
    else:
        rows.append(("GPU", "none"))
    cells = "".join(f"<tr><th style='text-align:left;padding-right:12px'>{html.escape(str(name))}</th>"
                    f"<td>{html.escape(str(value))}</td></tr>" for name, value in rows)
    return f"<table>{cells}</table>"


def timing_display(table: Any) -> Any:
    """The timing table as shown: median with its 95% interval, tokens/s, interval width, agreement."""
    import pandas as pd

    def interval(row: Any) -> str:
        if row.error:
            return "-"
        return f"{row.median_ms:.3g} [{row.low_ms:.3g}, {row.high_ms:.3g}]"

    return pd.DataFrame({
        "backend": [backend_label(row) for row in table.itertuples()],
        "median ms [95%]": [interval(row) for row in table.itertuples()],
        "repeats": [len(times) for times in table["times_ms"]],
        "tokens/s": [f"{value:,.0f}" if value == value else "-" for value in table["tokens_per_s"]],
        "interval width (x)": [f"{value:.2f}" if value == value else "-" for value in table["spread"]],
        "max |diff| vs first": [f"{value:.1e}" if value == value else "-" for value in table["max_abs_diff_vs_first"]],
        "error": table["error"],
    })


def backend_availability(device: str = "cpu", dtype: str = "float32") -> Any:
    """pandas DataFrame (backend, available, reason) over every known backend on (device, dtype). A backend that
    cannot run on this kind of device says so first, and a CPU is never told to install a GPU package."""
    import pandas as pd

    from hilbert_lab.attention.executors import BACKENDS, get_executor, unavailable_reason

    rows = []
    kind = torch.device(device).type
    for name in BACKENDS:
        capabilities = get_executor(name).capabilities
        devices = capabilities.devices
        reason = (f"it runs on {' or '.join(devices)} only, not on this {kind.upper()}" if kind not in devices
                  else unavailable_reason(name, device, DTYPES[dtype]))
        if reason and kind == "cpu" and "pip install" in reason:  # a GPU package: no use installing it for the CPU
            reason = (f"the package {capabilities.package!r} is not installed; it is a GPU package (on the CPU only a "
                      "slow interpreter runs it), so nothing needs installing here")
        rows.append({"backend": name, "available": reason is None, "reason": reason or ""})
    return pd.DataFrame(rows)


def explain_auto_choice(device: str = "cpu", dtype: str = "float32") -> dict[str, Any]:
    """What backend="auto" resolves to on (device, dtype) by the selection rules, and why."""
    from hilbert_lab.attention.selection import candidate_backends, rule_backend

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    torch_device = torch.device(device)
    chosen = rule_backend(torch_device, DTYPES[dtype])
    if torch_device.type == "cpu":
        why = ("on the CPU the rules pick sdpa for floating dtypes (one fused softmax(QK^T)V kernel per block) "
               "and manual otherwise")
    else:
        major, minor = torch.cuda.get_device_capability(torch_device)
        why = (f"CUDA compute capability {major}.{minor}: flash for fp16/bf16 on sm80+ when flash-attn is "
               f"installed, otherwise sdpa")
    return {"device": device, "dtype": dtype, "auto": chosen, "why": why,
            "candidates_timed_by_benchmark_selection": candidate_backends(torch_device, DTYPES[dtype])}


def time_backends(*, device: str = "cpu", dtype: str = "float32", seq_len: int = 1024, num_heads: int = 4,
                  head_dim: int = 32, segment_lengths: Sequence[int] = (256, 512), dilation_rates: Sequence[int] = (1, 2),
                  backends: Sequence[str] | None = None, repeats: int = 15, warmup: int = 1, seed: int = 0,
                  threads: int | None = 1, progress: bool = False) -> Any:
    """Forward time of each available backend on one (1, N, H, D) input, the backends run round-robin
    (each repeat runs every backend once, the order rotating) so drift hits all of them alike.

    DataFrame per backend: median_ms with its 95% bootstrap interval (low_ms, high_ms), min / max ms,
    times_ms (every repeat), tokens/s, spread (high_ms / low_ms), max |out - out of the first backend|
    (every backend must compute the same attention), runs (the backend that ran: for "auto", the one it
    chose for this input) and error (a backend that raises gets NaN times). backends: default, every
    backend available here and then "auto". `threads` pins torch's CPU threads while timing (None leaves them).
    """
    import pandas as pd

    from hilbert_lab.attention.executors import available_backends
    from hilbert_lab.bench.selection import candidate_calls
    from hilbert_lab.bench.stats import bootstrap_median_ci
    from hilbert_lab.bench.timing import time_interleaved

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    names = list(backends) if backends is not None else available_backends(device, DTYPES[dtype]) + ["auto"]
    if seq_len > REFERENCE_MAX_TOKENS:
        names = [name for name in names if name != "reference"]
    # each backend runs once (the output check; one that raises is left out of the timing), then round-robin
    running, outputs, errors = candidate_calls(device, DTYPES[dtype], (1, seq_len, num_heads, head_dim),
                                               segment_lengths, dilation_rates, backends=names, seed=seed,
                                               keep_outputs=True)
    cuda = device.startswith("cuda")
    timings = time_interleaved(running, device=device, warmup=max(warmup, 1) - 1, rounds=repeats,
                               max_seconds=float("inf"), threads=None if cuda else threads,
                               progress=progress) if running else {}
    samples = {name: list(timing.samples) for name, timing in timings.items()}
    baseline = next(iter(outputs.values()), None)
    rows = []
    for name in names:
        runs = auto_runs(device, dtype, (1, seq_len, num_heads, head_dim), segment_lengths,
                                 dilation_rates) if name == "auto" else name
        if name in errors:
            rows.append({"backend": name, "median_ms": float("nan"), "low_ms": float("nan"), "high_ms": float("nan"),
                         "min_ms": float("nan"), "max_ms": float("nan"), "times_ms": [], "tokens_per_s": float("nan"),
                         "spread": float("nan"), "max_abs_diff_vs_first": float("nan"), "runs": runs,
                         "error": errors[name]})
            continue
        median, low, high = bootstrap_median_ci(samples[name])
        rows.append({"backend": name, "median_ms": median, "low_ms": low, "high_ms": high,
                     "min_ms": min(samples[name]), "max_ms": max(samples[name]), "times_ms": samples[name],
                     "tokens_per_s": seq_len / (median / 1e3), "spread": high / low if low > 0 else float("nan"),
                     "max_abs_diff_vs_first": float((outputs[name] - baseline).abs().max()), "runs": runs, "error": ""})
    return pd.DataFrame(rows)


def auto_runs(device: str, dtype: str, shape: Sequence[int], segment_lengths: Sequence[int],
              dilation_rates: Sequence[int]) -> str:
    """The backend that backend="auto" runs for (B, N, H, D) `shape` and the pattern on (device, dtype), as the
    engine resolves it for a forward call."""
    from hilbert_lab.attention.selection import resolve_executor
    from hilbert_lab.attention.pattern import DilatedPattern

    # a view with the input's shape, device and dtype, and no memory of its own: all the choice reads
    probe = torch.empty((), device=device, dtype=DTYPES[dtype]).expand(tuple(int(extent) for extent in shape))
    return resolve_executor("auto", probe, DilatedPattern.create(segment_lengths, dilation_rates)).name


def backend_label(row: Any) -> str:
    """A timing row's backend as shown: "auto (runs sdpa)" for auto, else its name."""
    runs = getattr(row, "runs", None)
    return f"{row.backend} (runs {runs})" if row.backend == "auto" and runs else str(row.backend)


def timing_warnings(table: Any, max_spread: float = 1.25) -> list[str]:
    """Lines warning where a backend's 95% interval is wider than `max_spread` (high / low), and where two
    backends' intervals overlap (their order is within noise)."""
    ok = table[table["error"] == ""].sort_values("median_ms")
    notes = [f"{row.backend}: 95% interval {row.low_ms:.3g}-{row.high_ms:.3g} ms ({row.spread:.2f}x wide, "
             f"{len(row.times_ms)} repeats): noisy, add repeats" for row in ok.itertuples() if row.spread > max_spread]
    records = list(ok.itertuples())
    for first, second in zip(records, records[1:]):
        if second.low_ms <= first.high_ms:
            notes.append(f"{first.backend} and {second.backend} are within noise of each other "
                         f"(intervals overlap)")
    return notes


def timing_figure(table: Any, title: str = "forward time per backend") -> Any:
    """Bars of median ms per backend with its 95% bootstrap interval as error bars."""
    import plotly.graph_objects as go

    ok = table[table["error"] == ""]
    repeats = max((len(times) for times in ok["times_ms"]), default=0)
    fig = go.Figure(go.Bar(x=[backend_label(row) for row in ok.itertuples()], y=list(ok["median_ms"]),
                           name="median ms",
                           error_y=dict(type="data", symmetric=False, array=list(ok["high_ms"] - ok["median_ms"]),
                                        arrayminus=list(ok["median_ms"] - ok["low_ms"]))))
    # the axis title stays shorter than the axis; what the bars mean goes under the title
    fig.update_layout(title=f"{title}<br><sub>median of {repeats} repeats, error bars: 95% interval; lower is "
                            "better</sub>", xaxis_title="backend", yaxis_title="forward time (ms)", height=380,
                      margin={"t": 80})
    return fig


def backend_dashboard(device: str = "cpu", dtype: str = "float32", seq_len: int = 1024, num_heads: int = 4,
                      head_dim: int = 32, segment_lengths: str = "256,512", dilation_rates: str = "1,2",
                      repeats: int = 15) -> Panel:
    """Build the dashboard: info HTML, availability table, auto choice, and a 'time backends' button."""
    import ipywidgets as widgets
    import plotly.graph_objects as go

    from hilbert_lab.viz.attention_explorer import parse_int_list
    from hilbert_lab.viz.panels import FigureView, replace_figure

    devices = ["cpu"] + [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    controls = {
        "device": widgets.Dropdown(options=devices, value=device if device in devices else "cpu", description="device"),
        "dtype": widgets.Dropdown(options=list(DTYPES), value=dtype, description="dtype"),
        "seq_len": widgets.IntText(value=seq_len, description="tokens"),
        "num_heads": widgets.IntSlider(value=num_heads, min=1, max=32, description="heads", layout=slider_layout()),
        "head_dim": widgets.Dropdown(options=[16, 32, 64, 128], value=head_dim, description="head dim"),
        "segment_lengths": widgets.Text(value=segment_lengths, description="segments"),
        "dilation_rates": widgets.Text(value=dilation_rates, description="dilations"),
        "repeats": widgets.IntSlider(value=repeats, min=1, max=60, description="repeats", layout=slider_layout()),
    }
    run_button = widgets.Button(description="time backends", button_style="primary")
    message, info_html, table_html = widgets.HTML(), widgets.HTML(), widgets.HTML()
    figure = FigureView()
    state: dict = {}

    def describe(*_args: Any) -> None:
        try:
            choice = explain_auto_choice(controls["device"].value, controls["dtype"].value)
            availability = backend_availability(controls["device"].value, controls["dtype"].value)
            hardware = hardware_summary(controls["device"].value)
        except Exception as error:
            show_message(message, [f"{type(error).__name__}: {error}"], error=True)
            return
        state.update(choice=choice, availability=availability, hardware=hardware)
        info_html.value = (f"<b>hardware</b>{hardware_html(hardware)}<br><b>auto picks "
                           f"{html.escape(choice['auto'])}</b>: {html.escape(choice['why'])}<br>"
                           + availability.to_html(index=False))

    def changes() -> list[str]:
        """The controls changed since the timing shown: "tokens 1024 -> 512", ..."""
        timed = state.get("timed_controls") or {}
        return [f"{control.description} {timed[name]} -> {control.value}" for name, control in controls.items()
                if name in timed and control.value != timed[name]]

    def mark_out_of_date(*_args: Any) -> None:
        """The figure, notes and table show the last timing; when the controls differ from it, they say so."""
        if "timings" not in state:
            return
        changed = changes()
        shown = go.Figure(state["timing_figure"])
        if changed:
            heading = shown.layout.title.text.split("<br>")[0]
            shown.update_layout(title=f"<b>out of date</b>: {heading}<br><sub>the controls changed since this "
                                      "timing; press 'time backends'</sub>")
            shown.update_traces(opacity=0.35)
        replace_figure(figure, shown)
        table_html.value = (f"<div style='color:#a15c00'><b>out of date</b>: the controls changed since this timing "
                            f"({html.escape(', '.join(changed))}); press 'time backends'</div>"
                            f"<div style='opacity:0.45'>{state['timing_html']}</div>"
                            if changed else state["timing_html"])

    def run(_button: Any = None) -> None:
        notes: list[str] = []
        try:
            chosen_device = controls["device"].value
            tokens = clamp(controls["seq_len"].value, 16, MAX_DASHBOARD_TOKENS[chosen_device.split(":")[0]],
                           "tokens", notes)
            table = time_backends(device=chosen_device, dtype=controls["dtype"].value, seq_len=tokens,
                                  num_heads=controls["num_heads"].value, head_dim=controls["head_dim"].value,
                                  segment_lengths=parse_int_list(controls["segment_lengths"].value, "segment_lengths"),
                                  dilation_rates=parse_int_list(controls["dilation_rates"].value, "dilation_rates"),
                                  repeats=controls["repeats"].value)
        except Exception as error:
            show_message(message, [f"{type(error).__name__}: {error}"], error=True)
            return
        show_message(message, notes)  # clamped input; the notes on the timing itself go with its table
        remarks = timing_warnings(table) + ([] if chosen_device.startswith("cuda") else [
            "CPU timings on a shared machine are indicative only (backends run round-robin, one pinned thread)"])
        plain = timing_figure(table, f"forward time, {tokens} tokens, {controls['dtype'].value}")
        remarks_html = "".join(f"<div style='color:#a15c00'>{html.escape(remark)}</div>" for remark in remarks)
        state.update(timings=table, timing_figure=plain,
                     timing_html=remarks_html + timing_display(table).to_html(index=False),
                     timed_controls={name: control.value for name, control in controls.items()})
        replace_figure(figure, plain)
        table_html.value = state["timing_html"]

    controls["device"].observe(describe, names="value")
    controls["dtype"].observe(describe, names="value")
    for control in controls.values():
        control.observe(mark_out_of_date, names="value")
    run_button.on_click(run)
    layout = widgets.VBox([
        info_html,
        widgets.HBox([controls["device"], controls["dtype"], controls["seq_len"], controls["num_heads"]],
                     layout=wrapping_row()),
        widgets.HBox([controls["head_dim"], controls["segment_lengths"], controls["dilation_rates"], controls["repeats"]],
                     layout=wrapping_row()),
        run_button, message, figure.widget, table_html,
    ])
    describe()
    return Panel(widget=layout, figures={"timing": figure}, controls=controls, message=message, refresh=run,
                 state=state)


def auto_choice_heatmap(rows: Sequence[Mapping[str, Any]], title: str = "auto's pick against the fastest executor",
                        worst: float = 1.3) -> Any:
    """Heatmap of a measured-table check (rows of reports.auto_check.auto_check_table: mode, causal, head_dim,
    training, seq_len, auto_picks, picked_over_fastest[, batch]): one row per (mode, causal, D, direction[, B where
    the rows hold several]), one column per N; the colour is the pick's time over the fastest executor's (1 = the
    fastest; capped at `worst`), the text the executor auto picked and that ratio."""
    import plotly.graph_objects as go

    several = len({int(row.get("batch", 1)) for row in rows}) > 1

    def key(row: Mapping[str, Any]) -> tuple:
        return row["mode"], not row["causal"], int(row["head_dim"]), bool(row["training"]), int(row.get("batch", 1))

    def line(row: Mapping[str, Any]) -> str:
        return (f"{row['mode']} {'causal' if row['causal'] else 'full'} D{row['head_dim']} "
                f"{'fwd+bwd' if row['training'] else 'fwd'}" + (f" B{int(row.get('batch', 1))}" if several else ""))

    columns = sorted({int(row["seq_len"]) for row in rows})
    lines = [line(row) for row in sorted({key(row): row for row in rows}.values(), key=key)]
    ratio = [[None] * len(columns) for _ in lines]
    text = [[""] * len(columns) for _ in lines]
    for row in rows:
        value = float(row["picked_over_fastest"])
        i, j = lines.index(line(row)), columns.index(int(row["seq_len"]))
        ratio[i][j], text[i][j] = value, f"{row['auto_picks']}<br>{value:.2f}"
    labels = [f"{n // 1024}K" + (f"+{n % 1024}" if n % 1024 else "") if n >= 1024 else str(n) for n in columns]
    figure = go.Figure(go.Heatmap(z=ratio, x=labels, y=lines, text=text, texttemplate="%{text}", zmin=1.0, zmax=worst,
                                  colorscale=[[0.0, "#00CC96"], [0.1, "#B6E880"], [1.0, "#EF553B"]],
                                  colorbar={"title": "pick / fastest"},
                                  hovertemplate="%{y}, N %{x}: %{text}<extra></extra>"))
    figure.update_layout(title=title, xaxis_title="N (H 12; +5: ragged)", height=140 + 28 * len(lines),
                         margin=dict(l=220), xaxis_type="category", yaxis_autorange="reversed")
    return figure
