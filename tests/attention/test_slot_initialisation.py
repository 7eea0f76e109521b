"""The slots and gradient totals start uninitialised: their zeros and -inf LSEs are written once, before the first
write, by the executor inside its captured region (blockwise executors) or by the attention function before the
part runs. Every output and gradient then equals the float64 oracle even when fresh memory holds NaN."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention import dilated_attention
from hilbert_lab.attention.executors import get_executor
from hilbert_lab.attention.executors.base import Grads, Slots
from hilbert_lab.attention.reference import reference_attention
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.kernels.beside import Beside

from ._oracle import max_diff

B, N, H, D = 2, 24, 4, 8
PATTERN = dict(segment_lengths=[8, 24], dilation_rates=[1, 4])


@pytest.fixture
def nan_memory(monkeypatch):
    """torch.empty hands out floating tensors full of NaN (what a reused allocation may hold)."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        tensor = empty(*args, **kwargs)
        return tensor.fill_(float("nan")) if tensor.is_floating_point() and tensor.device.type != "meta" else tensor

    monkeypatch.setattr(torch, "empty", poisoned)


def test_slots_hand_their_initialisation_over_once():
    ran = []
    slots = Slots(torch.zeros(1), torch.zeros(1), {0: 0}, prepare=lambda: ran.append(1))
    first = slots.take_prepare()
    assert slots.prepare is None and ran == []
    first()
    slots.take_prepare()()  # a later take: nothing pending
    assert ran == [1]


def _zero_even_rows(x: torch.Tensor, beside=None) -> torch.Tensor:
    if beside is not None:
        return beside.run(_zero_even_rows, x)
    x[:, ::2].zero_()
    return x


@pytest.mark.parametrize("clear", [None, _zero_even_rows])
def test_allocated_totals_are_zeroed_only_when_the_returned_function_runs(clear):
    like = tuple(torch.ones(1, 4, 2, 3, dtype=torch.float64) for _ in range(3))
    grads = Grads(like, accumulate=False, dtype=torch.float64, clear=clear)
    zero = grads.allocate()
    totals = (grads.dq, grads.dk, grads.dv)
    for total in totals:
        total.fill_(5.0)
    grads.allocate()()  # a second allocate has nothing left to allocate or zero
    assert all(bool((total == 5).all()) for total in totals)
    zero()
    expected = torch.zeros(1, 4, 2, 3, dtype=torch.float64)
    if clear is not None:  # the plan's clear: only the entries it names
        expected[:, 1::2] = 5.0
    assert all(torch.equal(total, expected) for total in totals)
    assert all(result is total for result, total in zip(grads.results(), totals))


def test_the_plans_clear_runs_beside_the_calls_where_the_caller_gives_a_side():
    seen = []

    def clear(x: torch.Tensor, beside=None) -> torch.Tensor:
        seen.append(beside)
        return x

    like = tuple(torch.ones(1, 4, 2, 3, dtype=torch.float64) for _ in range(3))
    side = Beside(torch.device("cpu"))
    Grads(like, accumulate=False, dtype=torch.float64, clear=clear).allocate()(side)
    assert seen == [side, side, side]
    Grads(like, accumulate=True, dtype=torch.float64, clear=clear).allocate()(side)  # added shares: whole zeros
    assert seen == [side, side, side]


@pytest.mark.parametrize("executor", ["sdpa", "manual", "reference"])
@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
@pytest.mark.parametrize("causal", [False, True])
def test_outputs_and_gradients_match_the_oracle_when_fresh_memory_holds_nan(nan_memory, executor, mode, causal):
    assert get_executor(executor).prepares_slots
    gen = torch.Generator().manual_seed(3)
    leaves = [torch.randn(B, N, H, D, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    upstream = torch.randn(B, N, H, D, generator=gen, dtype=torch.float64)
    pattern = DilatedPattern.create(PATTERN["segment_lengths"], PATTERN["dilation_rates"], mode=mode, causal=causal)
    out, lse = dilated_attention(*leaves, **PATTERN, mode=mode, causal=causal, backend=executor, return_lse=True)
    expected_out, expected_lse = reference_attention(*leaves, pattern)
    assert max_diff(out, expected_out) < 1e-12 and max_diff(lse, expected_lse) < 1e-12
    got = torch.autograd.grad(out, leaves, upstream)
    expected = torch.autograd.grad(expected_out, leaves, upstream)
    assert max(max_diff(a, b) for a, b in zip(got, expected)) < 1e-11


def _merge_stand_in(calls):
    """merge_partials in plain torch (the exact LSE merge of attention.merge), recording each call."""
    from hilbert_lab.attention.merge import merge_lse

    def merge_partials(outs, lses, out, lse, *, over_first=False):
        parts, rows, dim = outs.shape
        merged, merged_lse = merge_lse([o.view(1, rows, 1, dim) for o in outs], [l.view(1, 1, rows) for l in lses])
        out.copy_(merged.view(rows, dim))
        lse.copy_(merged_lse.view(rows))
        calls.append(over_first)

    return merge_partials


@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
@pytest.mark.parametrize("train", [False, True])
def test_the_merge_runs_last_in_the_forward_region_of_a_graphed_kernel(monkeypatch, mode, train):
    """A blockwise executor whose kernel declares graphs runs the fused merge at the end of its forward region, which
    then lists the result's buffers (LongNet: several slots; head_groups: one, no merge); the result (a view of the first slot without a backward) and the gradients
    equal the float64 oracle."""
    import dataclasses

    from hilbert_lab.attention import merge
    from hilbert_lab.attention.executors import blockwise
    from hilbert_lab.kernels import triton_merge

    merged, regions = [], []
    monkeypatch.setattr(merge, "FUSED_MERGE_DEVICES", ("cpu",))
    monkeypatch.setattr(triton_merge, "HAVE_TRITON", True)
    monkeypatch.setattr(triton_merge, "merge_partials", _merge_stand_in(merged))

    def run_plan_graph(what, plans, key, tensors, launch, *, keep=()):
        before = len(merged)
        launch()
        regions.append((what, key, tuple(tensors), len(merged) - before))

    monkeypatch.setattr(blockwise, "run_plan_graph", run_plan_graph)
    sdpa = get_executor("sdpa")
    executor = blockwise.blockwise_executor("graphed", lambda q: dataclasses.replace(sdpa.kernel_for(q), graphs=True),
                                            sdpa.capabilities)
    gen = torch.Generator().manual_seed(5)
    leaves = [torch.randn(B, N, H, D, generator=gen, requires_grad=train) for _ in range(3)]
    pattern = DilatedPattern.create(PATTERN["segment_lengths"], PATTERN["dilation_rates"], mode=mode, causal=True)
    with torch.set_grad_enabled(train):
        out, lse = dilated_attention(*leaves, **PATTERN, mode=mode, causal=True, backend=executor, return_lse=True)
    forward = [region for region in regions if region[0] == "blocks forward"]
    if mode == "longnet":  # merged once, inside the region, whose tensors hold the result
        assert len(forward) == 1 and forward[0][3] == 1 and merged == [not train] and forward[0][1][-1] is True
        assert any(t is not None and t.data_ptr() == out.data_ptr() for t in forward[0][2])
    else:  # a head reads one branch: one slot, the result itself, nothing to merge
        assert len(forward) == 1 and merged == [] and forward[0][1][-1] is False
    exact = [t.detach().double().requires_grad_() for t in leaves]
    expected_out, expected_lse = reference_attention(*exact, pattern)
    assert max_diff(out, expected_out) < 1e-5 and max_diff(lse, expected_lse) < 1e-5
    if train:
        upstream = torch.randn(B, N, H, D, generator=gen)
        got = torch.autograd.grad(out, leaves, upstream)
        want = torch.autograd.grad(expected_out, exact, upstream.double())
        assert max(max_diff(a, b) for a, b in zip(got, want)) < 1e-4
