"""The PNG writer and the path rasterizer: decoded with zlib/struct only, pixels checked exactly."""
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from hilbert_lab.imaging import encode_png, render_path, write_png


def _decode_png(data: bytes) -> np.ndarray:
    """(H, W, 3) uint8 pixels of an 8-bit RGB PNG; checks the signature, every chunk CRC and the filters."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, chunks = 8, []
    while position < len(data):
        (length,) = struct.unpack(">I", data[position:position + 4])
        tag, body = data[position + 4:position + 8], data[position + 8:position + 8 + length]
        (crc,) = struct.unpack(">I", data[position + 8 + length:position + 12 + length])
        assert crc == zlib.crc32(tag + body) & 0xFFFFFFFF, tag
        chunks.append((tag, body))
        position += 12 + length
    assert [tag for tag, _ in chunks][0] == b"IHDR" and chunks[-1] == (b"IEND", b"")
    width, height, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour, compression, filtering, interlace) == (8, 2, 0, 0, 0)
    raw = zlib.decompress(b"".join(body for tag, body in chunks if tag == b"IDAT"))
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(height, 1 + 3 * width)
    assert np.all(rows[:, 0] == 0)  # filter type None on every row
    return rows[:, 1:].reshape(height, width, 3)


def test_png_round_trips_random_pixels(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 256, size=(7, 13, 3), dtype=np.uint8)
    path = tmp_path / "x.png"
    write_png(path, rgb)
    data = path.read_bytes()
    assert data == encode_png(rgb)
    assert np.array_equal(_decode_png(data), rgb)
    assert np.array_equal(_decode_png(encode_png(rgb[:1, :1])), rgb[:1, :1])


@pytest.mark.parametrize("bad", [np.zeros((4, 4), np.uint8), np.zeros((4, 4, 4), np.uint8),
                                 np.zeros((0, 4, 3), np.uint8), np.zeros((4, 4, 3), np.float32)])
def test_png_refuses_bad_arrays(bad):
    with pytest.raises(ValueError, match="rgb"):
        encode_png(bad)


def test_render_path_draws_the_lines_between_cell_centres():
    # an L: (0,0) -> (2,0) -> (2,1) on a 3x2 grid of 4-pixel cells; centres at 4*c + 2
    image = render_path(np.array([[0, 0], [2, 0], [2, 1]]), 4)
    assert image.shape == (8, 12, 3) and image.dtype == np.uint8
    drawn = (image != 255).any(axis=2)
    expected = np.zeros((8, 12), dtype=bool)
    expected[2, 2:11] = True  # first segment, along y = 2 from x = 2 to 10
    expected[2:7, 10] = True  # second segment, along x = 10 from y = 2 to 6
    assert np.array_equal(drawn, expected)
    assert tuple(image[2, 2]) == (0, 40, 255)  # first step blue
    assert tuple(image[6, 10]) == (255, 40, 0)  # last step red


def test_render_path_of_one_cell_is_blank():
    assert np.array_equal(render_path(np.array([[0, 0]]), 3), np.full((3, 3, 3), 255, np.uint8))


def test_render_path_of_a_curve_round_trips_through_png():
    coords = np.array([[x if y % 2 == 0 else 3 - x, y] for y in range(3) for x in range(4)])  # snake 4x3
    image = render_path(coords, 3)
    decoded = _decode_png(encode_png(image))
    assert np.array_equal(decoded, image)
    centres = coords * 3 + 1
    assert (decoded[centres[:, 1], centres[:, 0]] != 255).any(axis=1).all()


@pytest.mark.parametrize("coords, cell, match", [
    (np.zeros((0, 2), np.int64), 2, "coords"), (np.array([[0, 0, 0], [1, 0, 0]]), 2, "coords"),
    (np.array([[0, 0], [-1, 0]]), 2, "coords"), (np.array([[0.0, 0.0], [1.0, 0.0]]), 2, "coords"),
    (np.array([[0, 0], [1, 0]]), 0, "cell"),
])
def test_render_path_refuses_bad_input(coords, cell, match):
    with pytest.raises(ValueError, match=match):
        render_path(coords, cell)
