"""Needle-retrieval accuracy against attention compute: a grid of presets x seeds, each a resumable run.

Every run is hilbert_lab.models.train.train (the real loop) in its own folder RUNS_DIR/ROW/seed-S, trained
in chunks of checkpoint_every steps with exact resume, so a grid spreads over several time-limited calls:
    python benchmarks/train_retrieval_grid.py --rows gpu-32k,gpu-32k-dil8 --seeds 0,1,2 \
        --runs-dir runs/grid32k --out reports/results/retrieval_grid_h100.json --time-limit-s 540
stops cleanly before the time limit (finished runs and checkpoints are kept); the same command continues.
Another call with other --rows adds them to the same --out. Default rows: the 32K grid presets
(gpu-32k dense top; gpu-32k-dil8, its -early16k and -long1k curricula; gpu-32k-dil16, its -long1k curriculum;
gpu-32k-dil16-w1024; gpu-32k-local control).

The JSON (rewritten atomically after every finished run) holds per run: config, final eval (accuracy,
Wilson 95% interval, accuracy per needle-distance bucket), tokens/s at the full length, attention FLOPs
per token (hilbert_lab.models.cost, causal forward), wall s, loss history; per row: the attention cost and
the accuracy pooled over its finished seeds with its interval (overall and per distance bucket).

CPU: the small-scale grid (presets cpu-512-*, about a minute per run on one core):
    python benchmarks/train_retrieval_grid.py --rows cpu-512-dense,cpu-512-dil8,cpu-512-dil16,cpu-512-local \
        --seeds 0,1,2 --runs-dir /tmp/grid_cpu --out reports/results/retrieval_grid_cpu.json
Smoke check (seconds): python benchmarks/train_retrieval_grid.py --small --out /tmp/grid_small.json

--jobs K runs K runs at a time, each in its own process on the same device (small models leave a GPU idle
between kernels; concurrent runs fill it). Their training-window tokens/s then share the device, so the
rows' tokens/s come from --throughput-steps: each row's training step timed alone at its full length,
before the runs start (the JSON's "throughput"; the row summary uses it where present).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from hilbert_lab.bench.env import collect_environment  # noqa: E402
from hilbert_lab.io import atomic_write, strip_paths  # noqa: E402
from hilbert_lab.models.cost import config_attention_cost  # noqa: E402
from hilbert_lab.models.evaluate import bucket_rows, pooled_accuracy  # noqa: E402
from hilbert_lab.models.train import CHECKPOINT_NAME, PRESETS, SUMMARY_NAME, TrainConfig, read_log, train  # noqa: E402

GRID_ROWS = ("gpu-32k", "gpu-32k-dil8", "gpu-32k-dil8-early16k", "gpu-32k-dil8-long1k", "gpu-32k-dil16",
             "gpu-32k-dil16-long1k", "gpu-32k-dil16-w1024", "gpu-32k-local")
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


def measure_throughput(config: TrainConfig, steps: int) -> dict[str, Any]:
    """tokens/s and peak memory of ``steps`` training steps of ``config`` at its full length, timed alone (the
    first of 4 windows, which holds warm-up and compilation, left out); no files are written."""
    window = max(1, steps // 4)
    probe = TrainConfig.from_dict({**config.to_dict(), "steps": 4 * window, "curriculum": [], "log_every": window,
                                   "eval_every": 10**9, "checkpoint_every": 10**9, "final_eval_batches": 1,
                                   "eval_batches": 1, "progress": False})
    on_cuda = torch.device(probe.device).type == "cuda"
    if on_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(probe.device)
    history = train(probe).history
    row = {"steps": 4 * window, "seq_len": probe.seq_len, "batch_size": probe.batch_size,
           "tokens_per_s": tokens_per_second(history, probe.seq_len)}
    if on_cuda:
        row["peak_memory_bytes"] = torch.cuda.max_memory_allocated(probe.device)
    return row


def run_record(row: str, seed: int, config: TrainConfig, run_dir: Path) -> dict[str, Any]:
    """What the JSON keeps of a finished run."""
    summary = json.loads((run_dir / SUMMARY_NAME).read_text())
    history = read_log(run_dir)
    cost = config_attention_cost(config)
    return {"row": row, "seed": seed, "run_dir": strip_paths(run_dir), "config": config.to_dict(),
            "final_eval": summary["final_eval"], "chance_accuracy": summary["chance_accuracy"],
            "chance_loss": summary["chance_loss"], "tokens_per_s": tokens_per_second(history, config.seq_len),
            "attention_flops_per_token": cost["flops_per_token"], "wall_s": _read_state(run_dir)["wall_s"],
            "history": history}


def row_summaries(runs: list[dict[str, Any]], throughput: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Per row: attention cost, chance, seeds, tokens/s (the row's probe timed alone where ``throughput`` has
    it, else the mean over its runs' training windows), pooled accuracy (+ interval) overall and per bucket."""
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
        alone = (throughput or {}).get(name, {}).get("tokens_per_s")
        rows[name] = {
            "segment_lengths": config.segment_lengths, "dilation_rates": config.dilation_rates,
            "num_heads": config.num_heads, "dim": config.dim, "depth": config.depth, "seq_len": config.seq_len,
            "steps": config.steps, "curriculum": config.curriculum, "seeds": [run["seed"] for run in members],
            "chance_accuracy": members[0]["chance_accuracy"], "attention": config_attention_cost(config),
            "tokens_per_s": alone if alone else (sum(speeds) / len(speeds) if speeds else None),
            "tokens_per_s_source": "alone" if alone else "training windows",
            "pooled": pooled_accuracy(evals),
            "pooled_by_distance": bucket_rows([hits.get(k, 0) for k in range(top)], [counts.get(k, 0) for k in range(top)]),
        }
    return rows


def _run_in_children(pending: list[tuple[str, int]], jobs: int, args, runs_dir: Path, deadline: float,
                     finished) -> bool:
    """Run ``pending`` (row, seed) pairs, ``jobs`` at a time, each in a child process of this script writing
    its record to RUNS_DIR/ROW/seed-S/record.json; ``finished(record)`` is called as each one ends.
    True when all finished."""
    queue, running, complete = list(pending), [], True
    while queue or running:
        while queue and len(running) < jobs:
            row, seed = queue.pop(0)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                complete = False
                break
            record_path = runs_dir / row / f"seed-{seed}" / "record.json"
            command = [sys.executable, __file__, "--rows", row, "--seeds", str(seed), "--runs-dir", str(runs_dir),
                       "--out", str(record_path)]
            command += ["--time-limit-s", str(remaining)] if remaining != float("inf") else []
            command += ["--small"] if args.small else []
            print(f"{row} seed {seed}: started", flush=True)
            running.append((row, seed, record_path, subprocess.Popen(command, stdout=subprocess.DEVNULL)))
        if not queue and not running:
            break
        time.sleep(0.2)
        for entry in [e for e in running if e[3].poll() is not None]:
            running.remove(entry)
            row, seed, record_path, process = entry
            runs = json.loads(record_path.read_text())["runs"] if record_path.is_file() else []
            if process.returncode != 0:
                raise RuntimeError(f"the run {row} seed {seed} failed (exit {process.returncode})")
            if not runs:
                complete = False
                print(f"{row} seed {seed}: stopped before the time limit", flush=True)
                continue
            finished(runs[0])
    return complete


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
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time, each in its own process (default 1)")
    parser.add_argument("--throughput-steps", type=int, default=0,
                        help="time each row's training step alone over this many steps first (default 0: off)")
    parser.add_argument("--reference-row", default=None,
                        help="preset whose attention cost the rows are compared with, run or not (default: gpu-32k; "
                             "with --small: cpu-512-dense)")
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
    if args.jobs < 1 or args.throughput_steps < 0:
        parser.error(f"--jobs must be >= 1 and --throughput-steps >= 0, got {args.jobs} and {args.throughput_steps}")
    configs = {(row, seed): row_config(row, seed, args.small) for row in rows for seed in seeds}
    devices = {c.device for c in configs.values()}
    if any(torch.device(d).type == "cuda" for d in devices) and not torch.cuda.is_available():
        print("error: these rows need CUDA; use --small (or cpu-* rows) on a CPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    runs_dir = Path(args.runs_dir) if args.runs_dir else out.with_suffix("").with_name(out.stem + "_runs")
    out.parent.mkdir(parents=True, exist_ok=True)
    report = json.loads(out.read_text()) if out.is_file() else {"kind": "retrieval_grid", "runs": []}
    report.update(label=args.label or report.get("label", ""), command=strip_paths(" ".join(sys.argv)),
                  environment=collect_environment(sorted(devices)[0]))
    if args.jobs > 1:
        report["jobs"] = args.jobs
    reference = args.reference_row or ("cpu-512-dense" if args.small else "gpu-32k")
    if reference not in PRESETS:
        parser.error(f"--reference-row must name a preset of {sorted(PRESETS)}, got {reference!r}")
    report["reference"] = {"row": reference,
                           "attention": config_attention_cost(row_config(reference, seeds[0], args.small))}
    deadline = time.monotonic() + (args.time_limit_s if args.time_limit_s is not None else float("inf"))
    chunk_s: dict[str, float] = {}

    def save() -> None:
        report["rows"] = row_summaries(report["runs"], report.get("throughput"))
        atomic_write(out, json.dumps(report, indent=1) + "\n")

    def finished(record: dict[str, Any]) -> None:
        report["runs"] = [r for r in report["runs"] if (r["row"], r["seed"]) != (record["row"], record["seed"])]
        report["runs"].append(record)
        save()
        final = record["final_eval"]
        print(f"{record['row']} seed {record['seed']}: accuracy {final['accuracy']:.3f} [{final['accuracy_low']:.3f}, "
              f"{final['accuracy_high']:.3f}] over {final['count']} answers, {record['wall_s']:.0f} s", flush=True)

    if args.throughput_steps:
        speeds = report.setdefault("throughput", {})
        for row in rows:
            if row not in speeds:
                speeds[row] = measure_throughput(configs[(row, seeds[0])], args.throughput_steps)
                print(f"{row}: {speeds[row]['tokens_per_s']:.4g} tokens/s alone", flush=True)
                save()
    done = {(r["row"], r["seed"]) for r in report["runs"]}
    pending = [key for key in configs if key not in done]
    if args.jobs > 1:
        complete = _run_in_children(pending, args.jobs, args, runs_dir, deadline, finished)
    else:
        complete = True
        for row, seed in pending:
            run_dir = runs_dir / row / f"seed-{seed}"
            print(f"{row} seed {seed}: {run_dir}", flush=True)
            if not run_one(configs[(row, seed)], run_dir, deadline, chunk_s):
                complete = False
                break
            finished(run_record(row, seed, configs[(row, seed)], run_dir))
    save()
    if not complete:
        print("stopped before the time limit; run the same command to continue", flush=True)
        return 0
    for name, row in report["rows"].items():
        pooled = row["pooled"]
        print(f"{name}: {pooled['accuracy']:.3f} [{pooled['accuracy_low']:.3f}, {pooled['accuracy_high']:.3f}] "
              f"({pooled['runs']} seeds), attention {row['attention']['flops_per_token']:.3g} FLOPs/token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
