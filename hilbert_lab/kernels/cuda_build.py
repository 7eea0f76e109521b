"""Build and load hilbert_lab's CUDA extension (src_kernels/) at first use, in a cached directory."""
from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from types import ModuleType

SOURCES = ("curves.cu", "permute.cu", "bindings.cpp")


def src_kernels_dir() -> Path:
    """The src_kernels/ folder of this checkout (CUDA sources live outside the package)."""
    return Path(__file__).resolve().parents[2] / "src_kernels"


def _cache_root() -> Path:
    root = os.environ.get("HILBERT_LAB_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "hilbert_lab"


def _arch_flags() -> list[str]:
    import torch

    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}"
    return [f"-gencode=arch=compute_{arch},code=sm_{arch}"]


@functools.lru_cache(maxsize=1)
def load_extension(verbose: bool = False) -> ModuleType:
    """Compile (once per source hash, torch version and GPU arch) and import the extension.

    Raises NotImplementedError when no CUDA device or no toolchain is available, so callers can
    fall back to CPU implementations.
    """
    import torch

    if not torch.cuda.is_available():
        raise NotImplementedError("hilbert_lab CUDA kernels need a CUDA device")
    src = src_kernels_dir()
    paths = [src / name for name in SOURCES]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise NotImplementedError(f"CUDA kernel sources not found: {missing}")
    digest = hashlib.sha256()
    for p in sorted(src.iterdir()):
        if p.suffix in (".cu", ".cuh", ".cpp", ".h"):
            digest.update(p.name.encode() + p.read_bytes())
    flags = _arch_flags()
    digest.update(torch.__version__.encode() + " ".join(flags).encode())
    build_dir = _cache_root() / "cuda_build" / digest.hexdigest()[:16]
    build_dir.mkdir(parents=True, exist_ok=True)
    from torch.utils.cpp_extension import load

    try:
        return load(
            name="hilbert_lab_cuda",
            sources=[str(p) for p in paths],
            extra_cflags=["-O3"],
            extra_cuda_cflags=["-O3", *flags],
            extra_include_paths=[str(src)],
            build_directory=str(build_dir),
            verbose=verbose,
        )
    except (OSError, RuntimeError) as exc:  # no nvcc / ninja, or a failed build
        raise NotImplementedError(f"could not build hilbert_lab CUDA kernels: {exc}") from exc
