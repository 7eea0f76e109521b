"""ProgressiveTester: grow the sequence length (doubling, then bisecting) while it is safe and fast enough."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from hilbert_lab.bench.cases import CASE_PRELOAD, CASE_TARGET, estimate_case_bytes, exact_peak_env, normalize_case
from hilbert_lab.bench.checker import MemorySafetyChecker
from hilbert_lab.bench.config import SafetyConfig, format_bytes
from hilbert_lab.bench.isolate import IsolatedOutcome, run_isolated

# Why a probe stopped: a failed run (isolate statuses), a refused estimate, too slow, or the limit.
STOP_REASONS = ("estimate", "time_limit", "max_seq_len", "error", "oom", "timeout", "signal", "crash")


@dataclass
class ProbeStep:
    """One tried length: passed or why not, with the measured peak/time when it ran.

    estimated_bytes is the total the safety check used (inputs included); measured_peak_bytes is
    the peak the case measured above its inputs (for engine cases).
    """

    seq_len: int
    passed: bool
    reason: str = ""
    detail: str = ""
    estimated_bytes: int | None = None
    measured_peak_bytes: int | None = None
    seconds: float | None = None


@dataclass
class ProbeReport:
    """Largest passing length, what stopped the probe, the measured peak there, and every step."""

    largest_passing_len: int | None
    stopped_by: str
    stop_detail: str
    measured_peak_bytes: int | None
    estimated_bytes: int | None
    steps: list[ProbeStep] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        peak = format_bytes(self.measured_peak_bytes) if self.measured_peak_bytes is not None else "n/a"
        return (f"largest passing seq_len: {self.largest_passing_len} (measured peak {peak}); "
                f"stopped by {self.stopped_by}: {self.stop_detail}")


def _seconds_of(result: dict[str, Any], outcome: IsolatedOutcome) -> float:
    if "time_ms_median" in result:
        return float(result["time_ms_median"]) / 1e3
    if "time_s" in result:
        return float(result["time_s"])
    return float(outcome.duration_s)


def _peak_of(result: dict[str, Any]) -> int | None:
    for key in ("peak_bytes", "forward_backward_peak_bytes", "forward_peak_bytes"):
        if key in result:
            return int(result[key])
    return None


class ProgressiveTester:
    """Finds the largest sequence length a case runs at, without crashing the machine.

    From start_len the length doubles while (1) the estimated peak fits (MemorySafetyChecker) and
    (2) the isolated run succeeds within config.max_case_seconds. The doubling stops at the first
    failure; then the gap between the last pass and that failure is bisected (bisect_steps runs at
    most, lengths rounded down to multiple_of). Lengths never exceed config.max_seq_len.
    Runs use exact_peak_env, so on the CPU the reported peak RSS is the peak of live memory.
    """

    def __init__(self, base_case: dict[str, Any], *, config: SafetyConfig | None = None, start_len: int = 1024,
                 multiple_of: int = 1, bisect_steps: int = 3, target: str = CASE_TARGET,
                 estimate: Callable[[dict[str, Any]], int | None] | None = None, progress: bool = True) -> None:
        self.config = config if config is not None else SafetyConfig()
        for name, value, minimum in (("start_len", start_len, 1), ("multiple_of", multiple_of, 1),
                                     ("bisect_steps", bisect_steps, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        if start_len > self.config.max_seq_len:
            raise ValueError(f"start_len must be <= max_seq_len ({self.config.max_seq_len}), got {start_len}")
        self.base_case = normalize_case({**base_case, "seq_len": start_len})
        self.start_len = start_len
        self.multiple_of = multiple_of
        self.bisect_steps = bisect_steps
        self.target = target
        self.estimate = estimate if estimate is not None else estimate_case_bytes
        self.progress = progress
        self.checker = MemorySafetyChecker(self.config, str(self.base_case.get("device", "cpu")))

    def try_length(self, seq_len: int) -> ProbeStep:
        """Check the estimate for `seq_len`, then run it isolated; never raises for a failing run."""
        case = normalize_case({**self.base_case, "seq_len": seq_len})
        estimated = self.estimate(case)
        if estimated is not None:
            ok, reason = self.checker.check_memory_available(estimated)
            if not ok:
                return ProbeStep(seq_len, False, "estimate", reason, estimated_bytes=estimated)
        outcome = run_isolated(self.target, case, timeout_s=self.config.case_timeout_s, env=exact_peak_env(case),
                               preload=CASE_PRELOAD)
        if not outcome.ok:
            return ProbeStep(seq_len, False, outcome.status, outcome.error, estimated_bytes=estimated,
                             seconds=outcome.duration_s)
        seconds = _seconds_of(outcome.result, outcome)
        peak = _peak_of(outcome.result)
        if seconds > self.config.max_case_seconds:
            return ProbeStep(seq_len, False, "time_limit",
                             f"one run took {seconds:.3g} s > max_case_seconds {self.config.max_case_seconds:g}",
                             estimated_bytes=estimated, measured_peak_bytes=peak, seconds=seconds)
        return ProbeStep(seq_len, True, estimated_bytes=estimated, measured_peak_bytes=peak, seconds=seconds)

    def run(self) -> ProbeReport:
        """Probe and return the report (largest passing length, why it stopped, measured peak)."""
        bar = None
        if self.progress:
            from tqdm.auto import tqdm

            bar = tqdm(desc="probe", unit="run", dynamic_ncols=True)
        steps: list[ProbeStep] = []

        def attempt(length: int) -> ProbeStep:
            step = self.try_length(length)
            steps.append(step)
            if bar is not None:
                bar.set_postfix_str(f"N={length} {'pass' if step.passed else step.reason}")
                bar.update(1)
            return step

        best: ProbeStep | None = None
        failure: ProbeStep | None = None
        length = self.start_len
        try:
            while True:
                step = attempt(length)
                if not step.passed:
                    failure = step
                    break
                best = step
                if length >= self.config.max_seq_len:
                    break
                length = min(2 * length, self.config.max_seq_len)
            if best is not None and failure is not None:
                low, high = best.seq_len, failure.seq_len
                for _ in range(self.bisect_steps):
                    middle = (low + high) // 2 // self.multiple_of * self.multiple_of
                    if middle <= low or middle >= high:
                        break
                    step = attempt(middle)
                    if step.passed:
                        best, low = step, middle
                    else:
                        high = middle
        finally:
            if bar is not None:
                bar.close()
        if failure is None:
            stopped_by, detail = "max_seq_len", f"reached max_seq_len {self.config.max_seq_len} without a failure"
        else:
            stopped_by = failure.reason
            detail = f"seq_len {failure.seq_len}: {failure.detail}"
        return ProbeReport(best.seq_len if best else None, stopped_by, detail,
                           best.measured_peak_bytes if best else None, best.estimated_bytes if best else None, steps)
