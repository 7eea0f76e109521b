"""Generated bad-input sweep over the CLI and the public API: no tracebacks, no silent substitutions, no hangs.

CLI: every subcommand's numeric, list, choice, device and path arguments get zero, negative, huge,
non-numeric, empty and wrong values; each case calls `hilbert_lab.cli.main` in-process and must exit 2
with exactly one line on stderr that names the argument. API: the public functions get the same kinds
of values and must raise ValueError (TypeError where Python itself would) naming the argument.
Each case has a 30 s limit; the whole sweep takes well under two minutes on a 2-core CPU.
"""
from __future__ import annotations

import contextlib
import io
import os
from typing import Any, Callable

import numpy as np
import pytest
import torch

from hilbert_lab.cli import main
from hilbert_lab.reports.cli import missing_notebook_modules

pytestmark = pytest.mark.timeout(300)  # a bad input must not hang; wide: a busy machine's first call compiles kernels

HUGE = str(10**30)
CUDA = torch.cuda.is_available()


# ---------------------------------------------------------------- CLI case generation

NOT_ASCII_DIGITS = ["\u0664", "1_0", "\uff11"]  # an Arabic-Indic 4, an underscore, a fullwidth 1: int() takes them


def _int_values(low: int | None, high: int | None) -> list[str]:
    values = ["abc", "", "1.5", "nan", HUGE, "-" + HUGE] + NOT_ASCII_DIGITS
    if low is not None:
        values += [str(low - 1), str(low - 256)]
    if high is not None:
        values.append(str(high + 1))
    return values


def _list_values(low: int = 1) -> list[str]:
    return [str(low - 1), f"{low},{low - 1}", "-1", "", ",", "a,b", "1.5", f"{low},x", HUGE, "1;2",
            f"{low},1_0", "\u0664"]


def _float_values(low_open: bool = True) -> list[str]:
    return ["abc", "", "nan", "inf", "-inf", "-1", "1e400", "1_0", "\u0664"] + (["0"] if low_open else [])


def _choice_values(first: str | None = None) -> list[str]:
    return ["bogus", "", "NONE"] + ([f"{first},bogus"] if first else [])


def _device_values(runs_here: bool) -> list[str]:
    values = ["tpu", "", "cuda:x", "gpu", "cuda:-1", "cpu:0"]
    if runs_here:
        values += ["cuda:99"] if CUDA else ["cuda", "cuda:0"]
    return values


def _out_values(extension: str, refuses_existing: bool) -> list[str]:
    values = [f"/proc/hilbert_lab_sweep/x{extension}", f"/proc/x{extension}", "{tmp}", f"{{file}}/x{extension}", ""]
    return values + (["{file}"] if refuses_existing and extension == ".txt" else []) + (
        ["{existing}" + extension] if refuses_existing else [])


# command -> (valid base argv, [(flag, bad values)]); a bad value replaces the flag's value in the base
# (or is appended). Bases never do real work, so a value that slipped through would still be quick.
BENCH_BASE = ["bench", "--seq-len", "256", "--segment-lengths", "64,128", "--dilation-rates", "1,2",
              "--out", "{tmp}/bench.jsonl", "--dry-run", "--quiet"]
PROBE_BASE = ["probe", "--quiet", "--start-len", "64", "--max-seq-len", "128", "--segment-lengths", "32,64",
              "--dilation-rates", "1,2", "--max-case-seconds", "5", "--timeout", "30"]
ESTIMATE_BASE = ["estimate", "--seq-len", "1024", "--json"]
CURVE_BASE = ["curve", "--width", "4", "--height", "4", "--out", "{tmp}/curve_{n}.csv"]
RING_BASE = ["ring", "--check-only"]
TRAIN_BASE = ["train", "--out", "{tmp}/train_{n}", "--steps", "1", "--quiet"]


def _shape_arguments(run_here: bool, sweep: bool) -> list[tuple[str, list[str]]]:
    choices = (lambda first: _choice_values(first)) if sweep else (lambda first: _choice_values(None))
    return [
        ("--batch-size", _int_values(1, None)), ("--num-heads", _int_values(1, None)),
        ("--head-dim", _int_values(1, None)), ("--segment-lengths", _list_values()),
        ("--dilation-rates", _list_values()), ("--backend", choices("manual")), ("--mode", choices("longnet")),
        ("--dtype", choices("float32")), ("--ordering", choices("none")), ("--device", _device_values(run_here)),
    ]


CLI_ARGUMENTS: dict[str, tuple[list[str], list[tuple[str, list[str]]]]] = {
    "bench": (BENCH_BASE, _shape_arguments(True, True) + [
        ("--seq-len", _list_values()), ("--warmup", _int_values(0, 1000)), ("--repeats", _int_values(1, 1000)),
        ("--threads", _int_values(1, 1024)), ("--max-seq-len", _int_values(1, None)), ("--timeout", _float_values()),
        ("--pass", _choice_values()), ("--out", _out_values(".jsonl", False)),
    ]),
    "bench --selftest": (["bench", "--selftest", "ok", "--out", "{tmp}/selftest.jsonl", "--dry-run"], [
        ("--selftest", _choice_values("ok")), ("--seq-len", ["256"]), ("--matrix", ["{tmp}/good.yaml"]),
    ]),
    "bench --matrix": (["bench", "--matrix", "{tmp}/good.yaml", "--out", "{tmp}/matrix.jsonl", "--dry-run"], [
        ("--matrix", ["", "{tmp}/missing.yaml", "{tmp}/bad.yaml", "{tmp}", "{tmp}/keys.toml", "{tmp}/list.yaml",
                      "{tmp}/zero.yaml", "{tmp}/heads.yaml", "{tmp}/backend.yaml", "{tmp}/device.yaml"]),
    ]),
    "probe": (PROBE_BASE, _shape_arguments(True, False) + [
        ("--start-len", _int_values(1, None)), ("--multiple-of", _int_values(1, 1 << 20)),
        ("--bisect-steps", _int_values(0, 30)), ("--max-seq-len", _int_values(1, None)),
        ("--max-case-seconds", _float_values()), ("--max-memory-fraction", _float_values() + ["1.5"]),
        ("--timeout", _float_values()), ("--pass", _choice_values()), ("--json-out", _out_values(".json", True)),
    ]),
    "estimate": (ESTIMATE_BASE, _shape_arguments(False, False) + [
        ("--seq-len", _list_values()), ("--world-size", _int_values(1, 1 << 20)), ("--pass", _choice_values()),
    ]),
    "curve": (CURVE_BASE, [
        ("--width", _int_values(1, 1 << 24)), ("--height", _int_values(1, 1 << 24)),
        ("--depth", _int_values(1, 1 << 24)), ("--cell", _int_values(1, 64)), ("--kind", _choice_values()),
        ("--out", _out_values(".csv", True) + ["{tmp}/c.svg", "{tmp}/c"]),
    ]),
    "ring": (RING_BASE, [
        ("--seq-len", _int_values(1, None)), ("--num-heads", _int_values(1, 4096)),
        ("--head-dim", _int_values(1, 1024)), ("--segment-lengths", _list_values()), ("--dilation-rates", _list_values()),
        ("--repeats", _int_values(1, 1000)), ("--mode", _choice_values()), ("--dtype", _choice_values()),
    ]),
    "train": (TRAIN_BASE, [
        ("--seq-len", _int_values(2, 1 << 24)), ("--context-length", _int_values(2, 1 << 24)),
        ("--num-pairs", _int_values(1, None)), ("--num-queries", _int_values(1, None)),
        ("--num-keys", _int_values(1, None)), ("--num-values", _int_values(1, None)),
        ("--dim", _int_values(1, 1 << 16)), ("--depth", _int_values(1, 1024)), ("--num-heads", _int_values(1, 4096)),
        ("--num-kv-heads", _int_values(1, 4096)),
        ("--segment-lengths", _list_values()), ("--dilation-rates", _list_values()),
        ("--steps", _int_values(1, 10**9)), ("--batch-size", _int_values(1, 1 << 16)),
        ("--lr", _float_values()), ("--rotary-base", _float_values()), ("--seed", _int_values(0, 2**63 - 1)),
        ("--eval-every", _int_values(1, 10**9)), ("--checkpoint-every", _int_values(1, 10**9)),
        ("--log-every", _int_values(1, 10**9)), ("--curriculum", ["abc", "16", "16:x", "0:1", "8:0", "1024:1", "1_6:2", "16:\u0662"]),
        ("--dtype", _choice_values()), ("--autocast", _choice_values()), ("--mode", _choice_values()),
        ("--data-parallel", _int_values(1, 1 << 16)), ("--context-parallel", _int_values(1, 1 << 16)),
        ("--ring-layout", _choice_values()), ("--timeout", _float_values() + ["0.5", "1e6"]),
        ("--backend", ["bogus", ""]), ("--ordering", ["bogus"]), ("--preset", _choice_values()),
        ("--device", _device_values(True)), ("--out", ["/proc/hilbert_lab_sweep/run", "{file}", "{file}/run"]),
        ("--config", ["", "{tmp}/missing.json", "{file}", "{tmp}/bad_config.json", "{tmp}/unknown_config.json",
                      "{tmp}/list_config.json", "{tmp}"]),
    ]),
}

# Combinations that are bad together (each value alone is fine), and misuse of the commands.
CLI_EXTRA: list[tuple[list[str], str]] = [
    (ESTIMATE_BASE + ["--segment-lengths", "4", "--dilation-rates", "8"], "dilation"),
    (ESTIMATE_BASE + ["--segment-lengths", "4,8", "--dilation-rates", "1"], "--dilation-rates"),
    (["estimate", "--seq-len", "1000", "--world-size", "3"], "--world-size"),
    (["estimate", "--seq-len", str(1 << 40), "--num-heads", "65536"], "--num-heads"),
    (["estimate", "--seq-len", "1024", "--num-heads", "1000000000000"], "--num-heads"),
    (["estimate", "--seq-len", "1024", "--backend", "manual,sdpa"], "--backend"),
    (["estimate"], "--seq-len"),
    (["estimate", "--seq-len", "64", "--bogus"], "--bogus"),
    (BENCH_BASE + ["--segment-lengths", "64", "--dilation-rates", "128"], "dilation"),
    (BENCH_BASE + ["--seq-len", str(1 << 40), "--num-heads", "4096"], "--seq-len"),
    (["bench", "--out", "{tmp}/b.jsonl"], "--seq-len"),
    (["bench", "--seq-len", "256"], "--out"),
    (["bench", "--matrix", "{tmp}/missing.yaml", "--out", "{tmp}/b.jsonl"], "does not exist"),
    (["bench", "--matrix", "{tmp}/bad.yaml", "--out", "{tmp}/b.jsonl"], "malformed"),
    (["bench", "--matrix", "{tmp}/good.yaml", "--seq-len", "256", "--out", "{tmp}/b.jsonl"], "--matrix"),
    (PROBE_BASE + ["--backend", "manual,sdpa"], "--backend"),
    (PROBE_BASE + ["--segment-lengths", "32,64", "--dilation-rates", "1"], "--dilation-rates"),
    (["curve", "--width", "4", "--height", "4", "--depth", "2", "--out", "{tmp}/c.png"], "2D"),
    (["curve", "--width", "16777216", "--height", "2", "--out", "{tmp}/big.csv"], "--width"),
    (["curve", "--width", "4096", "--height", "4096", "--cell", "64", "--out", "{tmp}/big.png"], "--cell"),
    (["curve", "--width", "4", "--out", "{tmp}/c.csv"], "--height"),
    (RING_BASE + ["--segment-lengths", "2048,4096", "--dilation-rates", "1"], "--dilation-rates"),
    (RING_BASE + ["--segment-lengths", "4", "--dilation-rates", "8"], "dilation"),
    (RING_BASE + ["--segment-lengths", "2048", "4096"], "4096"),
    (TRAIN_BASE + ["--segment-lengths", "8,16", "--dilation-rates", "1"], "--dilation-rates"),
    (TRAIN_BASE + ["--preset", "gpu-32k"] if not CUDA else TRAIN_BASE + ["--device", "cuda:99"], "device"),
    (["train"], "--out"),
    (["report"], "report"),
    (["report", "list", "extra"], "extra"),
    (["report", "params", "nope"], "report name"),
    (["report", "run", "nope"], "report name"),
    (["report", "run", "benchmark-small", "-p", "nokey=1"], "nokey"),
    (["report", "run", "benchmark-small", "-p", "repeats=abc"], "repeats"),
    (["report", "run", "benchmark-small", "-p", "novalue"], "novalue"),
    (["report", "run", "benchmark-small", "-p", "repeats=-1"], "repeats"),
    (["report", "run", "benchmark-small", "-p", "seq_lens=[]"], "seq_lens"),
    (["report", "run", "benchmark-small", "-p", "repeats=1_0"], "repeats"),
    (["select", "--seq-len", str(10 ** 9)], "shape"),
    (["report", "run", "benchmark-small", "--output-root", "/proc/hilbert_lab_sweep"], "--output-root"),
    (["report", "run", "benchmark-small", "--output-root", "{file}"], "--output-root"),
    (["report", "run", "benchmark-small", "--output-root", "{tmp}/reports", "--run-id", "taken"], "--run-id"),
    (["report", "run", "benchmark-small", "--output-root", "{tmp}/reports", "--run-id", ""], "--run-id"),
    (["report", "run", "benchmark-small", "--output-root", "{tmp}/reports", "--run-id", "../up"], "--run-id"),
    (["info", "--bogus"], "--bogus"),
    (["frobnicate"], "invalid choice"),
]


def _replace(base: list[str], flag: str, value: str) -> list[str]:
    argv = list(base)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return argv


def _cli_cases() -> list[Any]:
    cases = []
    for command, (base, flags) in CLI_ARGUMENTS.items():
        for flag, values in flags:
            for value in values:
                argv = _replace(base, flag, value)
                cases.append(pytest.param(argv, flag, id=f"{command.split()[0]} {flag} {value!r}"[:90]))
    for argv, needle in CLI_EXTRA:
        cases.append(pytest.param(argv, needle, id=" ".join(argv)[:90]))
    return cases


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("sweep")
    (root / "a_file").write_text("not a directory\n")
    (root / "bad.yaml").write_text("base: {kind: attention\n")
    (root / "good.yaml").write_text("base: {kind: selftest, seconds: 0}\nmatrix: {behavior: [ok]}\n")
    (root / "bad_config.json").write_text("{not json")
    (root / "unknown_config.json").write_text('{"bogus_field": 1}')
    (root / "list_config.json").write_text("[1, 2]")
    (root / "keys.toml").write_text("[bases]\nkind = 'attention'\n")
    (root / "list.yaml").write_text("- 1\n- 2\n")
    case = "base: {{kind: attention, segment_lengths: [64], dilation_rates: [1], {}}}\nmatrix: {{seq_len: [{}]}}\n"
    for name, field, seq_len in (("zero", "num_heads: 2", "0"), ("heads", "num_heads: -1", "256"),
                                 ("backend", "backend: bogus", "256"), ("device", "device: tpu", "256")):
        (root / f"{name}.yaml").write_text(case.format(field, seq_len))
    for extension in (".csv", ".json", ".jsonl"):
        (root / f"existing{extension}").write_text("results\n")
    (root / "reports" / "benchmark-small" / "taken").mkdir(parents=True)
    return str(root)


def _fill(argv: list[str], root: str, index: int) -> list[str]:
    return [a.replace("{tmp}", root).replace("{file}", f"{root}/a_file").replace("{existing}", f"{root}/existing")
            .replace("{n}", str(index)) for a in argv]


def _run_cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's own exits (e.g. --help) would land here
            code = exit_.code if isinstance(exit_.code, int) else 1
    return code, out.getvalue(), err.getvalue()


_counter = iter(range(10**9))


def _names(flag: str) -> tuple[str, ...]:
    bare = flag.lstrip("-")
    return (flag, bare, bare.replace("-", "_"))


@pytest.mark.parametrize("argv, needle", _cli_cases())
def test_cli_bad_value_exits_2_with_one_line_naming_it(argv, needle, sweep_dir):
    argv = _fill(argv, sweep_dir, next(_counter))
    if argv[:2] == ["report", "run"] and missing_notebook_modules():
        needle = "hilbert-lab[reports]"  # without the extra, every report run is refused first
    code, out, err = _run_cli(argv)
    lines = err.strip().splitlines()
    assert code == 2, (argv, code, out[-500:], err[-2000:])
    assert "Traceback" not in err and len(lines) == 1, (argv, err)
    assert any(name in lines[0] for name in _names(needle)), (argv, lines[0])


# Commands whose options are not in CLI_ARGUMENTS, and why; every other command's value options all are.
NOT_SWEPT = {
    "info": "takes no values",
    "report": "its subcommands' arguments are cases of CLI_EXTRA and of the path and file families",
    "select": "a value that slipped through would time every backend and write the selection cache",
    "generate": "tests/models/test_generate_cli.py and the checkpoint cases of the file family",
}


def _value_options() -> dict[str, set[str]]:
    """command -> the options of the `hilbert-lab` parser that take a value (positionals by their name); hidden
    aliases of an option (help suppressed) are its old spellings, swept under its name."""
    import argparse

    from hilbert_lab.cli import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: {action.option_strings[-1] if action.option_strings else action.dest for action in child._actions
                   if action.nargs != 0 and not isinstance(action, argparse._SubParsersAction)
                   and action.help != argparse.SUPPRESS}
            for name, child in commands.choices.items()}


def test_the_sweep_gives_every_value_option_of_every_swept_command_its_bad_values():
    swept: dict[str, set[str]] = {}
    for command, (_, flags) in CLI_ARGUMENTS.items():
        swept.setdefault(command.split()[0], set()).update(flag for flag, _ in flags)
    options = _value_options()
    assert set(options) == set(swept) | set(NOT_SWEPT), set(options) ^ (set(swept) | set(NOT_SWEPT))
    assert {command: flags for command, flags in options.items() if command not in NOT_SWEPT} == swept
    cases = {case.id: case.values for case in _cli_cases()}
    generated = [f"{command.split()[0]} {flag} {value!r}"[:90] for command, (_, flags) in CLI_ARGUMENTS.items()
                 for flag, values in flags for value in values]
    assert len(set(generated)) == len(generated) == len(_cli_cases()) - len(CLI_EXTRA)  # no two cases the same
    for command, (base, flags) in CLI_ARGUMENTS.items():  # each bad value stands after its flag, once
        for flag, values in flags:
            for value in values:
                argv, needle = cases[f"{command.split()[0]} {flag} {value!r}"[:90]]
                assert needle == flag and argv.count(flag) == 1 and argv[argv.index(flag) + 1] == value
                assert [a for i, a in enumerate(argv) if a != flag and argv[i - 1] != flag] == \
                    [a for i, a in enumerate(base) if a != flag and base[i - 1] != flag], argv
    api = {case.id.split()[0] for case in _api_cases()}  # the public functions the API cases call
    assert api >= {"dilated_attention", "DilatedPattern.create", "MultiheadDilatedAttention", "segment_permutation",
                   "encode", "decode", "estimate_memory", "shard", "shard_positions", "zigzag_shard"}, api


# ---------------------------------------------------------------- API cases

def _qkv(shape=(1, 16, 2, 4), dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(*shape, generator=gen, dtype=dtype) for _ in range(3))


def _attention(**overrides):
    q, k, v = overrides.pop("qkv", None) or _qkv()
    arguments = {"segment_lengths": [8, 16], "dilation_rates": [1, 2], "backend": "manual", **overrides}
    return lambda: __import__("hilbert_lab.attention.engine", fromlist=["x"]).dilated_attention(q, k, v, **arguments)


def _pattern(*args, **kwargs):
    from hilbert_lab.attention.pattern import DilatedPattern

    return lambda: DilatedPattern.create(*args, **kwargs)


def _module(**overrides):
    from hilbert_lab.attention.modules import MultiheadDilatedAttention

    arguments = {"embed_dim": 8, "num_heads": 2, "segment_lengths": [8, 16], "dilation_rates": [1, 2], **overrides}
    return lambda: MultiheadDilatedAttention(**arguments)


def _permutation(length, ordering="hilbert"):
    from hilbert_lab.curves import segment_permutation

    return lambda: segment_permutation(length, ordering)


def _encode(coords, order, **kwargs):
    from hilbert_lab.curves import encode

    return lambda: encode(coords, order, **kwargs)


def _decode(index, order, ndim, **kwargs):
    from hilbert_lab.curves import decode

    return lambda: decode(index, order, ndim, **kwargs)


def _estimate(per_rank=False, **overrides):
    from hilbert_lab.attention.memory import MemoryConfig, estimate_memory
    from hilbert_lab.distributed.memory import estimate_memory_per_rank

    fields = {"seq_len": 1024, "num_heads": 4, "head_dim": 32, "segment_lengths": (256, 512),
              "dilation_rates": (1, 2), **overrides}
    return lambda: (estimate_memory_per_rank if per_rank else estimate_memory)(MemoryConfig(**fields))


def _shard(rank, world_size, length=16, **kwargs):
    from hilbert_lab.distributed.sharding import shard

    return lambda: shard(torch.zeros(1, length, 2, 4), rank, world_size, **kwargs)


def _positions(rank, world_size, seq_len, layout="contiguous"):
    from hilbert_lab.distributed.sharding import shard_positions

    return lambda: shard_positions(rank, world_size, seq_len, layout)


BAD_INTS: list[Any] = [0, -1, -2**40, 1.5, "8", None, True, float("nan")]
BAD_LISTS: list[Any] = [[], [0], [-4], [1.5], ["8"], [None], "abc", None, [True]]


def _api_cases() -> list[Any]:
    cases: list[tuple[str, Callable[[], Any], str]] = []

    def add(name, thunk, needle):
        cases.append((name, thunk, needle))

    for name in ("segment_lengths", "dilation_rates"):
        for value in BAD_LISTS:
            add(f"dilated_attention {name}={value!r}", _attention(**{name: value}), name)
            other = "dilation_rates" if name == "segment_lengths" else "segment_lengths"
            add(f"DilatedPattern.create {name}={value!r}",
                _pattern(**{name: value, other: [8]}), name)
    add("dilated_attention lengths differ", _attention(segment_lengths=[8, 16], dilation_rates=[1]), "dilation_rates")
    add("dilated_attention dilation > segment", _attention(segment_lengths=[4], dilation_rates=[8]), "dilation")
    add("dilated_attention dilation 2**60", _attention(segment_lengths=[8, 2**61], dilation_rates=[1, 2**60]),
        "dilation")
    for value in ("sparse", "", None, 1):
        add(f"dilated_attention mode={value!r}", _attention(mode=value), "mode")
        add(f"DilatedPattern.create mode={value!r}", _pattern([8], [1], mode=value), "mode")
    for value in ("yes", 1, None):
        add(f"dilated_attention causal={value!r}", _attention(causal=value), "causal")
        add(f"DilatedPattern.create causal={value!r}", _pattern([8], [1], causal=value), "causal")
    for value in ("nope", "", None):
        add(f"dilated_attention backend={value!r}", _attention(backend=value), "backend")
    for value in ("nope", "", 3):
        add(f"dilated_attention ordering={value!r}", _attention(ordering=value), "ordering")
    for value in (0.0, -1.0, "1", True):
        add(f"dilated_attention scale={value!r}", _attention(scale=value), "scale")
    for value in (float("inf"), float("nan")):
        add(f"dilated_attention scale={value!r}", _attention(scale=value), "scale")
    for value in (-0.1, 1.0, 1.5, float("nan"), "0.1"):
        add(f"dilated_attention dropout_p={value!r}", _attention(dropout_p=value), "dropout_p")
    for value in ("yes", 1, None):
        add(f"dilated_attention return_lse={value!r}", _attention(return_lse=value), "return_lse")
        add(f"dilated_attention hilbert_pattern={value!r}", _attention(hilbert_pattern=value), "hilbert_pattern")
    q, k, v = _qkv()
    for label, qkv in (("3D q", (q[0], k, v)), ("int q", (q.long(), k.long(), v.long())),
                       ("shapes differ", (q, k[:, :8], v)), ("dtypes differ", (q, k.double(), v)),
                       ("empty", (q[:, :0], k[:, :0], v[:, :0])), ("not tensors", ([1.0], k, v))):
        add(f"dilated_attention {label}", _attention(qkv=qkv), "q")

    for name in ("embed_dim", "num_heads"):
        for value in (0, -1, 1.5, None, "8", True):
            add(f"MultiheadDilatedAttention {name}={value!r}", _module(**{name: value}), name)
    add("MultiheadDilatedAttention embed_dim % num_heads", _module(embed_dim=6, num_heads=4), "num_heads")
    for name in ("segment_lengths", "dilation_rates"):
        for value in ([], [0], None, "abc"):
            add(f"MultiheadDilatedAttention {name}={value!r}", _module(**{name: value}), name)
    for value in (-0.5, 1.0, "0.1"):
        add(f"MultiheadDilatedAttention dropout={value!r}", _module(dropout=value), "dropout")
    for value in ("nope", ""):
        for name in ("mode", "backend", "ordering"):
            add(f"MultiheadDilatedAttention {name}={value!r}", _module(**{name: value}), name)

    for value in BAD_INTS:
        add(f"segment_permutation length={value!r}", _permutation(value), "length")
    for value in ("bogus", "", None, "rowmajor"):
        add(f"segment_permutation ordering={value!r}", _permutation(16, value), "ordering")
    for value in (2**40, 2**61 - 1):
        add(f"segment_permutation length={value}", _permutation(value), "length")

    coords = np.array([[0, 1], [2, 3]])
    for value in BAD_INTS + [64, 40]:
        add(f"encode order={value!r}", _encode(coords, value), "order")
        add(f"decode order={value!r}", _decode(np.array([0, 1]), value, 2), "order")
    for value in BAD_INTS:
        add(f"decode ndim={value!r}", _decode(np.array([0, 1]), 2, value), "ndim")
    for value in ("peano", "", None):
        add(f"encode curve={value!r}", _encode(coords, 2, curve=value), "curve")
        add(f"decode curve={value!r}", _decode(np.array([0, 1]), 2, 2, curve=value), "curve")
    for label, bad in (("negative", np.array([[-1, 0]])), ("too large", np.array([[4, 0]])),
                       ("float", np.array([[0.5, 1.0]])), ("torch negative", torch.tensor([[-1, 0]]))):
        add(f"encode coords {label}", _encode(bad, 2), "coords")
    for label, bad in (("negative", np.array([-1])), ("too large", np.array([16])), ("float", np.array([0.5]))):
        add(f"decode index {label}", _decode(bad, 2, 2), "index")

    for name in ("seq_len", "batch_size", "num_heads", "head_dim", "world_size"):
        for value in (0, -1, 1.5, "8", None, True):
            add(f"estimate_memory {name}={value!r}", _estimate(**{name: value}), name)
    add("estimate_memory num_heads=10**12", _estimate(num_heads=10**12), "num_heads")
    add("estimate_memory seq_len=2**60", _estimate(seq_len=2**60), "seq_len")
    add("estimate_memory head_dim=2**40", _estimate(head_dim=2**40), "head_dim")
    add("estimate_memory world_size=3", _estimate(world_size=3), "world_size")
    add("estimate_memory world_size=2", _estimate(world_size=2), "world_size")  # per rank: the ring's estimate
    add("estimate_memory_per_rank world_size=3", _estimate(per_rank=True, world_size=3), "world_size")
    for name, values in (("dtype", ("int8", "", None)), ("mode", ("sparse", None)), ("backend", ("magic", "")),
                         ("device", ("tpu", "", "cuda:x", None)), ("executor", ("magic", "", None, "inplace"))):
        for value in values:
            add(f"estimate_memory {name}={value!r}", _estimate(**{name: value}), name)
    for name in ("segment_lengths", "dilation_rates"):
        for value in ((), (0,), (-4,), (1.5,)):
            other = "dilation_rates" if name == "segment_lengths" else "segment_lengths"
            add(f"estimate_memory {name}={value!r}", _estimate(**{name: value, other: (1,) * max(len(value), 1)}), name)

    for rank, world, needle in ((-1, 2, "rank"), (2, 2, "rank"), (0, 0, "world_size"), (0, -1, "world_size"),
                                (1.5, 2, "rank"), (0, 3, "divisible"), ("0", 2, "rank"), (0, 2.0, "world_size")):
        add(f"shard rank={rank!r} world_size={world!r}", _shard(rank, world), needle)
        add(f"shard_positions rank={rank!r} world_size={world!r}", _positions(rank, world, 16), needle)
    for seq_len in (0, -16, 1.5, None):
        add(f"shard_positions seq_len={seq_len}", _positions(0, 2, seq_len), "seq_len")
    add("shard_positions seq_len=15", _positions(0, 2, 15), "divisible")
    add("shard_positions zigzag odd", _positions(0, 2, 6, "zigzag"), "divisible")
    add("zigzag_shard dim out of range", lambda: __import__("hilbert_lab.distributed.sharding", fromlist=["x"])
        .zigzag_shard(torch.zeros(1, 8), 0, 2, dim=2), "dim")
    add("shard_positions layout=bogus", _positions(0, 2, 16, "bogus"), "layout")
    add("shard dim out of range", _shard(0, 2, dim=7), "dim")

    # a size that cannot work must fail at once, never run for long: a limit on every case (a minute: what it must
    # not do runs for ever, and a busy machine's first call may import or compile for many seconds)
    return [pytest.param(thunk, needle, id=name[:90], marks=[pytest.mark.timeout(60)]) for name, thunk, needle in cases]


@pytest.mark.parametrize("call, needle", _api_cases())
def test_api_bad_value_raises_naming_the_argument(call, needle):
    with pytest.raises((ValueError, TypeError)) as error:
        call()
    assert needle in str(error.value), str(error.value)


# ---------------------------------------------------------------- family: config files with a field of the wrong type

def _wrong_json_values(hint: Any) -> list[Any]:
    """JSON values of another type than the annotation `hint` (two a field: a string, and another type)."""
    import typing

    optional = type(None) in typing.get_args(hint)
    if optional:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    values = {int: ["8", 1.5], float: ["0.1", True], bool: ["false", 1], str: [1, ["x"]]}.get(hint, ["8,16", [1.5]])
    return values + ([] if optional or hint is bool else [None])


def _config_cases() -> list[Any]:
    import typing

    from hilbert_lab.models.config import TrainConfig

    return [pytest.param(name, value, id=f"{name}={value!r}")
            for name, hint in typing.get_type_hints(TrainConfig).items() for value in _wrong_json_values(hint)]


@pytest.mark.parametrize("field, value", _config_cases())
def test_config_file_with_a_field_of_the_wrong_type_exits_2_naming_it(field, value, tmp_path):
    import json

    config = tmp_path / "config.json"
    config.write_text(json.dumps({field: value}))
    code, out, err = _run_cli(["train", "--out", str(tmp_path / "run"), "--config", str(config)])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (field, value, out[-300:], err[-1000:])
    assert f"{field} must be" in lines[0], lines[0]
    assert not (tmp_path / "run" / "log.jsonl").exists()


# ---------------------------------------------------------------- family: filesystem faults on every CLI path argument

RING_RUN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reports", "ring", "h200-gpu")
# (command, flag or positional dest) -> a valid argv with PATH where the path goes, and whether it is written
PATH_ARGUMENTS: dict[tuple[str, str], tuple[list[str], bool]] = {
    ("bench", "--out"): (["bench", "--selftest", "ok", "--out", "PATH", "--quiet"], True),
    ("bench", "--matrix"): (["bench", "--matrix", "PATH", "--out", "{tmp}/m_{n}.jsonl", "--dry-run"], False),
    ("probe", "--json-out"): (PROBE_BASE + ["--json-out", "PATH"], True),
    ("curve", "--out"): (["curve", "--width", "64", "--height", "64", "--out", "PATH"], True),
    ("train", "--out"): (["train", "--out", "PATH", "--steps", "1", "--checkpoint-every", "1", "--dim", "8", "--depth",
                          "1", "--batch-size", "2", "--quiet"], True),
    ("train", "--config"): (["train", "--out", "{tmp}/t_{n}", "--config", "PATH", "--quiet"], False),
    ("report run", "--output-root"): (["report", "run", "benchmark-small", "--output-root", "PATH"], True),
    ("report render", "run_dir"): (["report", "render", "PATH"], False),
    ("report render", "--out"): (["report", "render", RING_RUN, "--out", "PATH"], True),
}
_PATH_DEST = __import__("re").compile(r"(^|_)(out|config|matrix|dir|root|path|file)($|_)")


def _parser_path_arguments() -> dict[tuple[str, str], str]:
    """(command, flag) -> metavar of every argument of the `hilbert-lab` parser that names a path: its metavar
    ends in FILE or DIR (and every argument whose name says path must have such a metavar)."""
    import argparse

    from hilbert_lab.cli import build_parser

    found: dict[tuple[str, str], str] = {}

    def walk(parser: argparse.ArgumentParser, command: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{command} {name}".strip())
                continue
            name = action.option_strings[-1] if action.option_strings else action.dest
            metavar = str(action.metavar or "")
            if metavar.endswith(("FILE", "DIR")):
                found[(command, name)] = metavar
            elif _PATH_DEST.search(action.dest) and action.nargs != 0:
                found[(command, name)] = f"(no FILE/DIR metavar: {metavar!r})"

    walk(build_parser(), "")
    return found


def test_every_path_argument_of_the_parser_is_in_the_fault_sweep():
    found = _parser_path_arguments()
    assert set(found) == set(PATH_ARGUMENTS), set(found) ^ set(PATH_ARGUMENTS)
    assert all(metavar.endswith(("FILE", "DIR")) for metavar in found.values()), found


def _faults(root: str) -> dict[str, str]:
    """fault -> a path showing it (made once under `root`)."""
    faults = {"fifo": os.path.join(root, "fifo"), "dev-full": "/dev/full",
              "dangling-link": os.path.join(root, "dangling"), "link-loop": os.path.join(root, "loop"),
              "too-long-name": os.path.join(root, "x" * 300), "too-long-path": os.path.join(root, *(["ab"] * 2100)),
              "directory": os.path.join(root, "a_dir"), "file": os.path.join(root, "a_file")}
    if not os.path.exists(faults["fifo"]):
        os.mkfifo(faults["fifo"])
        os.symlink(os.path.join(root, "nowhere"), faults["dangling-link"])
        os.symlink(faults["link-loop"], faults["link-loop"])
        os.mkdir(faults["directory"])
    return faults


FOLDER_ARGUMENTS = {("train", "--out"), ("report run", "--output-root"), ("report render", "run_dir")}


def _fault_cases() -> list[Any]:
    cases = []
    for (command, flag), (_, _) in PATH_ARGUMENTS.items():
        folder = (command, flag) in FOLDER_ARGUMENTS
        for fault in ("fifo", "dev-full", "dangling-link", "link-loop", "too-long-name", "too-long-path",
                      "file" if folder else "directory"):
            cases.append(pytest.param(command, flag, fault, id=f"{command} {flag} {fault}"))
    return cases


@pytest.mark.timeout(120)  # wide: only a hang reaches it on a busy machine
@pytest.mark.parametrize("command, flag, fault", _fault_cases())
def test_a_path_argument_with_a_filesystem_fault_exits_2_with_one_line(command, flag, fault, sweep_dir):
    template, _ = PATH_ARGUMENTS[(command, flag)]
    argv = [a if a != "PATH" else _faults(sweep_dir)[fault] for a in _fill(template, sweep_dir, next(_counter))]
    code, out, err = _run_cli(argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (argv[:6], code, out[-300:], err[-1500:])
    if command == "report run" and missing_notebook_modules():
        return
    assert any(name in lines[0] for name in _names(flag)) or flag == "run_dir", lines[0]


FSIZE_SCRIPT = r'''
import contextlib, io, json, os, resource, sys
from hilbert_lab.cli import main
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    results.append([code, err.getvalue()])
print(json.dumps(results))
'''


@pytest.mark.slow  # 7-15 s of CPU: make test-all
@pytest.mark.timeout(120)
def test_a_file_size_limit_ends_each_writing_command_with_one_line_and_no_torn_file(tmp_path):
    """Every writing path argument under RLIMIT_FSIZE (a full disk as the process sees it), in one
    subprocess: exit 2, one line naming the file, and nothing torn left behind."""
    import json
    import subprocess
    import sys

    limit = 512  # below the smallest record or page any of these commands writes (a bench record: ~1 KB)
    runs = {key: [a.replace("PATH", str(tmp_path / f"out_{i}")) for a in _fill(template, str(tmp_path), i)]
            for i, (key, (template, writes)) in enumerate(PATH_ARGUMENTS.items())
            if writes and key not in {("report run", "--output-root"), ("probe", "--json-out")}}  # both write late
    runs[("curve", "--out")][-1] += ".csv"
    runs[("report render", "--out")][-1] += ".html"
    runs[("bench", "--out")][-2] += ".jsonl"
    proc = subprocess.run([sys.executable, "-c", FSIZE_SCRIPT, json.dumps(list(runs.values())), str(limit)],
                          capture_output=True, text=True, timeout=600, cwd=str(tmp_path))  # wide: a hang
    assert proc.returncode == 0, proc.stderr[-3000:]
    for (command, flag), (code, err) in zip(runs, json.loads(proc.stdout.strip().splitlines()[-1])):
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and "File too large" in lines[0], (command, flag, err[-1500:])
        assert str(tmp_path / "out_") in lines[0], lines[0]  # names the file
    for path in tmp_path.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert path.stat().st_size <= limit and not path.name.endswith(".tmp"), path
            if path.suffix in (".jsonl",):
                assert all(__import__("json").loads(line) for line in text.splitlines() if line.strip()), path
    assert not list(tmp_path.glob("out_*.csv")) and not list(tmp_path.glob("out_*.html"))


# ---------------------------------------------------------------- family: files the CLI reads, wrong content

def _run_folder(root, metrics: Any, env: Any = None) -> str:
    """A report run folder whose metrics.json (and env.json) hold `metrics` (`env`): JSON values, or bytes as is."""
    import json

    folder = root / "run"
    folder.mkdir()
    for name, content in (("metrics.json", metrics), ("env.json", env)):
        if content is not None:
            (folder / name).write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return str(folder)


def _checkpoint(root, state: dict[str, Any], *, checksum: bool = True, name: str = "checkpoint.pt") -> str:
    """`state` saved as a training checkpoint (with its sha256 unless checksum=False) in root/run/."""
    from hilbert_lab.models.checkpoint import atomic_save, save_checkpoint

    (root / "run").mkdir(exist_ok=True)
    path = root / "run" / name
    (save_checkpoint if checksum else atomic_save)(state, path)
    return str(path)


def _weights(**changes: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(config dict of the cpu-tiny preset, model weights of that preset with `changes`)."""
    from hilbert_lab.models.config import PRESETS, TrainConfig
    from hilbert_lab.models.loop import build_model

    config = TrainConfig.from_dict(dict(PRESETS["cpu-tiny"]))
    return config.to_dict(), build_model(TrainConfig.from_dict({**PRESETS["cpu-tiny"], **changes})).state_dict()


def _resumable(config: dict[str, Any], weights: dict[str, Any]) -> dict[str, Any]:
    """A format-2 checkpoint state a resume reads: every key `hilbert-lab train` writes."""
    from hilbert_lab.models.checkpoint import CHECKPOINT_FORMAT

    return {"format": CHECKPOINT_FORMAT, "config": config, "step": 0, "model": weights, "optimizer":
            {"state": {}, "param_groups": []}, "history": [], "rng": {"torch": torch.get_rng_state(), "cuda": None}}


def _file_cases() -> list[Any]:
    """(name, make(tmp_path) -> (argv, [what the one line must say]))."""
    render = lambda metrics, env=None: lambda tmp: (  # noqa: E731
        ["report", "render", _run_folder(tmp, metrics, env)], [str(tmp / "run" / "metrics.json")])
    cases = {
        "render a benchmark run without results": lambda tmp: (
            render({"report": "benchmark"})(tmp)[0], [str(tmp / "run" / "metrics.json"), "tables.results"]),
        "render a claims run without claims": lambda tmp: (
            render({"report": "claims", "tables": {}})(tmp)[0], [str(tmp / "run" / "metrics.json"), "tables.claims"]),
        "render a locality run without its table": lambda tmp: (
            render({"report": "locality", "tables": {"compare_orderings": {"rows": []}}})(tmp)[0],
            [str(tmp / "run" / "metrics.json"), "tables.compare_orderings"]),
        "render metrics.json holding an array": lambda tmp: (
            render([1, 2])(tmp)[0], [str(tmp / "run" / "metrics.json"), "holds an array", "expected the JSON object"]),
        "render metrics.json holding corrupt JSON": lambda tmp: (
            render(b'{"report": "benchmark",')(tmp)[0],
            [str(tmp / "run" / "metrics.json"), "not valid JSON", "line 1 column 24", "expected the JSON object"]),
        "render metrics.json holding binary": lambda tmp: (
            render(b"\x80\x04\x95\x00\xff")(tmp)[0], [str(tmp / "run" / "metrics.json"), "not UTF-8", "expected"]),
        "render metrics.json with tables an array": lambda tmp: (
            render({"report": "benchmark", "tables": [1]})(tmp)[0], [str(tmp / "run" / "metrics.json"), "'tables'"]),
        "render metrics.json with rows of numbers": lambda tmp: (
            render({"report": "training", "tables": {"runs": {"rows": [1, 2]}}})(tmp)[0],
            [str(tmp / "run" / "metrics.json"), "tables.runs"]),
        "render a suite whose parts are an array": lambda tmp: (
            render({"report": "default", "parts": ["locality"]})(tmp)[0],
            [str(tmp / "run" / "metrics.json"), "'parts'"]),
        "render env.json holding an array": lambda tmp: (
            render({"report": "custom"}, [1])(tmp)[0], [str(tmp / "run" / "env.json"), "holds an array"]),
        "generate from a format-1 checkpoint": lambda tmp: (
            ["generate", "--checkpoint", _checkpoint(tmp, {"format": 1}, checksum=False), "--prompt", "1"],
            [str(tmp / "run" / "checkpoint.pt"), "format 1 is no longer supported"]),
        "generate from a format-1 checkpoint with weights of another size": lambda tmp: (
            ["generate", "--checkpoint", _checkpoint(tmp, {"format": 1, "config": _weights()[0],
                                                           "model": _weights(dim=16)[1]}, checksum=False),
             "--prompt", "1"], [str(tmp / "run" / "checkpoint.pt"), "format 1 is no longer supported"]),
        "generate from a checkpoint without config": lambda tmp: (
            ["generate", "--checkpoint", _checkpoint(tmp, {"format": 2}), "--prompt", "1"],
            [str(tmp / "run" / "checkpoint.pt"), "lacks config, model"]),
        "generate from a checkpoint with weights of another size": lambda tmp: (
            ["generate", "--checkpoint", _checkpoint(tmp, {"format": 2, "config": _weights()[0],
                                                           "model": _weights(dim=16)[1]}), "--prompt", "1"],
            [str(tmp / "run" / "checkpoint.pt"), "model weights do not fit the configuration stored in it",
             "size mismatch"]),
        "generate from a checkpoint with an invalid config": lambda tmp: (
            ["generate", "--checkpoint", _checkpoint(tmp, {"format": 2, "config": {**_weights()[0], "dim": 0},
                                                           "model": _weights()[1]}), "--prompt", "1"],
            [str(tmp / "run" / "checkpoint.pt"), "invalid configuration", "dim must be"]),
        "train --resume from a format-1 checkpoint": lambda tmp: (
            ["train", "--out", os.path.dirname(_checkpoint(tmp, {"format": 1}, checksum=False)), "--resume", "--quiet"],
            [str(tmp / "run" / "checkpoint.pt"), "format 1 is no longer supported"]),
        "train --resume from a checkpoint without config": lambda tmp: (
            ["train", "--out", os.path.dirname(_checkpoint(tmp, {"format": 2})), "--resume", "--quiet"],
            [str(tmp / "run" / "checkpoint.pt"), "lacks config, model, step, optimizer, history, rng"]),
        "train --resume from a checkpoint without its optimizer": lambda tmp: (
            ["train", "--out", os.path.dirname(_checkpoint(tmp, {**_resumable(*_weights()), "optimizer": None})),
             "--resume", "--quiet"], [str(tmp / "run" / "checkpoint.pt"), "lacks optimizer"]),
        "train --resume from a checkpoint with weights of another size": lambda tmp: (
            ["train", "--out", os.path.dirname(_checkpoint(tmp, _resumable(_weights()[0], _weights(dim=16)[1]))),
             "--resume", "--quiet"],
            [str(tmp / "run" / "checkpoint.pt"), "model weights do not fit the configuration stored in it"]),
        "bench --out onto a results file whose case_id is a list": lambda tmp: (
            ["bench", "--selftest", "ok", "--out", _results(tmp, '{"case_id": ["a"], "status": "ok"}'), "--quiet"],
            [str(tmp / "results.jsonl"), "line 2", "case_id must be a string"]),
        "bench --out onto a results file whose case_id is an object": lambda tmp: (
            ["bench", "--selftest", "ok", "--out", _results(tmp, '{"case_id": {"a": 1}, "status": "ok"}'), "--quiet"],
            [str(tmp / "results.jsonl"), "line 2", "case_id must be a string"]),
        "bench --out onto a results file whose status is a number": lambda tmp: (
            ["bench", "--selftest", "ok", "--out", _results(tmp, '{"case_id": "x", "status": 0}'), "--quiet"],
            [str(tmp / "results.jsonl"), "line 2", "status must be a string"]),
    }
    return [pytest.param(make, id=name) for name, make in cases.items()]


def _results(root, line: str) -> str:
    """A results file: one record of the runner, then `line`."""
    path = root / "results.jsonl"
    path.write_text('{"case_id": "selftest-0", "status": "ok"}\n' + line + "\n")
    return str(path)


@pytest.mark.parametrize("make", _file_cases())
def test_a_file_with_the_wrong_content_exits_2_with_one_line_naming_it(make, tmp_path):
    argv, needles = make(tmp_path)
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    code, out, err = _run_cli(argv)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (argv, code, out[-300:], err[-2000:])
    assert all(needle in lines[0] for needle in needles), (needles, lines[0])
    after = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    assert {path: after[path] for path in before} == before  # the file is left as it was
    assert {path.name for path in set(after) - set(before)} <= {".train.lock"}  # and nothing else is written


# ---------------------------------------------------------------- family: train flags that do not fit together

@pytest.mark.parametrize("flags, needles", [
    (["--seq-len", "4", "--segment-lengths", "2,4"],
     ["--seq-len 4 is too short", "[2*num_pairs, seq_len - 2*num_queries] = [2, 2]", "give --seq-len >= 8, or "
      "--context-length in [2, 2]", "--segment-lengths 2,4 has 2 value(s) but dilation_rates 1,2,1 (preset cpu-tiny) "
      "has 3", "--dilation-rates with 2 value(s)"]),
    (["--seq-len", "5"], ["--seq-len 5 is too short", "(context length 4)", "= [2, 3]", "--seq-len >= 8"]),
    (["--seq-len", "12", "--num-pairs", "3", "--num-queries", "2", "--num-keys", "8"],
     ["--seq-len 12 is too short", "(context length 9)", "= [6, 8] (--num-pairs 3, --num-queries 2)",
      "--seq-len >= 16"]),
    (["--seq-len", "4", "--context-length", "3"], ["--context-length 3 must lie in", "= [2, 2] for --seq-len 4"]),
    (["--context-length", "63"], ["--context-length 63 must lie in", "= [2, 62] for seq_len 64 (preset cpu-tiny)"]),
    (["--dilation-rates", "1"], ["segment_lengths 8,16,64 (preset cpu-tiny) has 3 value(s) but --dilation-rates 1 "
                                 "has 1", "--dilation-rates with 3 value(s)"]),
])
def test_train_flags_that_do_not_fit_together_are_named_as_given(flags, needles, tmp_path):
    code, out, err = _run_cli(["train", "--out", str(tmp_path / "run"), "--quiet", *flags])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (flags, out[-300:], err[-2000:])
    assert all(needle in lines[0] for needle in needles) and "context_length must" not in lines[0], lines[0]
    assert not (tmp_path / "run").exists()


def test_the_seq_len_train_asks_for_is_the_shortest_whose_three_quarters_fit():
    from hilbert_lab.models.cli import _shortest_seq_len

    for pairs in range(1, 30):
        for queries in range(1, pairs + 1):
            fits = [n for n in range(2, 300) if 2 * pairs <= n - n // 4 <= n - 2 * queries]
            assert _shortest_seq_len(pairs, queries) == fits[0], (pairs, queries)


def test_a_config_file_whose_context_does_not_fit_is_named(tmp_path):
    import json

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"seq_len": 32, "context_length": 31}))
    code, _, err = _run_cli(["train", "--out", str(tmp_path / "run"), "--config", str(config)])
    assert code == 2 and err.strip() == (
        f"hilbert-lab train: error: context_length 31 (--config {str(config)!r}) must lie in [2*num_pairs, "
        f"seq_len - 2*num_queries] = [2, 30] for seq_len 32 (--config {str(config)!r})")
