"""MemorySafetyChecker: free/total memory of a device and whether a planned peak fits."""
from __future__ import annotations

from dataclasses import dataclass

from hilbert_lab.bench.config import SafetyConfig, format_bytes


@dataclass(frozen=True)
class MemoryInfo:
    """Free and total bytes of one device and where the numbers came from."""

    device: str
    free_bytes: int
    total_bytes: int
    sources: tuple[str, ...]


def _parse_device(device: str) -> tuple[str, int]:
    text = str(device)
    if text == "cpu":
        return "cpu", 0
    if text == "cuda":
        return "cuda", 0
    if text.startswith("cuda:") and text[5:].isdigit():
        return "cuda", int(text[5:])
    raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:<index>', got {device!r}")


def _nvml_memory(index: int) -> tuple[int, int] | None:
    """(free, total) from NVML (nvidia-ml-py) or None when it is not importable or fails."""
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
            return int(info.free), int(info.total)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVML present but no driver/device: not a source
        return None


def query_memory(device: str = "cpu") -> MemoryInfo:
    """Free/total memory of `device` ('cpu', 'cuda', 'cuda:N').

    CPU: psutil's available and total RAM. CUDA: NVML (when nvidia-ml-py is importable) and
    torch.cuda.mem_get_info (when NVML is missing or CUDA is already initialised); with both, the
    smaller free figure is kept.
    """
    kind, index = _parse_device(device)
    if kind == "cpu":
        import psutil

        virtual = psutil.virtual_memory()
        return MemoryInfo("cpu", int(virtual.available), int(virtual.total), ("psutil",))
    readings: list[tuple[int, int, str]] = []
    nvml = _nvml_memory(index)
    if nvml is not None:
        readings.append((nvml[0], nvml[1], "nvml"))
    import torch

    # torch.cuda.mem_get_info creates a CUDA context (hundreds of MiB): only when NVML gave nothing
    # or this process already has one.
    if torch.cuda.is_available() and (not readings or torch.cuda.is_initialized()):
        if index >= torch.cuda.device_count():
            raise ValueError(f"device index must be < {torch.cuda.device_count()} (CUDA devices), got {index}")
        free, total = torch.cuda.mem_get_info(index)
        readings.append((int(free), int(total), "torch.cuda.mem_get_info"))
    if not readings:
        raise ValueError(f"device {device!r} is not available: no CUDA device (torch.cuda and NVML both found none)")
    free = min(r[0] for r in readings)
    total = min(r[1] for r in readings)
    return MemoryInfo(f"cuda:{index}", free, total, tuple(r[2] for r in readings))


class MemorySafetyChecker:
    """Decides whether a planned peak fits on a device under a SafetyConfig.

    A request fits when required * estimate_margin <= free - min_free_bytes and
    required * estimate_margin <= total * max_memory_fraction.
    """

    def __init__(self, config: SafetyConfig | None = None, device: str = "cpu") -> None:
        _parse_device(device)
        self.config = config if config is not None else SafetyConfig()
        self.device = str(device)

    def memory_info(self) -> MemoryInfo:
        """Current free/total memory of the checker's device."""
        return query_memory(self.device)

    def check_memory_available(self, required_bytes: int, info: MemoryInfo | None = None) -> tuple[bool, str]:
        """(ok, reason) for a planned peak of `required_bytes` on this device."""
        if isinstance(required_bytes, bool) or not isinstance(required_bytes, (int, float)) or required_bytes < 0:
            raise ValueError(f"required_bytes must be a number >= 0, got {required_bytes!r}")
        info = info if info is not None else self.memory_info()
        planned = float(required_bytes) * self.config.estimate_margin
        usable_free = info.free_bytes - self.config.min_free_bytes
        cap = info.total_bytes * self.config.max_memory_fraction
        where = f"{info.device} ({'+'.join(info.sources)})"
        if planned > cap:
            return False, (f"needs {format_bytes(planned)} (estimate x{self.config.estimate_margin:g}) but "
                           f"max_memory_fraction={self.config.max_memory_fraction:g} of "
                           f"{format_bytes(info.total_bytes)} on {where} allows {format_bytes(cap)}")
        if planned > usable_free:
            return False, (f"needs {format_bytes(planned)} (estimate x{self.config.estimate_margin:g}) but "
                           f"{where} has {format_bytes(info.free_bytes)} free and "
                           f"{format_bytes(self.config.min_free_bytes)} must stay free")
        return True, (f"fits: needs {format_bytes(planned)} of {format_bytes(max(usable_free, 0))} usable on {where}")
