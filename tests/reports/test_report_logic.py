"""Report logic without notebooks: useful FLOPs, result tables, claim parsing and verdict rules."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.reports import claims, claims_measure
from hilbert_lab.bench.flops import useful_pairs
from hilbert_lab.reports.benchmark import COMPARISON_COLUMNS, comparisons, results_table, useful_flops
from hilbert_lab.reports.recorder import ReportRecorder, to_jsonable


@pytest.mark.parametrize("seq_len, heads, lengths, rates, mode, causal", [
    (64, 2, [16, 32], [1, 2], "longnet", False),
    (64, 3, [16, 32], [1, 2], "head_groups", True),
    (50, 2, [16, 32], [1, 4], "longnet", True),  # a shorter last segment
    (40, 4, [64], [2], "longnet", False),  # segment longer than the sequence
])
def test_useful_pairs_equal_the_reference_multiplicity(seq_len, heads, lengths, rates, mode, causal):
    pattern = DilatedPattern.create(lengths, rates, mode=mode, causal=causal)
    assert useful_pairs(pattern, seq_len, heads) == int(pattern.multiplicity(seq_len, heads).sum())


def test_useful_flops_by_hand():
    # one branch w=4, r=1, N=8, 1 head: 2 segments x 16 pairs = 32 pairs; 4 * B * D FLOPs per pair
    case = {"seq_len": 8, "num_heads": 1, "segment_lengths": [4], "dilation_rates": [1], "batch_size": 2,
            "head_dim": 8, "pass": "forward"}
    assert useful_flops(case) == 4 * 2 * 8 * 32
    assert useful_flops(dict(case, **{"pass": "forward_backward"})) == 3 * 4 * 2 * 8 * 32


def _record(backend, seq_len, ordering, times, status="ok"):
    params = {"backend": backend, "seq_len": seq_len, "mode": "longnet", "ordering": ordering, "pass": "forward",
              "num_heads": 1, "head_dim": 8, "batch_size": 1, "segment_lengths": [4], "dilation_rates": [1]}
    result = {"time_ms_median": sorted(times)[len(times) // 2], "times_ms": times, "peak_bytes": 2**20,
              "peak_method": "test"} if status == "ok" else {}
    return {"params": params, "result": result, "status": status, "error": "" if status == "ok" else "boom"}


def test_results_table_and_ordering_speedups():
    records = [_record("sdpa", 1024, None, [1.0, 2.0, 3.0]), _record("sdpa", 1024, "hilbert", [4.0, 4.0, 5.0]),
               _record("sdpa", 2048, None, [1.0]), _record("sdpa", 2048, "hilbert", [], status="timeout")]
    table = results_table(records)
    first = table.iloc[0]
    assert (first.median_ms, first.min_ms, first.max_ms, first.peak_mib) == (2.0, 1.0, 3.0, 1.0)
    assert first.tokens_per_s == pytest.approx(1024 / 2e-3)
    pairs = useful_pairs(DilatedPattern.create([4], [1]), 1024, 1)
    assert first.useful_tflops == pytest.approx(4 * 8 * pairs / 2e-3 / 1e12)
    assert table.iloc[3].status == "timeout" and math.isnan(table.iloc[3].median_ms)
    assert table.iloc[1].times_ms == [4.0, 4.0, 5.0] and table.iloc[3].times_ms == []
    metrics = {"tables": {"results": {"rows": to_jsonable(table.to_dict(orient="records"))}}}
    found = comparisons(metrics)
    assert len(found) == 1 and found.iloc[0].speedup == pytest.approx(0.5)  # identity 2 ms / hilbert 4 ms
    assert found.iloc[0].timing == "separate runs"
    assert found.iloc[0].speedup_low <= 0.5 <= found.iloc[0].speedup_high
    assert tuple(found.columns) == COMPARISON_COLUMNS
    rows = metrics["tables"]["results"]["rows"]  # a run of the identity order alone compares nothing, same columns
    alone = comparisons({"tables": {"results": {"rows": [row for row in rows if row["ordering"] == "identity"]}}})
    assert len(alone) == 0 and tuple(alone.columns) == COMPARISON_COLUMNS


def test_parse_claims_reads_the_table():
    text = "intro\n| id | claim | configuration | hardware |\n|---|---|---|---|\n" \
           "| C1 | fast | FP32 | GTX 1080 |\n| C12 | faster | - | - |\nnot a row | C3 |\n"
    parsed = claims.parse_claims(text)
    assert [claim["id"] for claim in parsed] == ["C1", "C12"]
    assert parsed[0] == {"id": "C1", "claim": "fast", "configuration": "FP32", "hardware": "GTX 1080"}


def test_package_carries_the_twelve_claims():
    path = claims.find_claims_file()
    assert path is not None and path.parent == Path(claims.__file__).parent
    assert [claim["id"] for claim in claims.parse_claims(path.read_text())] == [f"C{i}" for i in range(1, 13)]
    with pytest.raises(ValueError, match="claims_file"):
        claims.find_claims_file("/no/such/claims.md")


def test_ratio_bounds_and_timing_verdicts():
    speedup, low, high = claims_measure.ratio_with_bounds([10.0, 12.0, 14.0], [5.0, 6.0, 8.0])
    assert speedup == 2.0 and 10 / 8 <= low <= 2.0 <= high <= 14 / 5  # bootstrap interval inside the extremes
    assert claims_measure.timing_verdict(2.5, low, high, claimed_on_gpu=True, device="cpu") == "not reproducible here"
    assert claims_measure.timing_verdict(2.0, low, high, claimed_on_gpu=True, device="cuda") == "confirmed"
    assert claims_measure.timing_verdict(7.95, low, high, claimed_on_gpu=True, device="cuda") == "refuted"
    assert claims_measure.timing_verdict(1.0, low, high, claimed_on_gpu=False, device="cpu") == "refuted"


def test_dilation_mask_sparsity_by_hand():
    # w=128, r=2, N=256: per head 2 segments x 64^2 allowed pairs out of 256^2
    assert claims_measure.dilation_mask_sparsity(256, 128, 2, 8) == pytest.approx(1 - 2 * 64 * 64 / 256**2)


def test_claim_summary_counts_verdicts():
    pd = pytest.importorskip("pandas", reason="pandas (notebooks extra) holds the tables")
    frame = pd.DataFrame([
        {"claim": "C1", "verdict": "refuted"}, {"claim": "C1", "verdict": "not reproducible here"},
        {"claim": "C2", "verdict": "confirmed"}])
    summary = claims.claim_summary(frame, [{"id": "C1", "claim": "text one"}])
    assert summary.to_dict(orient="records") == [
        {"claim": "C1", "text": "text one", "confirmed": 0, "refuted": 1, "inconclusive": 0, "not reproducible here": 1},
        {"claim": "C2", "text": "", "confirmed": 1, "refuted": 0, "inconclusive": 0, "not reproducible here": 0}]


def test_recorder_writes_json_safe_metrics(tmp_path):
    import numpy as np

    pd = pytest.importorskip("pandas", reason="pandas (notebooks extra) holds the tables")

    recorder = ReportRecorder(tmp_path, "unit", {"sizes": (1, 2)}, show=False)
    recorder.metric("nan", float("nan"))
    recorder.metric("array", np.arange(3))
    recorder.table("t", pd.DataFrame({"a": [1.5, np.inf]}))
    data = __import__("json").loads((tmp_path / "metrics.json").read_text())
    assert data["parameters"] == {"sizes": [1, 2]}
    assert data["metrics"]["nan"]["value"] is None and data["metrics"]["array"]["value"] == [0, 1, 2]
    assert data["tables"]["t"]["rows"] == [{"a": 1.5}, {"a": None}]
    assert to_jsonable({"x": np.float32(0.5)}) == {"x": 0.5}


def _kaleido_ready() -> bool:
    import importlib.util
    import shutil

    return importlib.util.find_spec("kaleido") is not None and shutil.which("chromium") is not None


@pytest.mark.slow  # kaleido starts a browser
@pytest.mark.skipif(not _kaleido_ready(), reason="PNG export needs kaleido>=1 and a chromium on PATH")
def test_recorder_writes_png(tmp_path):
    go = pytest.importorskip("plotly.graph_objects", reason="plotly (notebooks extra) draws the figure")

    recorder = ReportRecorder(tmp_path, "png", show=False)
    recorder.figure("bars", go.Figure(go.Bar(x=["a", "b"], y=[1, 2], name="b1")), png=True)
    entry = __import__("json").loads((tmp_path / "metrics.json").read_text())["figures"]["bars"]
    assert entry["png"] == "bars.png" and (tmp_path / "bars.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    off = ReportRecorder(tmp_path / "off", "png", show=False, png=False)
    off.figure("bars", go.Figure(go.Bar(x=["a"], y=[1])), png=True)
    assert not (tmp_path / "off" / "bars.png").exists()


def _claim_row(aspect, verdict, measured="0.0%", why="a reason.", claimed="25%"):
    return {"claim": "C5", "aspect": aspect, "configuration": "N=65536, r=16, one head", "claimed": claimed,
            "measured": measured, "verdict": verdict, "why": why}


def test_claim_verdict_follows_from_its_rows_and_says_why():
    from hilbert_lab.reports.claims_verdict import claim_verdict, settle_row

    # 1 of 8 rows confirmed is not "partly confirmed": the reason counts the rows and names the exception
    rows = [_claim_row("cache: L1 misses", "refuted") for _ in range(7)] + [_claim_row("cache: L1 misses", "confirmed",
                                                                                        "50.0%")]
    verdict, reason = claim_verdict([settle_row(row) for row in rows])
    assert verdict == "mostly refuted" and "7 of 8 rows" in reason and "confirmed where N=65536" in reason
    # one kind confirmed, one refuted: partly confirmed, and the reason says which
    verdict, reason = claim_verdict([settle_row(_claim_row("accuracy, N=256", "confirmed")),
                                     settle_row(_claim_row("accuracy, N=1024", "confirmed")),
                                     settle_row(_claim_row("sparsity", "refuted"))])
    assert verdict == "partly confirmed" and "Accuracy: confirmed (2 of 2 rows)" in reason and "sparsity: refuted" in reason
    # a ratio recorded without its interval confirms nothing
    settled = settle_row(_claim_row("flash vs manual", "confirmed", measured="7.79x", claimed="5-10x"))
    assert settled["verdict"] == "inconclusive" and settled["measured"] == "7.79x (no interval recorded)"
    assert claim_verdict([settled])[0] == "inconclusive"
    # a claimed absolute throughput measured on other hardware is not reproducible, whatever the device
    rate = settle_row({**_claim_row("Hilbert tokens/s at 1024", "refuted", measured="828,826"), "claimed": "304,000"})
    assert rate["verdict"] == "not reproducible here"
    # an increase is written as one, 'nan' is not a value, a moved module is named where it is now
    row = settle_row(_claim_row("peak memory", "refuted", measured="-21.5% lower (372 -> 452 MiB); nan",
                                why="from hilbert_lab.safety.estimate_memory's model"))
    assert row["measured"] == "21.5% higher (372 -> 452 MiB); not measured"
    assert "hilbert_lab.attention.memory.estimate_memory" in row["why"]
    # the same sentence in every row's reason is said once
    verdict, reason = claim_verdict([settle_row(_claim_row(f"L1 at {n}", "refuted", why=f"{n} vs {n} misses. Same "
                                                           "sentence.")) for n in (8192, 16384, 32768)])
    assert reason.count("Same sentence") == 1 and "8192 vs" not in reason
