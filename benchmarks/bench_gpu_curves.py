"""GPU curve maps and segment permutation: time each kernel beside its anchor in the same run.

Encode/decode of 2**24 int32 2D points at order 12 (12 bytes per point) against hilbertsfc 0.5.1's
Triton kernels (when importable) and against the measured device copy bandwidth; permutation of a
bf16 (2, 32768, 12, 64) tensor against index_select and a plain copy, directly and through the engine's
permutation function (hilbert_lab.curves.permute_sequence). Correctness is checked on the
same data first (CPU curve core on a 2**20-point sample; exact equality for the permutation).
Times are medians of triton.testing.do_bench (hilbert_lab.bench.timing.time_function on CUDA, 300 ms
per measurement); the JSON carries the environment block (hilbert_lab.bench.env).
Usage: python benchmarks/bench_gpu_curves.py [--out reports/results/gpu_curves.json] [--points 24]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hilbert_lab.io import strip_paths  # noqa: E402
from hilbert_lab.bench.env import collect_environment  # noqa: E402
from hilbert_lab.bench.timing import time_function  # noqa: E402


def bench(fn) -> float:
    """Median milliseconds of fn() on the GPU (do_bench through the measurement kit)."""
    return time_function(fn, device="cuda", max_seconds=0.3).median


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + bytes written), 1 GiB buffers."""
    src = torch.randn(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="reports/results/gpu_curves.json")
    parser.add_argument("--points", type=int, default=24, help="log2 of the number of points")
    parser.add_argument("--order", type=int, default=12)
    args = parser.parse_args()

    from hilbert_lab import curves
    from hilbert_lab.kernels import cuda_curves

    n, order = 1 << args.points, args.order
    rows = []
    bandwidth = copy_bandwidth()
    rows.append({"name": "device copy", "bytes_per_s": bandwidth})
    gen = torch.Generator(device="cuda").manual_seed(0)
    coords = torch.randint(0, 1 << order, (n, 2), device="cuda", dtype=torch.int32, generator=gen)
    index = torch.full((n,), -1, device="cuda", dtype=torch.int32)
    cuda_curves.encode(coords, order, "hilbert", out=index)
    sample = min(n, 1 << 20)
    expected = torch.as_tensor(curves.encode(coords[:sample].cpu().numpy(), order, curve="hilbert", dtype="int64"))
    assert torch.equal(index[:sample].cpu().long(), expected), "CUDA encode disagrees with the CPU curve core"
    back = torch.full((n, 2), -1, device="cuda", dtype=torch.int32)
    cuda_curves.decode(index, order, 2, "hilbert", out=back)
    assert torch.equal(back, coords), "CUDA decode is not the inverse of encode"
    index_bitscan = torch.full_like(index, -1)
    cuda_curves.encode(coords, order, "hilbert", out=index_bitscan, method="bitscan")
    assert torch.equal(index_bitscan, index), "table and bitscan encoders disagree"
    floor_ms = 12 * n / bandwidth * 1e3

    def add(name, ms, bytes_moved, anchor=None):
        row = {"name": name, "ms": ms, "points_per_s": n / (ms * 1e-3), "bytes_per_s": bytes_moved / (ms * 1e-3),
               "fraction_of_copy_bw": bytes_moved / (ms * 1e-3) / bandwidth}
        if anchor is not None:
            row["speed_vs_anchor"] = anchor / ms
        rows.append(row)
        return row

    def time_hilbertsfc():
        import hilbertsfc.torch as hsfc

        x = coords[:, 0].contiguous()
        y = coords[:, 1].contiguous()
        h_out = torch.empty(n, device="cuda", dtype=torch.int32)
        hsfc.hilbert_encode_2d(x, y, nbits=order, out=h_out)
        ox, oy = torch.empty_like(x), torch.empty_like(y)
        hsfc.hilbert_decode_2d(h_out, nbits=order, out_x=ox, out_y=oy)
        assert torch.equal(h_out, index), "hilbertsfc and hilbert_lab disagree on the Hilbert index"
        assert torch.equal(ox, x) and torch.equal(oy, y), "hilbertsfc round trip failed"
        return (bench(lambda: hsfc.hilbert_encode_2d(x, y, nbits=order, out=h_out)),
                bench(lambda: hsfc.hilbert_decode_2d(h_out, nbits=order, out_x=ox, out_y=oy)))

    try:
        anchor_rounds = [time_hilbertsfc()]
    except ImportError as exc:
        anchor_rounds = []
        rows.append({"name": "hilbertsfc", "skipped": f"not importable: {exc}"})

    # Launch-configuration sweep (items = vectors per thread, threads per block, points per vector),
    # both 2D Hilbert methods, two interleaved rounds: the spread between rounds is the noise.
    configs = [(4, 256, 2), (2, 256, 2), (8, 256, 2), (4, 128, 2), (1, 256, 4), (2, 256, 4), (4, 256, 4),
               (8, 256, 4), (4, 128, 4)]
    sweep = []
    for round_index in range(2):
        for items, threads, points in configs:
            cuda_curves.set_launch_config(items, threads, points, points)
            for method in ("table", "bitscan"):
                enc = bench(lambda: cuda_curves.encode(coords, order, "hilbert", out=index, validate=False, method=method))
                dec = bench(lambda: cuda_curves.decode(index, order, 2, "hilbert", out=back, validate=False, method=method))
                sweep.append({"round": round_index, "items": items, "threads": threads, "points": points,
                              "method": method, "encode_ms": enc, "decode_ms": dec})
        if anchor_rounds:
            anchor_rounds.append(time_hilbertsfc())
    cuda_curves.set_launch_config()  # the defaults
    assert torch.equal(cuda_curves.encode(coords, order, "hilbert", validate=False), index.long())

    for curve in ("hilbert", "morton"):
        enc = bench(lambda: cuda_curves.encode(coords, order, curve, out=index, validate=False))
        dec = bench(lambda: cuda_curves.decode(index, order, 2, curve, out=back, validate=False))
        add(f"hilbert_lab {curve} encode 2D (int32 AoS -> int32), defaults", enc, 12 * n)
        add(f"hilbert_lab {curve} decode 2D (int32 -> int32 AoS), defaults", dec, 12 * n)
    cuda_curves.encode(coords, order, "hilbert", out=index, validate=False)
    enc_checked = bench(lambda: cuda_curves.encode(coords, order, "hilbert", out=index, validate=True))
    add("hilbert_lab hilbert encode 2D with range check", enc_checked, 20 * n)
    add("memory floor (12 B/point at copy bandwidth)", floor_ms, 12 * n)
    if anchor_rounds:
        import statistics

        ref_enc = statistics.median(r[0] for r in anchor_rounds)
        ref_dec = statistics.median(r[1] for r in anchor_rounds)
        add("hilbertsfc 0.5.1 triton encode 2D (int32 SoA -> int32)", ref_enc, 12 * n)
        add("hilbertsfc 0.5.1 triton decode 2D (int32 -> int32 SoA)", ref_dec, 12 * n)
        for row in rows:
            if row["name"].startswith("hilbert_lab hilbert encode 2D") and "range check" not in row["name"]:
                row["speed_vs_anchor"] = ref_enc / row["ms"]
            if row["name"].startswith("hilbert_lab hilbert decode 2D"):
                row["speed_vs_anchor"] = ref_dec / row["ms"]
        for entry in sweep:
            entry["encode_vs_hilbertsfc"] = ref_enc / entry["encode_ms"]
            entry["decode_vs_hilbertsfc"] = ref_dec / entry["decode_ms"]

    coords3 = torch.randint(0, 1 << 10, (n, 3), device="cuda", dtype=torch.int32, generator=gen)
    idx3 = torch.empty(n, device="cuda", dtype=torch.int32)
    enc3 = bench(lambda: cuda_curves.encode(coords3, 10, "hilbert", out=idx3, validate=False))
    add("hilbert_lab hilbert encode 3D order 10 (int32 -> int32)", enc3, 16 * n)

    # permutation of a bf16 (2, 32768, 12, 64) tensor by a per-segment Hilbert ordering
    x = torch.randn(2, 32768, 12, 64, device="cuda", dtype=torch.bfloat16)
    segment = 2048
    perm, _ = curves.segment_permutation(segment, "hilbert")
    perm_t = torch.tensor(perm, device="cuda")
    source = (torch.arange(32768 // segment, device="cuda")[:, None] * segment + perm_t[None, :]).reshape(-1)
    out = torch.empty_like(x)
    cuda_curves.apply_segment_permutation(x, perm, segment, out=out)
    assert torch.equal(out, x.index_select(1, source)), "permutation disagrees with index_select"
    moved = 2 * x.numel() * x.element_size()
    t_perm = bench(lambda: cuda_curves.apply_segment_permutation(x, perm_t, segment, out=out, validate=False))
    t_index = bench(lambda: torch.index_select(x, 1, source, out=out))
    t_copy = bench(lambda: out.copy_(x))
    # the engine's permutation function (curves.permute_sequence) on its layout tensors: the kernel
    # through the autograd Function, no out= buffer (it allocates like index_select does)
    layout, _ = curves.layout_permutation(32768, segment, "hilbert", device="cuda")
    assert torch.equal(layout, source), "layout_permutation disagrees with the per-segment source index"
    assert torch.equal(curves.permute_sequence(x, layout), x.index_select(1, source)), "permute_sequence disagrees"
    t_engine = bench(lambda: curves.permute_sequence(x, layout))
    t_index_alloc = bench(lambda: x.index_select(1, source))
    add("hilbert_lab apply_segment_permutation bf16 (2,32768,12,64)", t_perm, moved, anchor=t_index)
    add("hilbert_lab permute_sequence (engine) bf16 (2,32768,12,64)", t_engine, moved, anchor=t_index_alloc)
    add("torch.index_select (anchor)", t_index, moved)
    add("torch.index_select allocating (anchor)", t_index_alloc, moved)
    add("plain copy of the same tensor", t_copy, moved)
    for row in rows:
        if "points_per_s" in row and ("permutation" in row["name"] or "permute" in row["name"]) or row["name"].startswith(("torch.index_select", "plain copy")):
            row.pop("points_per_s", None)

    result = {"benchmark": "gpu_curves", "command": strip_paths("python " + " ".join(sys.argv)),
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "env": collect_environment("cuda"),
              "points": n, "order": order, "copy_bandwidth_bytes_per_s": bandwidth, "rows": rows,
              "hilbertsfc_rounds_ms": anchor_rounds, "launch_sweep": sweep}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"{'kernel':62s} {'ms':>8s} {'Gpts/s':>8s} {'GB/s':>8s} {'%copy':>6s} {'vs anchor':>9s}")
    for row in rows:
        if "ms" not in row:
            print(f"{row['name']:62s} {row.get('skipped', '')}")
            continue
        pts = f"{row['points_per_s'] / 1e9:8.1f}" if "points_per_s" in row else f"{'':8s}"
        anchor = f"{row['speed_vs_anchor']:9.2f}x" if "speed_vs_anchor" in row else ""
        print(f"{row['name']:62s} {row['ms']:8.4f} {pts} {row['bytes_per_s'] / 1e9:8.0f} "
              f"{100 * row['fraction_of_copy_bw']:5.0f}% {anchor}")
    print(f"{'sweep (items, threads, points, method)':44s} {'enc ms':>8s} {'dec ms':>8s} {'enc/hsfc':>8s} {'dec/hsfc':>8s}")
    for entry in sweep:
        print(f"{str((entry['items'], entry['threads'], entry['points'], entry['method'])):44s} {entry['encode_ms']:8.4f} "
              f"{entry['decode_ms']:8.4f} {entry.get('encode_vs_hilbertsfc', float('nan')):8.3f} "
              f"{entry.get('decode_vs_hilbertsfc', float('nan')):8.3f}")
    print(f"hilbertsfc rounds (enc, dec ms): {anchor_rounds}")
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s; written {args.out}")


if __name__ == "__main__":
    main()
