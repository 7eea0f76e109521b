"""The ring page against the committed bench_ring.py files it is drawn from: the context-parallel modes table
and finding (ring, head-parallel, hybrid; skipped modes with their reason), the mode of each correctness row,
the longest sequence on 1, 2 and 4 GPUs (a run that reached the search's limit said to be a lower bound), and
longest-sequence rows of an older revision shown under their older-code label and quoted by no finding or index
card."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="plotly (notebooks extra) draws the figures")

from hilbert_lab.reports.page import fmt, fmt_count, fmt_interval  # noqa: E402
from hilbert_lab.reports.render import build_page, load_run  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "reports" / "results"
RUN = REPO / "reports" / "ring" / "h200-gpu"
LABEL = "measured with older code (rev 530aee9 + uncommitted changes)"


def _raw(name: str) -> dict:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


def _at_ring_wait_code(env: dict) -> dict:
    """`env` as if its runs were measured with the current ring (the committed runs predate the change that
    stopped the host waiting for each ring step: as they are, the whole page goes under the older-code label)."""
    from hilbert_lab.reports.provenance import RING_WAIT_CODE

    return {**env, "git": {"commit": RING_WAIT_CODE, "dirty": False}}


@pytest.fixture(scope="module")
def page():
    metrics, env = load_run(RUN)
    return build_page(metrics, _at_ring_wait_code(env))


def test_the_committed_runs_predate_the_ring_wait_change_and_are_labelled_so():
    from hilbert_lab.reports.provenance import RING_WAIT_CODE

    page = build_page(*load_run(RUN))
    assert page.headline == page.findings[0]
    assert page.headline.startswith("Every figure on this page was measured with older code (rev 5a4f58b), before the "
                                    "ring's steps stopped making the host wait for each transfer "
                                    f"({RING_WAIT_CODE[:7]})")
    assert all(section.heading.endswith("measured with older code (rev 5a4f58b)") for section in page.sections[1:])


def _section(page, start: str):
    return next(section for section in page.sections if section.heading.startswith(start))


def test_parallel_modes_table_is_the_json(page):
    table = _section(page, "Ring, head-parallel and hybrid").table
    names = {"ring": "ring", "ulysses": "head-parallel (Ulysses)", "hybrid": "hybrid (ring 2 x Ulysses 2)"}
    seen = 0
    for gpus in (2, 4):
        raw = _raw(f"ring_{gpus}gpu_h200.json")["parallel_modes"]
        for config, block in raw.items():
            for mode in ("ring", "ulysses", "hybrid"):
                rows = table[(table["GPUs"] == gpus) & (table["config"] == config)
                             & table["mode"].str.startswith(names[mode].split(" (")[0])]
                assert len(rows) == 1, (gpus, config, mode)
                row = rows.iloc[0]
                assert row["tokens"] == block["seq_len"] == 2**20
                if mode in block.get("skipped", {}):
                    assert gpus == 2 and mode == "hybrid" and row["skipped because"] == block["skipped"][mode]
                    assert row["step ms [95%]"] == "-" and row["speed vs ring [95%]"] == "-"
                    continue
                entry = block[mode]
                assert row["mode"] == names[mode]
                assert row["step ms [95%]"] == fmt_interval(entry["median_ms"], *entry["ci_ms"])
                assert row["sent per rank (MiB)"] == fmt(entry["bytes_sent_max_rank"] / 2**20)
                assert row["mesh (ring x Ulysses)"] == (" x ".join(map(str, entry["mesh"])) if "mesh" in entry else "-")
                if mode == "ring":
                    assert row["speed vs ring [95%]"] == "reference"
                else:
                    versus = entry["speed_vs_ring"]
                    low, high = versus["ci"]
                    assert row["speed vs ring [95%]"] == f"{versus['ratio']:.3f} [{low:.3f}, {high:.3f}]"
                    assert row["verdict"] == {"A faster": "slower than the ring",
                                              "B faster": "faster than the ring"}[versus["verdict"]]
                seen += 1
    assert seen == 10 and len(table) == 12


def test_parallel_modes_finding_states_the_fastest_mode_with_intervals_and_the_skipped_hybrid(page):
    finding = page.findings[0]
    assert finding.startswith("Context-parallel modes") and page.headline.startswith("Context-parallel modes")
    # the config whose ring sends keys/values comes first; the one that sends nothing says so
    assert finding.index("spanning at 1M tokens") < finding.index("longnet at 1M tokens")
    for gpus in (2, 4):
        raw = _raw(f"ring_{gpus}gpu_h200.json")["parallel_modes"]
        for config, block in raw.items():
            others = [block[mode] for mode in ("ulysses", "hybrid") if mode in block]
            assert all(entry["speed_vs_ring"]["verdict"] == "A faster" for entry in others)  # the ring fastest
            part = finding.split(f"{config} at 1M tokens: ")[1].split(f"on {gpus} GPUs ")[1].split(")")[0]
            assert part.startswith("the ring is fastest ("), part
            sent = block["ring"]["bytes_sent_max_rank"]
            assert (f"the ring sends {fmt(sent / 2**20)} MiB per rank" if sent else "the ring sends nothing") in part
            for entry in others:
                low, high = entry["speed_vs_ring"]["ci"]
                assert f"{entry['speed_vs_ring']['ratio']:.3f} [{low:.3f}, {high:.3f}]" in finding
    reason = _raw("ring_2gpu_h200.json")["parallel_modes"]["longnet"]["skipped"]["hybrid"]
    assert f"The hybrid did not run on 2 GPUs ({reason.split(': ', 1)[1]})." in finding
    assert "longnet" not in page.headline and "spanning at 1M tokens" in page.headline


def test_correctness_rows_show_their_mode(page):
    table = _section(page, "Correctness").table
    names = {"ring": "ring", "ulysses": "head-parallel (Ulysses)", "hybrid": "hybrid (ring 2 x Ulysses 2)"}
    expected = []
    for gpus in (2, 4):
        for key, check in _raw(f"ring_{gpus}gpu_h200.json")["correctness"].items():
            if "skipped" in check:
                continue
            check_name = key.removeprefix(f"{check['parallel']}_").replace("_", " ")
            expected += [(gpus, names[check["parallel"]], check_name, tensor) for tensor in check["max_abs_error"]]
    assert sorted(zip(table["GPUs"], table["mode"], table["check"], table["tensor"])) == sorted(expected)
    assert set(table["mode"]) == set(names.values())
    assert "hybrid skipped on 2 GPUs" in _section(page, "Correctness").conclusion


def test_throughput_finding_gives_the_per_gpu_ratios_of_1_2_and_4_gpus(page):
    finding = next(line for line in page.findings if line.startswith("Tokens/s per GPU"))
    for config in ("longnet", "spanning"):
        ratios = [_raw(f"ring_{gpus}gpu_h200.json")["ratios_vs_baseline"][config][str(2**20)] for gpus in (2, 4)]
        assert f"(per GPU over one GPU: {ratios[0]:.2f} on 2, {ratios[1]:.2f} on 4)" in finding, config
    communication = next(line for line in page.findings if line.startswith("What the ring sends"))
    shares = {row["seq_len"]: row["hidden_share"] for row in _raw("ring_4gpu_h200.json")["throughput"]["spanning"]}
    assert f"on 4 GPUs {fmt(shares[2**19])} at 512K, {fmt(shares[2**20])} at 1M" in communication


OLD_GIT = {"commit": "530aee9cc7654194312dc063ce92929560f35304", "dirty": True}
CURRENT = [RESULTS / name for name in ("ring_1gpu_h200.json", "ring_2gpu_h200.json", "ring_4gpu_h200.json",
                                       "ring_4gpu_layouts_h200.json")]


def _older_copy(tmp_path: Path, name: str) -> Path:
    """`name` as if measured at rev 530aee9 with uncommitted changes."""
    data = _raw(name)
    data["environment"]["git"] = dict(OLD_GIT)
    path = tmp_path / name.replace(".json", "_530aee9.json")
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_longest_sequence_is_the_json_and_a_run_at_the_search_limit_is_a_lower_bound(page):
    section = _section(page, "Longest sequence")
    assert section.heading == "Longest sequence"
    runs = {gpus: _raw(f"ring_{gpus}gpu_longest_h200.json") for gpus in (1, 2, 4)}
    heights = {trace.name: dict(zip(trace.x, trace.y)) for trace in section.figure.data}
    assert heights == {variant: {str(gpus): runs[gpus]["longest"][variant]["seq_len"] for gpus in (1, 2, 4)}
                       for variant in ("longnet", "spanning")}
    for gpus, run in runs.items():
        for variant, entry in run["longest"].items():
            at_limit = entry["seq_len"] >= run["config"]["max_limit"]
            words = f"{fmt_count(entry['seq_len'])} tokens on {gpus} GPU{'s' if gpus > 1 else ''}"
            text = section.conclusion.split(f"{variant} (", 1)[1].split(";")[0]
            assert (words + " (the search's limit: a lower bound)" in text) == at_limit and words in text, text
    assert runs[4]["longest"]["longnet"]["seq_len"] >= runs[4]["config"]["max_limit"]  # the 4-GPU search hit it


def test_longest_sequence_of_older_code_is_labelled_and_quoted_by_no_finding_or_card(tmp_path):
    from hilbert_lab.reports.render import render_suite_index
    from hilbert_lab.reports.ring import write_ring_run

    older = [_older_copy(tmp_path, f"ring_{gpus}gpu_longest_h200.json") for gpus in (1, 2)]
    run = write_ring_run(CURRENT + older, tmp_path / "run")
    env = json.loads((run / "env.json").read_text(encoding="utf-8"))
    (run / "env.json").write_text(json.dumps(_at_ring_wait_code(env)), encoding="utf-8")
    page = build_page(*load_run(run))
    section = _section(page, "Longest sequence")
    assert section.heading == f"Longest sequence: {LABEL}" and LABEL in section.figure.layout.title.text
    assert not any(LABEL in line or "older code" in line for line in page.findings + [page.headline])
    sources = [source for source in page.sources if "530aee9" in source["what"]]
    assert len(sources) == 2 and all(f"its longest sequence only, {LABEL}" in source["what"] for source in sources)
    index = render_suite_index(tmp_path / "index", [], title="ring", gpu_runs=[run]).read_text(encoding="utf-8")
    card = index.split("Ring attention across GPUs", 1)[1].split("</div>", 1)[0]
    assert "Context-parallel modes" in card and "older code" not in card


def test_only_older_files_put_the_whole_page_under_their_label(tmp_path):
    from hilbert_lab.reports.ring import render, ring_run

    metrics, env = ring_run([_older_copy(tmp_path, f"ring_{gpus}gpu_h200.json") for gpus in (1, 2)])
    assert metrics["tables"]["throughput"]["rows"] and metrics["tables"]["parallel_modes"]["rows"]
    page = render(metrics, env)
    assert LABEL in page.headline
    assert all(section.heading.endswith(LABEL) for section in page.sections[1:])
    assert not any(section.heading.count("older code") > 1 for section in page.sections)


def test_anchor_verdicts_are_worded_against_their_reference(page):
    from hilbert_lab.bench.stats import verdict_sentence
    from hilbert_lab.reports.ring_anchors import implementation_name

    cp = _section(page, "Against PyTorch's context parallelism").table
    layouts = _section(page, "Causal load balance").table
    seen = 0
    for name in ("ring_2gpu_h200.json", "ring_4gpu_h200.json", "ring_4gpu_layouts_h200.json"):
        raw = _raw(name)
        gpus = raw["environment"]["world_size"]
        for section, reference, table in (("context_parallel", "ring_zigzag", cp),
                                          ("causal_layouts", "contiguous", layouts)):
            for variant, entry in (raw.get(section) or {}).items():
                if not isinstance(entry, dict) or "median_ms" not in entry:
                    continue
                row = table[(table["GPUs"] == gpus) & (table["implementation"] == implementation_name(variant))]
                versus = entry.get(f"speed_vs_{reference}")
                expected = verdict_sentence(versus["verdict"], "the reference") if versus else "reference"
                assert row["verdict"].tolist() == [expected], (name, variant)
                seen += 1
    assert seen == 16
    finding = next(line for line in page.findings if line.startswith("Dense causal attention"))
    assert finding.count("(PyTorch faster than ours)") == 2
    balance = _section(page, "Causal load balance").conclusion  # older zigzag code: a section, no finding
    assert "(zigzag faster than contiguous)" in balance and "(zigzag slower than contiguous)" in balance
    assert not any(line.startswith("Causal spanning pattern") for line in page.findings)


def test_zigzag_timings_before_the_zigzag_change_are_labelled_older_code():
    import pandas as pd

    from hilbert_lab.reports.provenance import ZIGZAG_CODE
    from hilbert_lab.reports.ring_anchors import anchor_rows, layouts_section

    data = json.loads((RESULTS / "ring_4gpu_layouts_h200.json").read_text())
    section, finding = layouts_section(pd.DataFrame(anchor_rows(data, 4)))
    assert section.heading == "Causal load balance: measured with older code (rev f620cad)" and finding is None
    assert section.conclusion.endswith("(zigzag slower than contiguous). The zigzag path has changed since.")
    data["environment"]["git"]["commit"] = ZIGZAG_CODE
    section, finding = layouts_section(pd.DataFrame(anchor_rows(data, 4)))
    assert section.heading == "Causal load balance" and finding == section.conclusion
    assert finding + " The zigzag path has changed since." == layouts_section(
        pd.DataFrame(anchor_rows(json.loads((RESULTS / "ring_4gpu_layouts_h200.json").read_text()), 4)))[0].conclusion
