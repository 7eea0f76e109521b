"""Needle-retrieval accuracy against attention compute: a grid of presets x seeds, each a resumable run.

Every run is hilbert_lab.models.train.train (the real loop) in its own folder RUNS_DIR/ROW/seed-S, trained
in chunks of checkpoint_every steps with exact resume, so a grid spreads over several time-limited calls:
    python benchmarks/train_retrieval_grid.py --rows gpu-32k,gpu-32k-dil8 --seeds 0,1,2 \
        --runs-dir runs/grid32k --out reports/results/retrieval_grid_h100.json --time-limit-s 540
stops cleanly before the time limit (finished runs and checkpoints are kept); the same command continues.
Another call with other --rows adds them to the same --out. Default rows: the 32K grid presets
(gpu-32k dense top, gpu-32k-dil8, gpu-32k-dil16, gpu-32k-dil16-w1024, gpu-32k-local control).

The JSON (rewritten atomically after every finished run) holds per run: config, final eval (accuracy,
Wilson 95% interval, accuracy per needle-distance bucket), tokens/s at the full length, attention FLOPs
per token (hilbert_lab.models.cost, causal forward), wall s, loss history; per row: the attention cost and
the accuracy pooled over its finished seeds with its interval (overall and per distance bucket).

CPU: the small-scale grid (presets cpu-512-*, about a minute per run on one core):
    python benchmarks/train_retrieval_grid.py --rows cpu-512-dense,cpu-512-dil8,cpu-512-dil16,cpu-512-local \
        --seeds 0,1,2 --runs-dir /tmp/grid_cpu --out reports/results/retrieval_grid_cpu.json
Smoke check (seconds): python benchmarks/train_retrieval_grid.py --small --out /tmp/grid_small.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from hilbert_lab.bench.env import collect_environment  # noqa: E402
from hilbert_lab.io import atomic_write  # noqa: E402
from hilbert_lab.models.cost import config_attention_cost  # noqa: E402
from hilbert_lab.models.evaluate import bucket_rows, pooled_accuracy  # noqa: E402
from hilbert_lab.models.train import CHECKPOINT_NAME, PRESETS, SUMMARY_NAME, TrainConfig, read_log, train  # noqa: E402

GRID_ROWS = ("gpu-32k", "gpu-32k-dil8", "gpu-32k-dil16", "gpu-32k-dil16-w1024", "gpu-32k-local")
CPU_ROWS = ("cpu-512-dense", "cpu-512-dil8", "cpu-512-dil16", "cpu-512-local")
SMALL = dict(steps=4, curriculum=[[64, 2]], eval_every=2, checkpoint_every=2, log_every=1, eval_batches=1,
             final_eval_batches=2, batch_size=4, device="cpu", autocast="none")
STATE_NAME = "grid_run.json"


def row_config(row: str, seed: int, small: bool) -> TrainConfig:
    values = {**PRESETS[row], "seed": seed, "progress": False}
    if small:
        values.update(SMALL)
    return TrainConfig(**values)


def _read_state(run_dir: Path) -> dict[str, Any]:
    path = run_dir / STATE_NAME
    return json.loads(path.read_text()) if path.is_file() else {"wall_s": 0.0, "done": False}


def tokens_per_second(history: list[dict[str, Any]], seq_len: int) -> float | None:
    """Mean tokens/s of the train windows at the full length, the first one (warm-up) left out when
    there are others."""
    windows = [r["tokens_per_s"] for r in history if r.get("kind") == "train" and r.get("seq_len") == seq_len]
    windows = windows[1:] or windows
    return sum(windows) / len(windows) if windows else None


def run_one(config: TrainConfig, run_dir: Path, deadline: float, chunk_s: dict[str, float]) -> bool:
    """Train ``config`` in ``run_dir`` in chunks of checkpoint_every steps until done (True) or until
    the next chunk would pass ``deadline`` (time.monotonic(); False, the checkpoint keeps the progress).
    ``chunk_s["max"]`` carries the longest chunk so far (over runs) as the estimate of the next one."""
    run_dir.mkdir(parents=True, exist_ok=True)
    state = _read_state(run_dir)
    if state["done"]:
        return True
    while True:
        done_steps = 0
        if (run_dir / CHECKPOINT_NAME).exists():
            done_steps = int(torch.load(run_dir / CHECKPOINT_NAME, map_location="cpu", weights_only=True)["step"])
        if done_steps >= config.steps:
            state["done"] = True
            atomic_write(run_dir / STATE_NAME, json.dumps(state))
            return True
        if time.monotonic() + 1.5 * chunk_s.get("max", 0.0) > deadline:  # margin: the last chunk adds the final eval
            return False
        stop = min(config.steps, done_steps + config.checkpoint_every)
        start = time.perf_counter()
        train(config, run_dir, resume=done_steps > 0, stop_at=stop)
        elapsed = time.perf_counter() - start
        chunk_s["max"] = max(chunk_s.get("max", 0.0), elapsed)
        state["wall_s"] += elapsed
        atomic_write(run_dir / STATE_NAME, json.dumps(state))


def run_record(row: str, seed: int, config: TrainConfig, run_dir: Path) -> dict[str, Any]:
    """What the JSON keeps of a finished run."""
    summary = json.loads((run_dir / SUMMARY_NAME).read_text())
    history = read_log(run_dir)
    cost = config_attention_cost(config)
    return {"row": row, "seed": seed, "run_dir": str(run_dir), "config": config.to_dict(),
            "final_eval": summary["final_eval"], "chance_accuracy": summary["chance_accuracy"],
            "chance_loss": summary["chance_loss"], "tokens_per_s": tokens_per_second(history, config.seq_len),
            "attention_flops_per_token": cost["flops_per_token"], "wall_s": _read_state(run_dir)["wall_s"],
            "history": history}


def row_summaries(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per row: attention cost, chance, seeds, mean tokens/s, pooled accuracy (+ interval) overall and per bucket."""
    rows: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(run["row"] for run in runs):
        members = [run for run in runs if run["row"] == name]
        config = TrainConfig.from_dict(members[0]["config"])
        evals = [run["final_eval"] for run in members]
        hits: dict[int, float] = {}
        counts: dict[int, float] = {}
        for final in evals:
            for bucket in final.get("by_distance", []):
                k = int(bucket["distance_low"]).bit_length() - 1
                hits[k] = hits.get(k, 0) + bucket["correct"]
                counts[k] = counts.get(k, 0) + bucket["count"]
        top = max(counts, default=-1) + 1
        speeds = [run["tokens_per_s"] for run in members if run.get("tokens_per_s")]
        rows[name] = {
            "segment_lengths": config.segment_lengths, "dilation_rates": config.dilation_rates,
            "num_heads": config.num_heads, "dim": config.dim, "depth": config.depth, "seq_len": config.seq_len,
            "steps": config.steps, "seeds": [run["seed"] for run in members],
            "chance_accuracy": members[0]["chance_accuracy"], "attention": config_attention_cost(config),
            "tokens_per_s": sum(speeds) / len(speeds) if speeds else None,
            "pooled": pooled_accuracy(evals),
            "pooled_by_distance": bucket_rows([hits.get(k, 0) for k in range(top)], [counts.get(k, 0) for k in range(top)]),
        }
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", required=True, help="grid JSON (kept and extended when it exists)")
    parser.add_argument("--rows", default=None, help=f"comma-separated presets (default: {','.join(GRID_ROWS)}; "
                        f"with --small: {','.join(CPU_ROWS)})")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--runs-dir", default=None, help="run folders RUNS_DIR/ROW/seed-S (default: next to --out)")
    parser.add_argument("--time-limit-s", type=float, default=None,
                        help="stop before this many seconds (finished runs and checkpoints are kept)")
    parser.add_argument("--label", default="", help="free text stored in the JSON (e.g. 'H100, 32K grid')")
    parser.add_argument("--small", action="store_true", help="CPU smoke sizes (a few steps per run)")
    args = parser.parse_args()

    rows = [r for r in (args.rows or ",".join(CPU_ROWS if args.small else GRID_ROWS)).split(",") if r]
    unknown = [r for r in rows if r not in PRESETS]
    if unknown:
        parser.error(f"--rows must name presets of {sorted(PRESETS)}; unknown: {unknown}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if not seeds or any(s < 0 for s in seeds):
        parser.error(f"--seeds must be comma-separated integers >= 0, got {args.seeds!r}")
    configs = {(row, seed): row_config(row, seed, args.small) for row in rows for seed in seeds}
    devices = {c.device for c in configs.values()}
    if any(torch.device(d).type == "cuda" for d in devices) and not torch.cuda.is_available():
        print("error: these rows need CUDA; use --small (or cpu-* rows) on a CPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    runs_dir = Path(args.runs_dir) if args.runs_dir else out.with_suffix("").with_name(out.stem + "_runs")
    out.parent.mkdir(parents=True, exist_ok=True)
    report = json.loads(out.read_text()) if out.is_file() else {"kind": "retrieval_grid", "runs": []}
    report.update(label=args.label or report.get("label", ""), command=" ".join(sys.argv),
                  environment=collect_environment(sorted(devices)[0]))
    deadline = time.monotonic() + (args.time_limit_s if args.time_limit_s is not None else float("inf"))
    chunk_s: dict[str, float] = {}

    def save() -> None:
        report["rows"] = row_summaries(report["runs"])
        atomic_write(out, json.dumps(report, indent=1) + "\n")

    for (row, seed), config in configs.items():
        run_dir = runs_dir / row / f"seed-{seed}"
        print(f"{row} seed {seed}: {run_dir}", flush=True)
        if not run_one(config, run_dir, deadline, chunk_s):
            save()
            print(f"stopped before the time limit; run the same command to continue ({run_dir})", flush=True)
            return 0
        record = run_record(row, seed, config, run_dir)
        report["runs"] = [r for r in report["runs"] if (r["row"], r["seed"]) != (row, seed)] + [record]
        save()
        final = record["final_eval"]
        print(f"  accuracy {final['accuracy']:.3f} [{final['accuracy_low']:.3f}, {final['accuracy_high']:.3f}] "
              f"over {final['count']} answers, {record['wall_s']:.0f} s", flush=True)
    save()
    for name, row in report["rows"].items():
        pooled = row["pooled"]
        print(f"{name}: {pooled['accuracy']:.3f} [{pooled['accuracy_low']:.3f}, {pooled['accuracy_high']:.3f}] "
              f"({pooled['runs']} seeds), attention {row['attention']['flops_per_token']:.3g} FLOPs/token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
