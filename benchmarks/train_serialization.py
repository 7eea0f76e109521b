"""Which serialization should an image / point-cloud LongNet use? Train the same small model on the
spatial majority task (hilbert_lab.models.spatial) with every ordering and several seeds, and write
accuracies with 95% intervals (plus the exact locality metrics of each setting) as JSON.

Tasks: the 2D task on a --grid x --grid image (default 48 x 48) (label = majority of the bits within --radius cells) at
each window of --windows, and the 3D point-cloud task (--points points, majority of the --neighbours
nearest) at --point-window. Every ordering gets the same model, steps, batches and compute.

GPU (bf16 autocast, backend="auto"); the default --time-budget 330 fits the whole grid in about 6 minutes
(it times a short probe, then gives every run the same number of steps, at most --steps):
    python benchmarks/train_serialization.py
CPU-sized run (what the report shows until a GPU run is committed), a few minutes on 2 cores:
    python benchmarks/train_serialization.py --small --out reports/results/serialization_cpu.json
Smoke check (seconds):
    python benchmarks/train_serialization.py --small --steps 3 --seeds 1 --out /tmp/serialization_smoke.json
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import re
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hilbert_lab.io import strip_paths  # noqa: E402
from hilbert_lab.bench.env import collect_environment  # noqa: E402
from hilbert_lab.locality.serialization import serialization_metrics  # noqa: E402
from hilbert_lab.models.spatial import (  # noqa: E402
    MajorityTask,
    SpatialRunConfig,
    make_spatial_batch,
    mean_interval,
    train_spatial,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_ORDERINGS = ["rowmajor", "snake", "morton", "hilbert", "hilbert,hilbert-trans"]


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def device_slug(device: str) -> str:
    """'cpu', or the GPU model in lower case (h100, h200, a100, ...) for file names."""
    if not device.startswith("cuda"):
        return "cpu"
    name = torch.cuda.get_device_name(torch.device(device))
    match = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    return match.group(1).lower() if match else re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def _orderings(text: list[str]) -> list:
    """'hilbert' -> 'hilbert'; 'hilbert,hilbert-trans' -> alternating per block (a list)."""
    return [item.split(",") if "," in item else item for item in text]


def _label(ordering) -> str:
    return ordering if isinstance(ordering, str) else "/".join(ordering)


def _per_block(ordering, depth: int):
    if isinstance(ordering, str):
        return ordering
    return [ordering[i % len(ordering)] for i in range(depth)]


def build_tasks(args) -> list[dict]:
    """[{name, task, config, metrics_data}] for the 2D windows and the 3D point-cloud task."""
    common = dict(dim=args.dim, depth=args.depth, num_heads=args.heads, steps=args.steps, batch_size=args.batch_size,
                  lr=args.lr, warmup_steps=max(1, args.steps // 10), eval_batches=args.eval_batches,
                  eval_batch_size=args.batch_size, backend=args.backend, device=args.device,
                  autocast="bfloat16" if args.device.startswith("cuda") else "none", frequencies=args.frequencies)
    tasks = []
    grid = MajorityTask("grid", (args.grid, args.grid), radius=args.radius)
    for window in args.windows:
        tasks.append({"name": f"2d {args.grid}x{args.grid} r={args.radius:g} window {window}", "task": grid,
                      "config": SpatialRunConfig(segment_lengths=[window], dilation_rates=[1], **common),
                      "metrics_data": grid.grid_shape})
    if args.points > 0:
        cloud = MajorityTask("points", num_points=args.points, ndim=3, neighbours=args.neighbours,
                             clusters=args.clusters, spread=args.spread)
        sample = make_spatial_batch(cloud, 1, seed=0, split="eval")["coords"][0].double().numpy()
        tasks.append({"name": f"3d points {args.points} k={args.neighbours} window {args.point_window}",
                      "task": cloud, "metrics_data": sample,
                      "config": SpatialRunConfig(segment_lengths=[args.point_window], dilation_rates=[1], **common)})
    return tasks


def _probe_steps(tasks: list[dict], orderings: list, seeds: list[int], budget: float, cap: int) -> int:
    """Steps per run that fit the whole grid in `budget` seconds (timed on a short probe per task)."""
    start = time.perf_counter()
    per_run_fixed = per_step = 0.0
    for entry in tasks:
        timings = []
        for steps in (2, 3, 13):  # the first run only warms up (kernel compilation, autotuning, caches)
            config = dataclasses.replace(entry["config"], steps=steps, warmup_steps=1)
            timings.append(train_spatial(entry["task"], config, _per_block(orderings[-1], config.depth),
                                         seed=0)["seconds"])
        step_cost = max(1e-4, (timings[2] - timings[1]) / 10)
        per_step += step_cost * len(orderings) * len(seeds)
        per_run_fixed += max(0.0, timings[1] - 3 * step_cost) * len(orderings) * len(seeds)
    left = 0.85 * budget - (time.perf_counter() - start) - per_run_fixed
    steps = int(max(10, min(cap, left / per_step)))
    _log(f"time budget {budget:.0f} s: {per_step / (len(orderings) * len(seeds)):.4f} s per step over the tasks, "
         f"{steps} steps per run (cap {cap})")
    return steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None, help="JSON path (default reports/results/serialization_<device>.json)")
    parser.add_argument("--small", action="store_true", help="CPU sizes: 12x12 grid, windows 16 and 48, 256 points")
    parser.add_argument("--orderings", nargs="+", default=DEFAULT_ORDERINGS,
                        help="names of SERIALIZATIONS; 'a,b' alternates a and b over the blocks")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="steps per run (a cap with --time-budget)")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="seconds for the whole grid: probe the step time, then pick the steps that fit "
                             "(default 330 on CUDA, none on CPU; 0 turns it off)")
    parser.add_argument("--grid", type=int, default=48,
                        help="image side; off powers of two Hilbert and Morton windows differ (on 2^k sides "
                             "windows of 4^j tokens are the same aligned squares)")
    parser.add_argument("--radius", type=float, default=1.5, help="disk radius in cells (1.5: the 3x3 square)")
    parser.add_argument("--windows", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--points", type=int, default=4096, help="points per cloud (0: skip the 3D task)")
    parser.add_argument("--neighbours", type=int, default=9)
    parser.add_argument("--clusters", type=int, default=0, help="0: uniform cloud; > 0: Gaussian blobs")
    parser.add_argument("--spread", type=float, default=0.05)
    parser.add_argument("--point-window", type=int, default=64)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--frequencies", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--eval-batches", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args(argv)
    if args.small:
        args.grid, args.radius, args.windows, args.points, args.neighbours = 12, 1.0, [16, 48], 256, 5
        args.point_window, args.dim, args.heads, args.batch_size, args.frequencies = 16, 32, 2, 16, 6
        args.steps = 100 if args.steps is None else args.steps
    if args.steps is None:
        args.steps = 600
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU (use --device cpu)")
    if args.device == "cpu":
        torch.set_num_threads(max(1, min(4, torch.get_num_threads())))
    orderings = _orderings(args.orderings)
    seeds = list(range(args.seeds))
    slug = device_slug(args.device)
    out = Path(args.out) if args.out else REPO / "reports" / "results" / f"serialization_{slug}.json"
    tasks = build_tasks(args)
    _log(f"device {args.device} ({slug}); {len(tasks)} tasks x {len(orderings)} orderings x {len(seeds)} seeds")
    if args.time_budget is None and args.device.startswith("cuda"):
        args.time_budget = 330.0
    if args.time_budget:
        args.steps = _probe_steps(tasks, orderings, seeds, args.time_budget, args.steps)
        tasks = build_tasks(args)
    started = time.perf_counter()
    results = []
    total = len(tasks) * len(orderings) * len(seeds)
    done = 0
    for entry in tasks:
        task, config = entry["task"], entry["config"]
        runs = []
        for ordering in orderings:
            for seed in seeds:
                run = train_spatial(task, config, _per_block(ordering, config.depth), seed=seed)
                run["ordering"] = _label(ordering)
                runs.append(run)
                done += 1
                elapsed = time.perf_counter() - started
                _log(f"[{done}/{total}] {entry['name']} | {_label(ordering)} seed {seed}: accuracy "
                     f"{run['accuracy']:.4f} ({run['seconds']:.1f} s; eta {elapsed / done * (total - done):.0f} s)")
        summary = []
        for ordering in orderings:
            accs = [r["accuracy"] for r in runs if r["ordering"] == _label(ordering)]
            metric_ordering = ordering if isinstance(ordering, str) else ordering[0]
            locality = serialization_metrics(entry["metrics_data"], metric_ordering, config.segment_lengths,
                                             config.dilation_rates, ks=(4, 8, 26))
            summary.append({"ordering": _label(ordering), **mean_interval(accs), "locality": locality})
        summary.sort(key=lambda row: -row["mean"])
        results.append({"name": entry["name"], "task": dataclasses.asdict(task), "config": dataclasses.asdict(config),
                        "summary": summary, "runs": runs})
        _log(f"{entry['name']}: " + ", ".join(f"{row['ordering']} {row['mean']:.4f} [{row['low']:.4f}, "
                                                f"{row['high']:.4f}]" for row in summary))
        _write(out, _document(slug, argv, args, started, results))  # what finished survives an interruption
    document = _document(slug, argv, args, started, results)
    _write(out, document)
    _log(f"wrote {out} ({document['seconds']:.0f} s)")
    return 0


def _document(slug, argv, args, started, results) -> dict:
    return {
        "benchmark": "train_serialization",
        "label": "GPU" if slug != "cpu" else "CPU",
        "device": slug,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": strip_paths(" ".join([Path(sys.argv[0]).name] + (sys.argv[1:] if argv is None else argv))),
        "arguments": {k: strip_paths(v) if isinstance(v, str) else v for k, v in vars(args).items()},
        "seconds": time.perf_counter() - started,
        "env": collect_environment(args.device),
        "tasks": results,
    }


def _write(out: Path, document: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(document, indent=1, default=lambda v: v.tolist() if isinstance(v, np.ndarray) else str(v))
    out.with_suffix(".tmp").write_text(text)
    out.with_suffix(".tmp").replace(out)


if __name__ == "__main__":
    raise SystemExit(main())
