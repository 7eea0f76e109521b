"""The README is a newcomer's page that stays true: its tour runs, its headline numbers are those of the
committed result files, it names what `make report` runs, it stays short and uses no undefined jargon."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
RESULTS = REPO / "reports" / "results"
FLAT = " ".join(README.split())  # whitespace-normalized, for phrases that wrap


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, flags=re.S | re.M)
    assert match, f"the README has no section {title!r}"
    return match.group(1)


def _blocks(text: str, language: str) -> list[str]:
    return [code for lang, code in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S) if lang == language]


TOUR = _section("A 5-minute tour (CPU)")


def test_the_tour_python_block_runs(tmp_path):
    (code,) = _blocks(TOUR, "python")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_tour_commands_run(tmp_path, monkeypatch, capsys):
    """Every `hilbert-lab` line of the tour (but `report run`, which tests/reports covers) exits 0."""
    from hilbert_lab.cli import main

    (shell,) = _blocks(TOUR, "bash")
    lines = [line.split("#")[0] for line in shell.splitlines() if line.startswith(".venv/bin/hilbert-lab ")]
    assert len(lines) >= 4
    monkeypatch.chdir(tmp_path)
    for line in lines:
        argv = shlex.split(line)[1:]
        if argv[:2] == ["report", "run"]:
            continue
        try:
            code = main(argv)
        except SystemExit as exit_:  # --help
            code = exit_.code
        out = capsys.readouterr().out
        assert code == 0, (line, out)
        for flag, value in zip(argv, argv[1:]):
            if flag == "--out":  # the tour writes inside the folder it runs in (build/ is git-ignored)
                assert not Path(value).is_absolute() and value.startswith("build/"), line
                assert (tmp_path / value).is_file(), line
        if argv[0] == "estimate":
            assert out.startswith("assumed: q, k, v of shape (B, N, H, D)"), out
    jupyter = next(line for line in shell.splitlines() if "jupyter lab" in line)
    assert "--allow-root" in jupyter  # JupyterLab refuses to start as root without it


def test_the_readme_is_a_short_page_with_the_reference_in_docs():
    assert len(README.splitlines()) <= 150
    for package in ("curves", "attention", "distributed", "locality", "models", "bench", "viz", "reports", "cli"):
        assert f"docs/{package}.md" in README and (REPO / "docs" / f"{package}.md").is_file()


@pytest.mark.parametrize("term", ["the predecessor", "w/r max", "dil8", "relay", "inlined once", "4-GPU"])
def test_no_undefined_term_or_stale_statement(term):
    assert term not in README


def test_it_names_the_reports_make_report_runs():
    from hilbert_lab.reports.registry import get_report

    parts = get_report("default").parts
    count = {4: "four", 5: "five", 6: "six"}[len(parts)]
    assert f"runs {count} reports ({', '.join(parts)})" in FLAT


def _interval(value: float, low: float, high: float) -> str:
    return f"{value:.3f} [{low:.3f}, {high:.3f}]"


def _pooled(row: dict) -> str:
    pooled = row["pooled"]
    return _interval(pooled["accuracy"], pooled["accuracy_low"], pooled["accuracy_high"])


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _expected_numbers() -> list[str]:
    grid = _load("retrieval_grid_h100.json")["rows"]
    dilated, dense = grid["gpu-32k-dil8-long1k"], grid["gpu-32k"]
    share = dilated["attention"]["flops_per_token"] / dense["attention"]["flops_per_token"]
    expected = [f"dilated {_pooled(dilated)}", f"dense top {_pooled(dense)}", _pooled(grid["gpu-32k-local"]),
                f"{share:.1%} of the attention FLOPs"]
    assert dilated["curriculum"] == [[1024, 1600], [16384, 1900]]
    expected.append("1,024 tokens until step 1,600, then 16,384 until step 1,900, then 32,768")
    long = _load("train_gpu_h100_128k.json")
    final = long["training"]["final_eval"]
    expected.append(f"{_interval(final['accuracy'], final['accuracy_low'], final['accuracy_high'])} over "
                    f"{final['count']} answers")
    cpu = _load("retrieval_grid_cpu.json")["rows"]
    expected.append(f"{_pooled(cpu['cpu-512-dil8'])} vs {_pooled(cpu['cpu-512-local'])}")
    (task,) = [task for task in _load("serialization_h100.json")["tasks"] if task["name"].endswith("window 64")
               and task["task"]["kind"] == "grid"]
    summary = {row["ordering"]: _interval(row["mean"], row["low"], row["high"]) for row in task["summary"]}
    expected += [f"Morton {summary['morton']}", f"transpose {summary['hilbert/hilbert-trans']}",
                 f"row-major {summary['rowmajor']}"]
    headline = _load("gpu_attention_headline_h100_1510a94_run1.json")["headline"]
    (cell,) = [row for row in headline
               if row["mode"] == "longnet" and not row["causal"] and row["direction"] == "fwd+bwd"]
    times = cell["timings"]
    auto, floor = times["auto"], times["floor[fa4]"]
    assert cell["auto_picks"] == "fa4"
    expected.append(f"{auto['median']:.2f} ms [{auto['low']:.2f}, {auto['high']:.2f}] vs floor "
                    f"{floor['median']:.2f} [{floor['low']:.2f}, {floor['high']:.2f}] ({cell['auto_over_floor']:.2f}x) "
                    f"and torchscale {cell['torchscale_ms']:.2f} ms ({cell['torchscale_over_auto']:.2f}x slower than "
                    f"ours); without FlashAttention-4 (`sdpa`) {cell['sdpa_ms']:.2f} ms")
    expected.append("Not re-measured since the attention core became one executor interface")
    return expected


@pytest.mark.parametrize("number", _expected_numbers())
def test_headline_numbers_are_those_of_the_committed_results(number):
    assert number in FLAT, f"the README does not show {number!r} (computed from reports/results/)"


def test_every_page_the_readme_names_is_one_the_default_suite_writes():
    """The serialization row pointed to serialization/serialization.html; the default suite writes each part as
    PART/PART.html (reports.render.write_index), the committed GPU runs as gpu/REPORT-RUN.html."""
    from hilbert_lab.reports.registry import get_report
    from hilbert_lab.reports.render import committed_gpu_runs

    written = ({"index.html"} | {f"{part}/{part}.html" for part in get_report("default").parts}
               | {f"gpu/{run.parent.name}-{run.name}.html" for run in committed_gpu_runs()})
    named = [path.removeprefix("reports/default/<run-id>/") for path in re.findall(r"`([^`\s]+\.html)`", README)]
    assert "serialization-small/serialization-small.html" in named and "training/training.html" in named
    assert [path for path in named if path not in written] == [], sorted(written)
