"""Decoding runs (benchmarks/bench_decode.py JSON) as a report run directory (metrics.json + env.json) and its page:
the per-token cost of LongNetLM's static-cache step against the memory-bandwidth limit and across contexts, the
other models timed in the same process (the dense Llama on transformers' static cache, the Llama on dilated attention
through register()) against it, and batched steps against their rows one at a time.

    python -m hilbert_lab.reports.decoding \\
        reports/results/decode_static/decode_1b_compiled_h200_b74bade_run{1,2,3}_{32768,131072}.json \\
        reports/results/decode_static/decode_1b_compiled_h200_b74bade_run4_32768.json \\
        reports/results/decode_static/decode_1b_compiled_h200_7030726_run{1,2,3}.json \\
        reports/results/decode_static/decode_1b_compiled_h200_7db65e2_run{1,2,3}.json \\
        reports/results/decode_static/decode_1b_register_gemv_h200_7db65e2_run{1,2,3}.json \\
        reports/results/decode_static/decode_tiny_batch8_compiled_h200_41a17df_run{1,2,3}.json \\
        --out reports/decoding/h200-gpu

Each file is one run (one process): ratios are taken inside a run only, never across runs. Runs are grouped by
model size (the config's dim, depth, heads, vocab) and by the code revision they record: runs of two revisions are
never pooled into one median.
"""
from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hilbert_lab.reports.provenance import committed_in, document_source, result_git, revision_text, strip_paths
from hilbert_lab.reports.render import files_run_main, write_run

__all__ = ["METHOD_LABELS", "batch_rows", "decoding_run", "flatness_rows", "per_token_rows", "relative_rows",
           "render", "size_label", "write_decoding_run"]

LONGNET = "longnet_static_graph"
# bench_decode.py's method names -> what the page calls them
METHOD_LABELS = {
    LONGNET: "LongNetLM",
    "llama_sdpa_static_cache": "dense Llama (sdpa)",
    "llama_sdpa_static_cache_filled": "dense Llama (sdpa)",
    "llama_dilated_static_cache": "Llama via register()",
    "llama_dilated_static_cache_filled": "Llama via register()",
    "llama_dilated_gemv_static_cache_filled": "Llama via register(), GEMV linears",
}
PER_TOKEN_COLUMNS = ["size", "run", "method", "context", "ms_per_token", "ms_min", "ms_max", "limit_ms", "x_limit",
                     "hbm_tb_per_s", "revision"]
RELATIVE_COLUMNS = ["size", "run", "method", "context", "ms_per_token", "longnet_ms", "ratio", "revision"]
BATCH_COLUMNS = ["size", "run", "context", "rows", "shortest", "longest", "batch_ms_per_step", "single_ms_per_step",
                 "tokens_per_s_ratio", "same_tokens", "revision"]
FLATNESS_COLUMNS = ["size", "run", "first_context", "last_context", "fastest_ms", "slowest_ms", "spread", "revision"]


def size_label(config: Mapping[str, Any]) -> str:
    """'dim 2048, 16 layers, 16 heads, vocab 32000' from a bench_decode.py config."""
    return (f"dim {config.get('dim')}, {config.get('depth')} layers, {config.get('heads')} heads, vocab "
            f"{config.get('vocab')}")


def _run_name(path: Path) -> str:
    return path.stem.removeprefix("decode_")


def per_token_rows(runs: Sequence[tuple[Path, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """A row per (run, method, context) that timed tokens: ms per token (median, fastest and slowest step), and for
    LongNetLM the bandwidth limit (ms), the ratio to it and the measured bandwidth (TB/s)."""
    rows = []
    for path, data in runs:
        revision = revision_text(result_git(data))
        for result in data.get("results") or []:
            if result.get("status") != "ok" or result.get("ms_per_token") is None:
                continue
            bandwidth = result.get("hbm_bytes_per_s")
            rows.append({"size": size_label(data.get("config") or {}), "run": _run_name(path),
                         "method": result["method"], "context": int(result["context"]),
                         "ms_per_token": float(result["ms_per_token"]), "ms_min": result.get("ms_per_token_min"),
                         "ms_max": result.get("ms_per_token_max"), "limit_ms": result.get("limit_ms"),
                         "x_limit": result.get("x_limit"),
                         "hbm_tb_per_s": None if bandwidth is None else bandwidth / 1e12,
                         "revision": revision})
    return rows


def relative_rows(per_token: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every other method's ms per token over LongNetLM's in the same run at the same context (ratio > 1: slower
    than LongNetLM)."""
    longnet = {(row["run"], row["context"]): row["ms_per_token"] for row in per_token if row["method"] == LONGNET}
    return [{"size": row["size"], "run": row["run"], "method": row["method"], "context": row["context"],
             "ms_per_token": row["ms_per_token"], "longnet_ms": longnet[row["run"], row["context"]],
             "ratio": row["ms_per_token"] / longnet[row["run"], row["context"]], "revision": row["revision"]}
            for row in per_token if row["method"] != LONGNET and (row["run"], row["context"]) in longnet]


def flatness_rows(per_token: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per run that timed LongNetLM at two contexts or more: its fastest and slowest ms per token over them and
    their ratio (spread)."""
    rows = []
    for run in dict.fromkeys(row["run"] for row in per_token):
        mine = [row for row in per_token if row["run"] == run and row["method"] == LONGNET]
        if len(mine) < 2:
            continue
        times = [row["ms_per_token"] for row in mine]
        contexts = [row["context"] for row in mine]
        rows.append({"size": mine[0]["size"], "run": run, "first_context": min(contexts),
                     "last_context": max(contexts), "fastest_ms": min(times), "slowest_ms": max(times),
                     "spread": max(times) / min(times), "revision": mine[0]["revision"]})
    return rows


def batch_rows(runs: Sequence[tuple[Path, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """A row per batched entry: rows and their prompt lengths, ms per batched step and per one-row step, the batch's
    tokens/s over its rows run one at a time, and whether every row gave the tokens it gives alone."""
    rows = []
    for path, data in runs:
        revision = revision_text(result_git(data))
        for result in data.get("results") or []:
            if result.get("status") != "ok" or result.get("tokens_per_s_ratio") is None:
                continue
            lengths = [int(length) for length in result.get("lengths") or []]
            rows.append({"size": size_label(data.get("config") or {}), "run": _run_name(path),
                         "context": int(result["context"]), "rows": int(result["rows"]),
                         "shortest": min(lengths, default=None), "longest": max(lengths, default=None),
                         "batch_ms_per_step": result.get("batch_ms_per_step"),
                         "single_ms_per_step": result.get("single_ms_per_step"),
                         "tokens_per_s_ratio": float(result["tokens_per_s_ratio"]),
                         "same_tokens": bool(result.get("same_tokens_per_row"))
                         and all(result["same_tokens_per_row"]), "revision": revision})
    return rows


def _table(columns: list[str], rows: list[dict[str, Any]], caption: str) -> dict[str, Any]:
    return {"caption": caption, "columns": columns, "rows": [{c: row.get(c) for c in columns} for row in rows]}


def decoding_run(paths: Sequence[str | Path]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metrics, env) of bench_decode.py result files; ValueError naming a file that holds no results list."""
    runs = []
    for path in paths:
        path = Path(path)
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("results"), list):
            raise ValueError(f"paths must be bench_decode.py JSON files (a 'results' list); {str(path)!r} is not")
        runs.append((path, data))
    if not runs:
        raise ValueError("paths must name at least one bench_decode.py JSON file")
    per_token = per_token_rows(runs)
    metrics = {
        "report": "decoding", "parameters": {"files": [path.name for path, _data in runs]}, "metrics": {},
        "tables": {
            "per_token": _table(PER_TOKEN_COLUMNS, per_token, "ms per token: median step (fastest, slowest) of each "
                                "run; limit: the bytes a step reads over the HBM copy bandwidth measured in the run"),
            "relative": _table(RELATIVE_COLUMNS, relative_rows(per_token), "ms per token over LongNetLM's in the same "
                               "run and context"),
            "flatness": _table(FLATNESS_COLUMNS, flatness_rows(per_token), "LongNetLM's slowest context over its "
                               "fastest, per run"),
            "batch": _table(BATCH_COLUMNS, batch_rows(runs), "batched steps against the same rows one at a time"),
        },
        "figures": {},
        "sources": [document_source(data, path, f"{_run_name(path)} ({size_label(data.get('config') or {})})")
                    for path, data in runs],
    }
    last = runs[-1][1]
    environment = last.get("environment") or {}
    device = environment.get("device") if isinstance(environment.get("device"), dict) else {}
    packages = environment.get("packages") or {}
    env = {
        "created_utc": None, "python": packages.get("python"), "packages": packages,
        "git": environment.get("git") or {}, "cpu": environment.get("cpu") or {},
        "device": {"cuda_available": str(device.get("device", "")).startswith("cuda"), "device": device.get("name"),
                   "driver": device.get("driver"), "torch_cuda": device.get("cuda"), "cudnn": device.get("cudnn"),
                   "device_count": 1},
        "parameters": {"report": "decoding"},
        "source": ", ".join(path.name for path, _data in runs),
        "command": "; ".join(strip_paths(data.get("command", "")) for _path, data in runs),
        "provenance": {"committed_in": committed_in(runs[-1][0])},
    }
    return metrics, env


def write_decoding_run(paths: Sequence[str | Path], out_dir: str | Path) -> Path:
    """Write metrics.json + env.json of `paths` into `out_dir` (created); returns out_dir."""
    return write_run(*decoding_run(paths), out_dir)


# ---------------------------------------------------------------------------------------------------
# the page (a pure function of metrics.json + env.json)

def _span(values: Sequence[float], unit: str = "", digits: int = 3) -> str:
    """'0.981-1.01 ms' (or one value where they are all the same to `digits` digits)."""
    from hilbert_lab.reports.page import fmt

    low, high = fmt(min(values), digits), fmt(max(values), digits)
    return (low if low == high else f"{low}-{high}") + (f" {unit}" if unit else "")


def _ratio(values: Sequence[float]) -> str:
    """'1.49x [1.42, 1.59]': the median of the runs' ratios and, bracketed, the lowest and highest run's; one run:
    '16.3x (no interval: one run)'."""
    from hilbert_lab.reports.page import fmt

    values = [float(value) for value in values]
    if len(values) == 1:
        return f"{fmt(values[0])}x (no interval: one run)"
    for digits in (3, 4):  # one more digit where 3 read the median as an end, or runs that differ as one value
        middle, low, high = (fmt(value, digits) for value in (statistics.median(values), min(values), max(values)))
        if middle not in (low, high) or min(values) == max(values):
            break
    at_end = " (the median, at the end of its interval)" if middle in (low, high) and low != high else ""
    return f"{middle}x [{low}, {high}]{at_end}"


def _longnet_finding(size: str, rows: Any, flat: Any) -> str:
    from hilbert_lab.reports.page import tokens

    mine = rows[rows["method"] == LONGNET]
    runs = list(dict.fromkeys(mine["run"]))
    alone = len(runs) > 1 and mine.groupby("run")["context"].nunique().max() == 1 and mine["context"].nunique() > 1
    text = (f"{size}: LongNetLM takes {_span(list(mine['ms_per_token']), 'ms')} per token from "
            f"{tokens(mine['context'].min())} to {tokens(mine['context'].max())} tokens of context over {len(runs)} "
            f"run{'s' if len(runs) > 1 else ''}{' (one context each)' if alone else ''}")
    limited = mine[mine["x_limit"].notna()]
    if len(limited):
        at = [f"{_ratio(list(limited[limited['context'] == context]['x_limit']))} at {tokens(context)}"
              for context in sorted(set(limited["context"]))]
        text += (f"; over the memory-bandwidth limit (its weights and the keys its branches read, over the HBM "
                 f"bandwidth measured in the same run; median [lowest, highest] over runs): {', '.join(at)}")
    if len(flat):
        slower = _span([100 * (spread - 1) for spread in flat["spread"]], digits=2)
        text += f"; its slowest context is {slower}% slower than its fastest"
    return text + "."


def _relative_finding(size: str, relative: Any) -> str:
    from hilbert_lab.reports.page import tokens

    parts = []
    for method in dict.fromkeys(relative["method"]):
        mine = relative[relative["method"] == method]
        label = METHOD_LABELS.get(method, method)
        at = [f"{_ratio(list(mine[mine['context'] == context]['ratio']))} at {tokens(context)}"
              for context in sorted(set(mine["context"]))]
        parts.append(f"the {label} {', '.join(at)}")
    return (f"{size}, each model's ms per token over LongNetLM's in the same run (median [lowest, highest] over "
            f"runs): " + "; ".join(parts) + ".")


def _batch_finding(size: str, batch: Any) -> str:
    from hilbert_lab.reports.page import tokens

    same = "every row gave the tokens it gives alone" if batch["same_tokens"].all() else \
        "some row did not give the tokens it gives alone"
    return (f"{size}: a batch of {int(batch['rows'].iloc[0])} rows of {tokens(batch['shortest'].min())}-"
            f"{tokens(batch['longest'].max())} tokens decodes at {_ratio(list(batch['tokens_per_s_ratio']))} the "
            f"tokens/s of its rows one at a time (median [lowest, highest] of {len(batch)} runs); {same}.")


def _of(table: Any, size: str, revision: str) -> Any:
    """The rows of a metrics table (a DataFrame) of one model size and revision (the empty table as it is)."""
    if not len(table):
        return table
    return table[(table["size"] == size) & (table["revision"] == revision)]


def render(metrics: Mapping[str, Any], env: Mapping[str, Any]) -> Any:
    """Decoding page: per model size and revision, LongNetLM's ms per token across contexts beside the bandwidth
    limit and the other models of its runs, the ratio to the limit, batched steps; the tables behind closed
    sections."""
    from hilbert_lab.reports.page import Page, Section, fmt, is_missing, metrics_table, style_axes, tokens
    from hilbert_lab.viz.decoding import limit_ratio_figure, per_token_figure

    per_token, relative, flatness, batch = (metrics_table(metrics, name)
                                            for name in ("per_token", "relative", "flatness", "batch"))
    groups = list(dict.fromkeys(list(zip(per_token.get("size", []), per_token.get("revision", [])))
                                + list(zip(batch.get("size", []), batch.get("revision", [])))))
    findings, sections = [], []
    for size, revision in groups:
        group = f"{size}, rev {revision}"
        rows, flat, mine_relative, mine_batch = (_of(table, size, revision)
                                                 for table in (per_token, flatness, relative, batch))
        if len(rows) and (rows["method"] == LONGNET).any():
            longnet = _longnet_finding(group, rows, flat)
            findings.append(longnet)
            if len(mine_relative):
                findings.append(_relative_finding(group, mine_relative))
            labelled = [{**{key: None if is_missing(value) else value for key, value in row.items()},
                         "label": METHOD_LABELS.get(row["method"], row["method"])}
                        for row in rows.to_dict(orient="records")]
            contexts = sorted(set(rows["context"]))
            fig = per_token_figure(labelled, title=f"{group}: ms per token")
            style_axes(fig, "tokens of context", "ms per token (lower is better)")
            fig.update_xaxes(tickvals=contexts, ticktext=[tokens(context) for context in contexts])
            sections.append(Section(f"{group}: ms per token", longnet, figure=fig))
            limited = [row for row in labelled if row["method"] == LONGNET and row["x_limit"] is not None]
            if limited:
                fig = limit_ratio_figure(limited, title=f"{group}: LongNetLM over the memory-bandwidth limit")
                style_axes(fig, "tokens of context", "times the limit (lower is better)")
                fig.update_xaxes(tickvals=contexts, ticktext=[tokens(context) for context in contexts])
                sections.append(Section(f"{group}: against the memory-bandwidth limit",
                                        "The limit is the bytes one step must read (weights, and the keys and values "
                                        "its branches see) over the HBM copy bandwidth measured in the same run.",
                                        figure=fig))
        if len(mine_batch):
            findings.append(_batch_finding(group, mine_batch))
            shown = mine_batch.assign(prompts=[f"{fmt(row['shortest'])}-{fmt(row['longest'])}"
                                               for row in mine_batch.to_dict(orient="records")])
            shown = shown[["run", "rows", "prompts", "batch_ms_per_step", "single_ms_per_step", "tokens_per_s_ratio",
                           "same_tokens"]].rename(columns={
                "prompts": "prompt tokens", "batch_ms_per_step": "ms per batched step",
                "single_ms_per_step": "ms per one-row step", "tokens_per_s_ratio": "tokens/s over rows one at a time",
                "same_tokens": "each row its own tokens"})
            sections.append(Section(f"{group}: batched decoding", findings[-1], table=shown))
    shown = {
        "per_token": per_token.assign(model=[METHOD_LABELS.get(m, m) for m in per_token.get("method", [])])[
            ["run", "model", "context", "ms_per_token", "ms_min", "ms_max", "limit_ms", "x_limit", "hbm_tb_per_s"]
        ].rename(columns={"ms_per_token": "ms per token", "ms_min": "fastest step", "ms_max": "slowest step",
                          "limit_ms": "limit (ms)", "x_limit": "over the limit", "hbm_tb_per_s": "HBM TB/s"})
        if len(per_token) else per_token,
        "relative": relative.assign(model=[METHOD_LABELS.get(m, m) for m in relative.get("method", [])])[
            ["run", "model", "context", "ms_per_token", "longnet_ms", "ratio"]
        ].rename(columns={"ms_per_token": "ms per token", "longnet_ms": "LongNetLM's ms", "ratio": "over LongNetLM's"})
        if len(relative) else relative,
        "flatness": flatness.drop(columns=["size", "revision"]).rename(columns={
            "first_context": "from", "last_context": "to", "fastest_ms": "fastest ms", "slowest_ms": "slowest ms",
            "spread": "slowest over fastest"}) if len(flatness) else flatness,
    }
    for name, key in (("ms per token, every run", "per_token"), ("against LongNetLM, every run", "relative"),
                      ("flatness across contexts, every run", "flatness")):
        if len(shown[key]):
            sections.append(Section(name, table=shown[key], caption=metrics["tables"][key]["caption"],
                                    collapsed=True))
    device = env.get("device") or {}
    about = ("Committed runs of benchmarks/bench_decode.py, each one process: a random cache of the given context "
             "(no timed prefill), then new tokens generated one at a time and timed per step (median, fastest and "
             "slowest), every model of a run timed in that run. LongNetLM's step is one CUDA graph on its static "
             "cache; the dense Llama runs transformers' static cache under its compiled generate.")
    return Page(title="Decoding: cost per token", findings=findings, about=about, sections=sections,
                sources=list(metrics.get("sources") or []), measured_here=not metrics.get("sources"),
                device=f"{device.get('device') or 'GPU'}, 1 GPU")


def main(argv: list[str] | None = None) -> int:
    return files_run_main(argv, "python -m hilbert_lab.reports.decoding", "bench_decode.py", decoding_run)


if __name__ == "__main__":
    raise SystemExit(main())
