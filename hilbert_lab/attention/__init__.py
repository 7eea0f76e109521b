"""Dilated attention: pattern, float64 oracle, LSE merge, block backends, engine, modules, selection."""
from __future__ import annotations

from hilbert_lab.attention.backends import BACKENDS, BackendUnavailableError, available_backends, get_backend
from hilbert_lab.attention.engine import dilated_attention, layout_permutation
from hilbert_lab.attention.grid import deserialize_grid, serialize_grid
from hilbert_lab.attention.merge import merge_lse
from hilbert_lab.attention.modules import DilatedAttention, MultiheadDilatedAttention
from hilbert_lab.attention.pattern import MODES, DilatedPattern, Group
from hilbert_lab.attention.reference import reference_attention
from hilbert_lab.attention.serialized import SerializedDilatedAttention, permute_tokens, serialized_attention
from hilbert_lab.attention.selection import get_gpu_info, recommended_dtype, select_backend

__all__ = [
    "BACKENDS", "BackendUnavailableError", "DilatedAttention", "DilatedPattern", "Group", "MODES",
    "MultiheadDilatedAttention", "SerializedDilatedAttention", "available_backends", "deserialize_grid",
    "dilated_attention", "get_backend", "get_gpu_info", "layout_permutation", "merge_lse", "permute_tokens",
    "recommended_dtype", "reference_attention", "select_backend", "serialize_grid", "serialized_attention",
]
