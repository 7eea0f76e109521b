"""Packed documents (cu_seqlens) and grouped-query heads through `dilated_attention`, against the float64
oracle run document by document with key/value heads repeated: outputs, LSE and gradients for a random
upstream gradient, on every CPU backend; the varlen path (packs: one kernel call for the blocks of many
documents) on its per-sequence reference and on a stand-in with FlashAttention-4's varlen semantics;
bad input."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from hilbert_lab.attention import DilatedPattern, dilated_attention, reference_attention, validate_attention_inputs
from hilbert_lab.attention.selection import resolve_executor
from hilbert_lab.attention.executors import Capabilities, Executor, unavailable_reason
from hilbert_lab.attention.executors.blockwise import blockwise_executor
from hilbert_lab.attention.executors.fa4 import FA4_VARLEN
from hilbert_lab.attention.executors.manual import EAGER_CAPABILITIES, MANUAL_KERNEL
from hilbert_lab.attention.executors.varlen import packs_for, per_sequence, plan_packs
from hilbert_lab.attention.plan import cached_plan

from ._fa4_standin import install_fa4_standin
from ._oracle import max_diff

TOL = 1e-10
CPU_BACKENDS = ["reference", "manual", "sdpa", "sdpa_flash", "sdpa_math", "flex"]
# (batch, document lengths or None, heads, kv heads, segment_lengths, dilation_rates, mode, causal)
CASES = {
    "documents+gqa": (1, (1, 3, 12, 7, 21), 4, 2, [4, 8, 1 << 40], [1, 2, 4], "longnet", True),
    "documents": (1, (5, 1, 16, 2), 6, 6, [4, 8], [1, 2], "head_groups", False),
    "whole-row+mqa": (1, (23,), 4, 1, [8, 1 << 40], [1, 4], "longnet", False),
    "gqa-batch": (2, None, 6, 2, [4, 8, 16], [1, 2, 4], "head_groups", True),
    "small": (1, (1, 6, 9), 4, 2, [4, 1 << 40], [1, 2], "longnet", True),  # FlexAttention (slow on the CPU)
}


def _inputs(case, seed=0):
    batch, lengths, heads, kv_heads, *_ = case
    total = sum(lengths) if lengths else 19
    gen = torch.Generator().manual_seed(seed)
    make = lambda h: torch.randn(batch, total, h, 4, generator=gen, dtype=torch.float64).requires_grad_(True)  # noqa: E731
    cu = None if lengths is None else torch.tensor([0, *lengths]).cumsum(0)
    return make(heads), make(kv_heads), make(kv_heads), cu


def _oracle(q, k, v, cu, pattern):
    """The float64 oracle on each document alone, key/value heads repeated to the query heads."""
    groups = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(groups, 2), v.repeat_interleave(groups, 2)
    bounds = [0, q.shape[1]] if cu is None else cu.tolist()
    parts = [reference_attention(q[:, a:b], k[:, a:b], v[:, a:b], pattern, scale=0.5) for a, b in zip(bounds, bounds[1:])]
    return torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 2)


def _check(case, backend, *, gradients=True, seed=0):
    _, _, _, _, segments, rates, mode, causal = case
    q, k, v, cu = _inputs(case, seed)
    pattern = DilatedPattern.create(segments, rates, mode=mode, causal=causal)
    out, lse = dilated_attention(q, k, v, segment_lengths=segments, dilation_rates=rates, mode=mode, causal=causal,
                                 backend=backend, scale=0.5, return_lse=True, cu_seqlens=cu)
    expected_out, expected_lse = _oracle(q, k, v, cu, pattern)
    assert max_diff(out, expected_out) < TOL and max_diff(lse, expected_lse) < TOL
    if not gradients:
        return
    gen = torch.Generator().manual_seed(seed + 7)
    g_out = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    g_lse = torch.randn(lse.shape, generator=gen, dtype=torch.float64)
    want = torch.autograd.grad((expected_out, expected_lse), (q, k, v), (g_out, g_lse))
    have = torch.autograd.grad((out, lse), (q, k, v), (g_out, g_lse))
    for name, a, b in zip("qkv", have, want):
        assert a.shape == b.shape and max_diff(a, b) < TOL, f"d{name}"


def relative_errors(case, backend, dtype: torch.dtype, seed: int = 0) -> dict:
    """Relative errors (norms) of out, LSE, dq, dk, dv of `backend` run in `dtype` against the float64 oracle per
    document, for random upstream gradients of both outputs."""
    _, _, _, _, segments, rates, mode, causal = case
    q, k, v, cu = _inputs(case, seed)
    low = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
    out, lse = dilated_attention(*low, segment_lengths=segments, dilation_rates=rates, mode=mode, causal=causal,
                                 backend=backend, scale=0.5, return_lse=True, cu_seqlens=cu)
    expected = _oracle(q, k, v, cu, DilatedPattern.create(segments, rates, mode=mode, causal=causal))
    gen = torch.Generator().manual_seed(seed + 7)
    upstream = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in expected]
    want = torch.autograd.grad(expected, (q, k, v), upstream)
    have = torch.autograd.grad((out, lse), low, [g.to(dtype) for g in upstream])
    relative = lambda a, b: ((a.double() - b).norm() / b.norm()).item()  # noqa: E731
    finite = lambda x: torch.where(torch.isinf(x), torch.zeros((), dtype=x.dtype), x)  # noqa: E731 (rows of no key)
    errors = {"out": relative(out.detach(), expected[0]), "lse": relative(finite(lse.detach()), finite(expected[1]))}
    errors.update({name: relative(a, b) for name, a, b in zip(("dq", "dk", "dv"), have, want)})
    return errors


@pytest.mark.parametrize("backend, case", [(b, c) for b in CPU_BACKENDS for c in CASES if (b == "flex") == (c == "small")])
def test_every_cpu_backend_matches_the_oracle_per_document(backend, case):
    """Documents of length 1, shorter than one segment and the whole row; segments longer than any
    document; fewer key/value heads than query heads (shared across head groups in 'gqa-batch')."""
    reason = unavailable_reason(backend, "cpu", torch.float64)
    if reason is not None:
        pytest.skip(f"{backend}: {reason}")
    _check(CASES[case], backend, gradients=backend != "flex")  # FlexAttention has no CPU backward


def _varlen_executor(varlen):
    return blockwise_executor("manual", lambda q: MANUAL_KERNEL, dataclasses.replace(EAGER_CAPABILITIES, varlen=True),
                              varlen_for=lambda q: varlen)


@pytest.mark.parametrize("case", ["documents+gqa", "documents"])
@pytest.mark.parametrize("kernel", ["per_sequence", "fa4_varlen"])
def test_packs_run_a_packed_row_in_few_calls_exactly(kernel, case, monkeypatch):
    """The varlen path: blocks of many documents grouped into packs on the row's residue views, one
    call each, outputs, LSE and gradient shares landing at the runs' rows only (rows between runs
    come back as NaN from the stand-in)."""
    if kernel == "fa4_varlen":
        install_fa4_standin(monkeypatch)
    varlen = FA4_VARLEN if kernel == "fa4_varlen" else per_sequence(MANUAL_KERNEL)
    batch, lengths, heads, kv_heads, segments, rates, mode, causal = CASES[case]
    pattern = DilatedPattern.create(segments, rates, mode=mode, causal=causal)
    documents = tuple((sum(lengths[:i]), n) for i, n in enumerate(lengths))
    q = torch.empty(1, sum(lengths), heads, 4)
    plan = cached_plan(pattern, sum(lengths), heads, num_kv_heads=None if kv_heads == heads else kv_heads,
                       documents=documents)
    packs = packs_for(plan, q)
    assert packs is not None and len(packs) < len(plan.blocks) / 2
    assert any(pack.gaps for pack in packs) and sum(p.rows for p in plan_packs(plan)) > 0
    _check(CASES[case], _varlen_executor(varlen), seed=3)


def test_a_single_sequence_keeps_its_units():
    pattern = DilatedPattern.create([8, 16], [1, 2])
    plan = cached_plan(pattern, 64, 4)
    assert packs_for(plan, torch.empty(1, 64, 4, 4)) is None


def test_auto_takes_a_varlen_executor_for_packed_rows(monkeypatch):
    from hilbert_lab.attention import executors

    varlen = _varlen_executor(per_sequence(MANUAL_KERNEL))
    q = torch.empty(1, 8, 2, 4)
    monkeypatch.setitem(executors.EXECUTORS, "manual_varlen", varlen)
    assert resolve_executor("auto", q, packed=True) is varlen
    assert resolve_executor("auto", q, packed=False) is not varlen


def _bad(name, cu, shape=(1, 10, 2, 4), kv_heads=2):
    q = torch.randn(shape)
    k = torch.randn(*shape[:2], kv_heads, shape[3])
    return name, (q, k, k.clone()), cu


BAD = [
    _bad("start at 0", torch.tensor([1, 4, 10])),
    _bad("end at N", torch.tensor([0, 4, 9])),
    _bad("non-decreasing", torch.tensor([0, 6, 4, 10])),
    _bad("integer dtype", torch.tensor([0.0, 4.0, 10.0])),
    _bad("1-D", torch.tensor([[0, 4, 10]])),
    _bad("one row", torch.tensor([0, 4, 10]), shape=(2, 10, 2, 4)),
    _bad("1-D integer tensor", "0,4,10"),
    _bad("at least 2 integers", [0, 4.0, 10]),
    _bad("at least 2 integers", [10]),
    _bad("end at N", [0, 4, 9]),
    _bad("one row", [0, 4, 10], shape=(2, 10, 2, 4)),
    _bad("must divide", None, shape=(1, 10, 3, 4)),
    _bad("q's B, N and D", None, kv_heads=1),
]


@pytest.mark.parametrize("needle, tensors, cu", [pytest.param(n, t, c, id=n) for n, t, c in BAD])
def test_bad_packed_or_grouped_input_names_the_argument(needle, tensors, cu):
    q, k, v = tensors
    if needle == "q's B, N and D":
        k, v = k[:, :5], v[:, :5]
    argument = "k and v" if needle in ("must divide", "q's B, N and D") else "cu_seqlens"
    with pytest.raises(ValueError, match=argument) as error:
        dilated_attention(q, k, v, segment_lengths=[4], dilation_rates=[1], cu_seqlens=cu)
    assert needle in str(error.value)


def test_cu_seqlens_on_another_device_is_refused():
    q = torch.randn(1, 10, 2, 4)
    with pytest.raises(ValueError, match="cu_seqlens must be on q's device"):
        dilated_attention(q, q, q, segment_lengths=[4], dilation_rates=[1], cu_seqlens=torch.tensor([0, 10], device="meta"))


def test_whole_pattern_executors_and_hilbert_pattern_refuse_documents():
    q = torch.randn(1, 10, 2, 4)
    cu = torch.tensor([0, 4, 10])
    whole = Executor("whole", Capabilities(whole_pattern=True), lambda *a, **k: None, lambda *a, **k: None)
    with pytest.raises(ValueError, match="does not take cu_seqlens"):
        dilated_attention(q, q, q, segment_lengths=[4], dilation_rates=[1], backend=whole, cu_seqlens=cu)
    with pytest.raises(ValueError, match="does not take 1 key/value heads"):
        dilated_attention(q, q[:, :, :1], q[:, :, :1], segment_lengths=[4], dilation_rates=[1], backend=whole)
    with pytest.raises(ValueError, match="hilbert_pattern"):
        dilated_attention(q, q, q, segment_lengths=[4], dilation_rates=[1], hilbert_pattern=True, cu_seqlens=cu)


def test_a_row_of_64_documents_is_a_few_varlen_calls_not_hundreds():
    """Per branch at most (offsets x residues) = r * r packs, whatever the number of documents."""
    gen = torch.Generator().manual_seed(0)
    cuts = sorted((torch.randperm(8191, generator=gen)[:63] + 1).tolist())
    bounds = [0, *cuts, 8192]
    documents = tuple((a, b - a) for a, b in zip(bounds, bounds[1:]))
    plan = cached_plan(DilatedPattern.create([256, 512, 1024], [1, 2, 4], causal=True), 8192, 8, documents=documents)
    packs = packs_for(plan, torch.empty(1, 8192, 8, 4))
    assert len(plan.blocks) > 300 and packs is not None and len(packs) <= 1 + 2 * 2 + 4 * 4


def test_the_shared_input_check_takes_fewer_key_value_heads_only_when_asked():
    q, k = torch.randn(1, 8, 4, 4), torch.randn(1, 8, 2, 4)
    with pytest.raises(ValueError, match="same shape"):
        validate_attention_inputs(q, k, k)
    assert validate_attention_inputs(q, k, k, grouped_heads=True) == 0.5
