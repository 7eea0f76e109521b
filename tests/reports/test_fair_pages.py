"""Pages a careful reader cannot catch out: figures of older code are labelled with their revision and
quoted by no finding or card, configs are defined, verdicts follow from what was measured."""
from __future__ import annotations

import html
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="plotly (notebooks extra) draws the figures")

from hilbert_lab.reports import claims_verdict, provenance  # noqa: E402
from hilbert_lab.reports.render import build_page, load_run  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def _head() -> str:
    return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_older_code_names_the_revision_or_says_unrecorded():
    assert provenance.older_code({"commit": _head(), "dirty": False}) == ""
    assert provenance.older_code({"commit": provenance.CURRENT_CODE}) == ""
    label = provenance.older_code({"commit": "530aee9cc7654194312dc063ce92929560f35304", "dirty": True})
    assert label == "measured with older code (rev 530aee9 + uncommitted changes)"
    assert provenance.older_code({}) == provenance.older_code(None) == "measured with older code (rev unrecorded)"
    assert provenance.older_code({"commit": "0" * 40}).startswith("measured with older code (rev 0000000")


def test_ring_page_quotes_no_older_figure_and_defines_its_configs():
    """Read as if its runs were of the current ring, only the zigzag timings predate their code (the zigzag ring
    changed): no finding quotes an older figure or a proportion that two points cannot show, only that section is
    labelled; the configs are defined, the one that sends nothing says so."""
    metrics, env = load_run(REPO / "reports" / "ring" / "h200-gpu")
    # as if measured with the current ring: the committed runs predate the ring-wait change (test_ring_page checks
    # that label), and this test reads what the page states of its runs
    page = build_page(metrics, {**env, "git": {"commit": provenance.RING_WAIT_CODE, "dirty": False}})
    summary = " ".join(page.findings + [page.headline])
    for stale in ("in proportion", "530aee9", "older code"):
        assert stale not in summary, stale
    older = [section.heading for section in page.sections if "older code" in section.heading]
    assert older == ["Causal load balance: measured with older code (rev f620cad)"]
    # the config that communicates is defined first, the one that sends nothing says so
    definitions = page.about.split("Configs: ", 1)[1]
    assert definitions.startswith("'spanning'") and "travel around the ring" in definitions
    assert definitions.index("'longnet'") > 0 and "so its ring sends no byte" in definitions
    assert not any("final code" in note for note in page.notes)
    longest = next(section for section in page.sections if section.heading == "Longest sequence")
    assert "proportion" not in longest.conclusion
    assert longest.conclusion.index("spanning") < longest.conclusion.index("longnet")
    # a config whose ring sends nothing is not presented as a communication result
    communication = next(section for section in page.sections if section.heading == "Communication")
    assert communication.conclusion.startswith("What the ring sends (longnet sends no byte): spanning on 2 GPUs")
    assert "longnet on" not in communication.conclusion and "is not stated as a result" in communication.conclusion


@pytest.mark.parametrize("run", ["benchmark", "claims"])
def test_gpu_runs_without_a_revision_are_shown_as_older_code(run):
    page = build_page(*load_run(REPO / "reports" / run / "h200-gpu"))
    assert page.headline == page.findings[0] and "older code (rev unrecorded)" in page.headline
    assert "sdpa" not in page.headline and "auto" not in page.headline
    assert page.sections[0].heading == "Measured with older code (rev unrecorded)"
    assert any("sdpa" in line for line in page.sections[0].text) or run == "claims"


def test_a_model_estimate_confirms_no_claim():
    row = {"claim": "C10", "aspect": "O(n/p) memory per device",
           "configuration": "1M tokens, H=8, D=64, fp16, forward, model estimate", "claimed": "O(n/p)",
           "measured": "p=1: 1.00 GiB, p=2: 0.50 GiB", "verdict": "confirmed",
           "why": "per-rank memory from the ring model (an estimate, not a multi-GPU measurement)"}
    settled = claims_verdict.settle_row(row)
    assert settled["verdict"] == "inconclusive" and "not a measurement" in settled["why"]
    page = build_page(*load_run(REPO / "reports" / "claims" / "h200-gpu"))
    overview = next(s.table for s in page.sections if s.heading.startswith("Claimed vs measured"))
    c10 = overview.set_index(overview["claim"].str[:4]).loc["C10:"]
    assert c10["verdict"] != "confirmed"
    # its reason names why the row settles nothing (an estimate), not a missing interval it never needed
    assert c10["reason"].startswith("1 row inconclusive (a model estimate, not a measurement); 1 row not reproducible")
    assert "no interval recorded" not in c10["reason"] and ". p=1 runs no ring buffers." in c10["reason"]


@pytest.mark.parametrize("run, device_words", [
    (REPO / "reports" / "claims" / "h200-gpu", "measured on the GPU"),
    (REPO / "reports" / "default" / "20261125T201010Z-9391a95-3de4" / "claims-small", "on a CPU"),
])
def test_c12_reason_follows_the_device_of_its_row(run, device_words):
    """The GPU run's C12 row (configuration '..., cuda') is not explained as a CPU measurement, and the CPU run's is."""
    metrics, env = load_run(run)
    row = next(r for r in metrics["tables"]["claims"]["rows"] if r["claim"] == "C12")
    assert ("cuda" in row["configuration"]) == (device_words == "measured on the GPU")
    page = build_page(metrics, env)
    overview = next(s.table for s in page.sections if s.heading.startswith("Claimed vs measured"))
    reason = overview.set_index(overview["claim"].str[:4]).loc["C12:"]["reason"]
    assert device_words.lower() in reason.lower()
    assert ("on a cpu" in reason.lower()) == (device_words == "on a CPU")
    assert claims_verdict.device_reason("cuda:0") != claims_verdict.device_reason("cpu")


TRAINING_RUN = REPO / "reports" / "default" / "20261125T201010Z-9391a95-3de4" / "training"


def test_training_findings_quote_no_older_cost_figure_and_no_unsupported_conclusion():
    page = build_page(*load_run(TRAINING_RUN))
    summary = " ".join(page.findings)
    assert "trains 4M" not in summary and "does not change the training" not in summary
    headings = {section.heading.split(":")[0]: section for section in page.sections}
    assert headings["Longest trainable sequence"].heading.endswith("measured with older code (rev unrecorded)")
    assert "length probe" in headings["Longest trainable sequence"].conclusion
    ring = headings["Ring attention against one GPU"]
    assert ring.heading.endswith("measured with older code (rev ca29081 + uncommitted changes)")
    assert "neither run learned" in ring.conclusion and "does not change" not in ring.conclusion
    assert headings["Training throughput and memory"].heading.endswith("(rev ca29081 + uncommitted changes)")
    # seeds shown where they disagree; a contrast resting on one seed says so; both 128K fine-tunes shown
    assert any("seeds 99.8, 64.5, 100.0%" in line and "rests on one seed" in line for line in page.findings)
    assert any("88.7% [85.6, 91.1]" in line and "97.3%" in line for line in page.findings)


def test_length_probe_keeps_its_own_command_and_no_revision_it_did_not_record():
    from hilbert_lab.reports.provenance import NOT_RECORDED
    from hilbert_lab.reports.training import load_runs
    from hilbert_lab.reports.training_length import longest_trainable_sections, longest_trainable_table

    groups = load_runs({"128K": {"fine-tune": "reports/results/train_gpu_h100_128k.json"}})
    table = longest_trainable_table(groups)
    assert set(table["revision"]) == {NOT_RECORDED} and set(table["stored_in"]) == {"train_gpu_h100_128k.json"}
    assert all("--probe-lengths" in command and "longest_h100.json" in command for command in table["command"])
    metrics = {"tables": {"longest_trainable": {"columns": list(table.columns),
                                                "rows": table.to_dict(orient="records")}}}
    (section,), findings = longest_trainable_sections(metrics)
    assert findings == [] and section.heading.endswith("measured with older code (rev unrecorded)")
    assert "stored in train_gpu_h100_128k.json" in section.conclusion
    assert "The file that command names is not in the repository" in section.conclusion


def test_a_contrast_carried_by_one_seed_is_named():
    from hilbert_lab.reports.training_grid import seed_contrast

    dilated = {"row": "dilated", "accuracy": 0.965, "accuracy_low": 0.955, "accuracy_high": 0.974,
               "run_accuracies": [0.984, 0.941, 0.971]}
    dense = {"row": "dense", "accuracy": 0.881, "accuracy_low": 0.864, "accuracy_high": 0.896,
             "run_accuracies": [0.998, 0.645, 1.0]}
    assert "only through one dense seed (64.5%)" in seed_contrast(dilated, dense)
    assert seed_contrast(dilated, {**dense, "run_accuracies": [0.80, 0.85, 0.90]}) is None  # every seed behind
    assert seed_contrast(dilated, {**dense, "accuracy_high": 0.96}) is None  # pooled intervals overlap


def test_readme_headline_shows_disagreeing_seeds_and_every_fine_tune():
    import json

    flat = " ".join((REPO / "README.md").read_text().split())
    rows = json.loads((REPO / "reports" / "results" / "retrieval_grid_h100.json").read_text())["rows"]
    for name, label in (("gpu-32k-dil8-long1k", "dilated"), ("gpu-32k", "dense top")):
        pooled = rows[name]["pooled"]
        seeds = ", ".join(f"{a:.3f}" for a in pooled["run_accuracies"])
        assert seeds in flat, f"{label}: seeds {seeds} not shown"
    assert "the contrast rests on one seed" in flat
    for name in ("train_gpu_h100_128k.json", "train_gpu_h100_128k_seed1.json"):
        final = json.loads((REPO / "reports" / "results" / name).read_text())["training"]["final_eval"]
        assert f"{final['accuracy']:.3f} [{final['accuracy_low']:.3f}, {final['accuracy_high']:.3f}]" in flat, name


DEFAULT_RUN = TRAINING_RUN.parent


def test_serialization_page_explains_chance_ranks_only_disjoint_intervals_and_names_renamed_files():
    import re

    page = build_page(*load_run(DEFAULT_RUN / "serialization-small"))
    trained = [s for s in page.sections if s.heading.startswith("Trained comparison on") and s.figure is not None]
    assert trained
    for section in trained:
        assert any(line.startswith("The dashed line at 0.5 is chance: ") for line in section.text)
        for line in (t for t in section.text if t.startswith("Ranking, ")):
            entries = re.findall(r"(\d\.\d{3}) \[(\d\.\d{3}), (\d\.\d{3})\]", line)
            signs = re.findall(r"\] ([>~]) ", line)
            assert len(signs) == len(entries) - 1 > 0, line
            for (_m, low, _h), (_m2, _l2, high), sign in zip(entries, entries[1:], signs):
                assert (sign == ">") == (float(low) > float(high)), line
    text = " ".join(page.findings + [s.conclusion for s in page.sections] + [t for s in page.sections for t in s.text])
    assert "rowmajor" not in text and "hilbert/hilbert-trans" not in text
    cpu = next(source for source in page.sources if "serialization_cpu.json" in source["what"])
    assert "its command wrote serialization_cpu_300.json, committed as serialization_cpu.json" in cpu["what"]


def test_locality_findings_say_where_the_winner_loses():
    page = build_page(*load_run(DEFAULT_RUN / "locality"))
    assert page.findings[0].startswith("Hilbert has 49% fewer LRU misses than row-major")
    assert page.findings[1].startswith("Where Hilbert loses: Hilbert has 19% more LRU misses than row-major "
                                       "(2,444 vs 2,048)")
    assert "at 5 of 18 (configuration, cache) points" in page.findings[1]


def _ab_metrics(interleaved, separate):
    """A benchmark run: the hilbert layout timed against identity alternately (interleaved) and in separate runs."""
    (identity, ordered), (identity_alone, ordered_alone) = interleaved, separate
    rows = [{"seq_len": 512, "mode": "longnet", "backend": "auto", "ordering": "hilbert",
             "identity_times_ms": list(identity), "ordered_times_ms": list(ordered), "max_abs_difference": 0.0}]
    results = [{"backend": "auto", "seq_len": 512, "mode": "longnet", "ordering": name, "pass": "forward",
                "status": "ok", "median_ms": float(sorted(times)[len(times) // 2]), "times_ms": list(times),
                "tokens_per_s": 1.0, "useful_tflops": 1.0, "peak_mib": None, "error": ""}
               for name, times in (("identity", identity_alone), ("hilbert", ordered_alone))]
    return {"report": "benchmark", "parameters": {"device": "cpu", "repeats": len(identity)},
            "tables": {"ordering_ab": {"rows": rows}, "results": {"rows": results}}}


def test_benchmark_card_says_not_settled_when_the_two_timings_disagree():
    import numpy as np

    from hilbert_lab.reports import benchmark_page

    env = {"device": {"device": "cpu"}, "cpu": {"model": "test", "usable_cores": 2}, "git": {"commit": _head()}}
    rng = np.random.default_rng(0)
    slower = (rng.normal(10, 0.1, 21), rng.normal(11, 0.1, 21))
    noise = (rng.lognormal(2.3, 0.3, 21), rng.lognormal(2.3, 0.3, 21))
    page = benchmark_page.render(_ab_metrics(slower, noise), env)
    assert "not settled in 1 of 1 comparisons" in page.headline and "slower" not in page.headline.split(":")[1][:40]
    assert "not settled at 512 tokens (auto)" in page.headline
    agreed = benchmark_page.render(_ab_metrics(slower, (rng.normal(10, 0.1, 21), rng.normal(11, 0.1, 21))), env)
    assert "slower in 1 of 1 comparisons" in agreed.headline and "not settled" not in agreed.headline
    steady = (rng.normal(10, 0.1, 21), rng.normal(10, 0.1, 21))
    same = benchmark_page.render(_ab_metrics(steady, steady), env)
    assert "no different in 1 of 1" in same.headline  # an interval holding 1, within 5% of it: no difference
    wide = benchmark_page.render(_ab_metrics(noise, steady), env)  # holds 1, but 10-20% either way: open
    assert "not settled in 1 of 1 comparisons" in wide.headline and "no different" not in wide.headline
    assert "its interval still spans 1 by more than 5% after 21 rounds" in wide.headline


def test_memory_differences_below_the_resolution_are_no_difference():
    from hilbert_lab.reports.page import memory_change, memory_resolution_mib

    assert memory_resolution_mib("cpu") == 16 and memory_resolution_mib("torch.cuda.max_memory_allocated") < 0.001
    assert memory_change(268, 280, 16).startswith("no difference (268 -> 280 MiB")
    assert memory_change(3, 5.85, 16).startswith("no difference")
    assert memory_change(432, 593, memory_resolution_mib("cuda")) == "37.3% higher (432 -> 593 MiB)"
    claims = build_page(*load_run(DEFAULT_RUN / "claims-small"))
    overview = next(s.table for s in claims.sections if s.heading.startswith("Claimed vs measured"))
    c6 = overview.set_index(overview["claim"].str[:3]).loc["C6:"]
    assert "no difference (268 -> 280 MiB, within the 16 MiB resolution" in c6["measured"]
    bench = build_page(*load_run(DEFAULT_RUN / "benchmark-small"))
    memory = next(s for s in bench.sections if s.heading == "Peak memory").conclusion
    assert "Hilbert against identity (auto): no difference (1 -> 8.81 MiB" in memory


@pytest.mark.slow  # builds every page of the committed runs
def test_committed_accuracy_findings_carry_their_revision():
    training = build_page(*load_run(TRAINING_RUN))
    assert training.headline.endswith("(32K grid on H100, trained at rev 8043871 + uncommitted changes).")
    assert any(line.startswith("Runs evaluated with answer counts") and "trained at rev 8043871" in line
               for line in training.findings)
    serialization = build_page(*load_run(DEFAULT_RUN / "serialization-small"))
    assert serialization.headline.startswith("Trained on NVIDIA H100 80GB HBM3 (3 seeds, rev 0ceb35e + uncommitted "
                                             "changes)")


@pytest.mark.slow  # builds every page of the committed runs
def test_every_page_names_orderings_by_their_display_name():
    import re

    for run in ("benchmark-small", "locality", "serialization-small"):
        page = build_page(*load_run(DEFAULT_RUN / run))
        text = " ".join(page.findings + [page.about] + [s.conclusion for s in page.sections]
                        + [t for s in page.sections for t in s.text])
        legends = [trace.name for s in page.sections if s.figure is not None for trace in s.figure.data
                   if trace.name]
        for words in [text] + legends:
            assert not re.search(r"\b(rowmajor|dilation_major|hilbert/hilbert-trans)\b", words), (run, words[:200])
            assert not re.search(r"(?<![\w/-])hilbert(?![\w/-])", words), (run, words[:200])


def test_a_page_drawn_from_other_runs_names_their_revisions_and_dates_in_its_header():
    from hilbert_lab.reports.html import page_html

    metrics, env = load_run(REPO / "reports" / "ring" / "h200-gpu")
    page = build_page(metrics, env)
    assert page.sources and not page.measured_here
    header = page_html(page, env).split("<p class='meta'>", 1)[1].split("</p>", 1)[0]
    revisions = {html.escape(source["revision"]) for source in page.sources}
    dates = {html.escape(source["recorded"]) for source in page.sources}
    assert all(revision in header for revision in revisions) and all(date in header for date in dates), header
    assert header.count("git ") == 1 and "f620cad" in header and "5a4f58b" in header, header


def _committed_runs() -> list[Path]:
    return sorted({path.parent for path in (REPO / "reports").rglob("metrics.json")})


@pytest.mark.parametrize("run", _committed_runs(), ids=lambda run: str(run.relative_to(REPO / "reports")))
def test_every_committed_page_draws_each_ordering_in_its_colour_under_its_display_name(run):
    """The benchmark page drew 'auto / Hilbert' in plotly's red in one chart and #1f77b4 in the next, and the
    serialization tables showed 'rowmajor', 'hilbert/hilbert-trans': every series and cell naming an ordering
    uses its display name, and every series its colour from viz.style.ORDERING_COLOURS."""
    from hilbert_lab.viz.style import ordering_figure_problems, ordering_table_problems

    page = build_page(*load_run(run))
    problems = []
    for section in page.sections:
        if section.figure is not None:
            problems += [f"{section.heading}: {p}" for p in ordering_figure_problems(section.figure)]
        if section.table is not None:
            problems += [f"{section.heading}: {p}" for p in ordering_table_problems(section.table)]
    assert problems == [], problems[:5]


def test_benchmark_page_draws_one_ordering_in_one_colour_in_every_chart():
    from hilbert_lab.viz.style import ORDERING_COLOURS

    page = build_page(*load_run(REPO / "reports" / "default" / "20261125T201010Z-9391a95-3de4" / "benchmark-small"))
    colours: dict[str, set] = {}
    for section in page.sections:
        for trace in (section.figure.data if section.figure is not None else []):
            for ordering in ("identity", "Hilbert"):
                if f" / {ordering}" in str(trace.name).split(" (on top of ")[0]:
                    colours.setdefault(ordering, set()).add(trace.line.color)
    assert colours == {"identity": {ORDERING_COLOURS["identity"]}, "Hilbert": {ORDERING_COLOURS["hilbert"]}}


def test_ring_throughput_and_memory_axes_start_at_zero():
    """Two points (1 and 2 GPUs) on an autoranged axis fill the plot from the lower to the higher value: a small
    change looks like a collapse. The per-GPU axes start at zero."""
    page = build_page(*load_run(REPO / "reports" / "ring" / "h200-gpu"))
    sections = [s for s in page.sections if s.heading.startswith(("Throughput per GPU", "Memory per GPU"))]
    assert len(sections) == 2
    for section in sections:
        values = [v for trace in section.figure.data for v in trace.y]
        assert min(values) > 0  # autorange would not reach zero on its own
        assert section.figure.layout.yaxis.rangemode == "tozero", section.heading


def test_length_probe_series_is_labelled_as_the_probe_not_the_run_it_was_stored_in():
    """The probe's rows sit in the JSON of 'H100 128K dil8 fine-tune (32K seed 0)': its legend named that run.
    The series says what it is, on which device, and by which revision (unrecorded there)."""
    from hilbert_lab.reports.training_length import probe_label

    metrics, env = load_run(TRAINING_RUN)
    rows = metrics["tables"]["longest_trainable"]["rows"]
    stored_in, device = rows[0]["run"], rows[0]["device"]
    assert "fine-tune" in stored_in and "revision" not in rows[0]
    page = build_page(metrics, env)
    section = next(s for s in page.sections if s.heading.startswith("Longest trainable sequence"))
    names = {str(trace.name) for trace in section.figure.data}
    assert names == {f"length probe, {device}, rev unrecorded", f"length probe, {device}, rev unrecorded: failed"}
    assert not any(stored_in in name or "seed" in name for name in names)
    assert probe_label({"device": "NVIDIA H200", "revision": "ca29081 + uncommitted changes (results committed in "
                                                             "91678e4)"}) == \
        "length probe, NVIDIA H200, rev ca29081 + uncommitted changes"
    assert probe_label({"device": None, "revision": "not recorded (older run)"}) == "length probe, GPU, rev unrecorded"
