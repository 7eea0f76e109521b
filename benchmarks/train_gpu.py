"""Train a LongNetLM on 32K-token retrieval on one GPU (or sharded over GPUs with the ring): tokens/s and
peak memory with and without gradient checkpointing, then a training run to retrieval accuracy.

One GPU (H100), writes JSON to --out:
    python benchmarks/train_gpu.py --out reports/results/train_gpu_h100.json
The same training run sharded over 2 GPUs with ring attention, compared with the 1-GPU curve:
    torchrun --nproc_per_node=2 benchmarks/train_gpu.py --ring --skip-throughput \
        --compare reports/results/train_gpu_h100.json --out reports/results/train_gpu_ring2.json
On a DeviceMesh with FSDP2 (models.parallel): --data-parallel and --context-parallel, their product the process
count, e.g. torchrun --nproc_per_node=4 benchmarks/train_gpu.py --data-parallel 2 --context-parallel 2 --out ...
(tokens/s counts the global batch; tokens_per_s_per_gpu divides it by the process count). The one-GPU baseline
of a scaling table runs the same program on a mesh of one: torchrun --nproc_per_node=1 ... --fsdp.
LongNet's geometric dilation on the spanning segment instead (the whole grid: train_retrieval_grid.py):
    python benchmarks/train_gpu.py --preset gpu-32k-dil16 --out reports/results/train_gpu_h100_dil16.json
Long runs resume: add --run-dir DIR (and --resume to continue after a time limit).
CPU smoke check of the script (tiny sizes, float32):
    python benchmarks/train_gpu.py --small --out /tmp/train_gpu_small.json

Every number comes from hilbert_lab.models.train.train (the real training loop: data, forward,
backward, optimizer step); tokens/s is measured over the logged windows after the first one
(which includes warm-up), peak memory is torch.cuda.max_memory_allocated over the run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hilbert_lab.io import strip_paths  # noqa: E402
from hilbert_lab.bench.env import collect_environment  # noqa: E402
from hilbert_lab.models.train import PRESETS, TrainConfig, parse_curriculum, train  # noqa: E402


def _resolved_backend(values: dict) -> str:
    """What the model's attention layers run: the configured backend, or what "auto" picks for training."""
    if values.get("backend", "auto") != "auto":
        return values["backend"]
    from hilbert_lab.attention.selection import select_backend

    dtype = torch.bfloat16 if values.get("autocast") == "bfloat16" else getattr(torch, values.get("dtype", "float32"))
    device = values["device"] if torch.cuda.is_available() or values["device"] == "cpu" else "cpu"
    sharded = values.get("ring", False) or values.get("context_parallel", 1) > 1
    return select_backend(device, dtype, mode=values.get("mode", "longnet"), whole_pattern=not sharded)


def _base_config(args) -> dict:
    values = dict(PRESETS[args.preset])
    if args.small:  # CPU smoke sizes
        values.update(seq_len=256, context_length=192, num_pairs=4, num_queries=2, num_keys=16, num_values=16,
                      segment_lengths=[32, 64, 256], dilation_rates=[1, 2, 4], dim=32, depth=2, num_heads=4,
                      batch_size=2, autocast="none", device="cpu", warmup_steps=2, curriculum=[[64, 2]])
    if args.seq_len is not None:  # keep the question a quarter of the sequence away from every pair
        values["context_length"] = args.seq_len - args.seq_len // 4
    for name in ("seq_len", "dim", "depth", "num_heads", "batch_size", "lr", "num_pairs", "num_queries",
                 "segment_lengths", "dilation_rates", "backend", "autocast", "seed", "rotary_base", "curriculum",
                 "init_from"):
        value = getattr(args, name)
        if value is not None:
            values[name] = value
    values["progress"] = not args.quiet
    return values


def throughput(values: dict, checkpointing: bool, steps: int, window: int) -> dict:
    """tokens/s (mean over the logged windows after the first) and peak memory of `steps` training steps."""
    config = TrainConfig(**{**values, "steps": steps, "curriculum": [], "log_every": window, "eval_every": 10**9,
                            "checkpoint_every": 10**9, "gradient_checkpointing": checkpointing})
    on_cuda = torch.device(config.device).type == "cuda"
    if on_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(config.device)
    row = {"gradient_checkpointing": checkpointing, "seq_len": config.seq_len, "batch_size": config.batch_size}
    try:
        result = train(config)
    except torch.OutOfMemoryError as error:
        return {**row, "error": f"out of memory: {str(error).splitlines()[0]}"}
    windows = [r for r in result.history if r["kind"] == "train"]
    measured = windows[1:] or windows
    ranks = config.data_parallel * config.context_parallel if config.on_mesh else 1
    if config.ring:
        import torch.distributed as dist

        ranks = dist.get_world_size()
    row.update(
        tokens_per_s=sum(r["tokens_per_s"] for r in measured) / len(measured),
        tokens_per_s_per_gpu=sum(r["tokens_per_s"] for r in measured) / len(measured) / ranks,
        tokens_per_s_windows=[r["tokens_per_s"] for r in windows],
        losses=[r["loss"] for r in windows],
        peak_memory_bytes=torch.cuda.max_memory_allocated(config.device) if on_cuda else None,
    )
    if on_cuda:
        row["peak_memory_gib"] = row["peak_memory_bytes"] / 2**30
    del result
    return row


def spanning_pattern(length: int, max_keys: int = 4096) -> tuple[list[int], list[int]]:
    """dil8's pattern [2048, 8192, 32768] / [1, 4, 8], extended by segments four times longer (each attending
    ``max_keys`` keys per query) until one spans ``length``."""
    segments, rates = [2048, 8192, 32768], [1, 4, 8]
    while segments[-1] < length:
        segments.append(segments[-1] * 4)
        rates.append(segments[-1] // max_keys)
    return segments, rates


def longest_trainable(values: dict, lengths: list[int], steps: int, rows: list[dict], save) -> None:
    """Training steps per length (batch 1, gradient checkpointing, the pattern extended to span it), timed
    over ``steps`` steps: tokens/s and peak memory, or the error, which ends the probe. Each row is
    appended to ``rows`` and saved at once."""
    for length in lengths:
        segments, rates = spanning_pattern(length)
        probe = {**values, "seq_len": length, "context_length": length - length // 4, "batch_size": 1,
                 "segment_lengths": segments, "dilation_rates": rates, "curriculum": [], "eval_batches": 1,
                 "final_eval_batches": 1, "init_from": None}
        row = {"seq_len": length, "segment_lengths": segments, "dilation_rates": rates}
        if torch.device(values["device"]).type == "cuda":
            row["device_memory_gib"] = torch.cuda.get_device_properties(values["device"]).total_memory / 2**30
        try:
            row.update(throughput(probe, True, steps, 1))
        except Exception as error:  # not only out of memory: every failure is a finding of the probe
            row["error"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"
        row.pop("losses", None)
        rows.append(row)
        save()
        speed = row.get("error") or f"{row['tokens_per_s']:.3g} tokens/s, peak {row.get('peak_memory_gib')} GiB"
        print(f"{length}: {speed}", flush=True)
        if "error" in row:
            break


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", required=True, help="JSON report path")
    parser.add_argument("--preset", choices=[name for name in PRESETS if name.startswith("gpu")], default="gpu-32k",
                        help="model + task configuration (hilbert_lab.models.train.PRESETS); default gpu-32k")
    parser.add_argument("--small", action="store_true", help="tiny CPU sizes to check the script runs")
    parser.add_argument("--ring", action="store_true", help="shard the sequence over the torchrun ranks")
    parser.add_argument("--ring-layout", choices=("contiguous", "zigzag"), default="contiguous")
    parser.add_argument("--data-parallel", type=int, default=1, help="ranks that split each batch's rows (FSDP2)")
    parser.add_argument("--context-parallel", type=int, default=1, help="ranks that shard each sequence (FSDP2)")
    parser.add_argument("--fsdp", action="store_true",
                        help="one rank on a DeviceMesh of one (FSDP2 mixed precision, as every mesh rank trains): "
                             "the like-for-like one-GPU baseline of the scaling table; run under torchrun")
    parser.add_argument("--compare", help="JSON of the 1-GPU run: report the loss-curve difference")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--throughput-steps", type=int, default=30)
    parser.add_argument("--window", type=int, default=10, help="steps per tokens/s window")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the gpu-32k preset)")
    parser.add_argument("--eval-every", type=int, default=None)
    parser.add_argument("--gradient-checkpointing", action="store_true", help="for the training run")
    parser.add_argument("--run-dir", default=None, help="checkpoint/log folder of the training run (resumable)")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--init-from", dest="init_from", default=None,
                        help="checkpoint whose model weights start the training run (fine-tuning at another length)")
    parser.add_argument("--probe-lengths", type=int, nargs="+", default=None,
                        help="longest trainable length: one step per length (batch 1, gradient checkpointing)")
    for name, kind in (("seq_len", int), ("dim", int), ("depth", int), ("num_heads", int), ("batch_size", int),
                       ("lr", float), ("num_pairs", int), ("num_queries", int), ("backend", str),
                       ("autocast", str), ("seed", int), ("rotary_base", float)):
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None)
    parser.add_argument("--segment-lengths", type=int, nargs="+", default=None)
    parser.add_argument("--dilation-rates", type=int, nargs="+", default=None)
    parser.add_argument("--curriculum", type=parse_curriculum, default=None,
                        help="SEQ_LEN:UNTIL_STEP pairs, e.g. 1024:800,4096:1000 ('' for none)")
    args = parser.parse_args()

    if args.init_from is not None and not Path(args.init_from).is_file():
        parser.error(f"--init-from must name an existing checkpoint file, got {args.init_from!r}")
    values = _base_config(args)
    rank, world_size = 0, 1
    if min(args.data_parallel, args.context_parallel) < 1 or \
            (args.ring and (args.fsdp or args.data_parallel * args.context_parallel > 1)):
        parser.error("--data-parallel and --context-parallel must be >= 1, and they (and --fsdp) do not go with --ring")
    on_mesh = args.fsdp or args.data_parallel * args.context_parallel > 1
    distributed = args.ring or on_mesh
    if distributed:
        import torch.distributed as dist

        cuda = torch.cuda.is_available() and not args.small
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=600))
        rank, world_size = dist.get_rank(), dist.get_world_size()
        values.update(ring=args.ring, ring_layout=args.ring_layout, data_parallel=args.data_parallel,
                      context_parallel=args.context_parallel, fsdp=args.fsdp)
        if cuda:
            values["device"] = f"cuda:{torch.cuda.current_device()}"
        values["progress"] = values["progress"] and rank == 0
    elif values["device"] == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device; use --small for the CPU smoke check", file=sys.stderr)
        return 2

    report: dict = {"command": strip_paths(" ".join(sys.argv)), "world_size": world_size, "environment": collect_environment(values["device"]),
                    "config": values, "attention_backend": _resolved_backend(values)}

    def save() -> None:
        if rank == 0:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n")

    save()
    if not args.skip_throughput:
        report["throughput"] = []
        for checkpointing in (False, True):
            report["throughput"].append(throughput(values, checkpointing, args.throughput_steps, args.window))
            save()
    if args.probe_lengths:
        report["longest_trainable"] = []
        longest_trainable(values, args.probe_lengths, 3, report["longest_trainable"], save)
    if not args.skip_train:
        config = TrainConfig(**{**values, **({"steps": args.steps} if args.steps else {}),
                                **({"eval_every": args.eval_every} if args.eval_every else {}),
                                "gradient_checkpointing": args.gradient_checkpointing})
        run_dir = args.run_dir or (tempfile.mkdtemp(prefix="train_gpu_") if rank == 0 else None)
        if distributed and args.run_dir is None:  # every rank needs the same folder
            import torch.distributed as dist

            holder = [run_dir]
            dist.broadcast_object_list(holder, src=0)
            run_dir = holder[0]
        if torch.device(config.device).type == "cuda":
            torch.cuda.reset_peak_memory_stats(config.device)
        start = time.perf_counter()
        result = train(config, run_dir, resume=args.resume)
        report["training"] = {
            "config": config.to_dict(),  # the run's effective configuration (after --steps / --eval-every)
            "run_dir": strip_paths(run_dir), "wall_s": time.perf_counter() - start, "final_eval": result.final_eval,
            "chance_accuracy": config.task().chance_accuracy, "chance_loss": config.task().chance_loss,
            "history": result.history,
            "peak_memory_bytes": (torch.cuda.max_memory_allocated(config.device)
                                  if torch.device(config.device).type == "cuda" else None),
        }
        if args.compare:
            other = json.loads(Path(args.compare).read_text())["training"]["history"]
            mine = {(r["kind"], r["step"]): r["loss"] for r in result.history}
            pairs = [(mine[(r["kind"], r["step"])], r["loss"]) for r in other if (r["kind"], r["step"]) in mine]
            differences = [abs(a - b) for a, b in pairs]
            report["comparison"] = {
                "against": strip_paths(args.compare), "points": len(pairs),
                "max_abs_loss_difference": max(differences) if differences else None,
                "max_rel_loss_difference": max((abs(a - b) / max(abs(b), 1e-12) for a, b in pairs), default=None),
            }
        save()
    if distributed:
        import torch.distributed as dist

        dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({k: v for k, v in report.items() if k in ("throughput", "comparison")} |
                         {"final_eval": report.get("training", {}).get("final_eval")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
