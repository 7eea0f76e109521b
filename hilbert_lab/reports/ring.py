"""Ring-attention runs (benchmarks/bench_ring.py JSON, one file per GPU count and section set) as a report run
directory (metrics.json + env.json) and its page.

    python -m hilbert_lab.reports.ring reports/results/ring_{1,2,4}gpu_h200.json \
        reports/results/ring_4gpu_layouts_h200.json reports/results/ring_{1,2,4}gpu_longest_h200.json \
        --out reports/ring/h200-gpu

A file measured with older code (provenance.older_code), given beside files of the current code, adds only its
longest-sequence rows, shown under that label and quoted by no finding. The comparison of context-parallel modes
is drawn by reports.ring_modes, the interleaved anchors by reports.ring_anchors.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

from hilbert_lab.reports.provenance import (RING_WAIT_CODE, committed_in, document_source, older_code, result_git,
                                            revision_text, strip_paths)
from hilbert_lab.reports.render import files_run_main, write_run
from hilbert_lab.reports.ring_anchors import ANCHOR_COLUMNS, anchor_rows, context_parallel_section, layouts_section
from hilbert_lab.reports.ring_modes import PARALLEL_MODES_COLUMNS, mode_name, modes_section, parallel_modes_rows

THROUGHPUT_COLUMNS = ["gpus", "variant", "seq_len", "seconds", "tokens_per_s_per_gpu", "tokens_per_s_total",
                      "peak_memory_gib_max_rank", "bytes_sent_max_rank"]
CORRECTNESS_COLUMNS = ["gpus", "mode", "mesh", "variant", "seq_len", "dtype", "tensor", "ring_vs_single",
                       "ring_vs_fp32", "single_vs_fp32", "pass"]
LONGEST_COLUMNS = ["gpus", "variant", "longest_seq_len", "first_failure_or_limit", "limit_reached", "revision",
                   "stored_in"]
COMMUNICATION_COLUMNS = ["gpus", "variant", "seq_len", "bytes_sent_max_rank", "seconds", "compute_only_seconds",
                         "exposed_communication_seconds", "exposed_pairs", "transfer_seconds_alone", "hidden_share"]
RATIO_COLUMNS = ["gpus", "variant", "seq_len", "tokens_per_s_per_gpu_vs_1_gpu"]


def _table(columns: list[str], rows: list[dict[str, Any]], caption: str) -> dict[str, Any]:
    return {"caption": caption, "columns": columns, "rows": [{c: row.get(c) for c in columns} for row in rows]}


def _gpus(data: dict[str, Any]) -> int:
    return int(data["environment"].get("world_size", 1))


def _what(path: Path, data: dict[str, Any], label: str) -> str:
    """A source's description: GPU count, file, the name its command wrote where it was committed under another,
    and, for an older file that adds only its longest sequence, that and its label."""
    written = re.search(r"--out\s+(\S+)", str(data.get("command") or ""))
    renamed = (f"; its command wrote {Path(written.group(1)).name}"
               if written and Path(written.group(1)).name != path.name else "")
    older = f"; its longest sequence only, {label}" if label else ""
    return f"{_gpus(data)} GPU run ({path.name}{renamed}{older})"


def ring_run(paths: Sequence[str | Path]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metrics, env) from bench_ring.py result files (any number of GPU counts). Where files of the current code
    are given, a file of older code (provenance.older_code) adds only its longest-sequence rows, each with its
    revision (the page shows them under that label)."""
    results = []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"paths must name existing bench_ring.py JSON files, got {str(path)!r}")
        data = json.loads(path.read_text(encoding="utf-8"))
        results.append((path, data, older_code(result_git(data))))
    results.sort(key=lambda item: _gpus(item[1]))
    current = [item for item in results if not item[2]]
    if not current:  # every file older: the page as a whole goes under the label (older_code_page)
        current, results = [(path, data, "") for path, data, _label in results], []
    throughput, correctness, longest, communication, anchors, ratios, modes, notes = [], [], [], [], [], [], [], []
    for path, data, label in current + [item for item in results if item[2]]:
        gpus = _gpus(data)
        for variant, entry in (data.get("longest") or {}).items():
            limit = (data.get("config") or {}).get("max_limit")
            longest.append({"gpus": gpus, "variant": variant, "longest_seq_len": entry.get("seq_len"),
                            "first_failure_or_limit": entry.get("first_failure_or_limit"),
                            "limit_reached": bool(limit) and (entry.get("seq_len") or 0) >= limit,
                            "stored_in": path.name,
                            "revision": revision_text(result_git(data), committed_in(path))})
        if label:
            continue
        for variant, rows in (data.get("throughput") or {}).items():
            for row in rows:
                throughput.append({"gpus": gpus, "variant": variant, **row,
                                   "tokens_per_s_total": row["tokens_per_s_per_gpu"] * gpus})
                if "compute_only_seconds" in row:
                    communication.append({"gpus": gpus, "variant": variant, **row})
        for variant, check in (data.get("correctness") or {}).items():
            for tensor, errors in (check.get("max_abs_error") or {}).items():
                mode = check.get("parallel", "ring")
                correctness.append({"gpus": gpus, "mode": mode, "mesh": check.get("mesh"),
                                    "variant": variant.removeprefix(f"{mode}_"), "seq_len": check.get("seq_len"),
                                    "dtype": str(check.get("dtype", "")).replace("torch.", ""), "tensor": tensor,
                                    **errors, "pass": check.get("pass")})
        modes += parallel_modes_rows(data, gpus)
        anchors += anchor_rows(data, gpus)
        for variant, by_len in (data.get("ratios_vs_baseline") or {}).items():
            if variant == "longest_seq_len":
                continue
            for seq_len, ratio in by_len.items():
                ratios.append({"gpus": gpus, "variant": variant, "seq_len": int(seq_len),
                               "tokens_per_s_per_gpu_vs_1_gpu": ratio})
        notes += [item for item in data.get("not_measured") or [] if item not in notes]
    if longest and not any(data.get("longest") for _path, data, _label in current):
        notes.append(f"the longest sequence with rev {revision_text(result_git(current[-1][1]))} (the page shows that "
                     "of older code, under its label)")
    path, last, _label = current[-1]
    config = {key: value for key, value in (last.get("config") or {}).items()
              if key not in ("out", "baseline", "sections")}
    metrics = {
        "report": "ring", "parameters": config, "metrics": {},
        "tables": {
            "throughput": _table(THROUGHPUT_COLUMNS, throughput, "forward+backward step, median of the iterations"),
            "correctness": _table(CORRECTNESS_COLUMNS, correctness, "max |error| at the check length, per mode"),
            "longest": _table(LONGEST_COLUMNS, longest, "longest sequence that ran (doubling, then bisection)"),
            "communication": _table(COMMUNICATION_COLUMNS, communication,
                                    "step with and without moving bytes (a communicator that sends nothing)"),
            "anchors": _table(ANCHOR_COLUMNS, anchors, "interleaved rounds, medians with bootstrap intervals"),
            "ratios": _table(RATIO_COLUMNS, ratios, "tokens/s per GPU over the 1-GPU run of the same script"),
            "parallel_modes": _table(PARALLEL_MODES_COLUMNS, modes, "ring, head-parallel and hybrid on the same "
                                     "shards, interleaved rounds, medians with bootstrap intervals"),
        },
        "notes": [f"Not measured: {'; '.join(notes)}."] if notes else [],
        "figures": {},
        "sources": [document_source(data, path, _what(path, data, label)) for path, data, label in current
                    + [item for item in results if item[2]]],
        "commands": [data.get("command", "") for _path, data, _label in current],
    }
    environment = last.get("environment") or {}  # the kit's environment block (bench.env) plus world_size
    device = environment.get("device") if isinstance(environment.get("device"), dict) else {}
    packages = environment.get("packages") or {}
    gpus_used = max(_gpus(data) for _path, data, _label in current)
    env = {
        "created_utc": None, "python": packages.get("python"),
        "packages": {**packages, "nccl": device.get("nccl")},
        "git": environment.get("git") or {}, "cpu": environment.get("cpu") or {},
        "device": {"cuda_available": True, "device": device.get("name"), "driver": device.get("driver"),
                   "torch_cuda": device.get("cuda"), "cudnn": device.get("cudnn"), "device_count": gpus_used},
        "parameters": {"report": "ring", **config},
        "source": ", ".join(path.name for path, _data, _label in current),
        "gpus_used": gpus_used,
        "command": "; ".join(strip_paths(data.get("command", "")) for _path, data, _label in current),
        "provenance": {"committed_in": committed_in(path)},
    }
    return metrics, env


def write_ring_run(paths: Sequence[str | Path], out_dir: str | Path) -> Path:
    """Write metrics.json + env.json of `paths` into `out_dir` (created); returns out_dir."""
    return write_run(*ring_run(paths), out_dir)


def _sending_variants(throughput: Any) -> set[str]:
    """Variants that sent bytes on a ring of more than one GPU."""
    if not len(throughput):
        return set()
    ring = throughput[(throughput["gpus"] > 1) & (throughput["bytes_sent_max_rank"].fillna(0) > 0)]
    return set(ring["variant"])


def config_definitions(parameters: dict[str, Any], sends: set[str]) -> list[str]:
    """What the configs 'longnet' and 'spanning' of bench_ring.py are, and whether the ring sends bytes in each."""
    segments, dilations = parameters.get("segment_lengths"), parameters.get("dilation_rates")
    if not segments or not dilations:
        return []
    pattern = f"segments {list(segments)} with dilations {list(dilations)}"
    travel = "were not sent in this run" if sends and "spanning" not in sends else "travel around the ring"
    spanning = (f"'spanning', the config that measures ring communication: the dilated pattern {pattern} plus a "
                f"branch spanning the whole sequence (dilation {parameters.get('spanning_dilation', '?')}), whose "
                f"keys/values {travel}.")
    longnet = (f"'longnet': the same pattern without that branch; every segment lies inside one GPU's shard at the "
               f"lengths run, so its ring {'sends keys/values' if 'longnet' in sends else 'sends no byte'}: it shows "
               "what sharding alone does.")
    return [spanning, longnet]


def _on(gpus: Any) -> str:
    return f"on {int(gpus)} GPU{'s' if gpus > 1 else ''}"


def _longest_section(longest: Any, order: dict, sends: set[str], page_label: str) -> tuple[Any, str]:
    """(Section, finding) of the longest table; rows of older code (their revision) put the section under that
    label (provenance.older_code_of_revision) and give no finding."""
    import plotly.graph_objects as go

    from hilbert_lab.reports.page import Section, fmt_count, style_axes
    from hilbert_lab.reports.provenance import older_code_of_revision

    label = "" if page_label else next((text for text in map(older_code_of_revision, longest.get("revision", []))
                                        if text), "")
    gpus = sorted(set(longest.gpus))
    lines = []
    for variant in sorted(set(longest.variant), key=order.get):
        chosen = longest[longest.variant == variant].sort_values("gpus")
        counts = ", ".join(f"{fmt_count(r.longest_seq_len)} tokens {_on(r.gpus)}"
                           + (" (the search's limit: a lower bound)" if getattr(r, "limit_reached", False) else "")
                           for r in chosen.itertuples())
        missing = [g for g in gpus if g not in set(chosen.gpus)]
        lines.append(f"{variant} ({'sends keys/values around the ring' if variant in sends else 'sends nothing'}): "
                     f"{counts}" + (f"; on {', '.join(map(str, missing))} GPUs not measured" if missing else ""))
    conclusion = (f"{label[:1].upper() + label[1:]}, not with the code of the other sections. " if label else "") + (
        "Longest sequence that runs a forward+backward step (doubling, then bisection; the search stops at the first "
        "failure or its limit): " + "; ".join(lines) + (f". Only {len(gpus)} ring sizes were run, too few to state how "
        "the length grows with the GPU count." if len(gpus) < 3 else "."))
    fig = go.Figure()
    for variant in sorted(set(longest.variant), key=order.get):
        group = longest[longest.variant == variant].sort_values("gpus")
        fig.add_trace(go.Bar(x=[str(g) for g in group["gpus"]], y=group["longest_seq_len"].tolist(), name=variant))
    style_axes(fig, "GPUs in the ring", "tokens (higher is better)")
    fig.update_layout(title="longest sequence per ring size (doubling, then bisection)" + (f", {label}" if label
                                                                                          else ""),
                      barmode="group", height=380)
    return (Section("Longest sequence" + (f": {label}" if label else ""), conclusion, figure=fig),
            "" if label else conclusion)


def _communication_line(communication: Any, throughput: Any, sends: set[str]) -> str:
    from hilbert_lab.reports.page import fmt, tokens

    rows = "; ".join(f"{r.variant} {_on(r.gpus)} at {tokens(r.seq_len)} tokens: {fmt(r.bytes_sent_max_rank / 2**20)} "
                     f"MiB sent, transfer alone {fmt(r.transfer_seconds_alone * 1e3)} ms of a "
                     f"{fmt(r.seconds * 1e3)} ms step" for r in communication.itertuples())
    quiet = ", ".join(sorted(set(throughput["variant"]) - sends))
    share = float((communication["transfer_seconds_alone"] / communication["seconds"]).max())
    hidden = "; ".join(f"{_on(g)} " + ", ".join(f"{fmt(r.hidden_share)} at {tokens(r.seq_len)}" for r in
                                                 group.sort_values("seq_len").itertuples())
                       for g, group in communication.groupby("gpus"))
    pairs = communication["exposed_pairs"].dropna() if "exposed_pairs" in communication else ()
    exposed = (f"the median over {int(min(pairs))} back-to-back pairs of the step minus the same step moving no byte"
               if len(pairs) == len(communication) else
               "the step minus the same step moving no byte, one difference of two medians")
    return (f"What the ring sends{f' ({quiet} sends no byte)' if quiet else ''}: {rows}. The transfers "
            f"alone take at most {100 * share:.2g}% of a step, so how much of them the computation hides cannot be "
            "told from the run-to-run noise of the step at this size: bench_ring's hidden share (1 - exposed / "
            f"transfer time, exposed = {exposed}, without an interval) comes out {hidden}, and is not stated as a "
            "result.")


def render(metrics: dict[str, Any], env: dict[str, Any]) -> Any:
    """Ring page: findings (the context-parallel modes, what the ring sends, throughput per GPU, the anchors with
    intervals), figures per GPU count, correctness per mode; the longest sequence under its revision's label where
    older code measured it; the raw measurements behind a closed section."""
    import plotly.graph_objects as go

    from hilbert_lab.reports.page import (Page, Section, fmt, fmt_count, metrics_table, older_code_page, style_axes,
                                          tokens)

    def frame(name: str) -> Any:
        return metrics_table(metrics, name)

    throughput, correctness, longest = frame("throughput"), frame("correctness"), frame("longest")
    gpus = sorted(throughput["gpus"].unique().tolist()) if len(throughput) else []
    parameters = metrics.get("parameters") or {}
    page_label = older_code(env.get("git"), since=RING_WAIT_CODE)  # its timings: the ring's own, and the host's waits
    sends = _sending_variants(throughput)
    order = {variant: (variant not in sends, variant) for variant in
             set(throughput.get("variant", [])) | set(longest.get("variant", []))}
    sections, findings, headline = [], [], ""
    modes = frame("parallel_modes")
    if len(modes):
        section, finding, headline = modes_section(modes, sends)
        sections.append(section)
        findings.append(finding)
    communication = frame("communication")
    if len(communication):
        conclusion = _communication_line(communication, throughput, sends)
        findings.append(conclusion)
        sections.append(Section("Communication", conclusion, table=communication.drop(
            columns=["hidden_share", "exposed_communication_seconds"], errors="ignore").rename(columns={
                "gpus": "GPUs", "variant": "config", "seq_len": "tokens",
                "bytes_sent_max_rank": "bytes sent (largest rank)", "seconds": "step (s)",
                "compute_only_seconds": "step moving no byte (s)", "transfer_seconds_alone": "transfer alone (s)"})))
    if len(throughput):
        longest_len = int(throughput["seq_len"].max())
        sub = throughput[throughput["seq_len"] == longest_len].sort_values("gpus")
        ratios = frame("ratios")
        variants = sorted(set(sub.variant), key=order.get)
        memory = "; ".join(f"{variant}: " + " -> ".join(f"{fmt(float(r.peak_memory_gib_max_rank))} GiB {_on(r.gpus)}"
                                                        for r in sub[sub.variant == variant].itertuples())
                           for variant in variants)
        memory_line = (f"Memory per GPU at {tokens(longest_len)} tokens (largest rank): {memory}: the sequence is "
                       "sharded, so each GPU holds its share.")

        def speed(variant: str) -> str:
            rows = sub[sub.variant == variant]
            ratio = ratios[(ratios.variant == variant) & (ratios.seq_len == longest_len)].sort_values("gpus") \
                if len(ratios) else ratios
            text = f"{variant}: " + ", ".join(f"{fmt_count(r.tokens_per_s_per_gpu)} {_on(r.gpus)}"
                                              for r in rows.itertuples())
            return text + (" (per GPU over one GPU: " + ", ".join(
                f"{r.tokens_per_s_per_gpu_vs_1_gpu:.2f} on {int(r.gpus)}" for r in ratio.itertuples()) + ")"
                if len(ratio) else "")
        throughput_line = (f"Tokens/s per GPU of a forward+backward step at {tokens(longest_len)} tokens: "
                           f"{'; '.join(speed(variant) for variant in variants)}; medians of "
                           f"{parameters.get('iters', 'a few')} iterations, recorded without an interval, so these "
                           "ratios are indicative and no scaling efficiency is claimed from them.")
        findings.append(throughput_line)
        for column, axis, title, conclusion in (
                ("tokens_per_s_per_gpu", "tokens/s per GPU (higher is better)",
                 "per-GPU throughput of one forward+backward step vs ring size", throughput_line),
                ("peak_memory_gib_max_rank", "peak memory of the largest rank (GiB, lower is better)",
                 "peak memory per GPU vs ring size (the sequence is sharded)", memory_line)):
            fig = go.Figure()
            for (variant, seq_len), group in throughput.groupby(["variant", "seq_len"], sort=True):
                group = group.sort_values("gpus")
                fig.add_trace(go.Scatter(x=group["gpus"].tolist(), y=group[column].tolist(), mode="lines+markers",
                                         name=f"{variant}, {tokens(seq_len)} tokens"))
            style_axes(fig, "GPUs in the ring", axis, gpus)
            # from zero: a per-GPU rate or memory read against a cropped axis overstates its change
            fig.update_layout(title=title, height=400, yaxis_rangemode="tozero")
            sections.append(Section("Throughput per GPU" if column.startswith("tokens") else "Memory per GPU",
                                    conclusion, figure=fig))
    anchors = frame("anchors")
    cp, layouts = (anchors[anchors.section == name] if len(anchors) else anchors
                   for name in ("context_parallel", "causal_layouts"))
    built = ([context_parallel_section(cp)] if len(cp) else []) + \
        ([layouts_section(layouts, page_label)] if len(layouts) and (layouts.variant == "zigzag").any() else [])
    for section, finding in built:
        sections.append(section)
        findings += [finding] if finding else []
    if len(longest):
        section, finding = _longest_section(longest, order, sends, page_label)
        sections.append(section)
        findings += [finding] if finding else []
    if len(correctness):
        passed = correctness["pass"].astype(bool).all()
        worst = correctness.sort_values("ring_vs_single").iloc[-1]
        skipped = modes[modes["skipped"].notna()] if len(modes) else modes
        checks = correctness.drop_duplicates(["gpus", "mode", "variant"])
        ran = "; ".join(f"{_on(count)}: " + ", ".join(mode_name(mode, group[group["mode"] == mode].mesh.iloc[0])
                                                       for mode in dict.fromkeys(group["mode"]))
                        for count, group in checks.groupby("gpus"))
        sections.append(Section(
            "Correctness", f"{'All' if passed else 'Not all'} {len(checks)} checks pass ({ran}"
            + "".join(f"; {mode_name(mode)} skipped {_on(count)}" for mode, count in
                      dict.fromkeys(zip(skipped["mode"], skipped["gpus"])))
            + f"); largest difference against one GPU {worst['ring_vs_single']:.1e} ({worst['tensor']}, "
            f"{mode_name(worst['mode'], worst['mesh'])}, {worst['variant'].replace('_', ' ')}, "
            f"{int(worst['gpus'])} GPUs, {worst['dtype']}), at the level of bf16 rounding (single vs fp32: "
            f"{worst['single_vs_fp32']:.1e}; a check passes when the parallel result's error against fp32 is at most "
            "twice the single GPU's plus 1e-3).",
            table=correctness.assign(mode=[mode_name(r.mode, r.mesh) for r in correctness.itertuples()],
                                     variant=correctness["variant"].str.replace("_", " ")).drop(
                columns=["mesh"]).rename(columns={
                    "gpus": "GPUs", "variant": "check", "seq_len": "tokens", "ring_vs_single": "max |parallel - 1 GPU|",
                    "ring_vs_fp32": "max |parallel - fp32|", "single_vs_fp32": "max |1 GPU - fp32|"}), collapsed=True))
    if len(throughput):
        sections.append(Section("Every throughput measurement", table=throughput.rename(columns={
            "gpus": "GPUs", "variant": "config", "seq_len": "tokens", "seconds": "step (s)",
            "tokens_per_s_per_gpu": "tokens/s per GPU", "tokens_per_s_total": "tokens/s (all GPUs)",
            "peak_memory_gib_max_rank": "peak GiB (largest rank)",
            "bytes_sent_max_rank": "bytes sent (largest rank)"}), collapsed=True))
    counts = " and ".join(", ".join(map(str, gpus)).rsplit(", ", 1))
    about = (f"Ring attention (each sequence sharded over the GPUs, key/value blocks passed around the ring) on "
             f"{counts} GPUs against head-parallel (Ulysses) and hybrid context parallelism and PyTorch's: step "
             "times in interleaved rounds (medians with 95% bootstrap intervals), throughput and memory per GPU, "
             "agreement with one GPU, the longest sequence. Configs: "
             + " ".join(config_definitions(parameters, sends)))
    device = env.get("device") or {}
    notes = [note.replace(" with the final code", "") for note in metrics.get("notes") or []]
    page = Page(title="Ring attention across GPUs", findings=findings[:5], headline=headline, about=about,
                sections=sections,
                notes=notes, sources=list(metrics.get("sources") or []),
                measured_here=not metrics.get("sources"),
                device=f"{device.get('device') or device.get('name') or 'GPU'}, {counts} GPUs")
    return older_code_page(page, page_label, before=f"the ring's steps stopped making the host wait for each transfer "
                                                     f"({RING_WAIT_CODE[:7]})")


def main(argv: list[str] | None = None) -> int:
    return files_run_main(argv, "python -m hilbert_lab.reports.ring", "bench_ring.py", ring_run)


if __name__ == "__main__":
    raise SystemExit(main())
