"""Training of a LongNetLM on the synthetic retrieval task, one name space for its public names:
configuration (.config), checkpoints and logs (.checkpoint), batches and losses (.batches), the loop (.loop) and the `train`
command (.cli)."""
from __future__ import annotations

from .checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    CHECKSUM_KEY,
    LOCK_NAME,
    LOG_NAME,
    SUMMARY_NAME,
    RunFolderError,
    atomic_save,
    check_run_folder,
    config_differences,
    content_digest,
    load_checkpoint,
    read_log,
    read_training_report,
    save_checkpoint,
)
from .cli import config_from_args, main, register_cli, summary_lines
from .config import (
    AUTOCAST_DTYPES, DTYPES, FIELD_RULES, OPTIMIZERS, PRESETS, RUN_CONTROL_FIELDS, TrainConfig, check_field,
    parse_curriculum,
)
from .batches import answer_loss
from .loop import TrainResult, build_model, evaluate, learning_rate, train

__all__ = [
    "AUTOCAST_DTYPES", "CHECKPOINT_FORMAT", "CHECKPOINT_NAME", "CHECKSUM_KEY", "DTYPES", "FIELD_RULES", "LOCK_NAME",
    "LOG_NAME", "OPTIMIZERS", "PRESETS", "RUN_CONTROL_FIELDS", "SUMMARY_NAME", "RunFolderError", "TrainConfig",
    "TrainResult", "answer_loss", "atomic_save", "build_model", "check_field", "check_run_folder", "config_differences",
    "config_from_args", "content_digest", "evaluate", "learning_rate", "load_checkpoint", "main", "parse_curriculum",
    "read_log", "read_training_report", "register_cli", "save_checkpoint", "summary_lines", "train",
]
