"""`hilbert-lab` CLI: commands run, help has examples, bad input exits 2 with one line."""
from __future__ import annotations

import argparse
import json
import os
import re
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from hilbert_lab.cli import main
from hilbert_lab.attention.memory import MemoryConfig, estimate_memory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_info_lists_backends_and_auto_choice_per_dtype(capsys):
    code, out, _ = run_cli(capsys, "info", "--json")
    assert code == 0
    info = json.loads(out)
    cpu = info["devices"]["cpu"]
    assert {"manual", "reference"} <= set(cpu["backends"])
    assert set(cpu["auto"]) == {"float32", "float64", "float16", "bfloat16"}
    assert all(choice in cpu["backends"] for choice in cpu["auto"].values())
    assert info["cpu"]["logical_cores"] >= 1 and info["ram_total_bytes"] > 0
    code, out, _ = run_cli(capsys, "info")
    assert code == 0 and "cpu auto picks: float32 -> " in out


def test_estimate_json_matches_the_library(capsys):
    code, out, _ = run_cli(capsys, "estimate", "--seq-len", "4096,8192", "--backend", "manual", "--num-heads", "4",
                           "--head-dim", "32", "--segment-lengths", "512,1024", "--dilation-rates", "1,2", "--json")
    assert code == 0
    rows = json.loads(out)
    for row, seq_len in zip(rows, (4096, 8192)):
        expected = estimate_memory(MemoryConfig(seq_len=seq_len, backend="manual", num_heads=4, head_dim=32,
                                                segment_lengths=(512, 1024), dilation_rates=(1, 2)))
        assert row["forward_backward_bytes"] == expected.forward_backward_bytes
        assert row["fits"] is True
    code, out, _ = run_cli(capsys, "estimate", "--seq-len", "4096", "--backend", "manual")
    assert code == 0 and "4096" in out and "manual" in out


def test_estimate_reports_a_config_that_cannot_fit(capsys):
    code, out, _ = run_cli(capsys, "estimate", "--seq-len", str(1 << 30), "--backend", "manual", "--json")
    assert code == 0
    (row,) = json.loads(out)
    assert row["fits"] is False and "needs" in row["fit_reason"]


def test_curve_csv_is_a_unit_step_traversal_of_the_grid(capsys, tmp_path):
    out = tmp_path / "h.csv"
    code, stdout, _ = run_cli(capsys, "curve", "--kind", "hilbert", "--width", "16", "--height", "8", "--out", str(out))
    assert code == 0 and "128 points" in stdout
    table = np.loadtxt(out, delimiter=",", skiprows=1, dtype=np.int64)
    assert out.read_text().splitlines()[0] == "index,x,y"
    assert np.array_equal(table[:, 0], np.arange(128))
    cells = {(x, y) for x, y in table[:, 1:]}
    assert cells == {(x, y) for x in range(16) for y in range(8)}
    assert np.all(np.abs(np.diff(table[:, 1:], axis=0)).sum(axis=1) == 1)  # 16x8 gilbert: unit steps only
    code, _, _ = run_cli(capsys, "curve", "--kind", "snake", "--width", "3", "--height", "2", "--depth", "2",
                         "--out", str(tmp_path / "s.csv"))
    table = np.loadtxt(tmp_path / "s.csv", delimiter=",", skiprows=1, dtype=np.int64)
    assert code == 0 and table.shape == (12, 4) and len({tuple(r) for r in table[:, 1:]}) == 12


def test_curve_png_is_a_valid_image_of_the_right_size(capsys, tmp_path):
    out = tmp_path / "h.png"
    code, _, _ = run_cli(capsys, "curve", "--width", "8", "--height", "4", "--cell", "5", "--out", str(out))
    assert code == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (40, 20)
    idat_length = struct.unpack(">I", data[33:37])[0]
    raw = np.frombuffer(zlib.decompress(data[41:41 + idat_length]), dtype=np.uint8).reshape(20, 1 + 40 * 3)
    pixels = raw[:, 1:].reshape(20, 40, 3)
    drawn = (pixels != 255).any(axis=2)
    assert drawn[2, 2] and drawn.sum() >= 31 * 5  # every cell centre on the path, 31 steps of 5 px


def test_bench_with_selftest_cases_records_failures_and_resumes(capsys, tmp_path):
    out = tmp_path / "r.jsonl"
    code, stdout, _ = run_cli(capsys, "bench", "--selftest", "ok,raise", "--out", str(out), "--quiet")
    assert code == 1 and "1 failed" in stdout and "failed [error]" in stdout
    assert [json.loads(line)["status"] for line in out.read_text().splitlines()] == ["ok", "error"]
    code, stdout, _ = run_cli(capsys, "bench", "--selftest", "ok,raise", "--out", str(out), "--quiet")
    assert code == 0 and "2 already finished" in stdout and len(out.read_text().splitlines()) == 2
    code, stdout, _ = run_cli(capsys, "bench", "--selftest", "ok", "--out", str(tmp_path / "ok.jsonl"), "--quiet")
    assert code == 0


def test_bench_dry_run_counts_the_matrix(capsys, tmp_path):
    code, stdout, _ = run_cli(capsys, "bench", "--seq-len", "256,512", "--backend", "manual,sdpa", "--mode",
                              "longnet,head_groups", "--segment-lengths", "64,128", "--dilation-rates", "1,2",
                              "--out", str(tmp_path / "r.jsonl"), "--dry-run")
    assert code == 0 and stdout.startswith("8 cases: 8 to run, 0 already finished")


@pytest.mark.parametrize("command", ["info", "bench", "probe", "estimate", "curve", "train", "ring"])
def test_every_command_has_help_with_examples(capsys, command):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "examples:" in capsys.readouterr().out


def _bad_inputs(tmp_path):
    malformed = tmp_path / "bad.yaml"
    malformed.write_text("base: {kind: attention\n")
    unknown_key = tmp_path / "keys.toml"
    unknown_key.write_text("[bases]\nkind = 'attention'\n")
    out = str(tmp_path / "r.jsonl")
    return [
        (["estimate", "--seq-len", "1024", "--backend", "magic"], "--backend"),
        (["estimate", "--seq-len", "1024", "--mode", "sparse"], "--mode"),
        (["estimate", "--seq-len", "1024", "--dtype", "int8"], "--dtype"),
        (["estimate", "--seq-len", "abc"], "--seq-len"),
        (["estimate", "--seq-len", "0"], "--seq-len"),
        (["estimate", "--seq-len", "1024", "--segment-lengths", "4", "--dilation-rates", "8"], "dilation"),
        (["estimate", "--seq-len", "1024", "--num-heads", "0"], "--num-heads"),
        (["bench", "--seq-len", "1024", "--backend", "nope", "--out", out], "--backend"),
        (["bench", "--matrix", str(malformed), "--out", out], "malformed"),
        (["bench", "--matrix", str(unknown_key), "--out", out], "unknown key"),
        (["bench", "--matrix", str(tmp_path / "missing.yaml"), "--out", out], "does not exist"),
        (["bench", "--seq-len", "1024", "--out", "/proc/hilbert_lab/r.jsonl"], "--out"),
        (["bench", "--selftest", "ok", "--out", str(tmp_path)], "directory"),
        (["bench", "--out", out], "--seq-len"),
        (["probe", "--backend", "manual,sdpa"], "--backend"),
        (["probe", "--start-len", "0", "--quiet"], "--start-len"),
        (["curve", "--width", "4", "--height", "4", "--out", str(tmp_path / "c.svg")], ".csv or .png"),
        (["curve", "--width", "0", "--height", "4", "--out", str(tmp_path / "c.csv")], "--width"),
        (["curve", "--width", "4", "--height", "4", "--depth", "2", "--out", str(tmp_path / "c.png")], "2D"),
        (["curve", "--kind", "peano", "--width", "4", "--height", "4", "--out", str(tmp_path / "c.csv")], "--kind"),
        (["frobnicate"], "invalid choice"),
    ]


def test_bad_input_exits_2_with_one_line_and_no_traceback(capsys, tmp_path):
    for argv, needle in _bad_inputs(tmp_path):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2, (argv, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err, (argv, err)


@pytest.mark.slow  # several fresh interpreters importing torch
def test_debug_flag_shows_the_traceback_and_module_entry_point(tmp_path):
    with pytest.raises(ValueError, match="dilation"):
        main(["--debug", "estimate", "--seq-len", "64", "--segment-lengths", "4", "--dilation-rates", "8"])
    proc = subprocess.run([sys.executable, "-m", "hilbert_lab.cli", "estimate", "--seq-len", "64", "--dtype", "int8"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--dtype" in proc.stderr


def test_top_level_help_states_the_list_syntax_and_the_output_rule(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "comma-separated" in text and "results are never overwritten" in text
    for command in ("info", "bench", "probe", "estimate", "curve", "report", "train", "ring"):
        assert command in text


def test_outputs_create_missing_folders_and_never_overwrite(capsys, tmp_path):
    out = tmp_path / "new" / "deeper" / "c.csv"
    code, _, _ = run_cli(capsys, "curve", "--width", "4", "--height", "4", "--out", str(out))
    assert code == 0 and out.read_text().splitlines()[0] == "index,x,y"
    before = out.read_text()
    code, _, err = run_cli(capsys, "curve", "--kind", "snake", "--width", "4", "--height", "4", "--out", str(out))
    assert code == 2 and "--out" in err and "already exists" in err and out.read_text() == before
    results = tmp_path / "runs" / "b.jsonl"  # bench appends to its file (and resumes) instead
    code, stdout, _ = run_cli(capsys, "bench", "--selftest", "ok", "--out", str(results), "--quiet")
    assert code == 0 and len(results.read_text().splitlines()) == 1
    code, stdout, _ = run_cli(capsys, "bench", "--selftest", "ok", "--out", str(results), "--quiet")
    assert code == 0 and "1 already finished" in stdout and len(results.read_text().splitlines()) == 1
    code, _, err = run_cli(capsys, "curve", "--width", "4", "--height", "4", "--out", str(results / "c.csv"))
    assert code == 2 and "--out" in err and "not a directory" in err


def test_bad_values_are_refused_before_any_output_is_created(capsys, tmp_path):
    code, _, _ = run_cli(capsys, "curve", "--width", "4", "--height", "0", "--out", str(tmp_path / "a" / "c.csv"))
    code2, _, _ = run_cli(capsys, "bench", "--seq-len", "256", "--segment-lengths", "8", "--dilation-rates", "16",
                          "--out", str(tmp_path / "b" / "r.jsonl"), "--dry-run")
    assert code == code2 == 2 and list(tmp_path.iterdir()) == []


def test_ring_lists_are_comma_separated_and_checked_before_the_process_group(capsys):
    from hilbert_lab.cli import build_parser
    from hilbert_lab.distributed.cli import validate_arguments

    args = build_parser().parse_args(["ring", "--segment-lengths", "2048, 4096", "--dilation-rates", "1,2"])
    assert args.segment_lengths == [2048, 4096] and args.dilation_rates == [1, 2] and args.seq_len is None
    for argv in (["--seq-len", "0"], ["--segment-lengths", "0", "--check-only"], ["--repeats", "0"],
                 ["--segment-lengths", "2048,4096", "--dilation-rates", "1"]):
        code, out, err = run_cli(capsys, "ring", *argv)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (argv, out, err)  # no self-check ran
    args = build_parser().parse_args(["ring", "--seq-len", "1000"])
    with pytest.raises(ValueError, match="--seq-len must be a multiple of the world size 16"):
        validate_arguments(args, world_size=16)


def test_estimate_accepts_a_gpu_device_it_only_describes(capsys):
    code, out, _ = run_cli(capsys, "estimate", "--seq-len", "4096", "--device", "cuda", "--dtype", "bfloat16",
                           "--backend", "sdpa", "--json")
    (row,) = json.loads(out)
    assert code == 0 and row["backend"] == "sdpa" and row["inputs_bytes"] == 3 * 4096 * 4 * 32 * 2


@pytest.mark.parametrize("backend", ["fa4", "flash", "xformers", "sdpa_cudnn", "sdpa_efficient"])
def test_estimate_refuses_a_cuda_only_backend_on_the_cpu(capsys, backend):
    """`estimate --backend fa4 --device cpu` printed 'fits yes' for a backend that runs only on CUDA."""
    from hilbert_lab.attention.executors import BACKENDS, EXECUTORS

    assert EXECUTORS[backend].capabilities.devices == ("cuda",)
    code, out, err = run_cli(capsys, "estimate", "--seq-len", "4096", "--backend", backend, "--device", "cpu")
    runs_on_cpu = ["auto"] + [name for name in BACKENDS if "cpu" in EXECUTORS[name].capabilities.devices]
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.strip() == (f"hilbert-lab: error: --backend must be one that runs on cpu: {', '.join(runs_on_cpu)}; "
                           f"got '{backend}' (it runs on cuda only)")
    assert "fits" not in err and backend not in runs_on_cpu
    with pytest.raises(ValueError, match=f"backend must be one that runs on cpu: .*got '{backend}'"):
        MemoryConfig(seq_len=4096, backend=backend, device="cpu")
    # the same backend on the device it runs on is estimated
    assert MemoryConfig(seq_len=4096, backend=backend, device="cuda:0").backend == backend


def test_estimate_refuses_sizes_no_device_holds_at_once():
    from hilbert_lab.attention.memory import MAX_INPUT_BYTES

    with pytest.raises(ValueError, match="num_heads must be <= 65536"):
        MemoryConfig(seq_len=1024, num_heads=10**12)
    with pytest.raises(ValueError, match="more than any device holds"):
        MemoryConfig(seq_len=MAX_INPUT_BYTES // (3 * 8 * 64 * 4) + 1, num_heads=8, head_dim=64)
    MemoryConfig(seq_len=MAX_INPUT_BYTES // (3 * 8 * 64 * 4), num_heads=8, head_dim=64)  # the limit itself is fine


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks a machine without CUDA")
def test_train_refuses_cuda_on_a_cpu_build_including_presets(capsys, tmp_path):
    for argv in (["--device", "cuda"], ["--preset", "gpu-32k"]):
        code, _, err = run_cli(capsys, "train", "--out", str(tmp_path / "run"), *argv)
        assert code == 2 and "CUDA is not available" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_each_command_is_registered_and_handled_by_its_package():
    from hilbert_lab.cli import build_parser

    homes = {"info": "bench", "bench": "bench", "probe": "bench", "estimate": "bench", "select": "bench",
             "curve": "curves", "report": "reports", "train": "models", "generate": "models", "ring": "distributed"}
    commands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    assert list(commands.choices) == list(homes)
    for name, package in homes.items():
        handler = commands.choices[name].get_default("func")
        assert handler.__module__ == f"hilbert_lab.{package}.cli", (name, handler.__module__)


def test_a_curve_file_cut_short_by_a_crash_does_not_block_the_rerun(capsys, tmp_path):
    out = tmp_path / "c.csv"
    code, _, _ = run_cli(capsys, "curve", "--width", "8", "--height", "8", "--out", str(out))
    complete = out.read_text()
    out.write_text(complete[: len(complete) // 2])  # what a killed non-atomic write left behind
    code, stdout, _ = run_cli(capsys, "curve", "--width", "8", "--height", "8", "--out", str(out))
    assert code == 0 and out.read_text() == complete
    assert f"set aside as {out}.torn" in stdout and (tmp_path / "c.csv.torn").exists()
    png = tmp_path / "c.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)  # no end chunk
    code, stdout, _ = run_cli(capsys, "curve", "--width", "8", "--height", "8", "--out", str(png))
    assert code == 0 and png.read_bytes().endswith(b"IEND\xaeB`\x82") and "set aside" in stdout
    code, _, err = run_cli(capsys, "curve", "--width", "8", "--height", "8", "--out", str(out))
    assert code == 2 and "already exists" in err  # a complete file is never replaced

def test_top_level_help_imports_no_heavy_module():
    """`hilbert-lab --help` lists every command without importing torch, numba or plotly (it took seconds)."""
    code = ("import contextlib, io, sys\nfrom hilbert_lab.cli import main\nout = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n    try:\n        main(['--help'])\n    except SystemExit:\n"
            "        pass\nassert 'estimate' in out.getvalue() and 'ring' in out.getvalue(), out.getvalue()\n"
            "print(sorted(name for name in ('torch', 'numba', 'plotly', 'numpy', 'pandas') if name in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", f"--help imported {proc.stdout.strip()}"


def test_top_level_summaries_are_the_ones_each_package_registers():
    from hilbert_lab.cli import COMMANDS, build_parser

    commands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    registered = {choice.dest: choice.help for choice in commands._choices_actions}
    assert registered == {name: summary for name, (_, summary) in COMMANDS.items()}
    lazy = next(action for action in build_parser("curve", lazy=True)._actions
                if isinstance(action, argparse._SubParsersAction))
    assert list(lazy.choices) == list(COMMANDS) and lazy.choices["curve"].get_default("func") is not None


def _parsers_and_names(parser, prefix=""):
    """(command path, parser) for every command and sub-command under `parser`."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield f"{prefix}{name}", child
                yield from _parsers_and_names(child, f"{prefix}{name} ")


@pytest.mark.parametrize("command", ["info", "bench", "probe", "estimate", "select", "curve", "report run",
                                     "report render", "ring"])
def test_help_shows_every_default(command):
    """Every option with a default (not a flag, not None) says it in --help, as it would be typed."""
    from hilbert_lab.cli import build_parser

    parser = dict(_parsers_and_names(build_parser()))[command]
    formatter = parser._get_formatter()
    missing = [action.option_strings[-1] for action in parser._actions
               if action.option_strings and action.default not in (None, False, argparse.SUPPRESS)
               and "default" not in formatter._format_action(action)]
    assert not missing, f"hilbert-lab {command} --help shows no default for {missing}"
    if command == "estimate":
        text = " ".join(parser.format_help().split())
        assert "(default: 256,512)" in text and "(default: longnet)" in text and "(default: identity" in text
        assert "(default: none)" not in text


def test_estimate_prints_the_shape_and_pattern_it_assumed(capsys):
    code, out, _ = run_cli(capsys, "estimate", "--seq-len", "8192", "--num-heads", "6", "--head-dim", "16",
                           "--segment-lengths", "1024,2048", "--dilation-rates", "1,2", "--causal")
    assert code == 0
    assumed = out.splitlines()[0]
    assert "(B, N, H, D) = (1, N, 6, 16)" in assumed and "float32 on cpu" in assumed, assumed
    assert "segment lengths 1024,2048, dilation rates 1,2, causal" in assumed and "backend auto" in assumed
    code, out, _ = run_cli(capsys, "estimate", "--seq-len", "8192", "--num-heads", "6", "--json")
    (row,) = json.loads(out)
    assert row["assumed"]["shape"] == [1, 8192, 6, 32] and row["assumed"]["segment_lengths"] == [256, 512]


def _options(parser):
    """(command, action) for every option and positional of every command, hidden aliases left out."""
    for command, child in _parsers_and_names(parser):
        for action in child._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
                continue
            yield command, action


def test_every_option_of_every_command_has_help():
    from hilbert_lab.cli import build_parser

    bare = [f"{command} {(action.option_strings or [action.dest])[-1]}" for command, action in _options(build_parser())
            if not (action.help or "").strip()]
    assert not bare, f"options without help: {bare}"


def test_one_flag_name_per_parameter_across_commands():
    """Each option is spelt as its parameter (num_heads: --num-heads in every command); the older ring spellings
    --heads and --iters still parse, hidden, into the same parameters."""
    from hilbert_lab.cli import build_parser

    parser = build_parser()
    odd = [(command, action.option_strings) for command, action in _options(parser) if action.option_strings
           and max(action.option_strings, key=len) != "--" + action.dest.rstrip("_").replace("_", "-")]
    assert not odd, odd
    shown = {flag for _, action in _options(parser) for flag in action.option_strings}
    assert {"--num-heads", "--repeats"} <= shown and not {"--heads", "--iters"} & shown
    args = parser.parse_args(["ring", "--heads", "2", "--iters", "5"])
    assert (args.num_heads, args.repeats) == (2, 5)
    assert (parser.parse_args(["ring"]).num_heads, parser.parse_args(["ring"]).repeats) == (8, 3)


def test_report_list_is_aligned_and_cites_files_that_exist(capsys):
    from hilbert_lab.reports.registry import list_reports

    code, out, _ = run_cli(capsys, "report", "list")
    lines = out.splitlines()
    assert code == 0 and [line.split()[0] for line in lines] == [spec.name for spec in list_reports()]
    width = max(len(spec.name) for spec in list_reports())
    assert all(line[width:width + 2] == "  " and line[width + 2] != " " for line in lines), out
    cited = [path for line in lines for path in re.findall(r"[\w./-]+\.(?:md|ipynb)", line)]
    assert cited and all(os.path.exists(os.path.join(REPO, path)) for path in cited), cited


@pytest.mark.parametrize("argv, flags, names", [
    (["estimate", "--seq-len", "1024", "--segment-lengths", "256,512", "--dilation-rates", "1"],
     ["--segment-lengths", "--dilation-rates"], ["segment_lengths", "dilation_rates"]),
    (["estimate", "--seq-len", "1024", "--batch-size", "100000000", "--num-heads", "4000", "--head-dim", "1000"],
     ["--batch-size=100000000", "--num-heads=4000", "--head-dim=1000"], ["batch_size", "num_heads", "head_dim"]),
    (["bench", "--seq-len", "1024", "--segment-lengths", "256,512", "--dilation-rates", "1", "--out", "RUN"],
     ["--segment-lengths", "--dilation-rates"], ["segment_lengths", "dilation_rates"]),
    (["ring", "--segment-lengths", "256,512", "--dilation-rates", "1,2,4"], ["--segment-lengths and --dilation-rates"],
     ["segment_lengths", "dilation_rates"]),
    # train: TrainConfig's fields as the flags `train --help` lists, before a run folder is made
    (["train", "--out", "RUN", "--num-kv-heads", "3"], ["--num-kv-heads must", "dividing --num-heads=4"],
     ["num_kv_heads", "num_heads", "None"]),
    (["train", "--out", "RUN", "--dim", "30"], ["--dim=30 must be a multiple of --num-heads=4"], ["num_heads", "dim="]),
    (["train", "--out", "RUN", "--num-heads", "16", "--dim", "48"], ["even head dim: --dim=48 / --num-heads=16 = 3"],
     ["num_heads", "dim //", "dim="]),
])
def test_library_errors_are_reported_with_flag_names(capsys, tmp_path, argv, flags, names):
    code, out, err = run_cli(capsys, *[str(tmp_path / "run") if word == "RUN" else word for word in argv])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert all(flag in err for flag in flags) and not any(f" {name}" in err for name in names), err
    assert not (tmp_path / "run").exists()


def test_flag_names_leave_words_positionals_and_paths_alone():
    from hilbert_lab.arguments import flag_names
    from hilbert_lab.cli import build_parser

    parser = build_parser()
    assert flag_names("parameter seq_lens must be a list", parser) == "parameter seq_lens must be a list"
    assert flag_names("run_dir '/tmp/seq_len/x' does not exist", parser) == "run_dir '/tmp/seq_len/x' does not exist"
    assert flag_names("the backend of the mode", parser) == "the backend of the mode"
    assert flag_names("pass_ and json_out", parser) == "--pass and --json-out"
    # a plain word given a value is a parameter ('dim=30'); the word alone stays a word
    assert flag_names("dim=30 and the dim of a head", {"dim": "--dim"}) == "--dim=30 and the dim of a head"


def test_results_table_gives_each_case_its_median_and_interval():
    from hilbert_lab.bench.runner import results_table
    from hilbert_lab.bench.stats import bootstrap_median_ci

    def record(seq_len, backend, times, status="ok", used=None):
        return {"case_id": f"id{seq_len}{backend}", "status": status,
                "params": {"kind": "attention", "backend": backend, "seq_len": seq_len, "mode": "longnet"},
                "result": {"times_ms": times, "backend_used": used or backend} if times else {}}

    times = [3.0, 1.0, 2.0, 5.0, 4.0]
    lines = results_table([record(256, "manual", times), record(512, "auto", [7.5, 7.25, 7.0], used="sdpa"),
                           record(512, "manual", None, status="oom")])
    _, low, high = bootstrap_median_ci(times)
    assert lines[0].split() == ["case", "backend", "median", "ms", "95%", "interval"]
    assert lines[1].split() == ["seq_len=256", "manual", "3.000", f"[{low:.3f},", f"{high:.3f}]"]
    assert lines[2].split()[:5] == ["seq_len=512", "auto", "->", "sdpa", "7.250"]
    assert lines[3].split() == ["seq_len=512", "manual", "-", "oom"]
    assert len({line.index("backend") if i == 0 else line.index(line.split()[1]) for i, line in enumerate(lines)}) == 1
    assert results_table([]) == []


@pytest.mark.slow  # bench cases in worker processes
def test_bench_prints_the_table_of_its_cases(capsys, tmp_path):
    from hilbert_lab.bench.stats import bootstrap_median_ci

    out = tmp_path / "r.jsonl"
    code, stdout, _ = run_cli(capsys, "bench", "--seq-len", "64", "--segment-lengths", "32,64", "--backend", "manual",
                              "--repeats", "3", "--warmup", "0", "--out", str(out), "--quiet")
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    median, low, high = bootstrap_median_ci(record["result"]["times_ms"])
    lines = stdout.splitlines()
    assert code == 0 and lines[0].split() == ["case", "backend", "median", "ms", "95%", "interval"]
    assert lines[1].split() == [record["case_id"], "manual", f"{median:.3f}", f"[{low:.3f},", f"{high:.3f}]"]
    assert lines[2].startswith("done: 1 ran")


def test_the_ordering_default_is_named_identity_in_every_command():
    """--ordering's default is the tokens in their order: its help says identity, never "(default: none)"."""
    from hilbert_lab.cli import build_parser

    seen = []
    for command, parser in _parsers_and_names(build_parser()):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if "--ordering" in action.option_strings:
                text = " ".join(formatter._format_action(action).split())
                assert "(default: identity" in text and "(default: none)" not in text, (command, text)
                seen.append(command)
    assert seen == ["bench", "probe", "estimate", "train"]

