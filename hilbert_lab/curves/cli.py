"""`hilbert-lab curve`: a curve over a grid exported as CSV (index,x,y[,z]) or PNG (registered by
hilbert_lab.cli)."""
from __future__ import annotations

import argparse
import os

from hilbert_lab import arguments
from hilbert_lab.arguments import add_command, integer
from hilbert_lab.curves.coordinates import curve_coordinates
from hilbert_lab.io import atomic_writer

CURVE_KINDS = ("hilbert", "morton", "snake", "rowmajor")
_PNG_SIGNATURE, _PNG_END = b"\x89PNG\r\n\x1a\n", b"IEND\xaeB`\x82"


def _is_torn(path: str, header: str, points: int) -> bool:
    """Whether `path` is a curve file cut short (a run killed while writing it, before writes were atomic):
    a CSV with this command's header whose last line is unfinished or is not the last point, or a PNG
    without its end chunk."""
    try:
        if os.path.islink(path) or not os.path.isfile(path):
            return False
        with open(path, "rb") as handle:
            head = handle.read(len(header) + 1)
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - 64))
            tail = handle.read()
    except OSError:
        return False
    if path.lower().endswith(".png"):
        return head.startswith(_PNG_SIGNATURE) and not tail.endswith(_PNG_END)
    if head != (header + "\n").encode():
        return False
    last = tail.rstrip(b"\n").rsplit(b"\n", 1)[-1].split(b",")[0]
    return not tail.endswith(b"\n") or last != str(points - 1).encode()


def _set_aside(path: str) -> str:
    """Rename `path` to PATH.torn (PATH.torn.1, ... when taken); returns the new name."""
    aside, number = path + ".torn", 0
    while os.path.lexists(aside):
        number += 1
        aside = f"{path}.torn.{number}"
    os.rename(path, aside)
    return aside


def _curve(args: argparse.Namespace) -> int:
    """Validate the sizes, then write the curve's coordinates (hilbert_lab.curves.curve_coordinates)."""
    import numpy as np

    from hilbert_lab.imaging import render_path, write_png

    extension = os.path.splitext(args.out)[1].lower()
    if extension not in (".csv", ".png"):
        raise ValueError(f"--out must end in .csv or .png, got {args.out!r}")
    cells = args.width * args.height * (args.depth or 1)
    if cells > 1 << 24:
        raise ValueError(f"--width x --height x --depth must be <= {1 << 24} cells, got {cells}")
    if extension == ".png" and args.depth is not None:
        raise ValueError("--out .png draws 2D curves only; drop --depth or write .csv")
    pixels = args.width * args.height * args.cell * args.cell
    if extension == ".png" and pixels > 1 << 26:
        raise ValueError(f"the PNG would have {pixels} pixels (> {1 << 26}); lower --cell or the grid size")
    header = "index,x,y" + (",z" if args.depth is not None else "")
    if _is_torn(os.path.expanduser(args.out), header, cells):
        aside = _set_aside(os.path.expanduser(args.out))
        print(f"note: {args.out} was cut short by an interrupted run; set aside as {aside}")
    out = arguments.prepare_output(args.out, "--out")
    coords = curve_coordinates(args.kind, width=args.width, height=args.height, depth=args.depth,
                               ndim=2 if args.depth is None else 3)
    if extension == ".csv":  # written to a temporary file and renamed: never a torn CSV
        table = np.concatenate([np.arange(len(coords))[:, None], coords], axis=1)
        with atomic_writer(out) as handle:
            np.savetxt(handle, table, fmt="%d", delimiter=",", header=header, comments="")
    else:
        write_png(out, render_path(coords, args.cell))
    print(f"wrote {len(coords)} points ({args.kind}, {args.width}x{args.height}"
          f"{'x' + str(args.depth) if args.depth else ''}) to {out}")
    return 0


def register_cli(subparsers: "argparse._SubParsersAction") -> argparse.ArgumentParser:
    """Add the `curve` command."""
    curve = add_command(subparsers, "curve", "export a curve over a grid as CSV (index,x,y[,z]) or PNG",
                        "  hilbert-lab curve --kind hilbert --width 16 --height 16 --out hilbert16.png\n"
                        "  hilbert-lab curve --kind hilbert --width 12 --height 5 --out gilbert.csv\n"
                        "  hilbert-lab curve --kind snake --width 8 --height 8 --depth 4 --out snake3d.csv")
    curve.add_argument("--kind", choices=CURVE_KINDS, default="hilbert",
                       help="hilbert (generalized, any size) | morton | snake | rowmajor")
    curve.add_argument("--width", type=integer(1, 1 << 24), required=True, help="grid cells along x")
    curve.add_argument("--height", type=integer(1, 1 << 24), required=True, help="grid cells along y")
    curve.add_argument("--depth", type=integer(1, 1 << 24), default=None, help="3D grid (CSV only)")
    curve.add_argument("--cell", type=integer(1, 64), default=16, help="PNG pixels per grid cell, 1..64 (default: 16)")
    curve.add_argument("--out", required=True, metavar="FILE",
                       help="a new file ending in .csv or .png (missing folders are created)")
    curve.set_defaults(func=_curve)
    return curve
