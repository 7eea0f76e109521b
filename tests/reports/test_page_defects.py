"""The pages as a reader gets them (the committed default run rendered with the committed GPU runs, as
`make report` writes them): findings first, numbers that agree with each other, no machine's paths, one
plotly.js per run folder. Each test names the defect it guards against."""
from __future__ import annotations

import html as html_lib
import importlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="plotly renders the pages")
pytestmark = pytest.mark.slow  # the committed run rendered whole (tens of seconds)

REPO = Path(__file__).resolve().parents[2]
RATIO = re.compile(r"(\d+(?:\.\d+)?)x \[(\d+(?:\.\d+)?), (\d+(?:\.\d+)?)\]")


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    from hilbert_lab.reports.render import render_suite_index

    runs = sorted((REPO / "reports" / "default").glob("*/metrics.json"))
    if not runs:
        pytest.skip("no committed reports/default run to render")
    target = tmp_path_factory.mktemp("suite") / runs[-1].parent.name
    shutil.copytree(runs[-1].parent, target, ignore=shutil.ignore_patterns("*.html", "*.ipynb", "*.js"))
    render_suite_index(target, list(json.loads((target / "metrics.json").read_text())["parts"]),
                       title="hilbert_lab reports (default)")
    return target


def _text(markup: str) -> str:
    """What a reader can read: no scripts, styles or tags."""
    markup = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", markup, flags=re.DOTALL)
    return html_lib.unescape(re.sub(r"<[^>]+>", " ", markup))


def _pages(suite: Path) -> dict[str, str]:
    return {path.relative_to(suite).as_posix(): path.read_text(encoding="utf-8") for path in sorted(suite.rglob("*.html"))}


def _page(suite: Path, start: str) -> str:
    return next(markup for name, markup in _pages(suite).items() if name.startswith(start))


def test_one_plotly_js_per_run_folder_loaded_relatively(suite):
    """Each page used to inline its own 4.9 MB plotly.js (65 MB a run)."""
    bundles = [path for path in suite.rglob("*") if path.is_file() and b"plotly.js v" in path.read_bytes()[:300]]
    assert [path.relative_to(suite).as_posix() for path in bundles] == ["plotly.min.js"]
    for name, markup in _pages(suite).items():
        sources = re.findall(r"<script[^>]*\ssrc='([^']+)'", markup)
        if "Plotly.newPlot" in markup:
            assert len(sources) == 1 and (suite / name).parent.joinpath(sources[0]).resolve() == bundles[0].resolve()
        assert "plotly.js v" not in markup[:200_000], name
    assert sum(path.stat().st_size for path in suite.rglob("*") if path.is_file()) < 15 * 2**20


def test_pages_lead_with_at_most_five_findings(suite):
    for name, markup in _pages(suite).items():
        if name == "index.html":
            continue
        body = markup.split("<h2>Findings</h2>", 1)
        assert len(body) == 2 and "<h2>" not in markup.split("<h2>Findings</h2>")[0], name
        findings = re.findall(r"<li>(.*?)</li>", body[1].split("</ul>")[0])
        assert 1 <= len(findings) <= 5 and all(re.search(r"\d", finding) for finding in findings), (name, findings)


def _finding(suite: Path, page: str, start: str) -> str:
    """The finding of `page` that starts with `start`, as a reader reads it; figures of older code, which no
    finding quotes, are read from the paragraphs of their sections."""
    markup = _pages(suite)[page]
    items = re.findall(r"<li>(.*?)</li>", markup.split("<h2>Findings</h2>", 1)[1].split("</ul>")[0])
    paragraphs = re.findall(r"<p[^>]*>(.*?)</p>", markup.split("<h2>Findings</h2>", 1)[1], re.DOTALL)
    return next(text for text in (_text(item).strip() for item in items + paragraphs) if text.startswith(start))


def _rows(suite: Path, part: str, table: str) -> list[dict]:
    return json.loads((suite / part / "metrics.json").read_text())["tables"][table]["rows"]


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def test_locality_finding_is_the_runs_miss_counts(suite):
    """A finding's counts and percentage must be the run's LRU misses, not a neighbouring configuration's."""
    text = _finding(suite, "locality/locality.html", "Hilbert has")
    share, hilbert, rowmajor, cache = re.search(
        r"(\d+)% fewer LRU misses than row-major \(([\d,]+) vs ([\d,]+)\) for window-8 attention on a 32x32 grid"
        r".* at a ([\d,]+)-line cache", text).groups()
    misses = {row["ordering"]: row["value"] for row in _rows(suite, "locality", "compare_orderings")
              if row["metric"] == "misses" and row["parameter"] == _number(cache)
              and row["configuration"].startswith("32x32, window 8,")}
    assert (_number(hilbert), _number(rowmajor)) == (misses["hilbert"], misses["rowmajor"])
    assert int(share) == round(100 * (1 - misses["hilbert"] / misses["rowmajor"]))


@pytest.mark.parametrize("page, metrics, short, long", [
    ("benchmark-small/benchmark-small.html", "benchmark-small/metrics.json", 512, 2048),
    ("gpu/benchmark-h200-gpu.html", "reports/benchmark/h200-gpu/metrics.json", 8192, 32768),
])
def test_benchmark_findings_are_the_medians_of_the_recorded_times(suite, page, metrics, short, long):
    """The fastest backend, its time, the ratio and the growth exponent, recomputed from the raw times."""
    import math
    import statistics

    source = suite / metrics if (suite / metrics).is_file() else REPO / metrics
    rows = [row for row in json.loads(source.read_text())["tables"]["results"]["rows"] if row["ordering"] == "identity"]
    median = {(row["backend"], row["seq_len"]): statistics.median(row["times_ms"]) for row in rows}
    text = _finding(suite, page, f"At {long:,} tokens")
    fastest, ms, low, high, ratio, slower = re.search(
        rf"At {long:,} tokens (\w+)(?: \(chose \w+\))? is the fastest backend, ([\d.]+) ms \[([\d.]+), ([\d.]+)\] "
        r"per call: ([\d.]+)x \[[\d., ]+\] faster than (\w+)", text).groups()
    at_long = {backend: value for (backend, seq_len), value in median.items() if seq_len == long}
    assert fastest == min(at_long, key=at_long.get) and set(at_long) == {fastest, slower}
    assert float(ms) == float(f"{at_long[fastest]:.3g}") and float(low) <= float(ms) <= float(high)
    assert float(ratio) == round(at_long[slower] / at_long[fastest], 2)
    text = _finding(suite, page, "Time grows like")
    exponent, backend = re.search(rf"N\^([\d.]+) \[[\d., ]+\] from {short:,} to {long:,} tokens for (\w+) / identity",
                                  text).groups()
    growth = math.log(median[(backend, long)] / median[(backend, short)]) / math.log(long / short)
    assert float(exponent) == round(growth, 2)


def test_training_main_result_is_its_rows_answers(suite):
    """The main result's accuracy, Wilson interval, seed spread and FLOPs share, from the row's seeds and answers."""
    import math

    text = _finding(suite, "training/training.html", "Main result")
    accuracy, low, high, answers, seeds, worst, best, flops = re.search(
        r"dilated r=8, 32K \(1K phase to step 1,600\) retrieves the needle at ([\d.]+)% \[([\d.]+), ([\d.]+)\] over "
        r"([\d,]+) answers \((\d+) seeds, seeds ([\d.]+)-([\d.]+)%\) with ([\d.]+)% of the dense-top config's attention "
        r"FLOPs", text).groups()
    grid = [row for row in _rows(suite, "training", "grid_rows") if row["grid"] == "32K grid on H100"]
    (row,) = [row for row in grid if row["curriculum"].startswith("1024:1600,") and row["dilation_rates"].endswith(",8")]
    runs = row["run_accuracies"]
    assert int(seeds) == len(runs) and _number(answers) == row["count"] and row["count"] % len(runs) == 0
    correct = sum(round(run * row["count"] / len(runs)) for run in runs)  # each seed answered count / seeds
    p, n, z = correct / row["count"], row["count"], 1.959964
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert (float(accuracy), float(low), float(high)) == (round(100 * p, 1), round(100 * (centre - half), 1),
                                                           round(100 * (centre + half), 1))
    assert (float(worst), float(best)) == (round(100 * min(runs), 1), round(100 * max(runs), 1))
    assert float(flops) == round(100 * row["flops_per_token"] / max(r["flops_per_token"] for r in grid), 1)


def test_serialization_finding_quotes_the_trained_intervals_and_they_are_disjoint(suite):
    """'ahead of ... (95% intervals disjoint)' must hold for the quoted intervals, which must be the table's."""
    text = _finding(suite, "serialization-small/serialization-small.html",
                    "Trained on NVIDIA H100 80GB HBM3 (3 seeds, rev 0ceb35e + uncommitted changes), 2D 48x48 image, "
                    "window 64:")
    rows = {row["ordering"]: row for row in _rows(suite, "serialization-small", "trained")
            if row["source"] == "GPU" and row["data"] == "2D 48x48 image" and row["window"] == "64"}
    from hilbert_lab.viz.style import ordering_name

    by_name = {ordering_name(ordering): ordering for ordering in rows}
    quoted_interval = r"(?:^|, | and )([A-Za-z][\w /()-]*?) ([\d.]+) \[([\d.]+), ([\d.]+)\]"
    ahead, behind = ([(by_name[name.strip()], *numbers) for name, *numbers in re.findall(quoted_interval, part.strip())]
                     for part in text.split(":", 1)[1].split(" ahead of "))
    assert {quoted[0] for quoted in ahead + behind} == set(rows)
    for name, mean, low, high in ahead + behind:
        assert (float(mean), float(low), float(high)) == tuple(round(rows[name][key], 3)
                                                               for key in ("mean", "low", "high"))
    assert min(rows[quoted[0]]["low"] for quoted in ahead) > max(rows[quoted[0]]["high"] for quoted in behind)


def test_ring_findings_are_the_raw_results_of_every_gpu_count(suite):
    """Memory, tokens/s per GPU and the longest sequence on the ring page, from the committed result files of 1, 2
    and 4 GPUs."""
    from hilbert_lab.reports.page import fmt

    raw = {gpus: json.loads((REPO / "reports" / "results" / f"ring_{gpus}gpu_h200.json").read_text()) for gpus in (1, 2, 4)}
    longest = {gpus: json.loads((REPO / "reports" / "results" / f"ring_{gpus}gpu_longest_h200.json").read_text())
               for gpus in (1, 2, 4)}
    page = "gpu/ring-h200-gpu.html"
    text = _finding(suite, page, "Longest sequence that runs")
    quoted = re.findall(r"(\w+) \(sends[^)]*\): ([\d.]+)M tokens on 1 GPU, ([\d.]+)M tokens on 2 GPUs, ([\d.]+)M "
                        r"tokens on 4 GPUs", text)
    assert {variant for variant, *_ in quoted} == {"longnet", "spanning"}, text
    for variant, *values in quoted:
        assert tuple(map(float, values)) == tuple(
            round(longest[gpus]["longest"][variant]["seq_len"] / 1e6, 1) for gpus in (1, 2, 4)), variant
    at_1m = {(gpus, name): next(row for row in rows if row["seq_len"] == 2**20)
             for gpus in (1, 2, 4) for name, rows in raw[gpus]["throughput"].items()}
    memory = re.findall(r"(\w+): ([\d.]+) GiB on 1 GPU -> ([\d.]+) GiB on 2 GPUs -> ([\d.]+) GiB on 4 GPUs",
                        _finding(suite, page, "Memory per GPU"))
    speed = re.findall(r"(\w+): ([\d.]+)M on 1 GPU, ([\d.]+)M on 2 GPUs, ([\d.]+)M on 4 GPUs",
                       _finding(suite, page, "Tokens/s per GPU"))
    assert {name for name, *_ in memory} == {name for name, *_ in speed} == {"longnet", "spanning"}
    for name, *values in memory:
        assert tuple(map(float, values)) == tuple(
            float(fmt(at_1m[(gpus, name)]["peak_memory_gib_max_rank"])) for gpus in (1, 2, 4)), name
    for name, *values in speed:
        assert tuple(map(float, values)) == tuple(
            round(at_1m[(gpus, name)]["tokens_per_s_per_gpu"] / 1e6, 2) for gpus in (1, 2, 4)), name


@pytest.mark.parametrize("page", ["claims-small/claims-small.html", "gpu/claims-h200-gpu.html"])
def test_claims_count_finding_is_the_tables_verdicts(suite, page):
    """'Of the predecessor's 12 claims, 1 holds (C10), 3 are refuted (...)': each count and list, from the
    verdicts of the page's own table (mostly confirmed or refuted count as such; inconclusive as not settled)."""
    markup = _pages(suite)[page]
    verdicts = {}
    for row in re.findall(r"<tr>(.*?)</tr>", markup.split("Claimed vs measured")[1].split("</table>")[0], re.DOTALL):
        cells = dict(re.findall(r"data-col=\"(\w[\w ]*)\">(.*?)</td>", row, re.DOTALL))
        if cells:
            verdicts[_text(cells["claim"]).split(":")[0]] = cells["verdict"]
    kinds = {"in part": {"partly confirmed"}, "hold": {"confirmed", "mostly confirmed"},
             "refuted": {"refuted", "mostly refuted"}}
    expected = {name: [claim for claim, verdict in verdicts.items() if verdict in wanted]
                for name, wanted in kinds.items()}
    expected["settled"] = [claim for claim in verdicts if not any(claim in claims for claims in expected.values())]
    text = _finding(suite, page, "Of the predecessor")
    assert text.startswith(f"Of the predecessor's {len(verdicts)} claims,") and len(verdicts) == 12
    quoted = re.findall(r"(\d+) ([a-z ]+?) (?:on [^(]+)?\(([^)]*)\)", text)
    assert len(quoted) == 4, text
    for count, phrase, listed in quoted:
        (name,) = [name for name in ("in part", "hold", "refuted", "settled") if name in phrase][:1]
        claims = sorted(expected[name], key=lambda claim: int(claim[1:]))
        assert int(count) == len(claims) and listed == (", ".join(claims) or "none"), (phrase, text)


def test_no_machine_paths_nan_values_or_empty_fields(suite):
    """Absolute paths of the rendering machine and of the GPU hosts, 'nan' as a value, '-' fields."""
    for name, markup in _pages(suite).items():
        text = _text(markup)
        assert not re.search(r"(?<![\w.])/(root|tmp|work|home|Users)/", text), (name, re.findall(r"/\w+/\S+", text)[:3])
        assert not re.search(r"(?<![\w.])nan(?![\w])", text, re.IGNORECASE), name
        assert not re.search(r"<th>[^<]+</th><td>-</td>", markup), (name, re.findall(r"<th>[^<]+</th><td>-</td>", markup))
        assert "git revision not recorded" not in text and "recorded (UTC) -" not in text, name


def test_committed_gpu_runs_state_revision_device_date_and_command(suite):
    """A single-GPU benchmark was listed as 'H200 x4'; revisions, dates and commands were missing."""
    for name in ("gpu/benchmark-h200-gpu.html", "gpu/claims-h200-gpu.html", "gpu/ring-h200-gpu.html"):
        text = _text(_pages(suite)[name])
        assert "x4" not in text and "H200, 1 GPU" in text, name
        assert "results committed in" in text and "hilbert-lab report run" in text or "bench_ring.py" in text, name
        assert re.search(r"2026-\d\d-\d\d \d\d:\d\d UTC", text), name


def test_pages_of_committed_runs_do_not_show_the_rendering_machine(suite):
    """The training page showed the rendering CPU as the environment of GPU runs."""
    text = _text(_pages(suite)["training/training.html"])
    assert "Environment of the run" not in text and "usable cores" not in text  # the rendering machine's CPU
    assert "Where the data come from" in text and "NVIDIA H100" in text


def test_index_separates_this_run_from_committed_gpu_results(suite):
    """Training and serialization cards sat under 'This run (CPU)' with GPU numbers; the training card gave
    the dense model (93.8%), not the main result; the locality card gave the mean step."""
    index = _pages(suite)["index.html"]
    here, committed = index.split("Committed GPU results")
    assert "training/training.html" not in here and "serialization" not in here.split("</h2>", 2)[-1]
    assert "training/training.html" in committed

    from hilbert_lab.reports.page import metrics_table, percent_interval
    from hilbert_lab.reports.training_grid import main_result

    rows = metrics_table(json.loads((suite / "training" / "metrics.json").read_text()), "grid_rows")
    best = main_result(rows)
    card = committed.split("training/training.html", 1)[1].split("</div>")[0]
    assert percent_interval(best["accuracy"], best["accuracy_low"], best["accuracy_high"]) in _text(card)
    locality = here.split("locality/locality.html", 1)[1].split("</div>")[0]
    assert "mean step" not in locality and "LRU misses" in locality


def test_ratios_carry_intervals_and_never_sit_unexplained_at_an_end(suite):
    """'0.95x [0.95, 1.27]' on the H200 page: the separate runs' repeats were paired by index."""
    for name, markup in _pages(suite).items():
        text = _text(markup)
        for match in RATIO.finditer(text):
            value, low, high = match.groups()
            if value in (low, high) and low != high:
                assert "end of its interval" in text[match.end():match.end() + 90], (name, match.group(0))


def test_claims_verdicts_and_reasons(suite):
    """A reason repeating one sentence 16 times, 'partly confirmed' with 1 of 8 rows confirmed, 'confirmed' at
    a ratio without interval, '-21.6% lower' for an increase, a module that no longer exists, C2 disagreeing
    between the CPU and GPU pages."""
    verdicts = {}
    for name in ("claims-small/claims-small.html", "gpu/claims-h200-gpu.html"):
        markup = _pages(suite)[name]
        text = _text(markup)
        assert not re.search(r"(?<![\d.])-\d+(\.\d+)?% lower", text) and "hilbert_lab.safety" not in text
        for row in re.findall(r"<tr>(.*?)</tr>", markup.split("Claimed vs measured")[1].split("</table>")[0], re.DOTALL):
            cells = dict(re.findall(r"data-col=\"(\w[\w ]*)\">(.*?)</td>", row, re.DOTALL))
            if not cells:  # the header
                continue
            claim, reason = _text(cells["claim"]).split(":")[0], _text(cells["reason"])
            sentences = [s.strip() for s in re.split(r"(?<=[.;])\s+", reason) if s.strip()]
            assert len(sentences) == len(set(sentences)), (name, claim, reason)
            verdict = cells["verdict"]
            verdicts[(name, claim)] = (verdict, reason.split(". ", 1)[-1])  # the why, after the row counts
            if verdict == "partly confirmed":
                assert "confirmed" in reason and "refuted" in reason, (name, claim, reason)
            if verdict == "confirmed":
                assert "no interval recorded" not in _text(cells["measured"]), (name, claim)
    assert verdicts[("claims-small/claims-small.html", "C2")] == verdicts[("gpu/claims-h200-gpu.html", "C2")]
    assert verdicts[("gpu/claims-h200-gpu.html", "C12")][0] == "inconclusive"
    assert verdicts[("gpu/claims-h200-gpu.html", "C5")][0] == "mostly refuted"


def test_package_names_on_the_pages_exist(suite):
    for name, markup in _pages(suite).items():
        for dotted in set(re.findall(r"hilbert_lab(?:\.\w+)+", _text(markup))):
            parts = dotted.split(".")
            for split in range(len(parts), 0, -1):
                try:
                    module = importlib.import_module(".".join(parts[:split]))
                except ImportError:
                    continue
                for attribute in parts[split:]:
                    module = getattr(module, attribute)
                break
            else:
                pytest.fail(f"{name} names {dotted}, which does not exist")


def test_h200_benchmark_names_autos_choice(suite):
    text = _text(_pages(suite)["gpu/benchmark-h200-gpu.html"])
    assert "auto (chose sdpa)" in text and "auto ran sdpa" in text


def test_ring_page_states_what_was_not_measured_once_and_no_noise_share(suite):
    markup = _pages(suite)["gpu/ring-h200-gpu.html"]
    assert "GPU(s): not measured" not in markup and "Not measured:" not in markup  # every section was measured
    assert "<th>hidden share</th>" not in markup and "tokens/s per GPU / 1 GPU" not in markup


def test_locality_charts_only_differences_and_names_metrics(suite):
    """Four bar charts of equal bars; a 296-row dump with snake_case names."""
    from hilbert_lab.reports.render import build_page, load_run

    page = build_page(*load_run(suite / "locality"))
    for section in page.sections:
        if section.figure is not None and section.figure.data and section.figure.data[0].type == "bar":
            heights = {value for trace in section.figure.data for value in trace.y}
            assert len(heights) > 1, section.heading
    every = next(section for section in page.sections if section.heading == "Every metric")
    assert every.collapsed and not any(re.search(r"\w_\w", str(v)) for v in every.table["metric"])
    assert not any("_" in ordering for ordering in every.table["ordering"])


def test_serialization_text_has_no_template_glitches_or_code_names(suite):
    text = _text(_page(suite, "serialization"))
    assert "the best Mean" not in text and "settings: Where" not in text and "recall@" not in text
    assert "serialization_table" not in text and "seconds_1M" not in text


def test_training_names_runs_by_pattern_and_shortens_failures(suite):
    text = _text(_pages(suite)["training/training.html"]).split("Where the data come from")[0]  # commands name ids
    assert not re.search(r"\b(gpu-32k|cpu-512)", text) and "dilated r=8, 32K" in text
    assert "CUDA out of memory" not in text and "PYTORCH_CUDA_ALLOC_CONF" not in text
    assert "Lowest final eval loss: H200" not in text  # a loss above chance is not "lowest"
    assert "No run's final eval loss is below chance" in text


def test_run_folders_are_ignored_by_git(tmp_path):
    """A `make report` run folder showed up as untracked."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    paths = ["reports/default/20990101T000000Z-abc1234-ab12/index.html",
             "reports/benchmark/20990101T000000Z-abc1234-ab12/metrics.json", "reports/ring/h200-gpu/plotly.min.js"]
    ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", *paths], capture_output=True,
                             text=True).stdout.split()
    assert ignored == paths
