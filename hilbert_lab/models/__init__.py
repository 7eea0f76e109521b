"""LongNet models (blocks, encoder, causal LM), the synthetic retrieval task and the training loop."""
from __future__ import annotations

from .blocks import DilatedTransformerBlock, LongNetEncoder, LongNetLM
from .ring import use_local_attention, use_ring_attention
from .rotary import apply_rotary
from .spatial import (
    MajorityTask,
    SpatialClassifier,
    SpatialRunConfig,
    compare_trained,
    make_spatial_batch,
    mean_interval,
    train_spatial,
)
from .tasks import IGNORE_INDEX, RetrievalTask, make_batch
from .train import TrainConfig, TrainResult, evaluate, load_checkpoint, read_log, train

__all__ = [
    "DilatedTransformerBlock", "LongNetEncoder", "LongNetLM", "apply_rotary",
    "IGNORE_INDEX", "RetrievalTask", "make_batch", "TrainConfig", "TrainResult", "evaluate",
    "load_checkpoint", "read_log", "train", "use_local_attention", "use_ring_attention",
    "MajorityTask", "SpatialClassifier", "SpatialRunConfig", "compare_trained", "make_spatial_batch", "mean_interval",
    "train_spatial",
]
