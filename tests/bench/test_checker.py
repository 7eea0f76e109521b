"""SafetyConfig validation, MemorySafetyChecker decisions and the CPU peak meter."""
from __future__ import annotations

import psutil
import pytest
import torch

from hilbert_lab.bench.checker import MemoryInfo, MemorySafetyChecker, query_memory
from hilbert_lab.bench.config import SafetyConfig, format_bytes
from hilbert_lab.bench.measure import PeakMeter, reset_cpu_peak

MIB = 1 << 20


@pytest.mark.parametrize("field, value", [
    ("max_memory_fraction", 0.0), ("max_memory_fraction", 1.5), ("min_free_bytes", -1),
    ("estimate_margin", 0.9), ("max_seq_len", 0), ("case_timeout_s", 0), ("max_case_seconds", float("inf")),
])
def test_safety_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SafetyConfig(**{field: value})


def _info(free_mib: int, total_mib: int) -> MemoryInfo:
    return MemoryInfo("cpu", free_mib * MIB, total_mib * MIB, ("test",))


def test_check_memory_available_applies_margin_min_free_and_fraction():
    config = SafetyConfig(max_memory_fraction=0.5, min_free_bytes=100 * MIB, estimate_margin=1.25)
    checker = MemorySafetyChecker(config, "cpu")
    # 400 MiB * 1.25 = 500 MiB <= 1000 - 100 free and <= 0.5 * 2000 total
    ok, reason = checker.check_memory_available(400 * MIB, _info(1000, 2000))
    assert ok and reason.startswith("fits")
    # 800 MiB * 1.25 = 1000 MiB > 900 MiB usable free
    ok, reason = checker.check_memory_available(800 * MIB, _info(1000, 4000))
    assert not ok and "must stay free" in reason and format_bytes(1000 * MIB) in reason
    # fits in free memory but over the fraction of the total
    ok, reason = checker.check_memory_available(900 * MIB, _info(3000, 2000))
    assert not ok and "max_memory_fraction" in reason
    # boundary: exactly the usable free memory fits
    ok, _ = checker.check_memory_available(int(900 * MIB / 1.25), _info(1000, 4000))
    assert ok


@pytest.mark.parametrize("bad", [-1, "10", None, True])
def test_check_memory_available_rejects_bad_required_bytes(bad):
    with pytest.raises(ValueError, match="required_bytes"):
        MemorySafetyChecker().check_memory_available(bad, _info(1000, 2000))


def test_query_memory_cpu_matches_psutil():
    info = query_memory("cpu")
    virtual = psutil.virtual_memory()
    assert info.total_bytes == virtual.total
    assert 0 < info.free_bytes <= info.total_bytes
    assert abs(info.free_bytes - virtual.available) < 0.1 * virtual.total


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "tpu:0"])
def test_bad_device_names_are_rejected(device):
    with pytest.raises(ValueError, match="device"):
        MemorySafetyChecker(device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_cuda_query_without_cuda_says_so():
    with pytest.raises(ValueError, match="not available"):
        query_memory("cuda:0")


# Run in a fresh interpreter: inside the test process, memory freed meanwhile by other threads or by
# a garbage collection of earlier tests' objects lowers the RSS under the meter and can hide the
# whole 64 MiB peak (the meter measures peak RSS minus RSS at entry of the one process).
_PEAK_SCRIPT = r"""
import json, mmap
import torch
from hilbert_lab.bench.measure import PeakMeter, reset_cpu_peak
MIB = 1 << 20
result = {"clear_refs": reset_cpu_peak()}
with PeakMeter("cpu") as probe:  # the host's /proc: does VmHWM keep the peak of unmapped memory?
    buffer = mmap.mmap(-1, 64 * MIB)
    buffer.write(b"x" * (64 * MIB))
    buffer.close()
result["probe"] = probe.peak_bytes
with PeakMeter("cpu") as meter:
    tensor = torch.ones(16 * MIB, dtype=torch.float32)  # 64 MiB, touched
    del tensor
result["tensor"] = meter.peak_bytes
with PeakMeter("cpu") as idle:
    pass
result["idle"] = idle.peak_bytes
print(json.dumps(result))
"""


def test_cpu_peak_meter_sees_a_freed_64_mib_tensor():
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT], capture_output=True, text=True, env=env, timeout=600)  # wide: a hang
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if not result["clear_refs"]:
        pytest.skip("kernel does not allow resetting the peak RSS (/proc/self/clear_refs)")
    if result["probe"] < 60 * MIB:
        pytest.skip(f"this host's VmHWM did not keep the peak of a freed 64 MiB mapping ({result['probe']} bytes)")
    assert 60 * MIB <= result["tensor"] <= 96 * MIB, result
    assert result["idle"] < 8 * MIB, result


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_peak_meter_and_query_see_an_allocation():
    info = query_memory("cuda:0")
    assert 0 < info.free_bytes <= info.total_bytes
    with PeakMeter("cuda:0") as meter:
        tensor = torch.ones(16 * MIB, dtype=torch.float32, device="cuda:0")
        del tensor
    assert 64 * MIB <= meter.peak_bytes <= 66 * MIB
