"""Training checkpoints and logs: atomic writes, checkpoints with a checksum of their content and a
configuration check on load, and the readers of a run's log.jsonl and of a training report JSON."""
from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import torch

from hilbert_lab.io import atomic_write

from .config import RUN_CONTROL_FIELDS, TrainConfig
from .parallel import load_sharded

CHECKPOINT_NAME = "checkpoint.pt"
LOG_NAME = "log.jsonl"
SUMMARY_NAME = "summary.json"
LOCK_NAME = ".train.lock"  # held (flock) by the run writing the folder
# 2: the checkpoint holds "sha256", the digest of the rest of its content (content_digest), checked on
# every load. Format 1 had no checksum and is refused by name (its content cannot be verified).
CHECKPOINT_FORMAT = 2
CHECKSUM_KEY = "sha256"
# the keys every checkpoint holds (generate, init_from), and those a resume needs besides
MODEL_KEYS = ("config", "model")
RESUME_KEYS = ("step", "optimizer", "history", "rng")


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save ``obj`` to ``path`` atomically (hilbert_lab.io.atomic_write): ``path`` holds either the
    previous complete file or the new complete file, never a partial one."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write(path, buffer.getvalue())


def _atomic_write_text(text: str, path: Path) -> None:
    atomic_write(path, text)


def _feed(digest: "hashlib._Hash", value: Any) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(value, dict):
        digest.update(f"D{len(value)};".encode())
        for key, item in value.items():
            _feed(digest, key)
            _feed(digest, item)
    elif isinstance(value, (list, tuple)):
        digest.update(f"L{len(value)};".encode())
        for item in value:
            _feed(digest, item)
    elif value is None or isinstance(value, (bool, int, float, str, bytes)):
        digest.update(repr((type(value).__name__, value)).encode() + b";")
    else:
        raise ValueError(f"a checkpoint holds tensors, dicts, lists and plain values, got {type(value).__name__}")


def content_digest(state: dict[str, Any]) -> str:
    """sha256 (hex) of a checkpoint's content: every tensor's dtype, shape and bytes, every key and plain
    value, in order; the same before torch.save and after torch.load."""
    digest = hashlib.sha256()
    _feed(digest, state)
    return digest.hexdigest()


def save_checkpoint(state: dict[str, Any], path: str | os.PathLike) -> None:
    """atomic_save of ``state`` with its content_digest stored under CHECKSUM_KEY."""
    atomic_save({**state, CHECKSUM_KEY: content_digest(state)}, path)


class RunFolderError(ValueError):
    """A run folder that cannot be used as asked; ``cli`` says the same in the train command's words."""

    def __init__(self, message: str, *, cli: str) -> None:
        super().__init__(message)
        self.cli = cli


def check_run_folder(out_dir: str | os.PathLike, *, resume: bool) -> None:
    """RunFolderError unless ``out_dir`` can take a run: with ``resume`` it must hold a checkpoint;
    without, it must hold no run (no checkpoint, log or summary: results are never overwritten)."""
    path = str(out_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise RunFolderError(f"out_dir {path!r} is a file; give a folder", cli=f"--out {path!r} is a file; give a folder")
    found = [name for name in (CHECKPOINT_NAME, LOG_NAME, SUMMARY_NAME) if os.path.exists(os.path.join(path, name))]
    if resume:
        if CHECKPOINT_NAME not in found:
            where = os.path.join(path, CHECKPOINT_NAME)
            raise RunFolderError(f"resume=True but there is no checkpoint at {where!r}",
                                 cli=f"--resume but there is no checkpoint at {where!r} (without --resume a new run "
                                     "starts in an empty folder)")
        return
    if not found:
        return
    what = ("a finished run" if SUMMARY_NAME in found else "an unfinished run") + f" ({', '.join(found)})"
    if CHECKPOINT_NAME in found:
        api, cli = "pass resume=True to continue it", "pass --resume to continue it"
    else:
        api = cli = "it has no checkpoint to continue from"
    rule = "and results are never overwritten"
    raise RunFolderError(f"out_dir {path!r} already holds {what} {rule}; {api}, or choose another out_dir",
                         cli=f"--out {path!r} already holds {what} {rule}; {cli}, or choose another --out")


def log_tail_note(log_path: str | os.PathLike, step: int, kept: int) -> str | None:
    """What resuming at ``step`` drops from the log (records written after the checkpoint, a torn last
    line), in words; None when it drops nothing. ``kept``: the records the checkpoint holds."""
    try:
        lines = [line for line in Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines()
                 if line.strip()]
    except OSError:
        return None
    torn = 0
    for line in lines:
        try:
            json.loads(line)
        except json.JSONDecodeError:
            torn += 1
    extra = max(0, len(lines) - torn - kept)
    if not extra and not torn:
        return None
    parts = ([f"{extra} record(s) written after the checkpoint"] if extra else []) + (
        [f"{torn} torn line(s)"] if torn else [])
    return f"resumed at step {step} (the checkpoint); dropped from {LOG_NAME}: {' and '.join(parts)}"


def config_differences(saved: dict[str, Any], requested: dict[str, Any]) -> list[str]:
    """'field: checkpoint X, requested Y' for every loss-curve-defining field that differs."""
    defaults = TrainConfig().to_dict()  # a field newer than the checkpoint reads as its default there
    differences = []
    for name in sorted(set(saved) | set(requested)):
        if name in RUN_CONTROL_FIELDS:
            continue
        before, after = saved.get(name, defaults.get(name)), requested.get(name, defaults.get(name))
        if before != after:
            differences.append(f"{name}: checkpoint {before!r}, requested {after!r}")
    return differences


_KEY_CHECKS = {"config": lambda value: isinstance(value, dict), "model": lambda value: isinstance(value, dict),
               "step": lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= 0,
               "optimizer": lambda value: isinstance(value, dict), "history": lambda value: isinstance(value, list),
               "rng": lambda value: isinstance(value, dict) and isinstance(value.get("torch"), torch.Tensor)}


def _missing(state: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    """The keys of ``keys`` that ``state`` lacks or holds with a value of another kind."""
    return [key for key in keys if not _KEY_CHECKS[key](state.get(key))]


def load_checkpoint(path: str | os.PathLike, config: TrainConfig | None = None) -> dict[str, Any]:
    """Load a checkpoint (format CHECKPOINT_FORMAT) and check its content against the checksum stored in it
    (ValueError naming the file when they differ: a corrupted file is never used) and that it holds a
    configuration and model weights; with ``config`` (a resume), also the step, optimizer, history and RNG
    state, and ValueError listing every field that differs from ``config``. A checkpoint of an older format
    is refused by name."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"checkpoint must be an existing file, got {str(path)!r}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated, foreign or corrupted file
        detail = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        raise ValueError(f"checkpoint {str(path)!r} cannot be read ({detail})") from None
    if isinstance(state, dict) and state.get("format") == 1:
        raise ValueError(f"checkpoint {str(path)!r}: format 1 is no longer supported (it has no checksum, so "
                         f"its content cannot be verified); train a new run to get a format {CHECKPOINT_FORMAT} "
                         "checkpoint")
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {str(path)!r} is not a hilbert_lab training checkpoint (format {CHECKPOINT_FORMAT})")
    stored = state.pop(CHECKSUM_KEY, None)
    try:
        actual = content_digest(state)
    except ValueError:
        actual = None
    if stored != actual:
        raise ValueError(f"checkpoint {str(path)!r} is corrupted: its content does not match the sha256 stored "
                         "in it, so it is not used; resume from a copy, or start a new run in another folder")
    sharded = state.get("sharded")  # a run on a DeviceMesh: its weights and optimizer state in that folder
    if sharded is not None and not (isinstance(sharded, str) and (path.parent / sharded).is_dir()):
        raise ValueError(f"checkpoint {str(path)!r} names its sharded state {sharded!r}, which is not a folder beside "
                         "it; copy the run folder whole")
    needed = tuple(key for key in MODEL_KEYS + (RESUME_KEYS if config is not None else ())
                   if sharded is None or key not in ("model", "optimizer"))
    missing = _missing(state, needed)
    if missing:
        raise ValueError(f"checkpoint {str(path)!r} lacks {', '.join(missing)} (a {'resumable ' if config else ''}"
                         f"training checkpoint holds {', '.join(MODEL_KEYS + (RESUME_KEYS if config else ()))}); "
                         "it was not written by `hilbert-lab train`")
    if config is not None:
        differences = config_differences(state["config"], config.to_dict())
        if differences:
            raise ValueError(
                f"cannot resume from {str(path)!r}: it was written with a different configuration ("
                + "; ".join(differences) + "). Use the same configuration or another out_dir."
            )
    return state


def checkpoint_config(state: dict[str, Any], path: str | os.PathLike, **overrides: Any) -> TrainConfig:
    """The TrainConfig stored in a loaded checkpoint (with ``overrides``); ValueError naming the file when
    it is not a valid configuration."""
    try:
        return TrainConfig.from_dict({**state["config"], **overrides})
    except ValueError as error:
        raise ValueError(f"checkpoint {str(path)!r} holds an invalid configuration: {error}") from None


def load_weights(model: torch.nn.Module, state: dict[str, Any], path: str | os.PathLike, *,
                 what: str = "checkpoint", fit: str = "the configuration stored in it") -> None:
    """Load a loaded checkpoint's model weights into ``model``; ValueError naming ``what`` and the file when
    they do not fit the model (other parameter names or shapes than the configuration ``fit`` gives)."""
    try:
        if state.get("sharded"):
            load_sharded(str(Path(path).parent / state["sharded"]), model)
        else:
            model.load_state_dict(state["model"])
    except (RuntimeError, TypeError, KeyError) as error:
        detail = " ".join(str(error).split())[:300]
        raise ValueError(f"{what} {str(path)!r}: its model weights do not fit {fit} ({detail})") from None


def read_log(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of ``run_dir/log.jsonl`` (dicts with kind "train" or "eval", step, loss, accuracy...)."""
    path = Path(run_dir) / LOG_NAME
    if not path.is_file():
        raise ValueError(f"run_dir must hold a {LOG_NAME} written by train(), got {str(run_dir)!r}")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise ValueError(f"{str(path)!r} line {number} is torn (a write cut short); continue the run with "
                             "resume=True (--resume), which rewrites the log from its checkpoint") from None
    return records


def read_training_report(path: str | os.PathLike) -> dict[str, Any]:
    """A training report JSON (benchmarks/train_gpu.py --out): command, config, training.history, ...

    ``training.history`` holds the records of read_log(); ValueError naming ``path`` when the file is
    missing, not JSON, or has no such list of records (each a dict with kind and step).
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"path must name a training report JSON file, got {str(path)!r}")
    try:
        report = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"training report {str(path)!r} is not JSON: {error}") from None
    training = report.get("training") if isinstance(report, dict) else None
    history = training.get("history") if isinstance(training, dict) else None
    if not isinstance(history, list) or not all(
        isinstance(record, dict) and "kind" in record and "step" in record for record in history
    ):
        raise ValueError(
            f"training report {str(path)!r} has no training.history (a list of log records with kind and step)"
        )
    return report
