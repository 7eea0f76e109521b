"""Locality and attention-pattern explorers and their figure builders, driven headlessly."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

pytest.importorskip("plotly", reason="plotly (notebooks extra) draws the figures")
pytest.importorskip("ipywidgets", reason="ipywidgets (notebooks extra) builds the panels")

from hilbert_lab.attention.pattern import DilatedPattern  # noqa: E402
from hilbert_lab.viz import attention as attention_viz  # noqa: E402
from hilbert_lab.viz.attention_explorer import attention_explorer, parse_int_list  # noqa: E402
from hilbert_lab.viz.locality_explorer import (  # noqa: E402
    CACHE_LINE_CHOICES,
    capacity_points,
    locality_explorer,
    locality_study,
)


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


def test_mask_figures_name_query_and_key_axes():
    pattern = DilatedPattern.create([4, 8], [1, 2])
    for figure in (attention_viz.branch_mask_figure(pattern, 16, 2), attention_viz.head_mask_figure(pattern, 16, 6),
                   attention_viz.multiplicity_figure(pattern, 16, 2)):
        for index in range(len(figure.data)):  # 4 panels a row; the query title on the first of each row
            suffix = "" if index == 0 else str(index + 1)
            assert "key" in figure.layout[f"xaxis{suffix}"].title.text
            assert ("query" in (figure.layout[f"yaxis{suffix}"].title.text or "")) == (index % 4 == 0)


def test_attention_explorer_defaults_show_orderings_differ():
    panel = attention_explorer()
    table = panel.state["tile_table"]
    shares = table[table["head"] >= 0].groupby("ordering")["nonempty_share"].mean()
    assert set(shares.index) == {"identity", "hilbert", "morton", "snake", "dilation_major"}
    assert shares["hilbert"] == shares["morton"] < 0.5 < shares["identity"] == shares["dilation_major"] == 1.0
    assert panel.state["pattern"].segment_lengths == (16, 64)
    coverage = attention_viz.token_coverage(panel.state["pattern"], 64, 2)
    assert coverage["covered_share"].tolist() == [1.0, 1.0]  # every query has keys at the defaults
    assert "same for every ordering" not in panel.figures["tiles"].layout.title.text
    bars = panel.figures["tiles"].data[0]
    assert list(bars.y) == [shares[ordering] for ordering in bars.x]
    table_widget = panel.widget.children[-1]  # the numbers under the bars follow the controls

    def shown_shares() -> list[float]:  # first column of the table under the bars
        rows = re.findall(r"<th>(\w+)</th>\s*<td>([0-9.]+)</td>", table_widget.value)
        return [float(value) for _ordering, value in rows]

    assert shown_shares() == pytest.approx([shares[ordering] for ordering in bars.x], abs=1e-4)
    panel.controls["causal"].value = True
    table = panel.state["tile_table"]
    causal = table[table["head"] >= 0].groupby("ordering", sort=False)["nonempty_share"].mean()
    assert causal["identity"] < 1.0
    assert shown_shares() == pytest.approx(causal.tolist(), abs=1e-4)


def test_tile_figure_says_when_every_ordering_is_the_same():
    # shortest branch w=8, r=1 and 8x8 tiles: every layout permutes tokens inside one tile
    pattern = DilatedPattern.create([8, 16], [1, 2])
    table = attention_viz.tile_density_table(pattern, 32, 2, 8, ["identity", "hilbert", "dilation_major"])
    figure = attention_viz.tile_density_figure(table, 8)
    assert table.groupby("ordering")["nonempty_share"].mean().nunique() == 1
    assert "same for every ordering" in figure.layout.title.text
    assert "better" in figure.data[0].name and "better" in figure.data[1].name


def test_explorer_labels_are_not_cut_off():
    for panel in (attention_explorer(seq_len=16, segment_lengths="4,8"), locality_explorer(size=8)):
        for name, control in panel.controls.items():
            assert control.style.description_width == "initial", name
    kind = locality_explorer(size=8).controls["kind"]
    assert kind.style.button_width == "auto"  # "1D sequence, dilated attention" in full


def test_attention_explorer_reference_check():
    pytest.importorskip("hilbert_lab.attention.engine", reason="the engine has not landed")
    panel = attention_explorer(segment_lengths="4,8", dilation_rates="1,2", seq_len=16, num_heads=2)
    panel.state["compare"]()
    assert "reference_check" in panel.state, panel.message.value
    result = panel.state["reference_check"]
    assert result["max_abs_out_error"] < 1e-10 and result["max_abs_lse_error"] < 1e-10 and result["empty_rows_agree"]
    assert "matches" in panel.state["check_html"].value


def test_reference_check_reads_as_a_sentence():
    from hilbert_lab.viz.attention_explorer import reference_check_html

    result = {"backend": "auto", "max_abs_out_error": 8.881784197001252e-16, "max_abs_lse_error": 4.4e-16,
              "empty_rows_agree": True}
    text = reference_check_html(result)
    assert text.startswith("<b>matches the float64 reference</b>") and "largest output error 8.9e-16" in text
    assert "max_abs" not in text and "=" not in text and "queries with no keys are the same" in text
    assert "DIFFERS FROM" in reference_check_html({**result, "max_abs_out_error": 1e-3})
    assert "queries with no keys differ" in reference_check_html({**result, "empty_rows_agree": False})


def test_an_empty_branch_panel_says_why():
    from hilbert_lab.viz.attention import branch_mask_figure

    pattern = DilatedPattern.create([16, 64], [1, 4], mode="head_groups")
    figure = branch_mask_figure(pattern, 64, 2, head=0)  # head_groups: branch 1 runs on head 1 only
    notes = [note for note in figure.layout.annotations if "empty" in note.text]
    assert len(notes) == 1 and notes[0].xref == "x2 domain"
    assert "head 0 does not run this branch" in notes[0].text.replace("<br>", " ")
    assert "head 1 of 2" in notes[0].text.replace("<br>", " ")
    longnet = DilatedPattern.create([16, 64], [1, 4])
    assert not [note for note in branch_mask_figure(longnet, 64, 2, head=0).layout.annotations if "empty" in note.text]


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
    assert [trace.name for trace in panel.figures["misses"].data] == ["row-major", "snake", "Hilbert", "Morton"]
    panel.controls["box_or_segment"].value = 5
    assert [list(trace.y) for trace in panel.figures["misses"].data] != misses_before
    panel.controls["size"].value = 1000
    assert "clamped to 64" in panel.message.value
    panel.controls["kind"].value = "sequence"
    assert [trace.name for trace in panel.figures["misses"].data][0] == "identity"
    panel.controls["box_or_segment"].value = 300  # does not divide 1024
    assert "segment must divide" in panel.message.value
    assert panel.state["study"]["index_grids"]["identity"].shape[1] == 256


def test_locality_heatmaps_share_one_x_title_and_the_miss_axis_ticks_at_the_capacities():
    panel = locality_explorer(kind="sequence", size=256, box_or_segment=64, max_cache_lines=256)
    heatmaps = panel.figures["heatmaps"]
    assert len(heatmaps.data) >= 5 and not any(axis.title.text for axis in heatmaps.select_xaxes())
    shared = [note.text for note in heatmaps.layout.annotations if "position in segment (tokens)" in note.text]
    assert shared == ["position in segment (tokens), one panel per ordering"]  # one title for the row of panels
    assert ("identity, hilbert, morton, snake and dilation_major have the same misses at every capacity"
            in panel.widget.children[-1].value)  # 256 lines hold every row: only compulsory misses
    axis = panel.figures["misses"].layout.xaxis
    assert axis.type == "log" and list(axis.tickvals) == [4, 8, 16, 32, 64, 128, 256]
    assert list(axis.ticktext) == ["4", "8", "16", "32", "64", "128", "256"]


def test_log_axis_at_a_sweep_labels_its_values():
    from hilbert_lab.viz.style import log_axis_at
    import plotly.graph_objects as go

    figure = log_axis_at(go.Figure(go.Scatter(x=[4, 8, 16, 32], y=[1, 2, 3, 4])), "x", [4, 8, 16, 32])
    assert figure.layout.xaxis.type == "log" and list(figure.layout.xaxis.tickvals) == [4, 8, 16, 32]
    many = log_axis_at(go.Figure(), "y", [2 ** power for power in range(2, 15)])
    assert list(many.layout.yaxis.tickvals) == [4, 16, 64, 256, 1024, 4096, 16384]
    assert list(many.layout.yaxis.ticktext) == ["4", "16", "64", "256", "1.02K", "4.1K", "16.4K"]


def test_locality_dilation_only_active_for_sequences():
    panel = locality_explorer(kind="grid", size=8, box_or_segment=2, max_cache_lines=16)
    assert panel.controls["dilation_rate"].disabled
    panel.controls["kind"].value = "sequence"
    assert not panel.controls["dilation_rate"].disabled
    panel.controls["kind"].value = "grid"
    assert panel.controls["dilation_rate"].disabled


def test_locality_cache_slider_steps_by_doubling():
    panel = locality_explorer(size=8, max_cache_lines=64)
    slider = panel.controls["max_cache_lines"]
    assert list(slider.options) == list(CACHE_LINE_CHOICES) == [2 ** power for power in range(2, 15)]
    slider.value = 1024
    assert panel.state["study"]["capacities"] == capacity_points(1024)
    with pytest.raises(ValueError, match="max_cache_lines"):
        locality_explorer(size=8, max_cache_lines=100)


def test_locality_misses_table_follows_the_controls():
    panel = locality_explorer(kind="grid", size=16, box_or_segment=3, max_cache_lines=64)
    table_widget = panel.widget.children[-1]
    first = panel.state["misses_table"]
    panel.controls["box_or_segment"].value = 5
    table = panel.state["misses_table"]
    study = panel.state["study"]
    assert not table.equals(first)
    assert list(table.index) == study["capacities"]
    for ordering, misses in study["misses"].items():
        assert table[ordering].tolist() == misses
        assert all(f"<td>{value}</td>" in table_widget.value for value in misses)
    assert "window 5" in table_widget.value


def test_replace_figure_shows_the_whole_figure_in_one_output():
    """A redraw is one output holding the whole figure (plotly's mime bundle): nothing of the figure before
    is kept, and there are no incremental relayout messages that a busy front-end could lose."""
    from hilbert_lab.viz.panels import FigureView, replace_figure

    view = FigureView()
    assert view.widget.outputs == () and len(view.data) == 0
    pattern = DilatedPattern.create([4, 8], [1, 2])
    figures = [attention_viz.head_mask_figure(pattern, 16, 4), attention_viz.head_mask_figure(pattern, 16, 2),
               attention_viz.coverage_figure(pattern, 16, 2)]
    for figure in figures:
        replace_figure(view, figure)
        (output,) = view.widget.outputs
        spec = output["data"]["application/vnd.plotly.v1+json"]
        assert spec["layout"]["title"]["text"] == figure.layout.title.text
        axes = {key for key in spec["layout"] if key.startswith(("xaxis", "yaxis"))}
        assert len(spec["data"]) == len(figure.data) and axes == {
            key for key in figure.layout.to_plotly_json() if key.startswith(("xaxis", "yaxis"))}  # none left over
        assert view.layout.to_plotly_json() == figure.layout.to_plotly_json()
        assert [trace.name for trace in view.data] == [trace.name for trace in figure.data]
        assert all(np.array_equal(shown.z, drawn.z) for shown, drawn in zip(view.data, figure.data))
