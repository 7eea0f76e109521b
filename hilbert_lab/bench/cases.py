"""Benchmark case kinds ("selftest", "attention", "memory"): validation and the code a worker runs."""
from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import sys
import time
from typing import Any

from hilbert_lab.dtypes import DTYPES

CASE_TARGET = "hilbert_lab.bench.cases:run_case"
# What a case process imports (bench.forkserver imports it once; each case is forked from there).
CASE_PRELOAD = ("torch", "torch._dynamo", "hilbert_lab.attention.engine", "hilbert_lab.attention.memory",
                "hilbert_lab.bench.cases", "hilbert_lab.bench.measure", "hilbert_lab.bench.timing")
KINDS = ("selftest", "attention", "memory")
SELFTEST_BEHAVIORS = ("ok", "raise", "sleep", "signal", "oom", "exit")
PASSES = ("forward", "forward_backward")
MAX_CASE_SEQ_LEN = 1 << 40  # as the CLI's bound; the memory estimate refuses what no device holds
MAX_SECONDS = 7 * 24 * 3600.0
MAX_REPEATS = 10 ** 6
MAX_BYTES = 2 ** 63 - 1  # byte counts are int64 where they are measured
# Defaults of an attention case (backend names: known_backends, from the engine's registry).
ATTENTION_DEFAULTS: dict[str, Any] = {
    "batch_size": 1, "num_heads": 4, "head_dim": 32, "segment_lengths": [256, 512],
    "dilation_rates": [1, 2], "mode": "longnet", "causal": False, "backend": "manual", "ordering": None,
    "dtype": "float32", "device": "cpu", "pass": "forward", "warmup": 1, "repeats": 3, "threads": None,
}


def case_id(params: dict[str, Any]) -> str:
    """Stable id of a case: sha256 of its canonical JSON (sorted keys), 16 hex digits."""
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def known_backends() -> tuple[str, ...]:
    """Backend names the engine registers, 'auto' included."""
    from hilbert_lab.attention.executors import BACKENDS  # lazily: importing bench must not load torch

    return ("auto",) + tuple(n for n in BACKENDS if n != "auto")


def _require(params: dict, name: str, allowed: tuple) -> None:
    if params[name] not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}; got {params[name]!r}")


def _positive_int(params: dict, name: str, minimum: int = 1, maximum: int | None = None) -> None:
    value = params[name]
    if (isinstance(value, bool) or not isinstance(value, int) or value < minimum
            or (maximum is not None and value > maximum)):
        allowed = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{name} must be an integer {allowed}, got {value!r}")


def _seconds(params: dict, name: str) -> None:
    value = params[name]
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or not 0 <= value <= MAX_SECONDS):
        raise ValueError(f"{name} must be a number of seconds in [0, {MAX_SECONDS:g}], got {value!r}")


def normalize_case(params: dict[str, Any]) -> dict[str, Any]:
    """Validated case with defaults filled in (the exact parameters stored with its result).

    Raises ValueError naming the bad field and the allowed values.
    """
    if not isinstance(params, dict):
        raise ValueError(f"a case must be a mapping of parameters, got {type(params).__name__}")
    kind = params.get("kind", "attention")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if kind == "selftest":
        case = {"kind": "selftest", "behavior": "ok", "seconds": 0.0, "value": 0, "seq_len": 1,
                "fail_above": None, "bytes_per_token": 0}
        unknown = set(params) - set(case)
        if unknown:
            raise ValueError(f"unknown selftest field(s) {sorted(unknown)}; allowed: {sorted(case)}")
        case.update(params)
        _require(case, "behavior", SELFTEST_BEHAVIORS)
        _positive_int(case, "seq_len", maximum=MAX_CASE_SEQ_LEN)
        _seconds(case, "seconds")
        _positive_int(case, "bytes_per_token", minimum=0, maximum=MAX_BYTES // case["seq_len"])
        if case["fail_above"] is not None:
            _positive_int(case, "fail_above", minimum=0)
        if not (case["value"] is None or isinstance(case["value"], (bool, int, float, str))):
            raise ValueError(f"value must be a number, string, bool or null, got {case['value']!r}")
        return case
    case = {"kind": kind, **ATTENTION_DEFAULTS}
    unknown = set(params) - set(case) - {"seq_len"}
    if unknown:
        raise ValueError(f"unknown {kind} field(s) {sorted(unknown)}; allowed: {sorted(set(case) | {'seq_len'})}")
    case.update(params)
    if "seq_len" not in case:
        raise ValueError(f"seq_len is required for a {kind} case")
    _positive_int(case, "seq_len", maximum=MAX_CASE_SEQ_LEN)
    for name in ("batch_size", "num_heads", "head_dim"):
        _positive_int(case, name)
    _positive_int(case, "repeats", maximum=MAX_REPEATS)
    _positive_int(case, "warmup", minimum=0, maximum=MAX_REPEATS)
    if case["threads"] is not None:
        _positive_int(case, "threads", maximum=1024)
    for name in ("segment_lengths", "dilation_rates"):
        value = case[name]
        if (not isinstance(value, (list, tuple)) or not value
                or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value)):
            raise ValueError(f"{name} must be a non-empty list of integers >= 1, got {value!r}")
        case[name] = list(value)
    if len(case["segment_lengths"]) != len(case["dilation_rates"]):
        raise ValueError(f"segment_lengths and dilation_rates must have the same length, got "
                         f"{len(case['segment_lengths'])} and {len(case['dilation_rates'])}")
    from hilbert_lab.attention.pattern import MODES  # lazily: importing bench must not load torch

    _require(case, "mode", MODES)
    _require(case, "dtype", DTYPES)
    _require(case, "pass", PASSES)
    _require(case, "backend", known_backends())
    device = str(case["device"])
    if not (device in ("cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:<index>', got {device!r}")
    if not isinstance(case["causal"], bool):
        raise ValueError(f"causal must be true or false, got {case['causal']!r}")
    from hilbert_lab.curves import ORDERINGS

    if case["ordering"] is not None and case["ordering"] not in ORDERINGS:
        raise ValueError(f"ordering must be null or one of {', '.join(ORDERINGS)}; got {case['ordering']!r}")
    from hilbert_lab.attention.pattern import DilatedPattern  # the engine's own validator

    DilatedPattern.create(case["segment_lengths"], case["dilation_rates"], mode=case["mode"], causal=case["causal"])
    return case


def worker_env(case: dict[str, Any]) -> dict[str, str]:
    """Environment variables the worker process of `case` needs.

    "memory" cases on the CPU set glibc's mmap threshold low and fixed, so that every freed tensor
    goes back to the system at once and the peak RSS tracks the peak of live tensors.
    """
    env: dict[str, str] = {}
    if case.get("kind") == "memory" and not str(case.get("device", "cpu")).startswith("cuda"):
        env.update(MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="65536")
    if case.get("threads"):
        env["OMP_NUM_THREADS"] = str(case["threads"])
    return env


def estimate_case_bytes(case: dict[str, Any]) -> int | None:
    """Estimated peak bytes of a validated case, inputs included (None: no estimate, e.g. a plain selftest).

    A selftest case with bytes_per_token > 0 claims bytes_per_token * seq_len, so that the safety
    checks can be tested without the engine.
    """
    if case["kind"] == "selftest":
        return int(case["bytes_per_token"]) * int(case["seq_len"]) or None
    from hilbert_lab.attention.memory import MemoryConfig
    from hilbert_lab.distributed.memory import estimate_memory_per_rank

    estimate = estimate_memory_per_rank(MemoryConfig.from_case(case))
    training = case["kind"] == "memory" or case.get("pass") == "forward_backward"
    return estimate.inputs_bytes + (estimate.forward_backward_bytes if training else estimate.forward_bytes)


def _peak_is_exact(case: dict[str, Any]) -> bool:
    """CUDA peaks are allocator-exact; CPU peak RSS is when freed memory goes back to the system at once."""
    return case["device"].startswith("cuda") or "MALLOC_MMAP_THRESHOLD_" in os.environ


def exact_peak_env(case: dict[str, Any]) -> dict[str, str]:
    """worker_env(case) plus, on the CPU, the glibc settings under which the peak RSS is the peak of live tensors."""
    env = worker_env(case)
    if not str(case.get("device", "cpu")).startswith("cuda"):
        env.update(MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="65536")
    return env


def _run_selftest(case: dict[str, Any]) -> dict[str, Any]:
    """Tiny built-in case for testing the runner and the probe without the engine."""
    behavior = case["behavior"]
    if case["fail_above"] is not None and case["seq_len"] > case["fail_above"]:
        raise MemoryError(f"selftest: seq_len {case['seq_len']} > fail_above {case['fail_above']}")
    if behavior == "raise":
        raise RuntimeError("selftest: raised on purpose")
    if behavior == "oom":
        raise MemoryError("selftest: simulated out of memory")
    if behavior == "signal":
        os.kill(os.getpid(), signal.SIGKILL)
    if behavior == "exit":
        print("selftest: leaving with code 3", file=sys.stderr, flush=True)
        os._exit(3)
    start = time.perf_counter()
    if float(case["seconds"]) > 0:
        time.sleep(float(case["seconds"]))
    return {"value": case["value"], "seq_len": case["seq_len"], "time_s": time.perf_counter() - start,
            "peak_bytes": int(case["bytes_per_token"]) * int(case["seq_len"])}


def _make_inputs(case: dict[str, Any], requires_grad: bool):
    import torch

    dtype = getattr(torch, case["dtype"])
    shape = (case["batch_size"], case["seq_len"], case["num_heads"], case["head_dim"])
    generator = torch.Generator(device="cpu").manual_seed(0)
    tensors = [torch.randn(shape, generator=generator, dtype=torch.float32).to(device=case["device"], dtype=dtype)
               for _ in range(3)]
    for tensor in tensors:
        tensor.requires_grad_(requires_grad)
    return tensors


def _attend(case: dict[str, Any], q, k, v):
    from hilbert_lab.attention.engine import dilated_attention

    return dilated_attention(q, k, v, segment_lengths=case["segment_lengths"], dilation_rates=case["dilation_rates"],
                             causal=case["causal"], mode=case["mode"], backend=case["backend"],
                             ordering=case["ordering"])


def _one_pass(case: dict[str, Any], q, k, v, upstream) -> None:
    out = _attend(case, q, k, v)
    if case["pass"] == "forward_backward":
        out.backward(upstream)
        q.grad = k.grad = v.grad = None


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def _estimate_fields(case: dict[str, Any]) -> dict[str, Any]:
    from hilbert_lab.attention.memory import MemoryConfig
    from hilbert_lab.distributed.memory import estimate_memory_per_rank

    try:
        estimate = estimate_memory_per_rank(MemoryConfig.from_case(case))
    except Exception as exc:  # an estimate is extra information, never a reason to lose a timing
        return {"estimate_error": f"{type(exc).__name__}: {exc}"}
    return {"estimated_forward_bytes": estimate.forward_bytes,
            "estimated_forward_backward_bytes": estimate.forward_backward_bytes,
            "estimated_inputs_bytes": estimate.inputs_bytes}


def _backend_used(case: dict[str, Any], q, training: bool) -> str:
    """The backend the engine runs for this case ("auto" resolved the way the engine resolves it)."""
    from hilbert_lab.attention.selection import resolve_executor
    from hilbert_lab.attention.pattern import DilatedPattern

    pattern = DilatedPattern.create(case["segment_lengths"], case["dilation_rates"], mode=case["mode"],
                                    causal=case["causal"])
    return resolve_executor(case["backend"], q, pattern, training=training).name


def _run_attention(case: dict[str, Any]) -> dict[str, Any]:
    """Time of the engine pass (bench.timing.time_function: median ms; on CUDA with Triton, do_bench's
    back-to-back GPU time and no per-repeat samples) and the peak memory above the inputs of one pass
    after the warm-up (measured apart from the timing, whose L2 flush buffer must not count)."""
    import torch

    from hilbert_lab.bench.timing import time_function
    from hilbert_lab.bench.measure import PeakMeter

    if case["threads"]:
        torch.set_num_threads(int(case["threads"]))
    backward = case["pass"] == "forward_backward"
    q, k, v = _make_inputs(case, requires_grad=backward)
    upstream = torch.randn_like(q) if backward else None
    for _ in range(case["warmup"]):
        _one_pass(case, q, k, v, upstream)
    _synchronize(case["device"])
    with PeakMeter(case["device"]) as meter:
        _one_pass(case, q, k, v, upstream)
        _synchronize(case["device"])
    timing = time_function(lambda: _one_pass(case, q, k, v, upstream), device=case["device"], warmup=0,
                           repeats=case["repeats"], max_seconds=float("inf"))
    times_ms = list(timing.samples)
    return {"backend_used": _backend_used(case, q, backward), "time_ms_median": timing.median,
            "time_ms_min": min(times_ms) if times_ms else timing.low,
            "times_ms": times_ms, "peak_bytes": meter.peak_bytes, "threads": torch.get_num_threads(),
            "peak_method": meter.method if _peak_is_exact(case) else
            "RSS growth over one pass after warm-up (reused heap hides freed memory; kind 'memory' measures peaks)",
            **_estimate_fields(case)}


def _run_memory(case: dict[str, Any]) -> dict[str, Any]:
    """Measured peak bytes above the inputs of one forward and one forward+backward, after a warm-up."""
    import torch

    from hilbert_lab.bench.measure import PeakMeter

    torch.set_num_threads(int(case["threads"] or 1))
    q, k, v = _make_inputs(case, requires_grad=True)
    upstream = torch.randn_like(q)
    warm = dict(case, **{"pass": "forward_backward"})
    for _ in range(max(1, case["warmup"])):  # both passes warm (a compiled kernel compiles each on its first call)
        _one_pass(warm, q, k, v, upstream)
        with torch.no_grad():
            _attend(case, q, k, v)
    _synchronize(case["device"])
    with torch.no_grad(), PeakMeter(case["device"]) as forward_meter:
        out = _attend(case, q, k, v)
        del out
    with PeakMeter(case["device"]) as training_meter:
        out = _attend(case, q, k, v)
        out.backward(upstream)
        del out
    # gradients are live at the peak of the backward pass; they are part of what it costs
    return {"forward_peak_bytes": forward_meter.peak_bytes,
            "forward_backward_peak_bytes": training_meter.peak_bytes,
            "peak_method": forward_meter.method, **_estimate_fields(case)}


def run_case(params: dict[str, Any]) -> dict[str, Any]:
    """Run one case in this process (the worker calls this) and return its result dict."""
    case = normalize_case(params)
    if case["kind"] == "selftest":
        return _run_selftest(case)
    if case["kind"] == "memory":
        return _run_memory(case)
    return _run_attention(case)
