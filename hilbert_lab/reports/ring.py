"""Ring-attention runs (benchmarks/bench_ring.py JSON, one file per GPU count) as a report run directory
(metrics.json + env.json) and its page.

    python -m hilbert_lab.reports.ring reports/results/ring_{1,2}gpu_h200.json --out reports/ring/h200-gpu
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

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
        notes += [f"{gpus} GPU(s): not measured: {item}" for item in data.get("not_measured") or []]
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
        "notes": notes,
        "figures": {},
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
    """Interleaved A/B rows, labelled for reading."""
    return frame.drop(columns=["section"]).rename(columns={
        "seq_len": "tokens", "median_ms": "median (ms)", "low_ms": "low", "high_ms": "high",
        "speedup_of_reference": "speed vs reference", "speedup_low": "low ", "speedup_high": "high ",
        "verdict": "verdict"})


def render(metrics: dict[str, Any], env: dict[str, Any]) -> Any:
    """Ring page: per-GPU throughput and memory against the GPU count, longest length, correctness."""
    import plotly.graph_objects as go

    from hilbert_lab.reports.page import Page, Section, fmt, metrics_table, style_axes

    def frame(name: str) -> Any:
        return metrics_table(metrics, name)

    throughput, correctness, longest = frame("throughput"), frame("correctness"), frame("longest")
    gpus = sorted(throughput["gpus"].unique().tolist()) if len(throughput) else []
    sections, bullets = [], []
    if len(throughput):
        fig = go.Figure()
        for (variant, seq_len), group in throughput.groupby(["variant", "seq_len"], sort=True):
            group = group.sort_values("gpus")
            fig.add_trace(go.Scatter(x=group["gpus"].tolist(), y=group["tokens_per_s_per_gpu"].tolist(),
                                     mode="lines+markers", name=f"{variant}, {seq_len:,} tokens"))
        style_axes(fig, "GPUs in the ring", "tokens/s per GPU (higher is better)", gpus)
        fig.update_layout(title="per-GPU throughput of one forward+backward step vs ring size", height=420)
        longest_len = throughput["seq_len"].max()
        lines = []
        for variant, group in throughput[throughput["seq_len"] == longest_len].groupby("variant", sort=True):
            values = ", ".join(f"{int(r.gpus)} GPU {fmt(r.tokens_per_s_per_gpu)}" for r in group.sort_values("gpus")
                               .itertuples())
            lines.append(f"{variant}: {values} tokens/s per GPU")
        conclusion = (f"At {int(longest_len):,} tokens: " + "; ".join(lines)
                      + ". Each value is one median of a few iterations; no interval was recorded.")
        sections.append(Section("Throughput per GPU", conclusion, figure=fig))
        bullets.append(conclusion)
        fig = go.Figure()
        for (variant, seq_len), group in throughput.groupby(["variant", "seq_len"], sort=True):
            group = group.sort_values("gpus")
            fig.add_trace(go.Scatter(x=group["gpus"].tolist(), y=group["peak_memory_gib_max_rank"].tolist(),
                                     mode="lines+markers", name=f"{variant}, {seq_len:,} tokens"))
        style_axes(fig, "GPUs in the ring", "peak memory of the largest rank (GiB, lower is better)", gpus)
        fig.update_layout(title="peak memory per GPU vs ring size (the sequence is sharded)", height=420)
        sub = throughput[(throughput["seq_len"] == longest_len)].sort_values("gpus")
        first = sub[sub["gpus"] == sub["gpus"].min()]
        last = sub[sub["gpus"] == sub["gpus"].max()]
        memory = "; ".join(f"{variant}: {fmt(float(first[first.variant == variant].peak_memory_gib_max_rank.iloc[0]))}"
                           f" GiB on {int(first.gpus.iloc[0])} GPU -> "
                           f"{fmt(float(last[last.variant == variant].peak_memory_gib_max_rank.iloc[0]))} GiB per GPU "
                           f"on {int(last.gpus.iloc[0])}" for variant in sorted(set(sub.variant)))
        sections.append(Section("Memory per GPU", f"At {int(longest_len):,} tokens, {memory}.", figure=fig))
        bullets.append(f"Memory per GPU at {int(longest_len):,} tokens: {memory}.")
    if len(longest):
        fig = go.Figure()
        for variant, group in longest.groupby("variant", sort=True):
            group = group.sort_values("gpus")
            fig.add_trace(go.Bar(x=[str(g) for g in group["gpus"]], y=group["longest_seq_len"].tolist(), name=variant))
        style_axes(fig, "GPUs in the ring", "tokens (higher is better)")
        fig.update_layout(title="longest sequence per ring size (doubling, then bisection)",
                          barmode="group", height=400)
        top = longest.sort_values("longest_seq_len").iloc[-1]
        chosen = longest[longest.variant == top.variant].sort_values("gpus")
        base = chosen.iloc[0]
        proportional = all(int(r.longest_seq_len) * int(base.gpus) == int(base.longest_seq_len) * int(r.gpus)
                           for r in chosen.itertuples())
        conclusion = ("Longest sequence: " + ", ".join(
            f"{int(r.gpus)} GPU {int(r.longest_seq_len):,}" for r in chosen.itertuples()) + f" tokens ({top.variant}); "
            + ("it grows in proportion to the GPU count" if proportional else "it does not grow in proportion to "
               "the GPU count") + f" (the probe stopped at {int(top.first_failure_or_limit):,}: failure or limit).")
        sections.append(Section("Longest sequence", conclusion, figure=fig))
        bullets.insert(0, conclusion)
    if len(correctness):
        passed = correctness["pass"].astype(bool).all()
        worst = correctness.sort_values("ring_vs_single").iloc[-1]
        sections.append(Section(
            "Correctness", f"{'All' if passed else 'Not all'} checks pass; largest ring vs single-GPU difference "
            f"{worst['ring_vs_single']:.1e} ({worst['tensor']}, {worst['variant']}, {int(worst['gpus'])} GPUs, "
            f"{worst['dtype']}), at the level of bf16 rounding (single vs fp32: {worst['single_vs_fp32']:.1e}).",
            table=correctness.rename(columns={"seq_len": "tokens", "ring_vs_single": "max |ring - 1 GPU|",
                                              "ring_vs_fp32": "max |ring - fp32|",
                                              "single_vs_fp32": "max |1 GPU - fp32|"})))
    ratios, anchors, communication = frame("ratios"), frame("anchors"), frame("communication")
    if len(ratios):
        text = "; ".join(f"{r.variant} at {int(r.seq_len):,} tokens on {int(r.gpus)} GPUs: "
                         f"{r.tokens_per_s_per_gpu_vs_1_gpu:.3f}" for r in ratios.itertuples())
        sections.insert(0, Section(
            "Per-GPU speed against one GPU",
            "tokens/s per GPU over one GPU running the same script (auto: the engine's fastest executor) in the "
            f"same session: {text}. 1.0 is perfect scaling; single medians, no interval.",
            table=ratios.rename(columns={"seq_len": "tokens", "tokens_per_s_per_gpu_vs_1_gpu": "tokens/s per GPU / 1 GPU"})))
        bullets.insert(0, f"Per-GPU speed vs 1 GPU: {text}.")
    cp = anchors[anchors.section == "context_parallel"] if len(anchors) else anchors
    if len(cp):
        timed = cp[cp["low_ms"].notna()]
        fig = go.Figure(go.Bar(x=timed["variant"].tolist(), y=timed["median_ms"].tolist(),
                               error_y=dict(type="data", symmetric=False,
                                            array=(timed["high_ms"] - timed["median_ms"]).tolist(),
                                            arrayminus=(timed["median_ms"] - timed["low_ms"]).tolist())))
        style_axes(fig, "implementation (2 GPUs)", "forward+backward step (ms, lower is better)")
        fig.update_layout(title=f"dense causal attention, {int(cp.seq_len.iloc[0]):,} tokens: our ring vs PyTorch "
                                "context parallel", height=440)
        fastest = timed[timed.variant.str.startswith("context_parallel")].sort_values("median_ms")
        ours = timed[timed.variant == "ring_zigzag"]
        if len(fastest) and len(ours):
            best = fastest.iloc[0]
            conclusion = (f"Our ring (zigzag shards) {fmt(float(ours.median_ms.iloc[0]))} ms against PyTorch's "
                          f"context parallelism at its fastest ({best.variant}) {fmt(float(best.median_ms))} ms: "
                          f"its speed relative to ours {best.speedup_of_reference:.3f} [{best.speedup_low:.3f}, "
                          f"{best.speedup_high:.3f}] (PyTorch {best.verdict.replace('the reference', 'ours')}).")
        else:
            conclusion = "PyTorch's context parallelism did not run here; see the table."
        sections.append(Section("Against PyTorch's context parallelism (dense causal)", conclusion, figure=fig,
                                table=_anchor_table(cp)))
        bullets.append(conclusion)
    layouts = anchors[anchors.section == "causal_layouts"] if len(anchors) else anchors
    zig = layouts[layouts.variant == "zigzag"] if len(layouts) else layouts
    if len(zig):
        row = zig.iloc[0]
        conclusion = (f"Causal spanning config at {int(row.seq_len):,} tokens: zigzag shards {fmt(row.median_ms)} ms vs "
                      f"contiguous {fmt(float(layouts[layouts.variant == 'contiguous'].median_ms.iloc[0]))} ms; "
                      f"zigzag speed-up {row.speedup_of_reference:.3f} [{row.speedup_low:.3f}, {row.speedup_high:.3f}] "
                      f"(zigzag {row.verdict.replace('the reference', 'contiguous')}).")
        sections.append(Section("Causal load balance", conclusion, table=_anchor_table(layouts)))
        bullets.append(conclusion)
    if len(communication):
        rows = "; ".join(f"{r.variant} {int(r.seq_len):,} tokens: {fmt(r.bytes_sent_max_rank / 2**20)} MiB sent, "
                         f"transfer alone {fmt(r.transfer_seconds_alone * 1e3)} ms of a {fmt(r.seconds * 1e3)} ms step"
                         for r in communication.itertuples())
        sections.append(Section(
            "Communication", f"{rows}. The transfers are under 1% of a step here, so the hidden share (1 - exposed / "
            "transfer, exposed = step - the same step moving no byte) is within the run-to-run noise of the step "
            "and is not a finding at this size.",
            table=communication.rename(columns={"seq_len": "tokens", "bytes_sent_max_rank": "bytes sent (largest rank)",
                                                "seconds": "step (s)", "compute_only_seconds": "no-transfer step (s)",
                                                "exposed_communication_seconds": "exposed (s)",
                                                "transfer_seconds_alone": "transfer alone (s)",
                                                "hidden_share": "hidden share"})))
    if len(throughput):
        sections.append(Section("Every throughput measurement", table=throughput.rename(columns={
            "seq_len": "tokens", "seconds": "step (s)", "tokens_per_s_per_gpu": "tokens/s per GPU",
            "tokens_per_s_total": "tokens/s (all GPUs)", "peak_memory_gib_max_rank": "peak GiB (largest rank)",
            "bytes_sent_max_rank": "bytes sent (largest rank)"})))
    summary = (f"Ring attention (each sequence sharded over the GPUs, key/value blocks passed around the ring) on "
               f"{', '.join(str(g) for g in gpus)} GPUs: throughput and memory per GPU, the longest sequence that "
               "runs, and agreement with one GPU.")
    return Page(title="Ring attention across GPUs", summary=summary, headline=bullets[0] if bullets else summary,
                sections=sections, bullets=bullets, notes=list(metrics.get("notes") or []))


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
