"""Locality and attention-pattern explorers and their figure builders, driven headlessly."""
from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("plotly", reason="plotly (notebooks extra) draws the figures")
pytest.importorskip("ipywidgets", reason="ipywidgets (notebooks extra) builds the panels")

from hilbert_lab.attention.pattern import DilatedPattern  # noqa: E402
from hilbert_lab.viz import attention as attention_viz  # noqa: E402
from hilbert_lab.viz.attention_explorer import attention_explorer, parse_int_list  # noqa: E402
from hilbert_lab.viz.locality_explorer import capacity_points, locality_explorer, locality_study  # noqa: E402


def _z(figure, index=0) -> np.ndarray:
    return np.asarray(figure.data[index].z)


# --- attention pattern figures -------------------------------------------------------------------

def test_branch_masks_union_is_the_dense_mask_and_counts_are_multiplicity():
    pattern = DilatedPattern.create([4, 8], [1, 2], mode="longnet", causal=True)
    masks = attention_viz.branch_masks(pattern, 16, 2)
    assert np.array_equal(masks.any(axis=0), pattern.dense_mask(16, 2).numpy())
    assert np.array_equal(masks.sum(axis=0), pattern.multiplicity(16, 2).numpy())
    # branch 0 (w=4, r=1) of head 0: block diagonal 4x4 lower triangles, hand-checked corners
    assert masks[0, 0, 3, 0] and not masks[0, 0, 4, 3] and not masks[0, 0, 0, 1]


def test_token_coverage_finds_skipped_queries():
    # one branch, dilation 2, longnet with 1 head: only offset 0 is used, so odd tokens get no keys
    pattern = DilatedPattern.create([8], [2])
    coverage = attention_viz.token_coverage(pattern, 16, 1)
    assert coverage["covered_share"].tolist() == [0.5]
    assert coverage["keys_per_query"][0, ::2].tolist() == [4] * 8 and coverage["keys_per_query"][0, 1::2].sum() == 0
    # with 2 heads both offsets are used and every token is a query in some head
    both = attention_viz.token_coverage(pattern, 16, 2)
    assert both["covered_share"].tolist() == [0.5, 0.5]
    assert ((both["keys_per_query"] > 0).any(axis=0)).all()


def test_tile_density_identity_block_diagonal_is_exact():
    pattern = DilatedPattern.create([8], [1])
    table = attention_viz.tile_density_table(pattern, 32, 1, 8, ["identity"])
    row = table.iloc[0]
    # 4 diagonal 8x8 blocks out of 16, each completely full
    assert row["nonempty_share"] == 0.25 and row["mean_density"] == 1.0 and row["nonempty_blocks"] == 4


def test_tile_density_dilation_major_packs_dilated_groups():
    pattern = DilatedPattern.create([16], [4])
    table = attention_viz.tile_density_table(pattern, 32, 1, 4, ["identity", "dilation_major"])
    by = table.set_index("ordering")
    assert by.loc["dilation_major", "nonempty_share"] < by.loc["identity", "nonempty_share"]
    assert by.loc["dilation_major", "mean_density"] == 1.0


def test_figures_carry_the_masks():
    pattern = DilatedPattern.create([4, 8], [1, 2], mode="head_groups")
    heads = attention_viz.head_mask_figure(pattern, 8, 2)
    assert np.array_equal(_z(heads, 1), pattern.dense_mask(8, 2)[1].numpy().astype(int))
    multiplicity = attention_viz.multiplicity_figure(pattern, 8, 2, head=0)
    assert np.array_equal(_z(multiplicity), pattern.multiplicity(8, 2)[0].numpy())
    with pytest.raises(ValueError, match="seq_len"):
        attention_viz.head_mask_figure(pattern, 4096, 2)
    with pytest.raises(ValueError, match="head"):
        attention_viz.branch_mask_figure(pattern, 8, 2, head=5)


def test_parse_int_list():
    assert parse_int_list("16, 32;64", "segment_lengths") == [16, 32, 64]
    for bad in ("", "a,b", "4,-1"):
        with pytest.raises(ValueError, match="segment_lengths"):
            parse_int_list(bad, "segment_lengths")


def test_attention_explorer_callbacks():
    panel = attention_explorer(segment_lengths="8,16", dilation_rates="1,2", seq_len=32, num_heads=2)
    before = _z(panel.figures["heads"]).copy()
    panel.controls["dilation_rates"].value = "1,4"
    after = _z(panel.figures["heads"])
    expected = DilatedPattern.create([8, 16], [1, 4]).dense_mask(32, 2)[0].numpy().astype(int)
    assert not np.array_equal(before, after) and np.array_equal(after, expected)
    panel.controls["causal"].value = True
    assert np.triu(_z(panel.figures["heads"]), k=1).sum() == 0
    # invalid pattern: a visible message, figures left as they were, no exception
    shown = _z(panel.figures["heads"]).copy()
    panel.controls["dilation_rates"].value = "1,40"
    assert "dilation" in panel.message.value and np.array_equal(_z(panel.figures["heads"]), shown)
    panel.controls["dilation_rates"].value = "1,2"
    panel.controls["seq_len"].value = 100_000
    assert "clamped to 256" in panel.message.value
    assert _z(panel.figures["heads"]).shape == (256, 256)


def test_attention_explorer_reference_check():
    pytest.importorskip("hilbert_lab.attention.engine", reason="the engine has not landed")
    panel = attention_explorer(segment_lengths="4,8", dilation_rates="1,2", seq_len=16, num_heads=2)
    panel.state["compare"]()
    assert "reference_check" in panel.state, panel.message.value
    result = panel.state["reference_check"]
    assert result["max_abs_out_error"] < 1e-10 and result["max_abs_lse_error"] < 1e-10 and result["empty_rows_agree"]
    assert "matches" in panel.state["check_html"].value


# --- locality explorer ---------------------------------------------------------------------------

def test_capacity_points():
    assert capacity_points(64) == [4, 8, 16, 32, 64]
    assert capacity_points(100) == [4, 8, 16, 32, 64, 100]
    with pytest.raises(ValueError, match="max_lines"):
        capacity_points(2)


def test_locality_study_index_grids_are_the_layouts():
    from hilbert_lab.curves import grid_permutation

    study = locality_study("grid", size=8, box_or_segment=3, max_cache_lines=64)
    assert set(study["index_grids"]) == {"rowmajor", "snake", "hilbert", "morton"}
    perm, inverse = grid_permutation((8, 8), "hilbert")
    assert np.array_equal(study["index_grids"]["hilbert"].reshape(-1), inverse)
    assert np.array_equal(study["index_grids"]["rowmajor"], np.arange(64).reshape(8, 8))
    for misses in study["misses"].values():  # LRU misses never grow with capacity
        assert all(a >= b for a, b in zip(misses, misses[1:]))
    # at the largest capacity only compulsory misses remain: same for every ordering (same data)
    assert len({misses[-1] for misses in study["misses"].values()}) == 1


def test_locality_explorer_callbacks():
    panel = locality_explorer(kind="grid", size=16, box_or_segment=3, max_cache_lines=64)
    misses_before = [list(trace.y) for trace in panel.figures["misses"].data]
    assert [trace.name for trace in panel.figures["misses"].data] == ["rowmajor", "snake", "hilbert", "morton"]
    panel.controls["box_or_segment"].value = 5
    assert [list(trace.y) for trace in panel.figures["misses"].data] != misses_before
    panel.controls["size"].value = 1000
    assert "clamped to 64" in panel.message.value
    panel.controls["kind"].value = "sequence"
    assert [trace.name for trace in panel.figures["misses"].data][0] == "identity"
    panel.controls["box_or_segment"].value = 300  # does not divide 1024
    assert "segment must divide" in panel.message.value
    assert panel.state["study"]["index_grids"]["identity"].shape[1] == 256
