"""Attention-pattern explorer panel: segments, dilations, mode, causal, ordering -> masks and tile density."""
from __future__ import annotations

import html

from hilbert_lab.viz.panels import FigureView, Panel, clamp, guarded, replace_figure, show_message

MAX_EXPLORER_TOKENS = 256
MAX_EXPLORER_HEADS = 8
BLOCK_SIZES = (4, 8, 16, 32, 64)
ORDERING_CHOICES = ("identity", "hilbert", "morton", "snake", "dilation_major")


def parse_int_list(text: str, name: str) -> list[int]:
    """'16, 32' -> [16, 32]; ValueError naming `name` when an entry is not a positive integer."""
    parts = [part for part in str(text).replace(";", ",").replace(" ", ",").split(",") if part]
    try:
        values = [int(part) for part in parts]
    except ValueError:
        raise ValueError(f"{name} must be a comma-separated list of positive integers, got {text!r}") from None
    if not values or any(value < 1 for value in values):
        raise ValueError(f"{name} must be a comma-separated list of positive integers, got {text!r}")
    return values


REFERENCE_TOLERANCE = 1e-10  # float64 engine vs float64 oracle: rounding only


def reference_check_html(result: dict) -> str:
    """A `viz.attention.reference_check` result as one sentence: does the engine match the float64 oracle,
    by how much, and do the queries without keys agree."""
    ok = (result["max_abs_out_error"] < REFERENCE_TOLERANCE and result["max_abs_lse_error"] < REFERENCE_TOLERANCE
          and result["empty_rows_agree"])
    empty = ("the queries with no keys are the same in both" if result["empty_rows_agree"]
             else "the queries with no keys differ")
    return (f"<b>{'matches' if ok else 'DIFFERS FROM'} the float64 reference</b> (engine in float64, backend "
            f"{html.escape(str(result['backend']))}): largest output error {result['max_abs_out_error']:.1e}, "
            f"largest log-sum-exp error {result['max_abs_lse_error']:.1e} (tolerance {REFERENCE_TOLERANCE:.0e}); "
            f"{empty}.")


def attention_explorer(segment_lengths: str = "16,64", dilation_rates: str = "1,4", mode: str = "longnet",
                       causal: bool = False, seq_len: int = 64, num_heads: int = 2, block_size: int = 4) -> Panel:
    """Build the attention-pattern explorer; its figures (FigureView) are in `panel.figures`.

    At the defaults every query has keys and the orderings differ: Hilbert / Morton lay each
    16-token segment on a 4x4 square, so the long branch's every-4th tokens (a column) share tiles.
    """
    import ipywidgets as widgets

    from hilbert_lab.attention.pattern import MODES, DilatedPattern
    from hilbert_lab.viz import attention as figures_module

    labelled = {"style": {"description_width": "initial"}}  # descriptions shown in full, never cut off
    controls = {
        "segment_lengths": widgets.Text(value=segment_lengths, description="segment lengths",
                                        continuous_update=False, **labelled),
        "dilation_rates": widgets.Text(value=dilation_rates, description="dilation rates", continuous_update=False,
                                       **labelled),
        "mode": widgets.Dropdown(options=list(MODES), value=mode, description="mode", **labelled),
        "causal": widgets.Checkbox(value=causal, description="causal", **labelled),
        "seq_len": widgets.IntText(value=seq_len, description="tokens", **labelled),
        "num_heads": widgets.IntSlider(value=num_heads, min=1, max=MAX_EXPLORER_HEADS, description="heads",
                                       **labelled),
        "head": widgets.IntSlider(value=0, min=0, max=MAX_EXPLORER_HEADS - 1, description="head shown", **labelled),
        "block_size": widgets.Dropdown(options=list(BLOCK_SIZES), value=block_size, description="tile (tokens)",
                                       **labelled),
        "orderings": widgets.SelectMultiple(options=list(ORDERING_CHOICES), value=list(ORDERING_CHOICES),
                                            description="orderings", rows=5, **labelled),
    }
    compare_button = widgets.Button(description="compare with reference", button_style="info",
                                    layout={"width": "auto", "min_width": "200px"})
    message = widgets.HTML()
    check_html = widgets.HTML()
    table_html = widgets.HTML()
    figures = {name: FigureView() for name in ("branches", "heads", "multiplicity", "coverage", "tiles")}
    state: dict = {}

    def current_pattern(notes: list[str]):
        lengths = parse_int_list(controls["segment_lengths"].value, "segment_lengths")
        rates = parse_int_list(controls["dilation_rates"].value, "dilation_rates")
        pattern = DilatedPattern.create(lengths, rates, mode=controls["mode"].value, causal=controls["causal"].value)
        tokens = clamp(controls["seq_len"].value, 2, MAX_EXPLORER_TOKENS, "tokens", notes)
        heads = controls["num_heads"].value
        head = clamp(controls["head"].value, 0, heads - 1, "head shown", notes)
        return pattern, tokens, heads, head

    def refresh() -> None:
        notes: list[str] = []
        pattern, tokens, heads, head = current_pattern(notes)
        block = controls["block_size"].value
        replace_figure(figures["branches"], figures_module.branch_mask_figure(pattern, tokens, heads, head))
        replace_figure(figures["heads"], figures_module.head_mask_figure(pattern, tokens, heads))
        replace_figure(figures["multiplicity"], figures_module.multiplicity_figure(pattern, tokens, heads, head))
        replace_figure(figures["coverage"], figures_module.coverage_figure(pattern, tokens, heads))
        table = figures_module.tile_density_table(pattern, tokens, heads, block, controls["orderings"].value)
        replace_figure(figures["tiles"], figures_module.tile_density_figure(table, block))
        notes += [f"ordering {row.ordering}: {row.note}" for row in table.itertuples() if row.note]
        summary = table[table["head"] >= 0].groupby("ordering", sort=False)[
            ["nonempty_share", "mean_density", "nonempty_blocks", "total_blocks"]].mean()
        summary.columns = ["non-empty tiles (share, lower is better)", "fill of non-empty tiles (higher is better)",
                           "non-empty tiles", "tiles"]
        table_html.value = (f"<b>{block}x{block} tiles by ordering, mean over heads</b>"
                            + summary.to_html(border=0, float_format=lambda value: f"{value:.4g}"))
        state.update(pattern=pattern, seq_len=tokens, num_heads=heads, tile_table=table)
        check_html.value = ""
        show_message(message, notes)

    def compare(_button=None) -> None:
        notes: list[str] = []
        try:
            pattern, tokens, heads, _head = current_pattern(notes)
            result = figures_module.reference_check(pattern, tokens, heads)
        except ImportError as error:
            check_html.value = f"<i>engine not available: {html.escape(str(error))}</i>"
            return
        except Exception as error:
            show_message(message, [f"{type(error).__name__}: {error}"], error=True)
            return
        state["reference_check"] = result
        check_html.value = reference_check_html(result)

    observer = guarded(refresh, message)
    for control in controls.values():
        control.observe(observer, names="value")
    compare_button.on_click(compare)
    layout = widgets.VBox([
        widgets.HBox([controls["segment_lengths"], controls["dilation_rates"], controls["mode"], controls["causal"]]),
        widgets.HBox([controls["seq_len"], controls["num_heads"], controls["head"], controls["block_size"]]),
        widgets.HBox([controls["orderings"], compare_button]),
        check_html,
        message,
        *(figures[name].widget for name in ("branches", "heads", "multiplicity", "coverage", "tiles")),
        table_html,
    ])
    observer()
    state.update(compare=compare, check_html=check_html)
    return Panel(widget=layout, figures=figures, controls=controls, message=message, refresh=refresh, state=state)
