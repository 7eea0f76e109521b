"""Benchmark: 2D Hilbert encode/decode throughput on the CPU beside the streaming limit and hilbertsfc.

Encodes and decodes ``--points`` (default 2**24) random 2D points at ``--order`` (default 12),
single- and multi-threaded (numba.set_num_threads), and reports points/s for

* ``kernel``: hilbert_lab.kernels.hilbert_numba into preallocated outputs (int64 (N, 2) coords in,
  int64 index out; decode the reverse) -- 24 bytes moved per point;
* ``api``: hilbert_lab.curves.encode/decode, the public calls: allocating (default index dtype
  uint32 here, since 2 * order <= 32) and with ``out=`` into preallocated uint32 / uint16 arrays;
* the streaming limit: a measured numpy copy moving the same number of bytes (read + write),
  split over the same number of threads;
* hilbertsfc 0.5.1 (needs Python >= 3.12), timed in a subprocess under a Python 3.12 virtual
  environment (created with ``--create-venv``): same int64 inputs and 64-bit outputs ("matched",
  24 bytes/point), and its own preferred dtypes (uint16 coords, uint32 index; 8 bytes/point).

Ours and hilbertsfc are timed alternately (copy, ours, hilbertsfc, ours, copy) and the median of
all repeats is reported (the best is kept beside it), because the machine may be shared (the JSON
records the load average and the environment block of hilbert_lab.bench.env). Our cases and the
copy are timed by hilbert_lab.bench.timing.time_function (perf_counter, one warm-up call for ours);
hilbertsfc runs under another interpreter without hilbert_lab, so its subprocess keeps the same
loop (one warm-up call, then perf_counter around each repeat) in HILBERTSFC_SCRIPT. Correctness
is checked: both libraries' indices must be identical (sha256 of the int64 index array), and our
decode must return the input points.

    .venv/bin/python benchmarks/bench_curves.py --create-venv          # full run, writes JSON
    .venv/bin/python benchmarks/bench_curves.py --points 1048576 --no-hilbertsfc   # quick
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numba
import numpy as np
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hilbert_lab.io import strip_paths  # noqa: E402
from hilbert_lab.bench.env import collect_environment  # noqa: E402
from hilbert_lab.bench.timing import time_function  # noqa: E402
from hilbert_lab.curves import decode, encode  # noqa: E402
from hilbert_lab.kernels import hilbert_numba as kernels  # noqa: E402

HILBERTSFC_VERSION = "0.5.1"
# Bytes read + written per point by each hilbertsfc case (see HILBERTSFC_SCRIPT).
HILBERTSFC_BYTES = {"encode_matched": 24, "decode_matched": 24, "encode_native": 8, "decode_native": 8,
                    "encode_api": 20, "decode_api": 8}

HILBERTSFC_SCRIPT = r'''
import hashlib, json, sys, time
import numba, numpy as np
import hilbertsfc as h
args = json.loads(sys.argv[1])
coords = np.load(args["input"])
order, repeats, threads = args["order"], args["repeats"], args["threads"]
numba.set_num_threads(threads)
parallel = threads > 1
n = coords.shape[0]
x = np.ascontiguousarray(coords[:, 0]); y = np.ascontiguousarray(coords[:, 1])
x16 = x.astype(np.uint16); y16 = y.astype(np.uint16)
index64 = np.empty(n, np.uint64); out_x = np.empty(n, np.uint64); out_y = np.empty(n, np.uint64)
index32 = np.empty(n, np.uint32); out_x16 = np.empty(n, np.uint16); out_y16 = np.empty(n, np.uint16)
cases = {
    "encode_matched": lambda: h.hilbert_encode_2d(x, y, nbits=order, out=index64, parallel=parallel),
    "decode_matched": lambda: h.hilbert_decode_2d(index64, nbits=order, out_x=out_x, out_y=out_y, parallel=parallel),
    "encode_native": lambda: h.hilbert_encode_2d(x16, y16, nbits=order, out=index32, parallel=parallel),
    "decode_native": lambda: h.hilbert_decode_2d(index32, nbits=order, out_x=out_x16, out_y=out_y16, parallel=parallel),
    "encode_api": lambda: h.hilbert_encode_2d(x, y, nbits=order, parallel=parallel),
    "decode_api": lambda: h.hilbert_decode_2d(index32, nbits=order, parallel=parallel),
}
best = {}
for name, case in cases.items():
    case()  # compile
    times = []
    for _ in range(repeats):
        start = time.perf_counter(); case(); times.append(time.perf_counter() - start)
    best[name] = times
ok = bool(np.array_equal(out_x, x.astype(np.uint64)) and np.array_equal(out_y, y.astype(np.uint64)))
digest = hashlib.sha256(index64.astype("<i8").tobytes()).hexdigest()
print(json.dumps({"seconds": best, "sha256": digest, "decode_ok": ok,
                  "threading_layer": numba.threading_layer(), "numba": numba.__version__}))
'''


def run_times(function, repeats: int, warmup: int = 0) -> list[float]:
    """Seconds of each of `repeats` calls (after `warmup` calls), by the measurement kit."""
    timing = time_function(function, warmup=warmup, repeats=repeats, max_seconds=float("inf"))
    return [ms / 1e3 for ms in timing.samples]


def threaded_copy(source: np.ndarray, target: np.ndarray, threads: int, pool: ThreadPoolExecutor) -> None:
    """numpy copy split over `threads` chunks (numpy releases the GIL while copying)."""
    if threads == 1:
        np.copyto(target, source)
        return
    bounds = np.linspace(0, source.shape[0], threads + 1).astype(np.int64)
    futures = [pool.submit(np.copyto, target[lo:hi], source[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])]
    for future in futures:
        future.result()


def find_python312(explicit: str | None) -> str | None:
    if explicit:
        return explicit
    candidates = sorted(glob.glob("/root/.pyenv/versions/3.12*/bin/python")) + ["/usr/bin/python3.12"]
    return next((path for path in candidates if os.path.exists(path)), None)


def ensure_venv(venv: Path, python312: str | None, create: bool) -> str | None:
    """Python of a 3.12 venv with hilbertsfc, or None (with a printed reason)."""
    python = venv / "bin" / "python"
    if python.exists():
        check = subprocess.run([str(python), "-c", "import hilbertsfc"], capture_output=True)
        if check.returncode == 0:
            return str(python)
    if not create:
        print(f"hilbertsfc: no usable venv at {venv} (pass --create-venv to build one); skipped")
        return None
    if python312 is None:
        print("hilbertsfc: no Python 3.12 interpreter found (hilbertsfc needs >= 3.12); skipped")
        return None
    print(f"hilbertsfc: creating {venv} with {python312} ...")
    subprocess.run([python312, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"hilbertsfc=={HILBERTSFC_VERSION}", "numba", "numpy"],
                   check=True)
    return str(python)


def run_hilbertsfc(python: str, input_path: str, order: int, threads: int, repeats: int) -> dict:
    payload = json.dumps({"input": input_path, "order": order, "threads": threads, "repeats": repeats})
    done = subprocess.run([python, "-c", HILBERTSFC_SCRIPT, payload], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_ours(coords: np.ndarray, coords16: np.ndarray, order: int, repeats: int) -> tuple[dict, np.ndarray]:
    count = coords.shape[0]
    flat = coords.reshape(-1)
    flat16 = coords16.reshape(-1)
    index = np.empty(count, dtype=np.int64)
    index32 = np.empty(count, dtype=np.uint32)
    decoded = np.empty((count, 2), dtype=np.int64)
    decoded16 = np.empty((count, 2), dtype=np.uint16)
    flat_decoded = decoded.reshape(-1)
    cases = {
        "encode_kernel": lambda: kernels.hilbert_encode_2d(flat, order, index),
        "decode_kernel": lambda: kernels.hilbert_decode_2d(index, order, flat_decoded),
        "encode_kernel_uint16_in": lambda: kernels.hilbert_encode_2d(flat16, order, index),
        "encode_api_out": lambda: encode(coords16, order, out=index32),
        "decode_api_out": lambda: decode(index32, order, 2, out=decoded16),
        "encode_api": lambda: encode(coords, order),
        "decode_api": lambda: decode(index32, order, 2),
        "decode_api_uint16": lambda: decode(index32, order, 2, dtype=np.uint16),
    }
    seconds = {}
    for name, case in cases.items():
        seconds[name] = run_times(case, repeats, warmup=1)
    kernels.hilbert_encode_2d(flat, order, index)
    kernels.hilbert_decode_2d(index, order, flat_decoded)
    if not np.array_equal(decoded, coords):
        raise AssertionError("decode(encode(points)) != points")
    if not (np.array_equal(index32, index) and np.array_equal(decoded16, coords)):
        raise AssertionError("the public API with out= disagrees with the kernels")
    return seconds, index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=1 << 24)
    parser.add_argument("--order", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=str, default=None, help="comma list; default 1 and numba's maximum")
    parser.add_argument("--no-hilbertsfc", action="store_true")
    parser.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "hilbertsfc-py312")
    parser.add_argument("--python312", type=str, default=None)
    parser.add_argument("--create-venv", action="store_true", help="build the 3.12 venv with hilbertsfc if missing")
    parser.add_argument("--json", type=Path, default=ROOT / "reports" / "results" / "curves_cpu.json")
    args = parser.parse_args()
    if args.points < 1:
        raise ValueError(f"--points must be >= 1, got {args.points}")
    if not 1 <= args.order <= 16:
        raise ValueError(f"--order must be in [1, 16] (uint16 inputs are part of the comparison), got {args.order}")
    max_threads = numba.config.NUMBA_NUM_THREADS
    thread_counts = [int(t) for t in args.threads.split(",")] if args.threads else sorted({1, max_threads})
    if any(not 1 <= t <= max_threads for t in thread_counts):
        raise ValueError(f"--threads entries must be in [1, {max_threads}], got {thread_counts}")

    python = None if args.no_hilbertsfc else ensure_venv(args.venv, find_python312(args.python312), args.create_venv)
    rng = np.random.default_rng(0)
    coords = rng.integers(0, 1 << args.order, size=(args.points, 2), dtype=np.int64)
    coords16 = coords.astype(np.uint16)
    copy_bytes = {24: np.ones(args.points * 12, dtype=np.uint8), 8: np.ones(args.points * 4, dtype=np.uint8)}
    copy_targets = {key: np.empty_like(value) for key, value in copy_bytes.items()}
    load_before = os.getloadavg()

    results = []
    with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(max(thread_counts)) as pool:
        input_path = os.path.join(scratch, "coords.npy")
        np.save(input_path, coords)
        steps = len(thread_counts) * (3 if python else 2)
        with tqdm(total=steps, desc="bench_curves", unit="step") as progress:
            for threads in thread_counts:
                numba.set_num_threads(threads)
                def measure_stream() -> dict:
                    return {nbytes: run_times(lambda b=nbytes: threaded_copy(copy_bytes[b], copy_targets[b], threads,
                                                                             pool), args.repeats)
                            for nbytes in copy_bytes}

                stream_first = measure_stream()
                ours_first, index = measure_ours(coords, coords16, args.order, args.repeats)
                progress.update()
                theirs = None
                if python:
                    theirs = run_hilbertsfc(python, input_path, args.order, threads, args.repeats)
                    ours_digest = hashlib.sha256(index.astype("<i8").tobytes()).hexdigest()
                    if theirs["sha256"] != ours_digest or not theirs["decode_ok"]:
                        raise AssertionError("hilbertsfc and hilbert_lab disagree on the Hilbert indices")
                    progress.update()
                ours_again, _ = measure_ours(coords, coords16, args.order, args.repeats)
                ours_times = {name: ours_first[name] + ours_again[name] for name in ours_first}
                ours = {name: float(np.median(times)) for name, times in ours_times.items()}
                stream_again = measure_stream()
                stream = {nbytes: float(np.median(stream_first[nbytes] + stream_again[nbytes])) for nbytes in copy_bytes}
                progress.update()
                stream_rate = {nbytes: args.points / seconds for nbytes, seconds in stream.items()}
                rows = [  # (library, operation, variant, case, bytes/point, hilbertsfc case to compare with)
                    ("hilbert_lab", "encode", "kernel, int64 in/out", "encode_kernel", 24, "encode_matched"),
                    ("hilbert_lab", "decode", "kernel, int64 in/out", "decode_kernel", 24, "decode_matched"),
                    ("hilbert_lab", "encode", "kernel, uint16 in, int64 out", "encode_kernel_uint16_in", 12,
                     "encode_native"),
                    ("hilbert_lab", "encode", "api, out=, uint16 in, uint32 out", "encode_api_out", 8, "encode_native"),
                    ("hilbert_lab", "decode", "api, out=, uint32 in, uint16 out", "decode_api_out", 8, "decode_native"),
                    ("hilbert_lab", "encode", "api, int64 in, allocates uint32", "encode_api", 20, "encode_api"),
                    ("hilbert_lab", "decode", "api, uint32 in, allocates uint16", "decode_api_uint16", 8, "decode_api"),
                    ("hilbert_lab", "decode", "api, uint32 in, allocates int64", "decode_api", 20, None),
                ]
                times = {("hilbert_lab", name): values for name, values in ours_times.items()}
                if theirs:
                    times.update({("hilbertsfc", name): values for name, values in theirs["seconds"].items()})
                    rows += [
                        ("hilbertsfc", "encode", "out=, int64 in, uint64 out", "encode_matched", 24, None),
                        ("hilbertsfc", "decode", "out=, uint64 in/out", "decode_matched", 24, None),
                        ("hilbertsfc", "encode", "out=, uint16 in, uint32 out", "encode_native", 8, None),
                        ("hilbertsfc", "decode", "out=, uint32 in, uint16 out", "decode_native", 8, None),
                        ("hilbertsfc", "encode", "api, int64 in, allocates uint32", "encode_api", 20, None),
                        ("hilbertsfc", "decode", "api, uint32 in, allocates uint16", "decode_api", 8, None),
                    ]
                for library, operation, variant, case, bytes_per_point, rival in rows:
                    rate = args.points / float(np.median(times[(library, case)]))
                    limit_bytes = 24 if bytes_per_point >= 12 else 8
                    stream_limit = stream_rate[limit_bytes] * limit_bytes / bytes_per_point
                    row = {"library": library, "operation": operation, "variant": variant, "threads": threads,
                           "mpoints_per_s": rate / 1e6, "best_mpoints_per_s": args.points / min(times[(library, case)]) / 1e6,
                           "repeats_timed": len(times[(library, case)]), "bytes_per_point": bytes_per_point,
                           "stream_limit_mpoints_per_s": stream_limit / 1e6, "fraction_of_stream": rate / stream_limit}
                    if theirs and rival:
                        row["vs_hilbertsfc"] = rate * float(np.median(times[("hilbertsfc", rival)])) / args.points
                        row["hilbertsfc_case"] = rival
                        row["same_bytes_as_hilbertsfc_case"] = bytes_per_point == HILBERTSFC_BYTES[rival]
                    results.append(row)

    report = {
        "benchmark": "benchmarks/bench_curves.py",
        "command": strip_paths(" ".join([Path(sys.executable).name, *sys.argv])),
        "points": args.points, "order": args.order, "repeats": args.repeats,
        "machine": {"load_average_before": load_before, "load_average_after": os.getloadavg()},
        "env": collect_environment("cpu"), "threading_layer": numba.threading_layer(),
        "hilbertsfc": HILBERTSFC_VERSION if python else None,
        "targets": {"vs_hilbertsfc_at_least": 0.8, "fraction_of_stream_at_least": 0.5},
        "notes": "rates are medians over all repeats of both interleaved runs (best_mpoints_per_s: the best "
                 "repeat); stream limit = median numpy copy (same thread count) moving the same bytes read+write, "
                 "scaled to the row's bytes/point; vs_hilbertsfc = our median rate / hilbertsfc's median rate on "
                 "the case named (the target applies to rows with same_bytes_as_hilbertsfc_case, in particular "
                 "the public API rows)",
        "results": results,
    }
    header = f"{'library':12} {'op':6} {'variant':34} {'thr':>3} {'Mpts/s':>8} {'B/pt':>4} {'stream':>8} {'%strm':>6} {'vs hsfc':>7}"
    print(header)
    print("-" * len(header))
    for row in results:
        versus = f"{row['vs_hilbertsfc']:.2f}x" if "vs_hilbertsfc" in row else ""
        print(f"{row['library']:12} {row['operation']:6} {row['variant']:34} {row['threads']:>3} "
              f"{row['mpoints_per_s']:8.0f} {row['bytes_per_point']:>4} {row['stream_limit_mpoints_per_s']:8.0f} "
              f"{100 * row['fraction_of_stream']:5.0f}% {versus:>7}")
    print(f"load average before/after: {load_before} / {report['machine']['load_average_after']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
