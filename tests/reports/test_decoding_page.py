"""The decoding page against the committed bench_decode.py files it is drawn from: the committed run directory is
what `python -m hilbert_lab.reports.decoding` writes from them; ms per token, the ratio to the bandwidth limit,
each model over LongNetLM in the same run, the spread across contexts and the batched steps are the files' numbers;
the findings quote them; the figure's lines are the medians over runs; runs of two revisions are never pooled; bad
input is refused naming the file."""
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
# the newest step: each run one context alone (one process per context), the bandwidth measured warm
NEWEST = [RESULTS / f"decode_1b_compiled_h200_b74bade_run{i}_{n}.json" for i in (1, 2, 3) for n in (32768, 131072)] \
    + [RESULTS / "decode_1b_compiled_h200_b74bade_run4_32768.json"]
NEWER = [RESULTS / f"decode_1b_compiled_h200_7030726_run{i}.json" for i in (1, 2, 3)]  # 32K and 128K only
STEP = [RESULTS / f"decode_1b_compiled_h200_7db65e2_run{i}.json" for i in (1, 2, 3)]
REGISTER = [RESULTS / f"decode_1b_register_gemv_h200_7db65e2_run{i}.json" for i in (1, 2, 3)]
BATCH = [RESULTS / f"decode_tiny_batch8_compiled_h200_41a17df_run{i}.json" for i in (1, 2, 3)]
FILES = NEWEST + NEWER + STEP + REGISTER + BATCH


def _raw(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _ms(path: Path, method: str, context: int) -> float:
    return next(r["ms_per_token"] for r in _raw(path)["results"] if r["method"] == method and r["context"] == context)


def _quoted(values: list[float]) -> str:
    """'m [low, high]' as the page quotes a median of runs: 3 digits, 4 where 3 would read the median as an end or
    runs that differ as one value, and a note where 4 still do (three runs, two of them equal)."""
    for digits in (3, 4):
        middle, low, high = (fmt(v, digits) for v in (statistics.median(values), min(values), max(values)))
        if middle not in (low, high) or min(values) == max(values):
            break
    note = " (the median, at the end of its interval)" if middle in (low, high) and low != high else ""
    return f"{middle}x [{low}, {high}]{note}"


@pytest.fixture(scope="module")
def run():
    return load_run(RUN)


def test_the_committed_run_is_what_the_module_writes_from_the_files(run, tmp_path):
    metrics, _env = run
    assert metrics["parameters"]["files"] == [path.name for path in FILES]
    written = load_run(decoding.write_decoding_run(FILES, tmp_path))[0]
    assert written["tables"] == metrics["tables"]


def test_tables_hold_the_files_numbers(run):
    tables = run[0]["tables"]
    per_token = {(row["run"], row["method"], row["context"]): row for row in tables["per_token"]["rows"]}
    for path in NEWEST + NEWER + STEP + REGISTER:
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
    # the register runs and the newest time one context each
    assert set(spread) == {path.stem[7:] for path in NEWER + STEP}
    for path in NEWER + STEP:
        times = [r["ms_per_token"] for r in _raw(path)["results"] if r["method"] == "longnet_static_graph"]
        assert spread[path.stem[7:]] == pytest.approx(max(times) / min(times))
    batch = {row["run"]: row for row in tables["batch"]["rows"]}
    for path in BATCH:
        result = _raw(path)["results"][0]
        row = batch[path.stem[7:]]
        assert row["tokens_per_s_ratio"] == result["tokens_per_s_ratio"]
        assert (row["shortest"], row["longest"]) == (min(result["lengths"]), max(result["lengths"]))
        assert row["same_tokens"] is all(result["same_tokens_per_row"])


def test_a_ratio_of_runs_gets_a_fourth_digit_where_three_hide_their_differences():
    assert decoding._ratio([1.5106, 1.5112, 1.5094]) == "1.511x [1.509, 1.511] (the median, at the end of its interval)"
    assert decoding._ratio([1.4903, 1.482, 1.4863, 1.4949]) == "1.488x [1.482, 1.495]"
    assert decoding._ratio([1.42, 1.50, 1.61]) == "1.5x [1.42, 1.61]"
    assert decoding._ratio([2.0, 2.0]) == "2x [2, 2]"


def test_findings_quote_the_spans_of_the_files(run):
    page = build_page(*run)
    assert page.findings[0].startswith("dim 2048, 16 layers, 16 heads, vocab 32000, rev b74bade: ")
    assert page.findings[1].startswith("dim 2048, 16 layers, 16 heads, vocab 32000, rev 7030726: ")
    assert page.findings[2].startswith("dim 2048, 16 layers, 16 heads, vocab 32000, rev 7db65e2: ")
    assert "slower than its fastest" not in page.findings[0]  # one context per run: no spread within a run
    assert f"over {len(NEWEST)} runs (one context each);" in page.findings[0]
    assert "1.488x [1.482, 1.495] at 32K" in page.findings[0]  # 4 digits: 1.49x [1.48, 1.49] reads the median as an end
    assert "one context each" not in page.findings[1] + page.findings[2]
    for finding, paths, contexts in ((page.findings[0], NEWEST, ((32768, "32K"), (131072, "128K"))),
                                     (page.findings[1], NEWER, ((32768, "32K"), (131072, "128K"))),
                                     (page.findings[2], STEP + REGISTER, ((32768, "32K"), (131072, "128K"),
                                                                          (1048576, "1M")))):
        longnet = [r for path in paths for r in _raw(path)["results"] if r["method"] == "longnet_static_graph"]
        assert f"over {len(paths)} runs" in finding
        for context, name in contexts:
            ratios = [r["x_limit"] for r in longnet if r["context"] == context]
            assert f"{_quoted(ratios)} at {name}" in finding
    for context, name in ((131072, "128K"), (524288, "512K")):
        dense = [r["ms_per_token"] / _ms(path, "longnet_static_graph", context) for path in STEP
                 for r in _raw(path)["results"] if r["method"] == "llama_sdpa_static_cache_filled"
                 and r["context"] == context]
        quoted = f"{fmt(dense[0])}x (no interval: one run)" if len(dense) == 1 else _quoted(dense)
        assert f"{quoted} at {name}" in page.findings[3]
    assert page.findings[3].count("the dense Llama (sdpa) ") == 1
    batch = [_raw(path)["results"][0]["tokens_per_s_ratio"] for path in BATCH]
    assert (f"{fmt(statistics.median(batch))}x [{fmt(min(batch))}, {fmt(max(batch))}] the tokens/s of its rows one "
            "at a time (median [lowest, highest] of 3 runs)") in page.findings[4]
    assert "every row gave the tokens it gives alone" in page.findings[4]
    assert len(page.findings) == 5  # each group's, none cut
    assert not page.measured_here and len(page.sources) == len(FILES)


def test_the_figure_draws_the_median_over_runs_and_the_limit(run):
    page = build_page(*run)
    figure = next(section.figure for section in page.sections
                  if section.heading.endswith("rev 7db65e2: ms per token"))
    traces = {trace.name: trace for trace in figure.data}
    longnet = traces[decoding.METHOD_LABELS["longnet_static_graph"]]
    assert list(longnet.x) == [32768, 131072, 524288, 1048576]
    at_128k = [_ms(path, "longnet_static_graph", 131072) for path in STEP + REGISTER]  # not the newer revision's
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


def test_runs_of_two_revisions_are_drawn_apart(tmp_path):
    files = []
    for revision, ms in (("a" * 40, 1.0), ("b" * 40, 2.0)):
        data = _raw(NEWER[0])
        data["environment"]["git"] = {"commit": revision, "dirty": False}
        for result in data["results"]:
            result["ms_per_token"] = ms
        files.append(tmp_path / f"decode_rev_{revision[0]}.json")
        files[-1].write_text(json.dumps(data))
    page = build_page(*decoding.decoding_run(files))
    figures = {section.heading: section.figure for section in page.sections if section.heading.endswith("ms per token")}
    assert sorted(figures) == [f"dim 2048, 16 layers, 16 heads, vocab 32000, rev {c * 7}: ms per token" for c in "ab"]
    for c, ms in (("a", 1.0), ("b", 2.0)):
        line = figures[f"dim 2048, 16 layers, 16 heads, vocab 32000, rev {c * 7}: ms per token"].data[0]
        assert list(line.y) == [ms, ms] and list(line.error_y.array) == [0, 0]
    assert [f.split(":")[0] for f in page.findings] == [f"dim 2048, 16 layers, 16 heads, vocab 32000, rev {c * 7}"
                                                        for c in "ab"]
