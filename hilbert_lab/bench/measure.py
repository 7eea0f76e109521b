"""Peak-memory probes: process peak RSS on the CPU (Linux VmHWM reset), allocator peak on CUDA."""
from __future__ import annotations

import resource
import sys


def _read_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def current_rss_bytes() -> int:
    """Resident set size of this process now (bytes)."""
    kib = _read_status_kib("VmRSS")
    if kib is not None:
        return kib * 1024
    import psutil

    return int(psutil.Process().memory_info().rss)


def reset_cpu_peak() -> bool:
    """Reset this process's peak RSS to its current RSS (Linux /proc/self/clear_refs '5').

    Returns False when the kernel does not allow it; cpu_peak_bytes then falls back to ru_maxrss,
    which is the peak since the process started.
    """
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def cpu_peak_bytes() -> int:
    """Peak RSS of this process since the last reset_cpu_peak (or since start), bytes."""
    kib = _read_status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(maxrss if sys.platform == "darwin" else maxrss * 1024)


class PeakMeter:
    """Peak memory above a baseline on one device: `with PeakMeter(device) as meter: ...; meter.peak_bytes`.

    CPU: peak RSS minus RSS at entry (needs a process of its own for trustworthy numbers, and
    MALLOC_MMAP_THRESHOLD_ set low so that freed tensors return to the system).
    CUDA: torch.cuda.max_memory_allocated minus memory_allocated at entry.
    """

    def __init__(self, device: str = "cpu") -> None:
        self.device = str(device)
        self.baseline_bytes = 0
        self.peak_bytes = 0
        self.method = ""

    def __enter__(self) -> "PeakMeter":
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline_bytes = int(torch.cuda.memory_allocated(self.device))
            self.method = "torch.cuda.max_memory_allocated"
        else:
            reset = reset_cpu_peak()
            self.baseline_bytes = current_rss_bytes()
            self.method = "VmHWM after clear_refs" if reset else "ru_maxrss (peak since process start)"
        return self

    def __exit__(self, *exc) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(self.device)
            peak = int(torch.cuda.max_memory_allocated(self.device))
        else:
            peak = cpu_peak_bytes()
        self.peak_bytes = max(0, peak - self.baseline_bytes)
