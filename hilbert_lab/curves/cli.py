"""`hilbert-lab curve`: a curve over a grid exported as CSV (index,x,y[,z]) or PNG (registered by
hilbert_lab.cli)."""
from __future__ import annotations

import argparse
import os
from hilbert_lab import arguments
from hilbert_lab.arguments import add_command, integer
from hilbert_lab.curves.coordinates import curve_coordinates

CURVE_KINDS = ("hilbert", "morton", "snake", "rowmajor")


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
    out = arguments.prepare_output(args.out, "--out")
    coords = curve_coordinates(args.kind, width=args.width, height=args.height, depth=args.depth,
                               ndim=2 if args.depth is None else 3)
    if extension == ".csv":
        header = "index,x,y" + (",z" if args.depth is not None else "")
        table = np.concatenate([np.arange(len(coords))[:, None], coords], axis=1)
        np.savetxt(out, table, fmt="%d", delimiter=",", header=header, comments="")
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
    curve.add_argument("--width", type=integer(1, 1 << 24), required=True)
    curve.add_argument("--height", type=integer(1, 1 << 24), required=True)
    curve.add_argument("--depth", type=integer(1, 1 << 24), default=None, help="3D grid (CSV only)")
    curve.add_argument("--cell", type=integer(1, 64), default=16, help="PNG pixels per grid cell, 1..64 (default 16)")
    curve.add_argument("--out", required=True,
                       help="a new file ending in .csv or .png (missing folders are created)")
    curve.set_defaults(func=_curve)
    return curve
