"""CUDA sources in src_kernels/: every file compiles for sm_90, and the curve math (compiled for
the host by nvcc) agrees with galtay/hilbertcurve and with hilbert_lab.curves."""
from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src_kernels"
NVCC = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
CXX = shutil.which("g++") or shutil.which("c++")
CU_FILES = sorted(SRC.glob("*.cu"))
CPP_FILES = sorted(SRC.glob("*.cpp"))

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA toolkit not installed)")


def test_sources_present():
    names = {p.name for p in SRC.iterdir()}
    assert {"curves.cu", "permute.cu", "curve_math.cuh", "bindings.cpp"} <= names
    from hilbert_lab.kernels.cuda_build import SOURCES, src_kernels_dir

    assert src_kernels_dir() == SRC
    assert all((SRC / name).exists() for name in SOURCES)


@pytest.mark.slow  # 7-15 s of CPU: make test-all
@needs_nvcc
@pytest.mark.parametrize("source", CU_FILES, ids=lambda p: p.name)
def test_cu_compiles_for_sm90(source, tmp_path):
    cubin = tmp_path / (source.stem + ".cubin")
    proc = subprocess.run([NVCC, "-arch=sm_90", "--cubin", "-O3", "-I", str(SRC), "-o", str(cubin), str(source)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data = cubin.read_bytes()
    # the kernels this file defines must be in the cubin (template names are mangled, so match stems)
    expected = {"curves": [b"map_pairs", b"HilbertEncodeTable", b"HilbertDecodeTable", b"Encode2d", b"Decode2d", b"Quad",
                           b"encode_generic", b"decode_generic"],
                "permute": [b"permute_rows"]}.get(source.stem, [])
    for name in expected:
        assert name in data, f"{name!r} missing from {cubin.name}"


@pytest.mark.slow  # a C++ compile against torch's headers (about 10 s)
@pytest.mark.skipif(CXX is None, reason="no C++ compiler (g++) found")
@pytest.mark.parametrize("source", CPP_FILES, ids=lambda p: p.name)
def test_cpp_bindings_compile(source):
    from torch.utils.cpp_extension import include_paths

    includes = [f"-I{p}" for p in include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    proc = subprocess.run([CXX, "-std=c++17", "-fsyntax-only", "-DTORCH_EXTENSION_NAME=hl_check", *includes, str(source)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def host_check(tmp_path_factory):
    if NVCC is None:
        pytest.skip("nvcc not found (CUDA toolkit not installed)")
    exe = tmp_path_factory.mktemp("curve_host") / "curve_host_check"
    proc = subprocess.run([NVCC, "-O2", "-I", str(SRC), "-o", str(exe), str(Path(__file__).with_name("curve_host_check.cu"))],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

    def run(op: str, curve: int, ndim: int, order: int, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.uint64).reshape(len(rows), -1)
        text = f"{op} {curve} {ndim} {order} {len(rows)}\n" + "\n".join(" ".join(map(str, r)) for r in rows) + "\n"
        out = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True).stdout.split()
        return np.array([int(v) for v in out], dtype=np.uint64)

    return run


CASES = [(2, order) for order in (1, 2, 3, 5, 8, 12, 15, 16, 17, 24, 31)] + [(3, order) for order in (1, 2, 4, 7, 10, 16, 21)]


@pytest.mark.parametrize("ndim,order", CASES)
def test_hilbert_math_matches_hilbertcurve(host_check, ndim, order):
    HilbertCurve = pytest.importorskip("hilbertcurve.hilbertcurve", reason="hilbertcurve (dev extra) is the "
                                       "reference Hilbert curve of this test").HilbertCurve

    rng = np.random.default_rng(ndim * 100 + order)
    curve = HilbertCurve(order, ndim)
    points = rng.integers(0, 2**order, size=(64, ndim), dtype=np.uint64)
    points[0] = 0
    points[1] = 2**order - 1
    expected = np.array([curve.distance_from_point([int(c) for c in p]) for p in points], dtype=np.uint64)
    table_ops = ("T",) if ndim == 2 and order <= 16 else ()
    for op in ("E", "G") + table_ops:  # prefix-scan 2D path, Skilling's generic loop, state-machine tables
        np.testing.assert_array_equal(host_check(op, 0, ndim, order, points), expected, err_msg=f"encode {op}")
    index = rng.integers(0, 2 ** (ndim * order), size=64, dtype=np.uint64)
    expected_points = np.array([curve.point_from_distance(int(h)) for h in index], dtype=np.uint64).reshape(-1)
    for op in ("D", "H") + (("U",) if table_ops else ()):
        np.testing.assert_array_equal(host_check(op, 0, ndim, order, index), expected_points, err_msg=f"decode {op}")


@pytest.mark.parametrize("ndim,order", [(2, 1), (2, 7), (2, 16), (2, 31), (3, 5), (3, 21)])
def test_morton_math_matches_curves_package(host_check, ndim, order):
    curves = pytest.importorskip("hilbert_lab.curves", reason="hilbert_lab.curves not importable")
    rng = np.random.default_rng(order)
    points = rng.integers(0, 2**order, size=(64, ndim), dtype=np.int64)
    expected = np.asarray(curves.encode(points, order, curve="morton"), dtype=np.uint64)
    for op in ("E", "G"):
        np.testing.assert_array_equal(host_check(op, 1, ndim, order, points.astype(np.uint64)), expected)
    decoded = host_check("D", 1, ndim, order, expected)
    np.testing.assert_array_equal(decoded, points.astype(np.uint64).reshape(-1))


@pytest.mark.parametrize("ndim,order", [(2, 6), (3, 4)])
def test_hilbert_full_grid_is_a_unit_step_bijection(host_check, ndim, order):
    index = np.arange(2 ** (ndim * order), dtype=np.uint64)
    points = host_check("D", 0, ndim, order, index).reshape(-1, ndim).astype(np.int64)
    assert len(np.unique(points, axis=0)) == len(index)
    assert (np.abs(np.diff(points, axis=0)).sum(axis=1) == 1).all()
    np.testing.assert_array_equal(host_check("E", 0, ndim, order, points.astype(np.uint64)), index)
