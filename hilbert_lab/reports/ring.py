"""Ring-attention runs (benchmarks/bench_ring.py JSON, one file per GPU count) as a report run directory
(metrics.json + env.json) and its page.

    python -m hilbert_lab.reports.ring reports/results/ring_{1,2}gpu_h200.json --out reports/ring/h200-gpu
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

from hilbert_lab.reports.provenance import committed_in, document_source, older_code, strip_paths

THROUGHPUT_COLUMNS = ["gpus", "variant", "seq_len", "seconds", "tokens_per_s_per_gpu", "tokens_per_s_total",
                      "peak_memory_gib_max_rank", "bytes_sent_max_rank"]
CORRECTNESS_COLUMNS = ["gpus", "variant", "seq_len", "dtype", "tensor", "ring_vs_single", "ring_vs_fp32",
                       "single_vs_fp32", "pass"]
LONGEST_COLUMNS = ["gpus", "variant", "longest_seq_len", "first_failure_or_limit"]
COMMUNICATION_COLUMNS = ["gpus", "variant", "seq_len", "bytes_sent_max_rank", "seconds", "compute_only_seconds",
                         "exposed_communication_seconds", "transfer_seconds_alone", "hidden_share"]
ANCHOR_COLUMNS = ["section", "variant", "seq_len", "median_ms", "low_ms", "high_ms", "speedup_of_reference",
                  "speedup_low", "speedup_high", "verdict"]
RATIO_COLUMNS = ["gpus", "variant", "seq_len", "tokens_per_s_per_gpu_vs_1_gpu"]


def _table(columns: list[str], rows: list[dict[str, Any]], caption: str) -> dict[str, Any]:
    return {"caption": caption, "columns": columns, "rows": [{c: row.get(c) for c in columns} for row in rows]}


def ring_run(paths: Sequence[str | Path]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metrics, env) from bench_ring.py result files (any number of GPU counts)."""
    results = []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"paths must name existing bench_ring.py JSON files, got {str(path)!r}")
        results.append((path, json.loads(path.read_text(encoding="utf-8"))))
    results.sort(key=lambda item: int(item[1]["environment"].get("world_size", 1)))
    throughput, correctness, longest, communication, anchors, ratios, notes = [], [], [], [], [], [], []
    for _path, data in results:
        gpus = int(data["environment"].get("world_size", 1))
        for variant, rows in (data.get("throughput") or {}).items():
            for row in rows:
                throughput.append({"gpus": gpus, "variant": variant, **row,
                                   "tokens_per_s_total": row["tokens_per_s_per_gpu"] * gpus})
        for variant, check in (data.get("correctness") or {}).items():
            for tensor, errors in (check.get("max_abs_error") or {}).items():
                correctness.append({"gpus": gpus, "variant": variant, "seq_len": check.get("seq_len"),
                                    "dtype": str(check.get("dtype", "")).replace("torch.", ""), "tensor": tensor,
                                    **errors, "pass": check.get("pass")})
        for variant, entry in (data.get("longest") or {}).items():
            longest.append({"gpus": gpus, "variant": variant, "longest_seq_len": entry.get("seq_len"),
                            "first_failure_or_limit": entry.get("first_failure_or_limit")})
        for variant, rows in (data.get("throughput") or {}).items():
            for row in rows:
                if "compute_only_seconds" in row:
                    communication.append({"gpus": gpus, "variant": variant, **row})
        for section, reference in (("causal_layouts", "contiguous"), ("context_parallel", "ring_zigzag")):
            block = data.get(section) or {}
            for variant, entry in block.items():
                if not isinstance(entry, dict) or "median_ms" not in entry:
                    continue
                versus = entry.get(f"speed_vs_{reference}") or {}
                low, high = (versus.get("ci") or [None, None])
                # bench_ring's ratio is time(reference) / time(variant): "B faster" = this variant faster
                said = {"B faster": "faster than the reference", "A faster": "slower than the reference"}.get(
                    versus.get("verdict"), versus.get("verdict", "reference"))
                anchors.append({"section": section, "variant": variant, "seq_len": block.get("seq_len"),
                                "median_ms": entry["median_ms"], "low_ms": entry["ci_ms"][0], "high_ms": entry["ci_ms"][1],
                                "speedup_of_reference": versus.get("ratio"), "speedup_low": low, "speedup_high": high,
                                "verdict": said})
        reference = (data.get("context_parallel") or {}).get("sdpa_cudnn_seconds")
        if reference:
            anchors.append({"section": "context_parallel", "variant": "one GPU: SDPA cuDNN",
                            "seq_len": data["context_parallel"].get("seq_len"), "median_ms": reference * 1e3,
                            "verdict": "ideal on P GPUs: this / P"})
        for variant, by_len in (data.get("ratios_vs_baseline") or {}).items():
            if variant == "longest_seq_len":
                continue
            for seq_len, ratio in by_len.items():
                ratios.append({"gpus": gpus, "variant": variant, "seq_len": int(seq_len),
                               "tokens_per_s_per_gpu_vs_1_gpu": ratio})
        notes += [item for item in data.get("not_measured") or [] if item not in notes]
    last = results[-1][1]
    config = dict(last.get("config") or {})
    for key in ("out", "baseline"):
        config.pop(key, None)
    metrics = {
        "report": "ring", "parameters": config, "metrics": {},
        "tables": {
            "throughput": _table(THROUGHPUT_COLUMNS, throughput, "forward+backward step, median of the iterations"),
            "correctness": _table(CORRECTNESS_COLUMNS, correctness, "max |error| at the check length"),
            "longest": _table(LONGEST_COLUMNS, longest, "longest sequence that ran (doubling, then bisection)"),
            "communication": _table(COMMUNICATION_COLUMNS, communication,
                                    "step with and without moving bytes (a communicator that sends nothing)"),
            "anchors": _table(ANCHOR_COLUMNS, anchors, "interleaved rounds, medians with bootstrap intervals"),
            "ratios": _table(RATIO_COLUMNS, ratios, "tokens/s per GPU over the 1-GPU run of the same script"),
        },
        "notes": [f"Not measured: {'; '.join(notes)}."] if notes else [],
        "figures": {},
        "sources": [document_source(data, path, f"{int(data['environment'].get('world_size', 1))} GPU run "
                                                f"({path.name})") for path, data in results],
        "commands": [data.get("command", "") for _path, data in results],
    }
    environment = last.get("environment") or {}  # the kit's environment block (bench.env) plus world_size
    device = environment.get("device") if isinstance(environment.get("device"), dict) else {}
    packages = environment.get("packages") or {}
    env = {
        "created_utc": None, "python": packages.get("python"),
        "packages": {**packages, "nccl": device.get("nccl")},
        "git": environment.get("git") or {}, "cpu": environment.get("cpu") or {},
        "device": {"cuda_available": True, "device": device.get("name"), "driver": device.get("driver"),
                   "torch_cuda": device.get("cuda"), "cudnn": device.get("cudnn"),
                   "device_count": max(int(data["environment"].get("world_size", 1)) for _p, data in results)},
        "parameters": {"report": "ring", **config},
        "source": ", ".join(path.name for path, _data in results),
        "gpus_used": max(int(data["environment"].get("world_size", 1)) for _p, data in results),
        "command": "; ".join(strip_paths(data.get("command", "")) for _path, data in results),
        "provenance": {"committed_in": committed_in(results[-1][0])},
    }
    return metrics, env


def write_ring_run(paths: Sequence[str | Path], out_dir: str | Path) -> Path:
    """Write metrics.json + env.json of `paths` into `out_dir` (created); returns out_dir."""
    metrics, env = ring_run(paths)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=1), encoding="utf-8")
    (out_dir / "env.json").write_text(json.dumps(env, indent=1), encoding="utf-8")
    return out_dir


def _anchor_table(frame: Any) -> Any:
    """Interleaved A/B rows, labelled for reading: time with its interval, speed against the reference."""
    import pandas as pd

    from hilbert_lab.reports.page import fmt_interval

    return pd.DataFrame({
        "implementation": frame["variant"].str.replace("_", " "), "tokens": frame["seq_len"],
        "step ms [95%]": [fmt_interval(r.median_ms, r.low_ms, r.high_ms) if r.low_ms == r.low_ms else fmt_interval(
            r.median_ms, r.median_ms, r.median_ms).split(" [")[0] for r in frame.itertuples()],
        "speed vs reference [95%]": [f"{r.speedup_of_reference:.3f} [{r.speedup_low:.3f}, {r.speedup_high:.3f}]"
                                     if r.speedup_low == r.speedup_low and r.speedup_low is not None else "-"
                                     for r in frame.itertuples()],
        "verdict": frame["verdict"]})


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
    spanning = (f"'spanning', the config that measures ring communication: the dilated pattern {pattern} plus a "
                f"branch spanning the whole sequence (dilation {parameters.get('spanning_dilation', '?')}), whose "
                f"keys/values {'were not sent in this run' if sends and 'spanning' not in sends else 'travel around the ring'}.")
    longnet = (f"'longnet': the same pattern without that branch; every segment lies inside one GPU's shard at the "
               f"lengths run, so its ring {'sends keys/values' if 'longnet' in sends else 'sends no byte'}: it shows "
               "what sharding alone does.")
    return [spanning, longnet]


def render(metrics: dict[str, Any], env: dict[str, Any]) -> Any:
    """Ring page: findings (longest sequence, memory and throughput per GPU, the anchors with intervals),
    figures per GPU count, correctness, communication; the raw measurements behind a closed section."""
    import plotly.graph_objects as go

    from hilbert_lab.reports.page import (Page, Section, fmt, fmt_count, metrics_table, older_code_page, style_axes,
                                          tokens)

    def frame(name: str) -> Any:
        return metrics_table(metrics, name)

    throughput, correctness, longest = frame("throughput"), frame("correctness"), frame("longest")
    gpus = sorted(throughput["gpus"].unique().tolist()) if len(throughput) else []
    parameters = metrics.get("parameters") or {}
    sends = _sending_variants(throughput)
    order = {variant: (variant not in sends, variant) for variant in
             set(throughput.get("variant", [])) | set(longest.get("variant", []))}
    definitions = config_definitions(parameters, sends)
    sections, findings = [], []
    if len(longest):
        lines = []
        for variant in sorted(set(longest.variant), key=order.get):
            chosen = longest[longest.variant == variant].sort_values("gpus")
            counts = ", ".join(f"{fmt_count(r.longest_seq_len)} tokens on {int(r.gpus)} GPU{'s' if r.gpus > 1 else ''}"
                               for r in chosen.itertuples())
            missing = [g for g in gpus if g not in set(chosen.gpus)]
            lines.append(f"{variant} ({'sends keys/values around the ring' if variant in sends else 'sends nothing'}): "
                         f"{counts}" + (f"; on {', '.join(map(str, missing))} GPUs not measured" if missing else ""))
        conclusion = ("Longest sequence that runs a forward+backward step (doubling, then bisection; the search stops "
                      "at the first failure or its limit): " + "; ".join(lines) + ". Only "
                      f"{len(gpus)} ring sizes were run, too few to state how the length grows with the GPU count.")
        fig = go.Figure()
        for variant in sorted(set(longest.variant), key=order.get):
            group = longest[longest.variant == variant].sort_values("gpus")
            fig.add_trace(go.Bar(x=[str(g) for g in group["gpus"]], y=group["longest_seq_len"].tolist(), name=variant))
        style_axes(fig, "GPUs in the ring", "tokens (higher is better)")
        fig.update_layout(title="longest sequence per ring size (doubling, then bisection)", barmode="group",
                          height=380)
        sections.append(Section("Longest sequence", conclusion, figure=fig))
        findings.append(conclusion)
    if len(throughput):
        longest_len = int(throughput["seq_len"].max())
        sub = throughput[throughput["seq_len"] == longest_len].sort_values("gpus")
        memory = "; ".join(
            f"{variant}: " + " -> ".join(f"{fmt(float(r.peak_memory_gib_max_rank))} GiB on {int(r.gpus)} GPU"
                                         f"{'s' if r.gpus > 1 else ''}" for r in sub[sub.variant == variant].itertuples())
            for variant in sorted(set(sub.variant), key=order.get))
        findings.append(f"Memory per GPU at {tokens(longest_len)} tokens (largest rank): {memory}: the sequence is "
                        "sharded, so each GPU holds its share.")
        speed = "; ".join(
            f"{variant}: " + ", ".join(f"{fmt_count(r.tokens_per_s_per_gpu)} on {int(r.gpus)} GPU{'s' if r.gpus > 1 else ''}"
                                       for r in sub[sub.variant == variant].itertuples())
            for variant in sorted(set(sub.variant), key=order.get))
        throughput_line = (f"Tokens/s per GPU of a forward+backward step at {tokens(longest_len)} tokens: {speed} "
                           "(medians of a few iterations, recorded without an interval: no scaling efficiency is "
                           "claimed from them).")
        findings.append(throughput_line)
        for column, axis, title in (
                ("tokens_per_s_per_gpu", "tokens/s per GPU (higher is better)",
                 "per-GPU throughput of one forward+backward step vs ring size"),
                ("peak_memory_gib_max_rank", "peak memory of the largest rank (GiB, lower is better)",
                 "peak memory per GPU vs ring size (the sequence is sharded)")):
            fig = go.Figure()
            for (variant, seq_len), group in throughput.groupby(["variant", "seq_len"], sort=True):
                group = group.sort_values("gpus")
                fig.add_trace(go.Scatter(x=group["gpus"].tolist(), y=group[column].tolist(), mode="lines+markers",
                                         name=f"{variant}, {tokens(seq_len)} tokens"))
            style_axes(fig, "GPUs in the ring", axis, gpus)
            # from zero: a per-GPU rate or memory read against a cropped axis overstates its change
            fig.update_layout(title=title, height=400, yaxis_rangemode="tozero")
            sections.append(Section("Throughput per GPU" if column.startswith("tokens") else "Memory per GPU",
                                    throughput_line if column.startswith("tokens") else findings[-2], figure=fig))
    anchors, communication = frame("anchors"), frame("communication")
    cp = anchors[anchors.section == "context_parallel"] if len(anchors) else anchors
    if len(cp):
        timed = cp[cp["low_ms"].notna()]
        fig = go.Figure(go.Bar(x=timed["variant"].str.replace("_", " ").tolist(), y=timed["median_ms"].tolist(),
                               error_y=dict(type="data", symmetric=False,
                                            array=(timed["high_ms"] - timed["median_ms"]).tolist(),
                                            arrayminus=(timed["median_ms"] - timed["low_ms"]).tolist())))
        style_axes(fig, "implementation (2 GPUs)", "forward+backward step (ms, lower is better)")
        fig.update_layout(title=f"dense causal attention, {tokens(cp.seq_len.iloc[0])} tokens: our ring vs PyTorch "
                                "context parallelism", height=420)
        fastest = timed[timed.variant.str.startswith("context_parallel")].sort_values("median_ms")
        ours = timed[timed.variant == "ring_zigzag"]
        if len(fastest) and len(ours):
            best = fastest.iloc[0]
            conclusion = (f"Dense causal attention at {tokens(cp.seq_len.iloc[0])} tokens on 2 GPUs: our ring (zigzag "
                          f"shards) {fmt(float(ours.median_ms.iloc[0]))} ms per step, PyTorch's context parallelism at "
                          f"its fastest ({best.variant.replace('_', ' ')}) {fmt(float(best.median_ms))} ms: its speed "
                          f"relative to ours {best.speedup_of_reference:.3f} [{best.speedup_low:.3f}, "
                          f"{best.speedup_high:.3f}] (PyTorch {best.verdict.replace('the reference', 'ours')}).")
            findings.append(conclusion)
        else:
            conclusion = "PyTorch's context parallelism did not run here; see the table."
        sections.append(Section("Against PyTorch's context parallelism (dense causal)", conclusion, figure=fig,
                                table=_anchor_table(cp)))
    layouts = anchors[anchors.section == "causal_layouts"] if len(anchors) else anchors
    zig = layouts[layouts.variant == "zigzag"] if len(layouts) else layouts
    if len(zig):
        row = zig.iloc[0]
        conclusion = (f"Causal spanning pattern at {tokens(row.seq_len)} tokens: zigzag shards {fmt(row.median_ms)} ms "
                      f"vs contiguous {fmt(float(layouts[layouts.variant == 'contiguous'].median_ms.iloc[0]))} ms per "
                      f"step; zigzag speed-up {row.speedup_of_reference:.3f} [{row.speedup_low:.3f}, "
                      f"{row.speedup_high:.3f}] (zigzag {row.verdict.replace('the reference', 'contiguous')}).")
        sections.append(Section("Causal load balance", conclusion, table=_anchor_table(layouts)))
        findings.append(conclusion)
    if len(correctness):
        passed = correctness["pass"].astype(bool).all()
        worst = correctness.sort_values("ring_vs_single").iloc[-1]
        sections.append(Section(
            "Correctness", f"{'All' if passed else 'Not all'} checks pass; largest ring vs single-GPU difference "
            f"{worst['ring_vs_single']:.1e} ({worst['tensor']}, {worst['variant']}, {int(worst['gpus'])} GPUs, "
            f"{worst['dtype']}), at the level of bf16 rounding (single vs fp32: {worst['single_vs_fp32']:.1e}).",
            table=correctness.rename(columns={"seq_len": "tokens", "ring_vs_single": "max |ring - 1 GPU|",
                                              "ring_vs_fp32": "max |ring - fp32|",
                                              "single_vs_fp32": "max |1 GPU - fp32|"}), collapsed=True))
    if len(communication):
        rows = "; ".join(f"{r.variant} {tokens(r.seq_len)} tokens: {fmt(r.bytes_sent_max_rank / 2**20)} MiB sent, "
                         f"transfer alone {fmt(r.transfer_seconds_alone * 1e3)} ms of a {fmt(r.seconds * 1e3)} ms step"
                         for r in communication.itertuples())
        share = float((communication["transfer_seconds_alone"] / communication["seconds"]).max())
        conclusion = (f"What the ring sends: {rows}. The transfers alone take at most {100 * share:.2g}% of a step, so "
                      "how much of them the computation hides cannot be told from the run-to-run noise of the step at "
                      "this size (no hidden share is stated).")
        findings.insert(1 if len(longest) else 0, conclusion)
        sections.insert(1 if len(longest) else 0, Section(
            "Communication", conclusion,
            table=communication.drop(columns=["hidden_share", "exposed_communication_seconds"], errors="ignore")
            .rename(columns={"seq_len": "tokens", "bytes_sent_max_rank": "bytes sent (largest rank)",
                             "seconds": "step (s)", "compute_only_seconds": "step moving no byte (s)",
                             "transfer_seconds_alone": "transfer alone (s)"})))
    if len(throughput):
        sections.append(Section("Every throughput measurement", table=throughput.rename(columns={
            "seq_len": "tokens", "seconds": "step (s)", "tokens_per_s_per_gpu": "tokens/s per GPU",
            "tokens_per_s_total": "tokens/s (all GPUs)", "peak_memory_gib_max_rank": "peak GiB (largest rank)",
            "bytes_sent_max_rank": "bytes sent (largest rank)"}), collapsed=True))
    about = (f"Ring attention (each sequence sharded over the GPUs, key/value blocks passed around the ring) on "
             f"{' and '.join(str(g) for g in gpus)} GPUs: the longest sequence that runs, memory and throughput per "
             "GPU, two anchors timed in interleaved rounds (medians with 95% bootstrap intervals), agreement with one "
             "GPU.")
    device = env.get("device") or {}
    notes = [note.replace(" with the final code", "") for note in metrics.get("notes") or []]
    page = Page(title="Ring attention across GPUs", findings=findings[:5], about=about, sections=sections,
                notes=notes, sources=list(metrics.get("sources") or []),
                measured_here=not metrics.get("sources"),
                device=f"{device.get('device') or device.get('name') or 'GPU'}, "
                       f"{' and '.join(str(g) for g in gpus)} GPUs")
    return older_code_page(page, older_code(env.get("git")), keep=definitions)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hilbert_lab.reports.ring",
                                     description="bench_ring.py JSON files -> a report run directory")
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    print(write_ring_run(args.paths, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
