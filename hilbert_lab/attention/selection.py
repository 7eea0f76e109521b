"""GPU description and backend selection: documented rules, optional timing with a JSON cache.

Rules of `select_backend` (first match wins):
1. CPU: "sdpa" (PyTorch's CPU flash kernel; exact LSE) for float32/float64/bfloat16/float16,
   "manual" for anything else. Recommended CPU dtype: float32.
2. CUDA, float32/float64 or compute capability < 8.0 (Pascal, Volta, Turing): "sdpa" (the
   efficient kernel; flash needs fp16/bf16) and no flash-attn. Pascal: use float32.
3. CUDA, fp16/bf16 on Hopper or newer (compute capability >= 9.0) with Triton, for a whole
   pattern: the fused kernel "triton". It was measured against the engine's "sdpa" on an H100
   (auto_selection in reports/results/gpu_attention.json: both modes, N = 8K to 512K, inference
   and training) and won every case, by 1.2x to 13x. Dense-block callers (the ring's local steps,
   whole_pattern=False) skip this rule.
4. CUDA, fp16/bf16 on Ampere/Ada: "flash" when flash-attn is installed, else "sdpa" (flash kernel).
   "triton"/"flex" are opt-in there or chosen by timing.
With benchmark_backends=True the candidates that can run are timed once per
(device name, dtype, shape, segment_lengths) key and the fastest is cached in memory and in a JSON
file ($HILBERT_LAB_CACHE_DIR or ~/.cache/hilbert_lab, file backend_selection.json).
"""
from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from hilbert_lab.attention.backends import unavailable_reason

# Compute-capability major (and minor for Ada) -> architecture.
_ARCHITECTURES = {3: "Kepler", 5: "Maxwell", 6: "Pascal", 7: "Volta", 8: "Ampere", 9: "Hopper", 10: "Blackwell",
                  12: "Blackwell"}
_MEMORY_CACHE: dict[str, str] = {}


def architecture_name(major: int, minor: int) -> str:
    """Architecture for compute capability (major, minor): 7.5 Turing, 8.9 Ada, 10.x/12.x Blackwell."""
    if (major, minor) == (7, 5):
        return "Turing"
    if (major, minor) == (8, 9):
        return "Ada"
    return _ARCHITECTURES.get(major, "Blackwell" if major > 12 else "unknown")


def get_gpu_info(device: int | str | torch.device | None = None) -> dict:
    """Describe a CUDA device: name, architecture, compute_capability, memory_gb, bf16 / fp16 support.

    Without CUDA: {"available": False, "architecture": None, ...}.
    """
    if not torch.cuda.is_available():
        return {"available": False, "name": None, "architecture": None, "compute_capability": None,
                "memory_gb": None, "supports_bf16": False, "supports_fp16": False, "device_count": 0}
    index = torch.device(device).index if isinstance(device, (str, torch.device)) else device
    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    major, minor = props.major, props.minor
    return {
        "available": True,
        "name": props.name,
        "architecture": architecture_name(major, minor),
        "compute_capability": (major, minor),
        "memory_gb": props.total_memory / 2**30,
        "supports_bf16": major >= 8,
        "supports_fp16": (major, minor) >= (5, 3),
        "device_count": torch.cuda.device_count(),
    }


def recommended_dtype(device: torch.device | str) -> torch.dtype:
    """float32 on CPU and on Pascal or older; float16 on Volta/Turing; bfloat16 on Ampere and newer."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.float32
    major = torch.cuda.get_device_capability(device)[0]
    return torch.bfloat16 if major >= 8 else torch.float16 if major >= 7 else torch.float32


def cache_path() -> Path:
    """JSON file of timed selections ($HILBERT_LAB_CACHE_DIR or ~/.cache/hilbert_lab)."""
    root = os.environ.get("HILBERT_LAB_CACHE_DIR") or Path.home() / ".cache" / "hilbert_lab"
    return Path(root) / "backend_selection.json"


def rule_backend(device: torch.device | str, dtype: torch.dtype, *, whole_pattern: bool = True) -> str:
    """The backend the documented rules pick for (device, dtype) without timing.

    whole_pattern=False: the caller runs dense blocks (the ring's local steps), so rule 3 (the fused
    whole-pattern kernel) does not apply."""
    device = torch.device(device)
    if device.type != "cuda":
        return rule_for(device.type, None, dtype)
    capability, triton_ok, flash_ok = _cuda_facts(device, dtype)
    return rule_for("cuda", capability, dtype, triton_ok=whole_pattern and triton_ok, flash_ok=flash_ok)


@functools.lru_cache(maxsize=64)
def _cuda_facts(device: torch.device, dtype: torch.dtype) -> tuple[tuple[int, int], bool, bool]:
    """(compute capability, triton runnable, flash runnable): cached, since a failed import of an
    optional package costs a file-system search on every call."""
    return (torch.cuda.get_device_capability(device), unavailable_reason("triton", device, dtype) is None,
            unavailable_reason("flash", device, dtype) is None)


def rule_for(device_type: str, capability: Optional[tuple[int, int]], dtype: torch.dtype, *, triton_ok: bool = False,
             flash_ok: bool = False) -> str:
    """The module's rules as a pure function of the facts they read (testable without a GPU). No rule
    needs the mode, N or training: the fused kernel won in every mode, length and direction measured."""
    if device_type == "cpu":
        return "sdpa" if dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16) else "manual"
    if device_type != "cuda" or capability is None:
        return "manual"
    half = dtype in (torch.float16, torch.bfloat16)
    if half and capability[0] >= 9 and triton_ok:
        return "triton"
    if half and capability[0] >= 8:
        return "flash" if flash_ok else "sdpa"
    return "sdpa"


def candidate_backends(device: torch.device | str, dtype: torch.dtype) -> list[str]:
    """Backends worth timing on (device, dtype) that can run here."""
    device = torch.device(device)
    names = ["manual", "sdpa"] if device.type == "cpu" else ["sdpa", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient",
                                                              "flash", "xformers", "triton", "flex"]
    return [n for n in names if unavailable_reason(n, device, dtype) is None]


def select_backend(
    device: torch.device | str,
    dtype: torch.dtype,
    shape: Optional[Sequence[int]] = None,
    segment_lengths: Sequence[int] = (),
    *,
    dilation_rates: Optional[Sequence[int]] = None,
    mode: str = "longnet",
    whole_pattern: bool = True,
    benchmark_backends: bool = False,
    use_file_cache: bool = True,
) -> str:
    """Backend name for (device, dtype[, shape (B, N, H, D)]) by the rules or by timing.

    mode ("longnet" / "head_groups") is what timing runs and part of its cache key.

    benchmark_backends=True (needs shape and segment_lengths) times each candidate once per key
    (forward, median of 3 after a warm-up) and caches the winner in memory and in `cache_path()`.
    """
    device = torch.device(device)
    if not benchmark_backends:
        return rule_backend(device, dtype, whole_pattern=whole_pattern)
    if shape is None or len(shape) != 4 or not segment_lengths:
        raise ValueError("benchmark_backends=True needs shape=(B, N, H, D) and segment_lengths")
    rates = tuple(dilation_rates) if dilation_rates is not None else tuple(1 for _ in segment_lengths)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    key = f"{name}|{dtype}|{tuple(shape)}|{tuple(segment_lengths)}|{rates}|{mode}"
    if key in _MEMORY_CACHE:
        return _MEMORY_CACHE[key]
    stored = _read_cache() if use_file_cache else {}
    if key in stored and unavailable_reason(stored[key], device, dtype) is None:
        _MEMORY_CACHE[key] = stored[key]
        return stored[key]
    timings = time_backends(device, dtype, tuple(shape), tuple(segment_lengths), rates, mode=mode)
    best = min(timings, key=timings.get) if timings else rule_backend(device, dtype, whole_pattern=whole_pattern)
    _MEMORY_CACHE[key] = best
    if use_file_cache:
        stored[key] = best
        _write_cache(stored)
    return best


def time_backends(device, dtype, shape, segment_lengths, dilation_rates, repeats: int = 3, *,
                  mode: str = "longnet") -> dict[str, float]:
    """Median forward seconds per runnable candidate (failing candidates are left out)."""
    from hilbert_lab.attention.engine import dilated_attention

    q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
    timings = {}
    for backend in candidate_backends(device, dtype):
        try:
            samples = []
            for i in range(repeats + 1):
                _sync(device)
                start = time.perf_counter()
                with torch.no_grad():
                    dilated_attention(q, k, v, segment_lengths=segment_lengths, dilation_rates=dilation_rates,
                                      mode=mode, backend=backend)
                _sync(device)
                if i:
                    samples.append(time.perf_counter() - start)
            timings[backend] = sorted(samples)[len(samples) // 2]
        except Exception:  # a candidate that fails on this shape is simply not chosen
            continue
    return timings


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _read_cache() -> dict:
    try:
        return json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}


def _write_cache(data: dict) -> None:
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home only loses the file cache
