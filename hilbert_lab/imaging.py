"""PNG images with numpy + zlib only (no core dependency writes PNG): an RGB encoder and a path
rasterizer. A leaf: imports nothing from hilbert_lab."""
from __future__ import annotations

import os
import struct
import zlib

import numpy as np

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)


def encode_png(rgb: np.ndarray) -> bytes:
    """The PNG file bytes (8-bit truecolour, no filter) of an (H, W, 3) uint8 array."""
    image = np.asarray(rgb)
    if image.ndim != 3 or image.shape[2] != 3 or image.shape[0] < 1 or image.shape[1] < 1:
        raise ValueError(f"rgb must be an (H, W, 3) array with H, W >= 1, got shape {image.shape}")
    if image.dtype != np.uint8:
        raise ValueError(f"rgb must have dtype uint8, got {image.dtype}")
    image = np.ascontiguousarray(image)
    height, width, _ = image.shape
    raw = np.concatenate([np.zeros((height, 1), dtype=np.uint8), image.reshape(height, width * 3)], axis=1)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (PNG_SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", zlib.compress(raw.tobytes(), 6))
            + _chunk(b"IEND", b""))


def write_png(path: str | os.PathLike, rgb: np.ndarray) -> None:
    """Write an (H, W, 3) uint8 array as a PNG file (all at once: hilbert_lab.io.atomic_write)."""
    from hilbert_lab.io import atomic_write

    atomic_write(path, encode_png(rgb))


def render_path(coords: np.ndarray, cell: int) -> np.ndarray:
    """(H*cell, W*cell, 3) uint8 image of a 2D path: the centres of consecutive grid cells joined by
    straight lines on white, coloured blue (first step) -> red (last step).

    coords: (P, 2) non-negative integer cell coordinates (x, y) in path order, P >= 1; the grid is
    (max y + 1) x (max x + 1) cells. cell: pixels per grid cell, >= 1.
    """
    coords = np.asarray(coords)
    if coords.ndim != 2 or coords.shape[1] != 2 or coords.shape[0] < 1:
        raise ValueError(f"coords must be a (P, 2) array with P >= 1, got shape {coords.shape}")
    if not np.issubdtype(coords.dtype, np.integer) or coords.min() < 0:
        raise ValueError("coords must hold non-negative integers")
    if isinstance(cell, bool) or not isinstance(cell, (int, np.integer)) or cell < 1:
        raise ValueError(f"cell must be a positive integer, got {cell!r}")
    coords = coords.astype(np.int64)
    width, height = int(coords[:, 0].max()) + 1, int(coords[:, 1].max()) + 1
    image = np.full((height * cell, width * cell, 3), 255, dtype=np.uint8)
    centres = coords * cell + cell // 2
    start, stop = centres[:-1], centres[1:]
    steps = np.maximum(np.abs(stop - start).max(axis=1), 1)
    counts = steps + 1
    owner = np.repeat(np.arange(len(start)), counts)
    first = np.cumsum(counts) - counts
    t = (np.arange(counts.sum()) - np.repeat(first, counts)) / np.repeat(steps, counts)
    points = np.rint(start[owner] + (stop[owner] - start[owner]) * t[:, None]).astype(np.int64)
    share = owner / max(len(start) - 1, 1)
    colour = np.stack([255 * share, 40 * np.ones_like(share), 255 * (1 - share)], axis=1).astype(np.uint8)
    image[points[:, 1], points[:, 0]] = colour
    return image
