"""A report page: its findings (at most five sentences, each with its number), sections (conclusion + figure,
table or text; reference material collapsed) and where its data come from. Report modules build a `Page`
from their metrics.json + env.json; reports.html writes it as HTML.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from hilbert_lab.reports.provenance import env_source

CPU_TIMING_NOTE = ("Absolute CPU timings on a shared 2-core machine are indicative only; comparisons use "
                   "medians with 95% bootstrap intervals.")
MAX_FINDINGS = 5
# the smallest peak-memory difference a page reads as a difference: a CPU peak is an RSS reading, and the same
# case differs by several MiB between processes and runs (allocator arenas, pages); a CUDA peak
# (torch.cuda.max_memory_allocated) counts allocated blocks of 512 B
CPU_MEMORY_RESOLUTION_MIB = 16.0
CUDA_MEMORY_RESOLUTION_MIB = 512 / 2**20


@dataclass
class Section:
    """One block of a page: heading, a one-line conclusion computed from the data, then a plotly figure,
    a table (pandas DataFrame, already labelled) or text paragraphs. `collapsed` puts it in a closed
    <details> (reference material: full tables, secondary figures)."""

    heading: str
    conclusion: str = ""
    figure: Any = None
    table: Any = None
    text: Sequence[str] = ()
    caption: str = ""
    collapsed: bool = False


@dataclass
class Page:
    """A report page. `findings`: at most MAX_FINDINGS sentences a reader can act on, first on the page;
    `headline`: the index card's line (default: the first finding); `about`: what was measured and how.

    `sources`: where the data were made, when not (only) by the run that rendered the page (rows of
    provenance.SOURCE_FIELDS); `measured_here`: the run's own environment (env.json) made the data and is
    shown as such."""

    title: str
    findings: list[str]
    about: str = ""
    headline: str = ""
    sections: list[Section] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    device: str = ""
    sources: list[dict[str, str]] = field(default_factory=list)
    measured_here: bool = True

    def __post_init__(self) -> None:
        if len(self.findings) > MAX_FINDINGS:
            raise ValueError(f"findings must be at most {MAX_FINDINGS} sentences, got {len(self.findings)}: "
                             f"{self.findings}")
        self.headline = self.headline or (self.findings[0] if self.findings else self.about)


def older_code_page(page: Page, label: str, keep: Sequence[str] = (), before: str = "") -> Page:
    """`page` when `label` is '' (its figures come from the current code); else the page with its figures under
    `label` ('measured with older code (rev 530aee9)', provenance.older_code): its findings move into a first
    section of that heading, every section heading names it, and the findings (hence the index card) quote none
    of its figures, only `keep` (sentences without figures, e.g. definitions). before: the change the figures
    predate (default: the current attention core, provenance.CURRENT_CODE)."""
    if not label:
        return page
    from hilbert_lab.reports.provenance import CURRENT_CODE

    before = before or f"the current attention core ({CURRENT_CODE[:7]})"
    first = (f"Every figure on this page was {label}, before {before}, and is not re-measured: no figure of it is "
             "stated as a current finding.")
    old = Section(label[0].upper() + label[1:], "These were the page's findings when it was measured; they hold "
                  "for that revision only.", text=list(page.findings))
    sections = [old] + [replace(section, heading=f"{section.heading}: {label}") for section in page.sections]
    return replace(page, findings=[first, *keep][:MAX_FINDINGS], headline=first, sections=sections)


def memory_resolution_mib(method_or_device: Any) -> float:
    """The resolution of a peak-memory measurement, MiB: CUDA_MEMORY_RESOLUTION_MIB for a CUDA peak (a method
    or device naming cuda), else CPU_MEMORY_RESOLUTION_MIB."""
    return CUDA_MEMORY_RESOLUTION_MIB if "cuda" in str(method_or_device).lower() else CPU_MEMORY_RESOLUTION_MIB


def memory_change(before_mib: float, after_mib: float, resolution_mib: float) -> str:
    """'no difference (268 -> 280 MiB, within the 16 MiB resolution of the measurement)' when the two peaks differ
    by less than `resolution_mib`, else '37.1% higher (432 -> 593 MiB)' / '12.0% lower (...)'."""
    numbers = f"{fmt(float(before_mib))} -> {fmt(float(after_mib))} MiB"
    if abs(after_mib - before_mib) < resolution_mib:
        return f"no difference ({numbers}, within the {fmt(resolution_mib)} MiB resolution of the measurement)"
    change = 100.0 * (after_mib / before_mib - 1) if before_mib else float("inf")
    return f"{abs(change):.1f}% {'higher' if change > 0 else 'lower'} ({numbers})"


def is_missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN and pandas NA
    except (TypeError, ValueError):
        return False


def fmt(value: Any, digits: int = 3) -> str:
    """A cell as text: '-' for missing, thousands separators, ~3 significant digits, no long decimals."""
    if is_missing(value):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) or (hasattr(value, "dtype") and getattr(value.dtype, "kind", "") in "iu"):
        return f"{int(value):,}"
    if isinstance(value, float) or hasattr(value, "dtype"):
        number = float(value)
        if not math.isfinite(number):
            return "-"
        if number == int(number) and abs(number) < 1e15:
            return f"{int(number):,}"
        size = abs(number)
        if size >= 1e10 or size < 1e-3:
            return f"{number:.{digits - 1}e}"
        if size >= 100:
            return f"{number:,.0f}"
        return f"{number:.{digits}g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(item, digits) for item in value)
    if isinstance(value, dict):
        return ", ".join(f"{key}={fmt(item, digits)}" for key, item in value.items())
    return str(value)


def fmt_count(value: Any) -> str:
    """Large counts short: 4,165,593 -> '4.17M', 23,855,104 -> '23.9M', 812 -> '812'."""
    if is_missing(value):
        return "-"
    number = float(value)
    for threshold, suffix in ((1e9, "G"), (1e6, "M"), (1e4, "K")):
        if abs(number) >= threshold:
            return f"{number / threshold:.3g}{suffix}"
    return fmt(value)


def tokens(seq_len: Any) -> str:
    """1024 -> '1K', 32768 -> '32K', 4194304 -> '4M', 1000 -> '1,000'."""
    seq_len = int(seq_len)
    if seq_len >= 2**20 and seq_len % 2**20 == 0:
        return f"{seq_len >> 20}M"
    return f"{seq_len >> 10}K" if seq_len >= 1024 and seq_len % 1024 == 0 else f"{seq_len:,}"


def out_of_memory(text: Any) -> str:
    """A failure message as a short cell: a CUDA / CPU out-of-memory message becomes 'out of memory (tried
    to allocate 1024.00 MiB)'; anything else its first sentence (at most 80 characters)."""
    text = str(text or "")
    if "out of memory" in text.lower():
        tried = re.search(r"Tried to allocate ([\d.]+ \w+)", text)
        return "out of memory" + (f" (tried to allocate {tried.group(1)})" if tried else "")
    first = text.split(". ")[0].splitlines()[0] if text else ""
    return first[:77] + "..." if len(first) > 80 else first


def metrics_table(metrics: Any, name: str) -> Any:
    """Table `name` of a run's metrics.json as a pandas DataFrame (empty with no rows)."""
    import pandas as pd

    entry = (metrics.get("tables") or {}).get(name) or {}
    return pd.DataFrame(entry.get("rows") or [], columns=entry.get("columns"))


def fmt_interval(median: float, low: float, high: float, unit: str = "") -> str:
    """'12.3 ms [11.9, 13.0]'."""
    if is_missing(median):
        return "-"
    suffix = f" {unit}" if unit else ""
    return f"{fmt(median)}{suffix} [{fmt(low)}, {fmt(high)}]"


def percent_interval(value: float, low: float, high: float) -> str:
    """'96.5% [95.5, 97.4]' from fractions."""
    return f"{100 * value:.1f}% [{100 * low:.1f}, {100 * high:.1f}]"


def style_axes(fig: Any, x: str, y: str, x_ticks: Sequence[Any] | None = None) -> Any:
    """Axis titles with units and direction, a readable layout (x ticks at `x_ticks`); returns `fig`."""
    if x_ticks:
        fig.update_xaxes(tickvals=list(x_ticks), ticktext=[fmt(tick) for tick in x_ticks])
    fig.update_layout(xaxis_title=x, yaxis_title=y, margin=dict(l=70, r=20, t=60, b=60),
                      legend=dict(font=dict(size=11)), font=dict(size=13))
    return fig


def figure_axis_titles(fig: Any) -> list[tuple[str, str]]:
    """(axis name, title) of every x/y axis the figure has (a missing title gives '')."""
    layout = fig.to_plotly_json().get("layout", {})
    axes = [name for name in layout if name.startswith(("xaxis", "yaxis"))] or ["xaxis", "yaxis"]
    titles = []
    for name in sorted(axes):
        title = (layout.get(name) or {}).get("title") or {}
        titles.append((name, title.get("text", "") if isinstance(title, dict) else str(title)))
    return titles


def is_gpu_env(env: dict[str, Any]) -> bool:
    device = env.get("device") or {}
    if "cuda_available" in device:
        return bool(device["cuda_available"])
    return str(device.get("device", "cpu")).startswith("cuda")


def device_label(env: dict[str, Any]) -> str:
    """The device of a run, as the page's meta line and the index show it ('NVIDIA H200, 1 GPU (of the
    machine's 4)', 'CPU (AMD EPYC, 2 usable cores)')."""
    return env_source(env)["device"]


def env_rows(env: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of a run's environment: device, revision, date, command, then the versions and
    the CPU; fields the run did not record are left out (the revision and date say 'not recorded')."""
    source = env_source(env)
    device = env.get("device") or {}
    packages = env.get("packages") or {}
    cpu = env.get("cpu") or {}
    rows = [("device", source["device"]), ("git revision", source["revision"]), ("recorded", source["recorded"]),
            ("command", source["command"])]
    driver = str(device.get("driver") or "").splitlines()
    optional = [("driver", driver[0] if driver else None),
                ("CUDA (torch build)", device.get("torch_cuda") or device.get("cuda")),
                ("torch", packages.get("torch")), ("triton", packages.get("triton")),
                ("python", env.get("python") or packages.get("python")),
                ("CPU", f"{cpu['model']}, {cpu.get('usable_cores', cpu.get('logical_cores', '?'))} usable cores"
                 if cpu.get("model") else None)]
    note = (env.get("provenance") or {}).get("note")
    return rows + [(label, str(value)) for label, value in optional if value] + ([("note", note)] if note else [])


def parameter_rows(parameters: dict[str, Any]) -> list[tuple[str, str]]:
    """Report parameters as (name, value) rows; run-specific paths (output_dir) left out, lists and dicts
    written compactly (long values cut with an ellipsis)."""
    rows = []
    for key, value in (parameters or {}).items():
        if key in ("output_dir", "report"):
            continue
        if isinstance(value, dict):
            text = "; ".join(f"{k}: {fmt(v) if not isinstance(v, dict) else ', '.join(map(str, v))}"
                             for k, v in value.items())
        else:
            text = fmt(value) if value != "" else "(default)"
        rows.append((key.replace("_", " "), text if len(text) <= 300 else text[:297] + "..."))
    return rows
