"""`hilbert-lab info | bench | probe | estimate | select`: the machine, the safe benchmark runner, the
length probe, the memory estimate and the timed backend selection (registered by hilbert_lab.cli).
Heavy imports happen inside the commands."""
from __future__ import annotations

import argparse
import json
import signal
from typing import Any, Sequence

from hilbert_lab import arguments
from hilbert_lab.arguments import (
    EXIT_INTERRUPTED, MAX_SEQ_LEN, add_command, available_device, choice_list, int_list, integer, number,
)
from hilbert_lab.bench.cases import PASSES, SELFTEST_BEHAVIORS, known_backends
from hilbert_lab.bench.config import SafetyConfig
from hilbert_lab.dtypes import DTYPES

MAX_SECONDS = 7 * 24 * 3600.0
_SAFE = SafetyConfig()  # the defaults of the safety flags

# ---------------------------------------------------------------- argument helpers

def _orderings() -> tuple[str, ...]:
    from hilbert_lab.curves import ORDERINGS

    return tuple(ORDERINGS)


def _ordering_list(text: str) -> list[str | None]:
    allowed = ("none",) + _orderings()
    return [None if v in ("none", "identity") else v for v in choice_list(allowed)(text)]


def _add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """Batch, heads, head dim and the pattern's lists: the flags every attention command takes."""
    parser.add_argument("--batch-size", type=integer(1), default=1, help="B of the (B, N, H, D) inputs")
    parser.add_argument("--num-heads", type=integer(1), default=4, help="H, attention heads")
    parser.add_argument("--head-dim", type=integer(1), default=32, help="D, channels per head")
    parser.add_argument("--segment-lengths", type=int_list(), default=[256, 512],
                        help="comma-separated, e.g. 2048,4096,8192")
    parser.add_argument("--dilation-rates", type=int_list(), default=[1, 2], help="comma-separated, e.g. 1,2,4")
    parser.add_argument("--causal", action="store_true", help="causal attention (default: not causal)")


def _add_attention_arguments(parser: argparse.ArgumentParser, *, sweep: bool, run: bool = True) -> None:
    """Shape/pattern flags shared by bench, probe and estimate (sweep: lists allowed; run: the device
    must exist here)."""
    from hilbert_lab.attention.pattern import MODES

    many = "comma-separated list; " if sweep else ""
    parser.add_argument("--backend", type=choice_list(known_backends()), default=["manual"] if sweep else ["auto"],
                        help=f"{many}one of: {', '.join(known_backends())}")
    parser.add_argument("--mode", type=choice_list(MODES), default=["longnet"], help=f"{many}{' | '.join(MODES)}")
    parser.add_argument("--dtype", type=choice_list(DTYPES), default=["float32"], help=f"{many}{' | '.join(DTYPES)}")
    parser.add_argument("--ordering", type=_ordering_list, default=[None],
                        help=f"{many}{' | '.join(_orderings())} (default: identity, the tokens in their order)")
    parser.add_argument("--device", type=available_device if run else arguments.device, default="cpu",
                        help=arguments.DEVICE_SYNTAX + ("" if run else "; need not exist here"))
    _add_shape_arguments(parser)


def _single(values: list, flag: str) -> Any:
    if len(values) != 1:
        raise ValueError(f"{flag} takes one value here, got {values}")
    return values[0]


def _base_case(args: argparse.Namespace, kind: str = "attention") -> dict[str, Any]:
    return {"kind": kind, "backend": _single(args.backend, "--backend"), "mode": _single(args.mode, "--mode"),
            "dtype": _single(args.dtype, "--dtype"), "ordering": _single(args.ordering, "--ordering"),
            "device": args.device, "batch_size": args.batch_size, "num_heads": args.num_heads,
            "head_dim": args.head_dim, "segment_lengths": args.segment_lengths,
            "dilation_rates": args.dilation_rates, "causal": args.causal}


def _validate_pattern(args: argparse.Namespace, seq_lens: Sequence[int] = ()) -> None:
    """The pattern, and the sizes (B, N, H, D) for each sequence length, as the memory estimate checks them."""
    from hilbert_lab.attention.pattern import DilatedPattern
    from hilbert_lab.attention.memory import MemoryConfig

    for mode in args.mode:
        DilatedPattern.create(args.segment_lengths, args.dilation_rates, mode=mode, causal=args.causal)
    for seq_len in seq_lens:
        for dtype in args.dtype:
            MemoryConfig(seq_len=seq_len, batch_size=args.batch_size, num_heads=args.num_heads,
                         head_dim=args.head_dim, segment_lengths=tuple(args.segment_lengths),
                         dilation_rates=tuple(args.dilation_rates), dtype=dtype,
                         world_size=getattr(args, "world_size", 1))


def _safety_config(args: argparse.Namespace) -> SafetyConfig:
    fields = {"timeout": "case_timeout_s", "max_seq_len": "max_seq_len", "max_case_seconds": "max_case_seconds",
              "max_memory_fraction": "max_memory_fraction"}  # flag -> SafetyConfig field, where the flag was given
    return SafetyConfig(**{field: getattr(args, flag) for flag, field in fields.items()
                           if getattr(args, flag, None) is not None})


# ---------------------------------------------------------------- info

def _info(args: argparse.Namespace) -> int:
    import torch

    from hilbert_lab.attention.auto_table import describe_table, device_kind
    from hilbert_lab.attention.executors import available_backends
    from hilbert_lab.attention.selection import get_gpu_info, rule_backend
    from hilbert_lab.bench.env import cpu_description, package_versions
    from hilbert_lab.bench.checker import query_memory

    memory = query_memory("cpu")
    info: dict[str, Any] = {"cpu": cpu_description(), "ram_total_bytes": memory.total_bytes,
                            "ram_available_bytes": memory.free_bytes, "packages": package_versions(),
                            "cuda_available": torch.cuda.is_available(), "devices": {}}
    devices = ["cpu"] + ([f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else [])
    for device in devices:
        entry: dict[str, Any] = {}
        if device.startswith("cuda"):
            entry["gpu"] = get_gpu_info(int(device.split(":")[1]))
            entry["auto_table"] = describe_table(device_kind(entry["gpu"]["name"]))
        entry["backends"] = available_backends(device)
        entry["auto"] = {dtype: rule_backend(device, getattr(torch, dtype)) for dtype in DTYPES}
        info["devices"][device] = entry
    if args.json:
        print(json.dumps(info, indent=1, default=str))
        return 0
    from hilbert_lab.bench.config import format_bytes

    cpu = info["cpu"]
    print(f"CPU: {cpu['model']} ({cpu['usable_cores']} usable of {cpu['logical_cores']} logical cores, {cpu['machine']})")
    print(f"RAM: {format_bytes(info['ram_available_bytes'])} available of {format_bytes(info['ram_total_bytes'])}")
    print("packages: " + ", ".join(f"{k} {v}" for k, v in info["packages"].items() if v))
    if not torch.cuda.is_available():
        print("CUDA: not available")
    for device, entry in info["devices"].items():
        gpu = entry.get("gpu")
        if gpu:
            print(f"{device}: {gpu['name']} ({gpu['architecture']}, compute capability "
                  f"{'.'.join(map(str, gpu['compute_capability']))}, {gpu['memory_gb']:.1f} GiB, "
                  f"bf16 {'yes' if gpu['supports_bf16'] else 'no'})\n{device} {entry['auto_table']}")
        print(f"{device} backends: {', '.join(entry['backends'])}")
        print(f"{device} auto picks: " + ", ".join(f"{d} -> {b}" for d, b in entry["auto"].items()))
    return 0


# ---------------------------------------------------------------- bench

def _bench_cases(args: argparse.Namespace) -> list[dict[str, Any]]:
    from hilbert_lab.bench.matrix import expand_matrix, load_matrix_file

    if args.selftest is not None:
        if args.matrix is not None or args.seq_len:
            raise ValueError("--selftest excludes --matrix and --seq-len")
        return expand_matrix({"kind": "selftest", "seconds": 0.0}, {"behavior": args.selftest, "value": [0]})
    if args.matrix is not None:
        if args.seq_len:
            raise ValueError("--matrix and --seq-len exclude each other: put seq_len in the matrix file")
        return load_matrix_file(args.matrix)
    if not args.seq_len:
        raise ValueError("bench needs --seq-len (or --matrix FILE, or --selftest)")
    _validate_pattern(args, args.seq_len)
    base = {"kind": "attention", "device": args.device, "batch_size": args.batch_size, "num_heads": args.num_heads,
            "head_dim": args.head_dim, "segment_lengths": args.segment_lengths, "dilation_rates": args.dilation_rates,
            "causal": args.causal, "pass": args.pass_, "warmup": args.warmup, "repeats": args.repeats}
    if args.threads:
        base["threads"] = args.threads
    matrix = {"backend": args.backend, "seq_len": args.seq_len, "mode": args.mode, "ordering": args.ordering,
              "dtype": args.dtype}
    return expand_matrix(base, matrix)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _bench(args: argparse.Namespace) -> int:
    from hilbert_lab.bench.runner import SafeBenchmarkRunner, results_table

    cases = _bench_cases(args)
    out = arguments.prepare_output(args.out, "--out", existing="keep")
    runner = SafeBenchmarkRunner(out, config=_safety_config(args), progress=not args.quiet,
                                 retry_failed=args.retry_failed, check_memory=not args.no_memory_check)
    if args.dry_run:
        pending, skipped = runner.pending(cases)
        print(f"{len(cases)} cases: {len(pending)} to run, {skipped} already finished in {out}")
        return 0
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM: stop like Ctrl-C, keep results
    try:
        summary = runner.run(cases)
    finally:
        signal.signal(signal.SIGTERM, previous)
    print("\n".join(results_table(summary.records) + [summary.line()]))
    for record in summary.records:
        if record["status"] != "ok":
            print(f"  failed [{record['status']}] {record['case_id']}: {record['error']}")
    if summary.interrupted:
        return EXIT_INTERRUPTED
    return 1 if summary.failed else 0


# ---------------------------------------------------------------- probe

def _probe(args: argparse.Namespace) -> int:
    from hilbert_lab.bench.progressive import ProgressiveTester

    _validate_pattern(args, [args.start_len])
    json_out = arguments.prepare_output(args.json_out, "--json-out") if args.json_out is not None else None
    base = _base_case(args)
    base.update({"pass": args.pass_, "warmup": 1, "repeats": 1})
    tester = ProgressiveTester(base, config=_safety_config(args), start_len=args.start_len,
                               multiple_of=args.multiple_of, bisect_steps=args.bisect_steps, progress=not args.quiet)
    report = tester.run()
    print(report.line())
    if json_out is not None:
        from hilbert_lab.bench.env import collect_environment

        from hilbert_lab.io import atomic_write

        payload = {**report.to_dict(), "base_case": base, "environment": collect_environment(args.device)}
        atomic_write(json_out, json.dumps(payload, indent=1, default=str))
    return 0


# ---------------------------------------------------------------- estimate

def _estimate(args: argparse.Namespace) -> int:
    from hilbert_lab.attention.memory import MemoryConfig
    from hilbert_lab.distributed.memory import estimate_memory_per_rank
    from hilbert_lab.bench.checker import MemorySafetyChecker
    from hilbert_lab.bench.config import format_bytes

    _validate_pattern(args, args.seq_len)
    base = _base_case(args)
    base.pop("kind")
    rows = []
    for seq_len in args.seq_len:
        estimate = estimate_memory_per_rank(MemoryConfig(seq_len=seq_len, world_size=args.world_size, **{
            k: (tuple(v) if isinstance(v, list) else v) for k, v in base.items()}))
        required = estimate.total_forward_backward_bytes if args.pass_ == "forward_backward" else estimate.total_forward_bytes
        try:
            fits, reason = MemorySafetyChecker(_safety_config(args), args.device).check_memory_available(required)
        except ValueError as error:  # e.g. a CUDA estimate on a machine without CUDA
            fits, reason = None, str(error)
        assumed = {"shape": [args.batch_size, seq_len, args.num_heads, args.head_dim], **base, "pass": args.pass_,
                   "world_size": args.world_size}  # backend: as requested ("auto"); the row's backend: as resolved
        rows.append({"seq_len": seq_len, **estimate.to_dict(), "fits": fits, "fit_reason": reason, "assumed": assumed})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    unit = "per rank " if args.world_size > 1 else ""
    print(_assumed_line(args, base))
    print(f"{'seq_len':>9} {'backend':>9} {'executor':>13} {'inputs':>11} {'forward':>11} {'fwd+bwd':>11} "
          f"{'total':>11}  fits")
    for row in rows:
        total = row["total_forward_backward_bytes"] if args.pass_ == "forward_backward" else row["total_forward_bytes"]
        fits = {True: "yes", False: "NO", None: "?"}[row["fits"]]
        print(f"{row['seq_len']:>9} {row['backend']:>9} {row['executor']:>13} {format_bytes(row['inputs_bytes']):>11} "
              f"{format_bytes(row['forward_bytes']):>11} {format_bytes(row['forward_backward_bytes']):>11} "
              f"{format_bytes(total):>11}  {fits}" + ("" if row["fits"] else f" ({row['fit_reason']})"))
    print(f"(bytes {unit}above the inputs unless 'total'; device {args.device})")
    return 0


def _assumed_line(args: argparse.Namespace, base: dict[str, Any]) -> str:
    """The inputs and pattern an estimate assumes, in one line: shape, dtype, device, pattern, backend, pass."""
    from hilbert_lab.arguments import default_text

    ring = f", ring of {args.world_size} ranks" if args.world_size > 1 else ""
    ordering = f", ordering {base['ordering']}" if base["ordering"] else ""
    return (f"assumed: q, k, v of shape (B, N, H, D) = ({args.batch_size}, N, {args.num_heads}, {args.head_dim}) "
            f"{base['dtype']} on {base['device']}{ring}; {base['mode']} pattern, segment lengths "
            f"{default_text(base['segment_lengths'])}, dilation rates {default_text(base['dilation_rates'])}, "
            f"{'causal' if base['causal'] else 'not causal'}{ordering}; backend {base['backend']}; "
            f"pass {args.pass_.replace('_', '+')}")


# ---------------------------------------------------------------- select

def _select(args: argparse.Namespace) -> int:
    import torch

    from hilbert_lab.attention.pattern import DilatedPattern
    from hilbert_lab.bench.selection import measure_selection

    rows = []
    for mode in args.mode:
        DilatedPattern.create(args.segment_lengths, args.dilation_rates, mode=mode, causal=args.causal)
    for seq_len in args.seq_len:
        for dtype in args.dtype:
            for mode in args.mode:
                shape = (args.batch_size, seq_len, args.num_heads, args.head_dim)
                try:
                    result = measure_selection(args.device, getattr(torch, dtype), shape, args.segment_lengths,
                                               args.dilation_rates, mode=mode, causal=args.causal,
                                               repeats=args.repeats, refresh=args.refresh)
                except OSError as error:
                    raise ValueError(f"the selection cache is not writable (set HILBERT_LAB_CACHE_DIR): {error}")
                rows.append({"seq_len": seq_len, "dtype": dtype, "mode": mode, **result})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for row in rows:
        timed = ", ".join(f"{name} {ms:.3f} ms" for name, ms in sorted(row["timings_ms"].items(), key=lambda i: i[1]))
        print(f"N={row['seq_len']} {row['dtype']} {row['mode']}: {row['backend']} ({row['source']}"
              + (f": {timed})" if timed else ")"))
    if rows:
        print(f"(selection cache: {rows[0]['path']}; read by select_backend(..., timed=True))")
    return 0


# ---------------------------------------------------------------- registration

def register_cli(subparsers: "argparse._SubParsersAction") -> None:
    """Add the info, bench, probe, estimate and select commands to the `hilbert-lab` parser's subparsers."""
    info = add_command(subparsers, "info", "hardware, available backends and what 'auto' picks per dtype",
                       "  hilbert-lab info\n  hilbert-lab info --json > machine.json")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(func=_info)

    bench = add_command(subparsers, "bench", "run a benchmark matrix safely (isolated cases, append-only JSONL, resume)",
                        "  hilbert-lab bench --seq-len 2048,4096 --backend manual,sdpa --out runs/cpu.jsonl\n"
                        "  hilbert-lab bench --matrix bench.yaml --out runs/matrix.jsonl --timeout 300\n"
                        "  hilbert-lab bench --matrix bench.yaml --out runs/matrix.jsonl   # again: resumes\n"
                        "  hilbert-lab bench --selftest ok,raise --out /tmp/selftest.jsonl\n\n"
                        "matrix file (YAML or TOML): base: {fields}, matrix: {field: [values]}, cases: [{fields}]\n"
                        "  base: {kind: attention, num_heads: 8, head_dim: 64, segment_lengths: [2048, 4096],\n"
                        "         dilation_rates: [1, 2], device: cuda, dtype: bfloat16}\n"
                        "  matrix: {backend: [sdpa, flex], seq_len: [32768, 65536], mode: [longnet, head_groups]}")
    bench.add_argument("--out", required=True, metavar="FILE", help="results file (JSON lines; only ever appended to; missing "
                       "folders are created)")
    bench.add_argument("--matrix", type=arguments.input_file, metavar="FILE",
                       help="YAML/TOML matrix file (instead of the flags below)")
    bench.add_argument("--selftest", type=choice_list(SELFTEST_BEHAVIORS),
                       help="run built-in self-test cases (checks the runner without the engine)")
    bench.add_argument("--seq-len", type=int_list(1, MAX_SEQ_LEN), help="comma-separated sequence lengths")
    _add_attention_arguments(bench, sweep=True)
    bench.add_argument("--pass", dest="pass_", choices=PASSES, default="forward", help="what each case times")
    bench.add_argument("--warmup", type=integer(0, 1000), default=1, help="untimed runs per case, 0..1000")
    bench.add_argument("--repeats", type=integer(1, 1000), default=3, help="timed runs per case, 1..1000")
    bench.add_argument("--threads", type=integer(1, 1024), default=None, help="torch threads per case (default: torch's)")
    bench.add_argument("--timeout", type=number(0, MAX_SECONDS), default=None, help=f"seconds per case (default: {_SAFE.case_timeout_s:g})")
    bench.add_argument("--max-seq-len", type=integer(1, MAX_SEQ_LEN), default=None,
                       help=f"a longer case is refused, not run (default: {_SAFE.max_seq_len})")
    bench.add_argument("--retry-failed", action="store_true", help="re-run cases recorded as failed")
    bench.add_argument("--no-memory-check", action="store_true", help="run cases even when the estimate does not fit")
    bench.add_argument("--dry-run", action="store_true", help="only count cases to run / already finished")
    bench.add_argument("--quiet", action="store_true", help="no progress bar")
    bench.set_defaults(func=_bench)

    probe = add_command(subparsers, "probe", "find the largest sequence length that runs (doubling, then bisecting)",
                        "  hilbert-lab probe --backend sdpa --start-len 4096\n"
                        "  hilbert-lab probe --backend manual --pass forward_backward --max-case-seconds 20 "
                        "--json-out probe.json")
    _add_attention_arguments(probe, sweep=False)
    probe.add_argument("--pass", dest="pass_", choices=PASSES, default="forward", help="what each run executes")
    probe.add_argument("--start-len", type=integer(1, MAX_SEQ_LEN), default=1024, help="first sequence length tried")
    probe.add_argument("--multiple-of", type=integer(1, 1 << 20), default=256, help="bisection granularity (default: 256)")
    probe.add_argument("--bisect-steps", type=integer(0, 30), default=3, help="bisections after the first failure")
    probe.add_argument("--max-seq-len", type=integer(1, MAX_SEQ_LEN), default=None, help=f"upper limit (default: {_SAFE.max_seq_len})")
    probe.add_argument("--max-case-seconds", type=number(0, MAX_SECONDS), default=None,
                       help=f"slowest allowed run, seconds (default: {_SAFE.max_case_seconds:g})")
    probe.add_argument("--max-memory-fraction", type=number(0, 1), default=None, help=f"largest share of the device's memory a run may plan to use, in (0, 1] (default: {_SAFE.max_memory_fraction:g})")
    probe.add_argument("--timeout", type=number(0, MAX_SECONDS), default=None, help=f"seconds per run (default: {_SAFE.case_timeout_s:g})")
    probe.add_argument("--json-out", metavar="FILE", help="write the report as JSON here (a new file; missing folders are created)")
    probe.add_argument("--quiet", action="store_true", help="no progress lines")
    probe.set_defaults(func=_probe)

    estimate = add_command(subparsers, "estimate", "estimated peak memory of the engine (and whether it fits)",
                           "  hilbert-lab estimate --seq-len 16384,65536 --backend manual\n"
                           "  hilbert-lab estimate --seq-len 1048576 --device cuda --dtype bfloat16 --backend flash "
                           "--num-heads 12 --head-dim 64 --segment-lengths 2048,4096,8192 --dilation-rates 1,2,4\n"
                           "  hilbert-lab estimate --seq-len 262144 --world-size 8 --json")
    estimate.add_argument("--seq-len", type=int_list(1, MAX_SEQ_LEN), required=True,
                          help="comma-separated sequence lengths")
    _add_attention_arguments(estimate, sweep=False, run=False)
    estimate.add_argument("--pass", dest="pass_", choices=PASSES, default="forward_backward",
                          help="the peak of this pass decides 'fits'")
    estimate.add_argument("--world-size", type=integer(1, 1 << 20), default=1, help="ring attention: estimate per rank")
    estimate.add_argument("--json", action="store_true", help="machine-readable output")
    estimate.set_defaults(func=_estimate)

    from hilbert_lab.attention.pattern import MODES

    select = add_command(subparsers, "select", "time the backends that run here on one input per shape and store the "
                         "fastest for select_backend(..., timed=True)",
                         "  hilbert-lab select --seq-len 4096 --num-heads 8 --head-dim 64\n"
                         "  hilbert-lab select --device cuda --dtype bfloat16 --seq-len 32768,65536 "
                         "--segment-lengths 2048,4096,8192 --dilation-rates 1,2,4 --mode longnet,head_groups --refresh")
    select.add_argument("--seq-len", type=int_list(1, MAX_SEQ_LEN), required=True,
                        help="comma-separated sequence lengths")
    select.add_argument("--device", type=available_device, default="cpu",
                        help=f"{arguments.DEVICE_SYNTAX} (default: cpu)")
    select.add_argument("--dtype", type=choice_list(DTYPES), default=["float32"],
                        help=f"comma-separated list; {' | '.join(DTYPES)}")
    select.add_argument("--mode", type=choice_list(MODES), default=["longnet"],
                        help=f"comma-separated list; {' | '.join(MODES)}")
    _add_shape_arguments(select)
    select.add_argument("--repeats", type=integer(1, 1000), default=3, help="timed rounds per candidate, 1..1000")
    select.add_argument("--refresh", action="store_true", help="time again keys already stored")
    select.add_argument("--json", action="store_true", help="machine-readable output")
    select.set_defaults(func=_select)
