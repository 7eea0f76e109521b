"""The serialization page: verdicts from the intervals, the committed GPU run, titled axes, a sentence headline."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="plotly (notebooks extra) draws the figures")
pd = pytest.importorskip("pandas", reason="pandas (notebooks extra) holds the tables")

from hilbert_lab.reports import serialization, serialization_page  # noqa: E402
from hilbert_lab.reports.page import figure_axis_titles  # noqa: E402
from hilbert_lab.reports.render import build_page, renderer_for  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CPU_ENV = {"device": {"device": "cpu", "name": "test cpu"}, "cpu": {"model": "test", "usable_cores": 2},
           "git": {"commit": "0123456789abcdef"}, "packages": {"torch": "2.x"}}


def _task(name, window, kind, values):
    spec = {"kind": kind, "grid_shape": [8, 8], "radius": 1.0, "num_points": 64, "ndim": 3, "neighbours": 5}
    return {"name": name, "task": spec, "config": {"segment_lengths": [window], "steps": 10},
            "summary": [{"ordering": o, "mean": m, "low": lo, "high": hi, "n": 3,
                         "locality": {"recall@8": r, "unmet_adjacent": 1 - r, "diameter_mean": 5.0}}
                        for o, m, lo, hi, r in values]}


DOCUMENT = {"device": "h100", "env": {"device": {"device": "cuda:0", "name": "Test GPU"}}, "tasks": [
    # separated: hilbert and morton ahead of rowmajor (intervals disjoint); snake overlaps both sides
    _task("grid w16", 16, "grid", [("hilbert", 0.90, 0.88, 0.92, 0.8), ("morton", 0.89, 0.86, 0.91, 0.8),
                                   ("snake", 0.84, 0.80, 0.885, 0.5), ("rowmajor", 0.78, 0.76, 0.80, 0.4)]),
    # every interval overlaps
    _task("grid w64", 64, "grid", [("rowmajor", 0.80, 0.70, 0.90, 0.9), ("hilbert", 0.79, 0.69, 0.89, 0.9)]),
]}


def _locality():
    rows = []
    for data, scale in (("8 x 8", 1.0), ("cloud", 0.5)):
        for segments, rates, values in (([16], [1], {"rowmajor": 0.3, "hilbert": 0.7}),
                                        ([64], [1], {"rowmajor": 0.95, "hilbert": 0.951}),
                                        # Hilbert loses to row-major here: never called "does not matter"
                                        ([256], [4], {"rowmajor": 0.5, "hilbert": 0.3})):
            for ordering, value in values.items():
                rows.append({"data": data, "tokens": 64, "segment_lengths": segments, "dilation_rates": rates,
                             "ordering": ordering, "recall@4": value, "recall@8": value * scale,
                             "recall@26": value, "diameter_mean": 3.0 / value, "diameter_max": 4.0,
                             "unmet_adjacent": 1 - value, "seconds": 0.01})
    return pd.DataFrame(rows)


def _metrics():
    trained = pd.DataFrame(serialization.trained_rows(DOCUMENT, "GPU"))
    locality = _locality()
    table = lambda frame: {"caption": "", "columns": list(frame.columns),  # noqa: E731
                           "rows": json.loads(frame.to_json(orient="records"))}
    parameters = {"window_examples": [[8, "rowmajor", 16, 1], [8, "hilbert", 16, 1]], "timing_grid": [64, 64]}
    return {"report": "serialization", "parameters": parameters,
            "metrics": {"chance_accuracy": {"value": 0.5}, "locality_seconds": {"value": 1.5, "unit": "s", "note": ""},
                        "seconds_1M_grid_hilbert": {"value": 0.2, "unit": "s", "note": ""}},
            "tables": {"locality": table(locality), "trained": table(trained)}, "figures": {}}


def test_ranking_verdict_reads_intervals():
    rows = DOCUMENT["tasks"][0]["summary"]
    ranking, verdict, separated = serialization.ranking_verdict(rows)
    # '>' only between neighbours whose intervals are disjoint, '~' where they overlap; display names
    assert ranking == ("Hilbert 0.900 [0.880, 0.920] ~ Morton 0.890 [0.860, 0.910] ~ snake 0.840 [0.800, 0.885] ~ "
                       "row-major 0.780 [0.760, 0.800]")
    assert separated and verdict.startswith("Hilbert and Morton ahead of row-major (95% intervals disjoint)")
    assert "snake ahead" not in verdict and "other pairs overlap" in verdict
    _, numbers, _ = serialization.ranking_verdict(rows, numbers=True)
    assert numbers.startswith("Hilbert 0.900 [0.880, 0.920] and Morton 0.890 [0.860, 0.910] ahead of row-major 0.780")
    _, verdict, separated = serialization.ranking_verdict(DOCUMENT["tasks"][1]["summary"])
    assert not separated and verdict.startswith("no difference")
    # touching intervals are not disjoint
    touching = [{"ordering": "a", "mean": 1.0, "low": 0.9, "high": 1.1}, {"ordering": "b", "mean": 0.8, "low": 0.7,
                                                                          "high": 0.9}]
    assert serialization.ranking_verdict(touching)[1].startswith("no difference")
    assert serialization.ranking_verdict(touching)[0] == "a 1.000 [0.900, 1.100] ~ b 0.800 [0.700, 0.900]"
    apart = [{"ordering": "hilbert", "mean": 1.0, "low": 0.95, "high": 1.05},
             {"ordering": "rowmajor", "mean": 0.8, "low": 0.7, "high": 0.9}]
    assert serialization.ranking_verdict(apart)[0] == "Hilbert 1.000 [0.950, 1.050] > row-major 0.800 [0.700, 0.900]"


def test_page_findings_name_ranking_device_and_no_difference():
    assert renderer_for("serialization") is serialization_page.render
    page = build_page(_metrics(), CPU_ENV)
    assert page.title.startswith("Serialization: which curve ordering")
    assert "Test GPU" in page.device and 1 <= len(page.findings) <= 5
    assert page.findings[0].startswith("Trained on Test GPU")
    assert "Hilbert 0.900 [0.880, 0.920] and Morton 0.890 [0.860, 0.910] ahead of row-major" in page.findings[0]
    assert any(f.startswith("No trained difference") and "window 64" in f for f in page.findings)
    # the index card: a sentence with the verdicts, no raw metric keys
    assert page.headline == page.findings[0]
    assert "locality_seconds" not in page.headline and "recall@8" not in page.headline
    # exact locality: the largest gap is a finding; near ties (within 10% of row-major) are said to be no finding
    assert any("0.7 of each token's 8 nearest neighbours" in f and "0.3 for row-major" in f for f in page.findings)
    assert ("On 2 of 6 settings some ordering keeps 10% or more fewer of the 8 nearest neighbours than row-major "
            "(e.g. 8 x 8 w=256 r=4: Hilbert 0.3 vs row-major 0.5; cloud w=256 r=4: Hilbert 0.15 vs row-major 0.25): "
            "there that ordering loses.") in page.findings
    small = next(f for f in page.findings if "does not matter" in f)
    assert small.startswith("On 2 of 6 settings every ordering is within 10% of row-major's 8-NN recall")
    assert "8 x 8 w=64" in small and "w=256 r=4" not in small


def test_page_text_has_no_template_glitches_code_names_or_paths():
    page = build_page(_metrics(), CPU_ENV)
    text = " ".join(page.findings + [page.about] + [s.conclusion for s in page.sections]
                    + [t for s in page.sections for t in s.text])
    assert "the best Mean" not in text and "the best Adjacent" not in text and "best 8-NN recall comes" in text
    assert "settings: Where" not in text and ": Where" not in text
    assert "recall@" not in " ".join(page.findings + [page.about])
    captions = " ".join(s.caption for s in page.sections)
    assert "recall@8 per data set" not in captions and "8-NN recall per data set" in captions


def test_page_sections_conclusions_axes_and_compact_tables():
    page = build_page(_metrics(), CPU_ENV)
    figures = [section for section in page.sections if section.figure is not None]
    assert len(figures) >= 4  # accuracy, windows, three locality metrics
    for section in figures:
        assert section.conclusion, section.heading
        titles = figure_axis_titles(section.figure)
        assert titles and all(title for _axis, title in titles), (section.heading, titles)
    recall = next(section for section in page.sections if section.heading.startswith("8-NN recall")
                  and section.figure is not None)
    pivot = next(section for section in page.sections if section.heading.startswith("8-NN recall")
                 and section.table is not None)
    # pivot: one row per (data, ordering), one column per setting, not the tidy dump (behind a closed section)
    assert list(pivot.table.columns) == ["data", "ordering", "w=16", "w=64", "w=256 r=4"] and len(pivot.table) == 4
    assert pivot.collapsed
    assert pivot.table.set_index(["data", "ordering"]).loc[("cloud", "Hilbert"), "w=16"] == pytest.approx(0.35)
    # w=16: Hilbert best on both data sets; w=64: within 10% of row-major, no finding
    assert "Hilbert on 2" in recall.conclusion and "on the other 2 settings every ordering is within" in recall.conclusion
    assert ("some ordering is 10% or more worse than row-major on 2 of 6 settings (8 x 8 w=256 r=4: Hilbert 0.3 vs "
            "row-major 0.5; cloud w=256 r=4: Hilbert 0.15 vs row-major 0.25)") in recall.conclusion
    adjacent = next(section for section in page.sections if section.heading.startswith("Adjacent pairs")
                    and section.figure is not None)
    assert "8 x 8 w=256 r=4: Hilbert 0.7 vs row-major 0.5" in adjacent.conclusion
    which = next(section for section in page.sections if section.heading.startswith("Which ordering"))
    text = " ".join(which.text)
    assert ("8 x 8: use Hilbert at w=16 (8-NN recall 0.7 vs row-major 0.3); 10% or more worse than row-major: at "
            "w=256 r=4, Hilbert 0.3 vs row-major 0.5; every ordering within 10% of row-major (no finding) at w=64.") in text
    assert serialization._family(["hilbert", "morton", "hilbert-trans", "morton-trans"]) == \
        "Hilbert or Morton (either orientation)"
    assert serialization._family(["hilbert", "morton", "hilbert-trans"]) == "Hilbert, Morton or Hilbert (transposed)"
    assert "Trained on Test GPU, 2D 8x8 image, window 64: no difference" in text
    windows = next(section for section in page.sections if section.heading.startswith("The attention windows"))
    assert "row-major w=16: mostly 2 x 8 boxes" in windows.conclusion
    assert "Hilbert w=16: mostly 4 x 4" in windows.conclusion


def test_committed_gpu_file_is_read_with_its_device():
    document = json.loads((REPO / "reports" / "results" / "serialization_h100.json").read_text())
    rows = serialization.trained_rows(document, "GPU")
    assert {row["device"] for row in rows} == {"NVIDIA H100 80GB HBM3"}
    frame = pd.DataFrame(rows)
    window64 = frame[frame["task"] == document["tasks"][0]["name"]].to_dict(orient="records")
    _, verdict, separated = serialization.ranking_verdict(window64)
    assert separated and verdict.startswith("Morton, Hilbert alternating with its transpose and Hilbert ahead of "
                                            "snake and row-major")
    with pytest.raises(ValueError, match="document must be"):
        serialization.trained_rows({"device": "cpu"}, "GPU")


def test_committed_run_never_calls_a_losing_ordering_no_difference():
    """The committed default run: every setting where some ordering is 10% or more worse than row-major (read from
    its locality table) is named as a loss, never as a setting where the ordering does not matter."""
    run = sorted((REPO / "reports" / "default").glob("*/serialization-small"))[-1]
    metrics = json.loads((run / "metrics.json").read_text())
    page = build_page(metrics, json.loads((run / "env.json").read_text()))
    table = pd.DataFrame(metrics["tables"]["locality"]["rows"])
    for metric, direction in (("recall@8", 1), ("unmet_adjacent", -1)):
        frame = table.assign(setting=[serialization._setting(s, r) for s, r in
                                      zip(table["segment_lengths"], table["dilation_rates"])])
        losing = []
        for (data, setting), rows in frame.groupby(["data", "setting"], sort=False):
            values = dict(zip(rows["ordering"], rows[metric].astype(float)))
            base = values["rowmajor"]
            if any(direction * (base - v) / max(abs(v), abs(base)) >= 0.10 for v in values.values()):
                losing.append(f"{data} {setting}")
        assert losing, metric
        verdicts = serialization.locality_verdicts(table, metric)
        assert sorted(f"{v['data']} {v['setting']}" for v in verdicts if v["worse"]) == sorted(losing)
    # the audit's case: 64 x 64 w=256 r=4, Morton 0.000 and Hilbert 0.162 against row-major 0.193
    text = " ".join(page.findings)
    assert "64 x 64 w=256 r=4: Morton (either orientation) 0, Hilbert (either orientation) 0.162 vs row-major 0.193" in text
    for finding in page.findings:
        if "does not matter" in finding:
            assert "w=256 r=4" not in finding.split("(e.g.")[1]
    which = " ".join(next(s for s in page.sections if s.heading.startswith("Which ordering")).text)
    for paragraph in which.split("64 x 64: ")[1:2]:
        assert "no finding) at w=256 r=4" not in paragraph and "at w=256 r=4, Morton (either orientation) 0" in paragraph


def test_speed_section_says_another_report_may_have_run_beside_it():
    """A suite runs the reports that compare no timings two at a time: the page's seconds are not clean timings."""
    from hilbert_lab.reports.registry import get_report

    assert not get_report("serialization-small").measures_speed
    speed = next(section for section in build_page(_metrics(), CPU_ENV).sections
                 if section.heading == "Speed of the exact metrics (CPU)")
    assert "possibly with another report beside this one" in speed.conclusion
    assert "no conclusion rests on them" in speed.conclusion
