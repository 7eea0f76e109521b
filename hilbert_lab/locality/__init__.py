"""Cache-locality and tile-density analysis of token orderings: LRU simulators, attention traces, metrics."""
from __future__ import annotations

from hilbert_lab.locality.cache import (
    CacheLevel,
    lru_miss_mask,
    lru_misses,
    miss_curve,
    reuse_distance_histogram,
    reuse_distances,
    simulate_hierarchy,
)
from hilbert_lab.locality.claims import CLAIM_COLUMNS, evaluate_claims
from hilbert_lab.locality.compare import COLUMNS, GRID_ORDERINGS, compare_orderings
from hilbert_lab.locality.hardware import CACHE_PARAMETERS, cache_levels, cache_table
from hilbert_lab.locality.metrics import (
    blocks_touched_per_box,
    box_clustering_numbers,
    mask_tile_density,
    segment_compactness,
    step_distances,
    tile_density,
    worst_case_stretch,
)
from hilbert_lab.locality.neighbours import clustered_points, knn, knn_offsets, uniform_points
from hilbert_lab.locality.serialization import serialization_metrics, serialization_table
from hilbert_lab.locality.traces import (
    AttentionGroups,
    AttentionTrace,
    attention_trace,
    dilated_attention_trace,
    dilated_groups,
    grid_coordinates,
    window_attention_trace,
    window_groups,
)

__all__ = [
    "CACHE_PARAMETERS", "CLAIM_COLUMNS", "COLUMNS", "GRID_ORDERINGS",
    "AttentionGroups", "AttentionTrace", "CacheLevel",
    "attention_trace", "blocks_touched_per_box", "box_clustering_numbers", "cache_levels", "cache_table",
    "compare_orderings", "dilated_attention_trace", "dilated_groups", "evaluate_claims", "grid_coordinates",
    "lru_miss_mask", "lru_misses", "mask_tile_density", "miss_curve", "reuse_distance_histogram",
    "reuse_distances", "segment_compactness", "serialization_metrics", "serialization_table", "knn", "knn_offsets",
    "clustered_points", "uniform_points", "simulate_hierarchy", "step_distances",
    "tile_density", "window_attention_trace", "window_groups", "worst_case_stretch",
]
