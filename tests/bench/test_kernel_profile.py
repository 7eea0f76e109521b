"""bench.kernel_profile: kernels sorted into kinds by name, and (on a GPU) the profiler's kernel time of a step
against CUDA events around the same kernels."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.bench.kernel_profile import device_timeline, kernel_kind, kernel_profile


@pytest.mark.parametrize("name, kind", [
    ("kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90FlashAttentionForwardSm90", "attention"),
    ("_merge_kernel", "merge"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "fills"),
    ("Memcpy DtoD (Device -> Device)", "copies"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>>", "adds/conversions"),
    ("_put_rows_kernel", "adds/conversions"),
    ("void gemv2T_kernel_val", "other"),
])
def test_kernels_are_sorted_into_kinds_by_name(name, kind):
    assert kernel_kind(name) == kind


def test_the_device_timeline_counts_the_waits_between_kernels():
    """Two calls of three kernels (one overlapping the one before it): the span, the idle time between them and the
    pair of kernels around the waits, per call."""
    intervals = [(0.0, 10.0, "a"), (12.0, 20.0, "b"), (15.0, 25.0, "c"),  # call 1: a 2 us wait a -> b
                 (40.0, 50.0, "a"), (52.0, 60.0, "b"), (55.0, 65.0, "c")]  # 15 us c -> a between calls, 2 us a -> b
    timeline = device_timeline(list(reversed(intervals)), calls=2)
    assert timeline["ms_span"] == pytest.approx(65.0 / 2 / 1000)
    assert timeline["ms_idle"] == pytest.approx((2 + 15 + 2) / 2 / 1000)
    assert timeline["largest_gaps"] == [
        {"before": "c", "after": "a", "us_per_call": 7.5, "waits_per_call": 0.5},
        {"before": "a", "after": "b", "us_per_call": 2.0, "waits_per_call": 1.0}]
    assert device_timeline([], calls=3) == {"ms_span": 0.0, "ms_idle": 0.0, "largest_gaps": []}


def test_at_least_one_call_is_profiled():
    with pytest.raises(ValueError, match="calls must be at least 1"):
        kernel_profile(lambda: None, calls=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the profiler's CUDA kernels)")
def test_the_kernel_time_of_a_step_matches_cuda_events():
    """A step of large matrix products (GPU-bound, so events and kernels time the same work): the profiler's sum
    per call matches the events' median within 10% in one of three rounds of (profile, events). `make test-gpu`
    shares the GPU among workers, whose kernels time-slice with ours and stretch both timings: one quiet round of
    three is asked for."""
    a = torch.randn(8192, 8192, device="cuda")

    def step():
        for _ in range(4):
            torch.matmul(a, a)

    rounds = []
    for _ in range(3):
        profile = kernel_profile(step, calls=5)
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        rounds.append((profile, sorted(times)[2]))
    assert min(abs(profile["ms_total"] - events) / events for profile, events in rounds) <= 0.1, rounds
    assert profile["ms_by_kind"] and sum(profile["ms_by_kind"].values()) == pytest.approx(profile["ms_total"], abs=1e-3)
    # the span holds the kernels and the waits between them (kernels of one stream do not overlap)
    assert profile["ms_span"] == pytest.approx(profile["ms_total"] + profile["ms_idle"], rel=0.02), profile
