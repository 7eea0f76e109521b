"""compare_orderings: one tidy table of every locality metric for orderings x configurations."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hilbert_lab.curves import grid_permutation
from hilbert_lab.curves.layouts import LAYOUTS, layout_permutation
from hilbert_lab.curves.orderings import GRID_ORDERINGS
from hilbert_lab.locality.cache import miss_curve
from hilbert_lab.locality.metrics import (
    STRETCH_MAX_TOKENS,
    blocks_touched_per_box,
    box_clustering_numbers,
    segment_compactness,
    step_distances,
    tile_density,
    worst_case_stretch,
)
from hilbert_lab.locality.traces import attention_trace, dilated_groups, grid_coordinates, window_groups

__all__ = ["GRID_ORDERINGS", "COLUMNS", "compare_orderings", "grid_rows", "dilated_rows"]

COLUMNS = ("family", "configuration", "ordering", "metric", "parameter", "value", "note")


def _row(family, configuration, ordering, metric, value, parameter=None, note=""):
    return {
        "family": family,
        "configuration": configuration,
        "ordering": ordering,
        "metric": metric,
        "parameter": parameter,
        "value": float(value),
        "note": note,
    }


def _trace_rows(family, configuration, ordering, trace, cache_lines) -> list[dict]:
    rows = [
        _row(family, configuration, ordering, "line_accesses", trace.lines.size),
        _row(family, configuration, ordering, "distinct_lines", np.unique(trace.lines).size),
        _row(family, configuration, ordering, "rows_needed", trace.rows_needed),
        _row(family, configuration, ordering, "rows_loaded", trace.rows_loaded),
    ]
    misses = miss_curve(trace.lines, cache_lines) if trace.lines.size else np.zeros(len(cache_lines))
    rows += [
        _row(family, configuration, ordering, "misses", miss, parameter=int(capacity))
        for capacity, miss in zip(cache_lines, misses)
    ]
    return rows


def grid_rows(
    shape: Sequence[int],
    ordering: str,
    *,
    box_sizes: Sequence[int] = (4, 8),
    segment_lengths: Sequence[int] = (64,),
    tile_size: int = 64,
    head_dim: int = 64,
    element_bytes: int = 2,
    line_bytes: int = 128,
    cache_lines: Sequence[int] = (64, 256, 1024),
    key_block: int | None = None,
) -> list[dict]:
    """Geometry metrics and window-attention trace metrics of one grid ordering (tidy rows).

    lines_per_box_mean is exact when the row size divides the line size or the line size divides the
    row size (head_dim * element_bytes vs line_bytes); otherwise rows are rounded to whole lines.
    """
    shape = tuple(int(side) for side in shape)
    shape_text = "x".join(map(str, shape))
    perm, _ = grid_permutation(shape, ordering)
    coords = grid_coordinates(shape, perm)
    family = f"grid{len(shape)}d"
    geometry = f"{shape_text}"
    steps = step_distances(coords)
    rows = [
        _row(family, geometry, ordering, "step_mean", steps.mean()),
        _row(family, geometry, ordering, "step_max", steps.max()),
    ]
    if coords.shape[0] <= STRETCH_MAX_TOKENS:
        rows.append(_row(family, geometry, ordering, "stretch_max", worst_case_stretch(coords)))
    for segment_length in segment_lengths:
        rows.append(_row(family, geometry, ordering, "compactness_aligned",
                         segment_compactness(shape, coords, segment_length), parameter=segment_length))
        rows.append(_row(family, geometry, ordering, "compactness_shifted",
                         segment_compactness(shape, coords, segment_length, shift=segment_length // 2),
                         parameter=segment_length))
    row_bytes = head_dim * element_bytes
    rows_per_line = max(1, line_bytes // row_bytes)
    lines_per_row = max(1, -(-row_bytes // line_bytes))
    for box in box_sizes:
        if box > min(shape):
            continue
        clusters = box_clustering_numbers(shape, coords, box)
        rows.append(_row(family, geometry, ordering, "clustering_mean", clusters.mean(), parameter=box))
        rows.append(_row(family, geometry, ordering, "clustering_max", clusters.max(), parameter=box))
        lines = blocks_touched_per_box(shape, coords, box, rows_per_line) * lines_per_row
        rows.append(_row(family, geometry, ordering, "lines_per_box_mean", lines.mean(), parameter=box,
                         note=f"{row_bytes} B rows, {line_bytes} B lines"))
        tiles = blocks_touched_per_box(shape, coords, box, tile_size)
        rows.append(_row(family, geometry, ordering, "tiles_per_box_mean", tiles.mean(), parameter=box,
                         note=f"tile {tile_size}"))
        mode = "gather" if key_block is None else f"block-sparse {key_block}"
        configuration = f"{shape_text}, window {box}, tile {tile_size}, {mode}, {row_bytes} B rows"
        trace = attention_trace(window_groups(shape, box), perm, tile_size=tile_size, key_block=key_block,
                                head_dim=head_dim, element_bytes=element_bytes, line_bytes=line_bytes)
        rows += _trace_rows(f"{family}_window", configuration, ordering, trace, cache_lines)
    return rows


def dilated_rows(
    seq_len: int,
    segment_length: int,
    dilation_rate: int,
    ordering: str,
    *,
    tile_size: int = 64,
    key_blocks: Sequence[int | None] = (None, 64),
    density_block_sizes: Sequence[int] = (64,),
    head_dim: int = 64,
    element_bytes: int = 2,
    line_bytes: int = 128,
    cache_lines: Sequence[int] = (64, 256, 1024),
) -> list[dict]:
    """Trace and tile-density metrics of one head of one dilated branch under a 1D layout."""
    groups = dilated_groups(seq_len, segment_length, dilation_rate)
    perm = layout_permutation(seq_len, segment_length, ordering, dilation_rate=dilation_rate)[0].numpy()
    base = f"N={seq_len}, w={segment_length}, r={dilation_rate}"
    rows = []
    for block_size in density_block_sizes:
        density = tile_density(groups, perm, block_size)
        rows.append(_row("dilated1d", base, ordering, "tile_nonempty_share", density["nonempty_share"],
                         parameter=block_size))
        rows.append(_row("dilated1d", base, ordering, "tile_mean_density", density["mean_density"],
                         parameter=block_size))
    row_bytes = head_dim * element_bytes
    for key_block in key_blocks:
        mode = "gather" if key_block is None else f"block-sparse {key_block}"
        configuration = f"{base}, tile {tile_size}, {mode}, {row_bytes} B rows"
        trace = attention_trace(groups, perm, tile_size=tile_size, key_block=key_block, head_dim=head_dim,
                                element_bytes=element_bytes, line_bytes=line_bytes)
        rows += _trace_rows("dilated1d_trace", configuration, ordering, trace, cache_lines)
    return rows


def compare_orderings(
    grid_shapes: Sequence[Sequence[int]] = ((32, 32), (8, 8, 8)),
    *,
    grid_orderings: Sequence[str] = GRID_ORDERINGS,
    box_sizes: Sequence[int] = (4, 8),
    segment_lengths: Sequence[int] = (64,),
    dilated_configs: Sequence[tuple[int, int, int]] = ((4096, 1024, 4),),
    layouts_1d: Sequence[str] = LAYOUTS,
    tile_size: int = 64,
    head_dim: int = 64,
    element_bytes: int = 2,
    line_bytes: int = 128,
    cache_lines: Sequence[int] = (64, 256, 1024),
    progress: bool = True,
):
    """Tidy pandas DataFrame (columns COLUMNS) of locality metrics for orderings x configurations.

    Grids: step, stretch, compactness, box clustering, lines/tiles per box and window-attention
    traces (window = box side; box sizes above a grid's smallest side are skipped). dilated_configs: (seq_len, segment_length, dilation_rate) triples;
    tile density and K/V traces per 1D layout. misses rows carry the LRU capacity in lines as
    `parameter`; `note` says what a row assumes (row and line bytes, tile size).
    """
    import pandas as pd
    from tqdm.auto import tqdm

    for ordering in grid_orderings:
        if ordering not in GRID_ORDERINGS:
            raise ValueError(f"grid_orderings must be drawn from {GRID_ORDERINGS}, got {ordering!r}")
    for ordering in layouts_1d:
        if ordering not in LAYOUTS:
            raise ValueError(f"layouts_1d must be drawn from {LAYOUTS}, got {ordering!r}")
    tasks = [("grid", tuple(shape), ordering) for shape in grid_shapes for ordering in grid_orderings]
    tasks += [("dilated", tuple(config), ordering) for config in dilated_configs for ordering in layouts_1d]
    common = dict(tile_size=tile_size, head_dim=head_dim, element_bytes=element_bytes, line_bytes=line_bytes,
                  cache_lines=tuple(cache_lines))
    rows: list[dict] = []
    for kind, config, ordering in tqdm(tasks, desc="compare_orderings", disable=not progress):
        if kind == "grid":
            rows += grid_rows(config, ordering, box_sizes=box_sizes, segment_lengths=segment_lengths, **common)
        else:
            rows += dilated_rows(*config, ordering, **common)
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame["parameter"] = frame["parameter"].astype("Int64")
    return frame
