"""The measured table `backend="auto"` reads on this GPU, then `auto` checked against it, in one process.

Table: every candidate executor ("sdpa", "triton", "fa4" where each runs) timed round-robin in every cell of
the sweep (bf16, H 12, w [2048, 4096, 8192], r [1, 2, 4]; both modes, causal or not, forward alone and
forward+backward; B 1 and 2, N 8K-512K at head dims 64 and 128, and ragged N = 32K + 5 and 128K + 5 at the
smallest head dim: query rows B * N * H a factor 2 apart, so that every call between 8K at B 1 and 512K at B 2
lies within the factor sqrt(2) a cell answers). It is written, after each finished cell, to the package
(hilbert_lab/attention/auto_tables/<kind>.json, kind from the GPU's name), where `auto` reads it
(attention.auto_table, rule 0 of attention.selection).

Check: per cell, `auto` (reading that table) timed beside the same executors on fresh inputs; prints auto
over the fastest executor per cell with its 95% interval, and a summary (bench.auto_table.check_summary: cells
where auto, and its pick timed by name, are within 3% of the fastest; auto's cells settled within, settled beyond
or undecided by their intervals), and writes the rows as JSON (--check-out: after each finished cell, its summary's
"finished" false until the last). --settle-rounds N times each undecided cell again, alone, with N rounds.
--check-against fastest times auto beside only the executor the table measured fastest in each cell. --stage
measure or check runs one of the two (check: the packaged table). Each cell's captured regions and cached memory
are freed before the next (bench.auto_table), so the last cells of a sweep have the memory the first had.

Usage: python benchmarks/bench_auto_table.py [--stage both|measure|check] [--check-out PATH] [--repeats 8]
       [--settle-rounds 0] [--burst-ms 0] [--check-against all|fastest]
       python benchmarks/bench_auto_table.py --verdict CHECK.json [CHECK.json ...]  (no GPU: the target over checks)
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from hilbert_lab.attention import unavailable_reason  # noqa: E402
from hilbert_lab.attention.auto_table import device_kind, load_table, table_path  # noqa: E402
from hilbert_lab.bench.auto_table import (  # noqa: E402
    CHECK_AGAINST, check_auto_table, check_summary, measure_auto_table, sweep_cells, update_cells,
)
from hilbert_lab.bench.env import collect_environment  # noqa: E402
from hilbert_lab.bench.targets import (  # noqa: E402
    auto_check_verdicts, format_verdicts, read_runs, runs_line,
)
from hilbert_lab.io import atomic_write, strip_paths  # noqa: E402

PATTERN = dict(segment_lengths=[2048, 4096, 8192], dilation_rates=[1, 2, 4])


def ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def print_verdicts(parser: argparse.ArgumentParser, paths: list[str]) -> None:
    """auto within 3% of the fastest over the checks at `paths` (bench.targets): met only where every check meets it;
    the cells that miss, each with its ratio per check."""
    try:
        rows = auto_check_verdicts(read_runs(paths))
    except ValueError as error:  # a file that cannot be read, or is JSON but not a check of this script
        parser.error(f"--verdict: {error}")
    print(runs_line(paths, "check"))
    print("\n".join(format_verdicts(rows, "auto within 3% of the fastest", missed_only=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", default="8192,32768,131072,524288")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--ragged-lens", default="32773,131077")
    parser.add_argument("--batches", default="1,2")
    parser.add_argument("--backends", default="sdpa,triton,fa4")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--settle-rounds", type=int, default=0,
                        help="check: time a cell whose interval of auto over the fastest holds the 3%% tolerance "
                             "again, alone, with this many rounds (default 0: no second timing)")
    parser.add_argument("--burst-ms", type=float, default=0.0,
                        help="each round's sample a burst of calls issued back to back for about this long, as a "
                             "training loop issues steps (bench.timing.time_interleaved; 0, the default: one call "
                             "after a device sync, as the packaged table was measured)")
    parser.add_argument("--check-against", choices=CHECK_AGAINST, default="all",
                        help="check: time auto beside every executor of the table (all, the default) or beside the "
                             "one the table measured fastest in each cell (fastest: a fraction of the time)")
    parser.add_argument("--stage", choices=("both", "measure", "check"), default="both",
                        help="measure the table, check auto against the packaged one, or both (default)")
    parser.add_argument("--check-out", default=None, help="JSON of the check (default: none written)")
    parser.add_argument("--update", action="store_true",
                        help="measure only the given cells into the packaged table, each marked with this revision, "
                             "keeping its other cells (e.g. --seq-lens '' --ragged-lens 32773,131077)")
    parser.add_argument("--verdict", nargs="+", metavar="CHECK.json", default=None,
                        help="no timing: read checks this benchmark wrote (--check-out) and print whether auto is "
                             "within 3%% of the fastest in every check, per cell (bench.targets)")
    args = parser.parse_args()
    if args.verdict:
        print_verdicts(parser, args.verdict)
        return
    if args.settle_rounds < 0:
        parser.error(f"--settle-rounds must be >= 0, got {args.settle_rounds}")
    if args.burst_ms < 0:
        parser.error(f"--burst-ms must be >= 0, got {args.burst_ms}")
    burst_ms = args.burst_ms or None
    if not torch.cuda.is_available():
        print("bench_auto_table: needs a CUDA GPU", file=sys.stderr)
        raise SystemExit(2)
    device = torch.device("cuda")
    kind = device_kind(torch.cuda.get_device_name(device))
    began = time.time()
    if args.stage != "check":
        backends = [name for name in args.backends.split(",")
                    if unavailable_reason(name, device, torch.bfloat16) is None]
        cells = sweep_cells(ints(args.seq_lens), ints(args.head_dims), ints(args.ragged_lens),
                            batches=ints(args.batches))
        meta = dict(env=collect_environment(str(device)), command=strip_paths(" ".join(sys.argv)))
        path = table_path(kind)
        path.parent.mkdir(parents=True, exist_ok=True)

        previous = json.loads(path.read_text()) if args.update else None
        revision = meta["env"].get("git", {}).get("commit") or "unknown"

        def keep(table: dict) -> None:
            written = {**meta, **table} if previous is None else update_cells(previous, table, revision=revision)
            atomic_write(path, json.dumps(written, indent=1))

        measure_auto_table(cells, backends, **PATTERN, device=device, repeats=args.repeats, on_cell=keep,
                           burst_ms=burst_ms)
        load_table.cache_clear()
        print(f"wrote {path} in {time.time() - began:.0f} s", flush=True)
    if args.stage == "measure":
        return
    table = json.loads(table_path(kind).read_text())
    check_meta = dict(env=collect_environment(str(device)), command=strip_paths(" ".join(sys.argv)),
                      table=f"hilbert_lab/attention/auto_tables/{kind}.json")

    def keep_rows(rows: list[dict], finished: bool = False) -> None:
        if args.check_out:
            summary = {**check_summary(rows), "seconds": time.time() - began, "finished": finished}
            out = Path(args.check_out)
            out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(out, json.dumps(dict(check_meta, summary=summary, rows=rows), indent=1, default=str))

    rows = check_auto_table(table, device=device, repeats=args.repeats, settle_rounds=args.settle_rounds,
                            burst_ms=burst_ms, against=args.check_against, on_row=keep_rows)
    print(f"{'mode':11s} {'c':1s} {'N':>7s} {'D':>3s} {'dir':7s} {'auto picks':10s} {'fastest':8s} auto/fastest "
          f"(95% interval)")
    for row in rows:
        low, high = row.get("auto_over_fastest_interval", (float("nan"), float("nan")))
        print(f"{row['mode']:11s} {int(row['causal'])} {row['seq_len']:7d} {row['head_dim']:3d} "
              f"{'fwd+bwd' if row['training'] else 'fwd':7s} {row['auto_picks']:10s} {row.get('fastest', '-'):8s} "
              f"{row.get('auto_over_fastest', float('nan')):.3f} ({low:.3f}-{high:.3f})")
    keep_rows(rows, finished=True)
    print(json.dumps({**check_summary(rows), "seconds": time.time() - began}))

if __name__ == "__main__":
    main()
