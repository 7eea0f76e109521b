"""The training loop of a LongNetLM on the synthetic retrieval task: progress bar, periodic eval,
atomic checkpoints with exact resume, JSON-lines logs; ring attention over an initialised process group, or
data and context parallelism on a DeviceMesh with FSDP2 (models.parallel), its checkpoints sharded."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .blocks import LongNetLM
from hilbert_lab.io import append_line, exclusive_lock

from .checkpoint import (
    CHECKPOINT_FORMAT, CHECKPOINT_NAME, LOCK_NAME, LOG_NAME, SUMMARY_NAME, _atomic_write_text,
    check_run_folder, load_checkpoint, load_weights, log_tail_note, save_checkpoint,
)
from .batches import (
    all_reduce_sum, answer_loss, batch_logits, is_main_rank, sequence_positions, training_batch, widened,
)
from .config import DTYPES, TrainConfig
from .evaluate import bucket_rows, distance_bucket, num_distance_buckets, wilson_interval
from .parallel import check_agreement, init_mesh, load_sharded, local_batch, parallelize, save_sharded
from .tasks import IGNORE_INDEX, answer_positions, make_batch


@dataclass
class TrainResult:
    """What `train` returns: the model (on the config's device), the log records and the last eval."""

    model: LongNetLM
    history: list[dict[str, Any]]
    final_eval: dict[str, float]
    out_dir: Path | None
    notes: list[str] = dataclasses.field(default_factory=list)  # e.g. what a resume dropped from the log


def build_model(config: TrainConfig) -> LongNetLM:
    """The LongNetLM for ``config`` on its device and dtype, seeded by ``config.seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = LongNetLM(**config.model_kwargs())
    return model.to(device=config.device, dtype=DTYPES[config.dtype])


@torch.no_grad()
def evaluate(model: torch.nn.Module, config: TrainConfig, *, batches: int | None = None,
             by_distance: bool = False, mesh=None) -> dict[str, Any]:
    """Loss and answer accuracy on the fixed "eval" stream: ``batches`` (default ``eval_batches``)
    batches of ``batch_size`` samples, the same samples for every model of a config's task.

    Returns loss (mean nats per answer), accuracy, correct, count and the Wilson 95% interval
    (accuracy_low, accuracy_high); with ``by_distance`` also ``by_distance``: per bucket
    [2^k, 2^(k+1)) of needle-to-query distance (query position - key position of the asked pair)
    its count, correct, accuracy and interval (evaluate.bucket_rows). ``mesh``: the DeviceMesh a model
    parallelized by models.parallel runs on (every rank calls evaluate; each scores its rows and shard).
    """
    batches = config.eval_batches if batches is None else batches
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        raise ValueError(f"batches must be a positive integer, got {batches!r}")
    task = config.task()
    positions = sequence_positions(config)
    query_positions = answer_positions(task)
    buckets = num_distance_buckets(task.seq_len)
    was_training = model.training
    model.eval()
    totals = torch.zeros(3 + 2 * buckets, dtype=torch.float64)  # loss, correct, count, hits[k], counts[k]
    try:
        for index in range(batches):
            tokens, targets, needles = make_batch(task, config.batch_size, seed=config.seed, split="eval", step=index,
                                                  with_needles=True)
            distance = torch.zeros_like(targets)
            distance[:, query_positions] = query_positions - needles
            if positions is not None:
                distance = distance[:, positions.cpu()]
            if mesh is not None:
                distance = local_batch(mesh, distance, distance, layout=config.ring_layout)[0]
            logits, local_targets = batch_logits(model, tokens, targets, positions, config, mesh=mesh)
            mask = local_targets != IGNORE_INDEX
            selected, wanted = widened(logits[mask]), local_targets[mask]
            hits = (selected.argmax(dim=-1) == wanted).cpu().double()
            bucket = distance_bucket(distance[mask.cpu()])
            totals[0] += float(F.cross_entropy(selected, wanted, reduction="sum"))
            totals[1] += hits.sum()
            totals[2] += hits.numel()
            totals[3:3 + buckets] += torch.bincount(bucket, weights=hits, minlength=buckets).double()
            totals[3 + buckets:] += torch.bincount(bucket, minlength=buckets).double()
    finally:
        model.train(was_training)
    totals = torch.tensor(all_reduce_sum(totals.tolist(), config, mesh), dtype=torch.float64)
    loss, correct, count = (float(v) for v in totals[:3])
    low, high = wilson_interval(correct, count)
    result: dict[str, Any] = {"loss": loss / count, "accuracy": correct / count, "correct": int(correct),
                              "count": int(count), "accuracy_low": low, "accuracy_high": high}
    if by_distance:
        result["by_distance"] = bucket_rows(totals[3:3 + buckets].tolist(), totals[3 + buckets:].tolist())
    return result


def _final_eval(model: torch.nn.Module, config: TrainConfig, mesh=None) -> dict[str, Any]:
    """The end-of-run evaluation: ``final_eval_batches`` (default ``eval_batches``) batches, by distance."""
    return evaluate(model, config, batches=config.final_eval_batches or config.eval_batches, by_distance=True,
                    mesh=mesh)


def learning_rate(config: TrainConfig, step: int) -> float:
    """Linear warm-up over ``warmup_steps`` then cosine decay to 10% at ``steps`` (step is 0-based)."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress))))


def _make_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=0.9, weight_decay=config.weight_decay)
    return torch.optim.AdamW(params, lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay)


def _log(record: dict[str, Any], history: list[dict[str, Any]], log_path: Path | None) -> None:
    history.append(record)
    if log_path is not None:
        with open(log_path, "a", encoding="utf-8") as handle:
            append_line(handle, json.dumps(record))


def _load_weights(model: torch.nn.Module, path: str) -> None:
    """The model weights of the training checkpoint at ``path``; ValueError when they do not fit ``model``."""
    try:
        state = load_checkpoint(path)
    except ValueError as error:
        raise ValueError(f"init_from: {error}") from None
    load_weights(model, state, path, what="init_from", fit="this configuration")


def agreed_configuration(config: TrainConfig) -> dict[str, Any]:
    """The fields every rank of a mesh run must start with alike: the configuration, its device named by type
    (each rank holds its own index, cuda:0, cuda:1, ...)."""
    return {**config.to_dict(), "device": torch.device(config.device).type}


def train(
    config: TrainConfig,
    out_dir: str | os.PathLike | None = None,
    *,
    resume: bool = False,
    stop_at: int | None = None,
) -> TrainResult:
    """Train per ``config``; returns the model, the log records and the final eval.

    ``out_dir`` (optional) receives ``log.jsonl`` (one JSON record per train/eval log event),
    ``checkpoint.pt`` (atomic, every ``checkpoint_every`` steps and at the end) and ``summary.json``.
    ``resume=True`` continues from ``out_dir/checkpoint.pt`` (ValueError if its configuration differs
    in any field outside RUN_CONTROL_FIELDS); batches are a pure function of (seed, step) and the RNG
    state is restored, so the resumed loss curve is the one an uninterrupted run produces.
    ``stop_at`` ends the run after that many total steps (an interruption; it checkpoints).
    Results are never overwritten: without ``resume`` a folder that holds a run (its checkpoint, log or
    summary) is refused, and a folder another ``train`` is writing is refused at once (a lock file,
    ``.train.lock``); both are RunFolderError / LockedError, ValueErrors naming ``out_dir``.
    Sets the global torch seed (``seed + 1``, the dropout stream) unless resuming. ``config.init_from``
    starts a new run from a checkpoint's model weights (a resumed run continues from its own checkpoint).

    With ``config.ring`` every rank of the initialised process group calls ``train`` with the same
    arguments; each holds its shard of every sequence (ring attention), gradients are summed over
    ranks, and only rank 0 writes files and shows the progress bar.
    With ``config.data_parallel`` x ``config.context_parallel`` > 1 (their product the world size) every rank
    calls ``train`` alike: the model runs on that DeviceMesh (models.parallel: FSDP2, ring attention over
    "cp"; autocast becomes FSDP's mixed precision, float32 master weights), each rank takes its rows and shard
    of every batch, the loss is the global batch's mean, and checkpoints are sharded
    (torch.distributed.checkpoint, a folder beside checkpoint.pt): a run resumes on any mesh or in one process.
    """
    if stop_at is not None and not 0 <= stop_at <= config.steps:
        raise ValueError(f"stop_at must be None or in [0, steps={config.steps}], got {stop_at}")
    if resume and out_dir is None:
        raise ValueError("resume=True needs out_dir (the folder holding checkpoint.pt)")
    positions = {length: sequence_positions(config, length)
                 for length in {config.seq_len, *(phase[0] for phase in config.curriculum)}}
    out_path = Path(out_dir) if out_dir is not None else None
    mesh = init_mesh(config.data_parallel, config.context_parallel, torch.device(config.device).type) \
        if config.on_mesh else None
    if mesh is not None:
        check_agreement("configuration, run folder and resume flag",
                        [agreed_configuration(config), None if out_dir is None else str(out_dir), resume, stop_at])
    model = build_model(config)  # bad model arguments fail here, before anything is written
    if config.init_from is not None and not resume:
        _load_weights(model, config.init_from)
    if config.ring:
        from .ring import use_ring_attention

        use_ring_attention(model, layout=config.ring_layout)
    if mesh is not None:
        low = None if config.autocast == "none" else getattr(torch, config.autocast)
        parallelize(model, mesh, layout=config.ring_layout, param_dtype=low)
    optimizer = _make_optimizer(model, config)
    with contextlib.ExitStack() as stack:
        if out_path is not None:
            if resume:
                check_run_folder(out_path, resume=True)  # before anything is created
            if is_main_rank():  # the rank that writes holds the folder's lock for the whole run
                out_path.mkdir(parents=True, exist_ok=True)
                stack.enter_context(exclusive_lock(out_path / LOCK_NAME, f"run folder {str(out_path)!r}"))
                check_run_folder(out_path, resume=resume)
        return _run(config, model, optimizer, out_path, resume=resume, stop_at=stop_at, positions=positions, mesh=mesh)


SHARDED_PREFIX = "checkpoint-step"  # sharded checkpoints: folder checkpoint-step<N>.dcp beside checkpoint.pt


def _grad_norm(norm: torch.Tensor) -> float:
    """clip_grad_norm_'s total norm as a float (a DTensor's under FSDP)."""
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)


def _run(config: TrainConfig, model: LongNetLM, optimizer: torch.optim.Optimizer, out_path: Path | None, *,
         resume: bool, stop_at: int | None, positions: dict[int, torch.Tensor | None], mesh=None) -> TrainResult:
    """The training loop of `train`, once the run folder is checked (and locked)."""
    main_rank = is_main_rank()
    checkpoint_path = out_path / CHECKPOINT_NAME if out_path is not None else None
    log_path = out_path / LOG_NAME if out_path is not None and main_rank else None
    task = config.task()
    history: list[dict[str, Any]] = []
    notes: list[str] = []
    start_step = 0
    if resume:
        state = load_checkpoint(checkpoint_path, config)
        if state.get("sharded"):
            load_sharded(str(checkpoint_path.parent / state["sharded"]), model, optimizer)
        elif mesh is not None:
            raise ValueError(f"cannot resume {str(checkpoint_path)!r} on a mesh: it was written by one process "
                             "(resume it in one process, data_parallel and context_parallel 1)")
        else:
            load_weights(model, state, checkpoint_path)
            optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"]["torch"])
        if state["rng"].get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        start_step = int(state["step"])
        history = list(state["history"])
        if log_path is not None:  # records an interrupted run wrote after its checkpoint are dropped
            note = log_tail_note(log_path, start_step, len(history))
            if note:
                notes.append(note)
            _atomic_write_text("".join(json.dumps(record) + "\n" for record in history), log_path)
    else:
        torch.manual_seed(config.seed + 1)
        if log_path is not None:
            _atomic_write_text("", log_path)
    runner = torch.compile(model) if config.compile else model
    end_step = config.steps if stop_at is None else stop_at

    def save(step: int) -> None:
        if checkpoint_path is None or not (main_rank or mesh is not None):
            return
        state = {"format": CHECKPOINT_FORMAT, "config": config.to_dict(), "step": step, "history": history,
                 "rng": {"torch": torch.get_rng_state(),
                         "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}}
        if mesh is None:
            save_checkpoint({**state, "model": model.state_dict(), "optimizer": optimizer.state_dict()},
                            checkpoint_path)
            return
        # every rank writes its shards to a new folder; checkpoint.pt, written last, names it (the switch is atomic)
        folder = f"{SHARDED_PREFIX}{step}.dcp"
        save_sharded(str(checkpoint_path.parent / folder), model, optimizer)
        if main_rank:
            save_checkpoint({**state, "sharded": folder}, checkpoint_path)
            for old in checkpoint_path.parent.glob(f"{SHARDED_PREFIX}*.dcp"):
                if old.name != folder:
                    shutil.rmtree(old, ignore_errors=True)

    from tqdm.auto import tqdm

    model.train()
    answers_per_batch = config.batch_size * task.num_queries
    on_cuda = torch.device(config.device).type == "cuda"
    last_eval: dict[str, float] = {}
    window_start, window_steps, window_tokens = time.perf_counter(), 0, 0
    bar = tqdm(total=config.steps, initial=start_step, disable=not (config.progress and main_rank),
               desc="train", unit="step")
    try:
        for step in range(start_step, end_step):
            lr = learning_rate(config, step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            length = config.seq_len_at(step)
            tokens, targets, cu_seqlens = training_batch(config, step)
            logits, local_targets = batch_logits(runner, tokens, targets, positions[length], config, cu_seqlens,
                                                  mesh)
            optimizer.zero_grad(set_to_none=True)
            loss_sum, hits, answers = answer_loss(logits, local_targets)
            # a packed row holds as many answers as it has documents with questions (over its shards on a mesh);
            # otherwise every rank divides by the whole batch's answers
            if config.pack:
                answers = max(int(all_reduce_sum([float(answers)], config, mesh)[0]), 1)
            else:
                answers = answers_per_batch
            # on a mesh FSDP averages the gradients over its ranks: each rank's share scaled back to the global mean
            (loss_sum * ((mesh.size() if mesh is not None else 1) / answers)).backward()
            if config.ring:
                import torch.distributed as dist

                for parameter in model.parameters():
                    if parameter.grad is not None:
                        dist.all_reduce(parameter.grad)
            grad_norm = None  # a device tensor, read at log steps only: reading it every step would make the host
            # wait for the backward each step, and the GPU wait for the host's next batch
            if config.grad_clip is not None:
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            window_steps += 1
            window_tokens += config.batch_size * length
            done = step + 1
            if done % config.log_every == 0 or done == config.steps:
                loss_total, hits_total = all_reduce_sum([float(loss_sum.detach()), float(hits)], config, mesh)
                if on_cuda:
                    torch.cuda.synchronize()
                elapsed = time.perf_counter() - window_start
                record = {
                    "kind": "train", "step": done, "seq_len": length, "loss": loss_total / answers,
                    "accuracy": hits_total / answers, "lr": lr,
                    "grad_norm": None if grad_norm is None else _grad_norm(grad_norm),
                    "tokens_per_s": window_tokens / elapsed,
                }
                if on_cuda:
                    record["peak_memory_bytes"] = torch.cuda.max_memory_allocated(config.device)
                _log(record, history, log_path)
                bar.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record['accuracy']:.2f}")
                window_start, window_steps, window_tokens = time.perf_counter(), 0, 0
            if done % config.eval_every == 0 or done == config.steps:
                last_eval = _final_eval(runner, config, mesh) if done == config.steps else \
                    evaluate(runner, config, mesh=mesh)
                _log({"kind": "eval", "step": done, **last_eval}, history, log_path)
                window_start, window_steps, window_tokens = time.perf_counter(), 0, 0
            if done % config.checkpoint_every == 0 or done == end_step:
                save(done)
            bar.update(1)
    finally:
        bar.close()
    if not last_eval:
        last_eval = _final_eval(runner, config, mesh) if end_step == config.steps else \
            evaluate(runner, config, mesh=mesh)
    if out_path is not None and main_rank:
        summary = {"config": config.to_dict(), "steps_done": end_step, "final_eval": last_eval,
                   "chance_loss": task.chance_loss, "chance_accuracy": task.chance_accuracy}
        _atomic_write_text(json.dumps(summary, indent=1) + "\n", out_path / SUMMARY_NAME)
    return TrainResult(model=model, history=history, final_eval=last_eval, out_dir=out_path, notes=notes)
