"""Dilated attention: pattern, plan, executors, the one attention function, engine, modules, the decoding caches
(growing and static), selection."""
from __future__ import annotations

from hilbert_lab.attention.engine import dilated_attention, execute_plan
from hilbert_lab.attention.executors import (
    BACKENDS, EXECUTORS, BackendUnavailableError, Capabilities, Executor, available_backends, get_executor,
    unavailable_reason,
)
from hilbert_lab.attention.grid import deserialize_grid, serialize_grid
from hilbert_lab.attention.kv_cache import DilatedKVCache
from hilbert_lab.attention.merge import merge_lse
from hilbert_lab.attention.modules import DilatedAttention, MultiheadDilatedAttention
from hilbert_lab.attention.pattern import MODES, DilatedPattern, Group
from hilbert_lab.attention.plan import Block, Plan, build_plan, cached_plan, is_selected
from hilbert_lab.attention.reference import reference_attention
from hilbert_lab.attention.selection import get_gpu_info, recommended_dtype, select_backend
from hilbert_lab.attention.static_cache import DilatedStaticCache
from hilbert_lab.attention.serialized import SerializedDilatedAttention, permute_tokens, serialized_attention
from hilbert_lab.attention.validation import validate_attention_inputs

__all__ = [
    "BACKENDS", "EXECUTORS", "BackendUnavailableError", "Block", "Capabilities", "DilatedAttention", "DilatedKVCache",
    "DilatedPattern", "DilatedStaticCache",
    "Executor", "Group", "MODES", "MultiheadDilatedAttention", "Plan", "SerializedDilatedAttention",
    "available_backends", "build_plan", "cached_plan", "deserialize_grid", "dilated_attention", "execute_plan",
    "get_executor", "get_gpu_info", "is_selected", "merge_lse", "permute_tokens", "recommended_dtype",
    "reference_attention", "select_backend", "serialize_grid", "serialized_attention", "unavailable_reason",
    "validate_attention_inputs",
]
