"""Training of a LongNetLM on the synthetic retrieval task, one name space for its public names:
configuration (.config), checkpoints and logs (.checkpoint), the loop (.loop) and the `train`
command (.cli)."""
from __future__ import annotations

from .checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    LOG_NAME,
    SUMMARY_NAME,
    atomic_save,
    config_differences,
    load_checkpoint,
    read_log,
    read_training_report,
)
from .cli import config_from_args, main, register_cli
from .config import AUTOCAST_DTYPES, DTYPES, OPTIMIZERS, PRESETS, RUN_CONTROL_FIELDS, TrainConfig, parse_curriculum
from .loop import TrainResult, answer_loss, build_model, evaluate, learning_rate, train

__all__ = [
    "AUTOCAST_DTYPES", "CHECKPOINT_FORMAT", "CHECKPOINT_NAME", "DTYPES", "LOG_NAME", "OPTIMIZERS", "PRESETS",
    "RUN_CONTROL_FIELDS", "SUMMARY_NAME", "TrainConfig", "TrainResult", "answer_loss", "atomic_save",
    "build_model", "config_differences", "config_from_args", "evaluate", "learning_rate", "load_checkpoint",
    "main", "parse_curriculum", "read_log", "read_training_report", "register_cli", "train",
]
