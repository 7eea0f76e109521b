"""The decoding page against the committed bench_decode.py files it is drawn from: the committed run directory is
what `python -m hilbert_lab.reports.decoding` writes from them; ms per token, the ratio to the bandwidth limit,
each model over LongNetLM in the same run, the spread across contexts and the batched steps are the files' numbers;
the findings quote them; the figure's lines are the medians over runs; bad input is refused naming the file."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="plotly (notebooks extra) draws the figures")

from hilbert_lab.reports import decoding  # noqa: E402
from hilbert_lab.reports.page import fmt  # noqa: E402
from hilbert_lab.reports.render import build_page, load_run  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "reports" / "results" / "decode_static"
RUN = REPO / "reports" / "decoding" / "h200-gpu"
STEP = [RESULTS / f"decode_1b_compiled_h200_7db65e2_run{i}.json" for i in (1, 2, 3)]
REGISTER = [RESULTS / f"decode_1b_register_gemv_h200_7db65e2_run{i}.json" for i in (1, 2, 3)]
BATCH = [RESULTS / f"decode_tiny_batch8_compiled_h200_41a17df_run{i}.json" for i in (1, 2, 3)]


def _raw(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _ms(path: Path, method: str, context: int) -> float:
    return next(r["ms_per_token"] for r in _raw(path)["results"] if r["method"] == method and r["context"] == context)


@pytest.fixture(scope="module")
def run():
    return load_run(RUN)


def test_the_committed_run_is_what_the_module_writes_from_the_files(run, tmp_path):
    metrics, _env = run
    assert metrics["parameters"]["files"] == [path.name for path in STEP + REGISTER + BATCH]
    written = load_run(decoding.write_decoding_run(STEP + REGISTER + BATCH, tmp_path))[0]
    assert written["tables"] == metrics["tables"]


def test_tables_hold_the_files_numbers(run):
    tables = run[0]["tables"]
    per_token = {(row["run"], row["method"], row["context"]): row for row in tables["per_token"]["rows"]}
    for path in STEP + REGISTER:
        for result in _raw(path)["results"]:
            row = per_token[path.stem.removeprefix("decode_"), result["method"], result["context"]]
            assert row["ms_per_token"] == result["ms_per_token"]
            assert row["x_limit"] == result.get("x_limit")
    relative = {(row["run"], row["method"], row["context"]): row["ratio"] for row in tables["relative"]["rows"]}
    for path in STEP:  # the dense anchor at 128K in every run, at 512K in the first
        dense = [r for r in _raw(path)["results"] if r["method"] == "llama_sdpa_static_cache_filled"]
        assert 131072 in {r["context"] for r in dense}
        for r in dense:
            assert relative[path.stem[7:], r["method"], r["context"]] == pytest.approx(
                r["ms_per_token"] / _ms(path, "longnet_static_graph", r["context"]))
    for path in REGISTER:
        assert relative[path.stem[7:], "llama_dilated_gemv_static_cache_filled", 131072] == pytest.approx(
            _ms(path, "llama_dilated_gemv_static_cache_filled", 131072) / _ms(path, "longnet_static_graph", 131072))
    spread = {row["run"]: row["spread"] for row in tables["flatness"]["rows"]}
    assert set(spread) == {path.stem[7:] for path in STEP}  # the register runs time one context
    for path in STEP:
        times = [r["ms_per_token"] for r in _raw(path)["results"] if r["method"] == "longnet_static_graph"]
        assert spread[path.stem[7:]] == pytest.approx(max(times) / min(times))
    batch = {row["run"]: row for row in tables["batch"]["rows"]}
    for path in BATCH:
        result = _raw(path)["results"][0]
        row = batch[path.stem[7:]]
        assert row["tokens_per_s_ratio"] == result["tokens_per_s_ratio"]
        assert (row["shortest"], row["longest"]) == (min(result["lengths"]), max(result["lengths"]))
        assert row["same_tokens"] is all(result["same_tokens_per_row"])


def test_findings_quote_the_spans_of_the_files(run):
    page = build_page(*run)
    longnet = [r for path in STEP + REGISTER for r in _raw(path)["results"] if r["method"] == "longnet_static_graph"]
    for context, name in ((32768, "32K"), (131072, "128K"), (1048576, "1M")):
        ratios = [r["x_limit"] for r in longnet if r["context"] == context]
        assert (f"{fmt(statistics.median(ratios))}x [{fmt(min(ratios))}, {fmt(max(ratios))}] at {name}"
                in page.findings[0])
    for context, name in ((131072, "128K"), (524288, "512K")):
        dense = [r["ms_per_token"] / _ms(path, "longnet_static_graph", context) for path in STEP
                 for r in _raw(path)["results"] if r["method"] == "llama_sdpa_static_cache_filled"
                 and r["context"] == context]
        digits = 3 if len(dense) == 1 or fmt(statistics.median(dense)) not in (fmt(min(dense)), fmt(max(dense))) \
            else 4  # one more digit where the median would read as an end of the range
        quoted = (f"{fmt(dense[0])}x (no interval: one run)" if len(dense) == 1 else
                  f"{fmt(statistics.median(dense), digits)}x [{fmt(min(dense), digits)}, {fmt(max(dense), digits)}]")
        assert f"{quoted} at {name}" in page.findings[1]
    assert page.findings[1].count("the dense Llama (sdpa) ") == 1
    batch = [_raw(path)["results"][0]["tokens_per_s_ratio"] for path in BATCH]
    assert (f"{fmt(statistics.median(batch))}x [{fmt(min(batch))}, {fmt(max(batch))}] the tokens/s of its rows one "
            "at a time (median [lowest, highest] of 3 runs)") in page.findings[2]
    assert "every row gave the tokens it gives alone" in page.findings[2]
    assert not page.measured_here and len(page.sources) == len(STEP + REGISTER + BATCH)


def test_the_figure_draws_the_median_over_runs_and_the_limit(run):
    page = build_page(*run)
    figure = next(section.figure for section in page.sections if section.heading.endswith("ms per token"))
    traces = {trace.name: trace for trace in figure.data}
    longnet = traces[decoding.METHOD_LABELS["longnet_static_graph"]]
    assert list(longnet.x) == [32768, 131072, 524288, 1048576]
    at_128k = [_ms(path, "longnet_static_graph", 131072) for path in STEP + REGISTER]
    assert longnet.y[1] == pytest.approx(statistics.median(at_128k))
    assert longnet.y[1] + longnet.error_y.array[1] == pytest.approx(max(at_128k))
    limits = [r["limit_ms"] for path in STEP for r in _raw(path)["results"] if r["context"] == 32768]
    assert traces["memory-bandwidth limit"].y[0] == pytest.approx(statistics.median(limits))


def test_a_file_that_is_not_a_decode_result_is_refused_naming_it(tmp_path, capsys):
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="other.json"):
        decoding.decoding_run([bad])
    assert decoding.main([str(bad), "--out", str(tmp_path / "out")]) == 2
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err.count("\n") == 1 and "other.json" in printed.err
