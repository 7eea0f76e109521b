"""Serialized dilated attention: exact against the float64 oracle on the permuted sequence (values and
gradients), per-sample and per-branch serializations, and the module on grids and point clouds."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention import (
    DilatedPattern,
    SerializedDilatedAttention,
    deserialize_grid,
    reference_attention,
    serialize_grid,
    serialized_attention,
)
from hilbert_lab.curves import serialize


def _qkv(batch, seq_len, heads, dim, dtype=torch.float64):
    return [torch.randn(batch, seq_len, heads, dim, dtype=dtype, requires_grad=True) for _ in range(3)]


def _oracle_permuted(q, k, v, perm, inverse, pattern):
    """The oracle run on the serialized sequence, its output put back in input order (per sample)."""
    outs, lses = [], []
    for b in range(q.shape[0]):
        p = perm if perm.dim() == 1 else perm[b]
        i = inverse if inverse.dim() == 1 else inverse[b]
        out, lse = reference_attention(q[b:b + 1, p], k[b:b + 1, p], v[b:b + 1, p], pattern)
        outs.append(out[:, i])
        lses.append(lse[:, :, i])
    return torch.cat(outs), torch.cat(lses)


def _oracle_per_branch(q, k, v, pairs, pattern):
    """Dense float64 softmax over the union of the branches' keys, each branch on its own ordering."""
    seq_len, heads = q.shape[1], q.shape[2]
    mult = torch.zeros(heads, seq_len, seq_len, dtype=torch.float64)
    for w, r, (perm, inverse) in zip(pattern.segment_lengths, pattern.dilation_rates, pairs):
        branch = DilatedPattern.create([w], [r], causal=pattern.causal).multiplicity(seq_len, heads).double()
        mult += branch[:, inverse][:, :, inverse]  # serialized (slot, slot) -> input (token, token)
    scores = torch.einsum("bnhd,bmhd->bhnm", q, k) * q.shape[-1] ** -0.5
    scores = torch.where(mult > 0, scores + mult.clamp_min(1e-300).log(), torch.full_like(scores, float("-inf")))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bhnm,bmhd->bnhd", torch.softmax(scores, dim=-1), v)
    return out, lse


def _grads(fn, tensors):
    for t in tensors:
        t.grad = None
    out, lse = fn()
    weights = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(7))
    (out * weights).sum().backward()
    return [t.grad.clone() for t in tensors]


@pytest.mark.parametrize("ordering", ["hilbert", "morton", "snake-trans", "rowmajor"])
@pytest.mark.parametrize("causal", [False, True])
def test_grid_serialization_is_exact_against_the_oracle(ordering, causal):
    grid = (6, 10)
    pattern = DilatedPattern.create([8, 32], [1, 4], causal=causal)
    perm, inverse = (torch.tensor(t) for t in serialize(grid, ordering))
    q, k, v = _qkv(2, 60, 4, 8)
    run = lambda: serialized_attention(q, k, v, (perm, inverse), segment_lengths=[8, 32], dilation_rates=[1, 4],  # noqa: E731
                                       causal=causal, backend="manual", return_lse=True)
    oracle = lambda: _oracle_permuted(q, k, v, perm, inverse, pattern)  # noqa: E731
    out, lse = run()
    ref_out, ref_lse = oracle()
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(lse, ref_lse, atol=1e-12, rtol=1e-10)
    for got, want in zip(_grads(run, (q, k, v)), _grads(oracle, (q, k, v))):
        torch.testing.assert_close(got, want, atol=1e-11, rtol=1e-9)


def test_ordering_changes_the_result_of_a_local_window():
    q, k, v = (t.detach() for t in _qkv(1, 64, 2, 8))
    outs = [serialized_attention(q, k, v, tuple(torch.tensor(t) for t in serialize((8, 8), o)),
                                 segment_lengths=[16], dilation_rates=[1], backend="manual")
            for o in ("rowmajor", "hilbert")]
    assert not torch.allclose(outs[0], outs[1])


def test_per_sample_point_serializations_are_exact():
    points = torch.rand(3, 50, 3, dtype=torch.float64)
    perm, inverse = serialize(points, "hilbert")
    pattern = DilatedPattern.create([16, 50], [1, 2])
    q, k, v = _qkv(3, 50, 2, 8)
    run = lambda: serialized_attention(q, k, v, (perm, inverse), segment_lengths=[16, 50], dilation_rates=[1, 2],  # noqa: E731
                                       backend="manual", return_lse=True)
    oracle = lambda: _oracle_permuted(q, k, v, perm, inverse, pattern)  # noqa: E731
    out, lse = run()
    ref_out, ref_lse = oracle()
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(lse, ref_lse, atol=1e-12, rtol=1e-10)
    for got, want in zip(_grads(run, (q, k, v)), _grads(oracle, (q, k, v))):
        torch.testing.assert_close(got, want, atol=1e-11, rtol=1e-9)


@pytest.mark.parametrize("causal", [False, True])
def test_one_ordering_per_branch_is_exact(causal):
    grid = (8, 8)
    pattern = DilatedPattern.create([16, 64], [1, 2], causal=causal)
    pairs = [tuple(torch.tensor(t) for t in serialize(grid, o)) for o in ("hilbert", "hilbert-trans")]
    q, k, v = _qkv(2, 64, 4, 8)
    run = lambda: serialized_attention(q, k, v, pairs, segment_lengths=[16, 64], dilation_rates=[1, 2],  # noqa: E731
                                       causal=causal, backend="manual", return_lse=True)
    oracle = lambda: _oracle_per_branch(q, k, v, pairs, pattern)  # noqa: E731
    out, lse = run()
    ref_out, ref_lse = oracle()
    torch.testing.assert_close(out, ref_out, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(lse, ref_lse, atol=1e-12, rtol=1e-10)
    for got, want in zip(_grads(run, (q, k, v)), _grads(oracle, (q, k, v))):
        torch.testing.assert_close(got, want, atol=1e-11, rtol=1e-9)


def test_module_on_a_grid_matches_serialize_grid_then_engine():
    grid = (4, 8, 8)
    module = SerializedDilatedAttention([32, 256], [1, 4], "morton", grid_shape=grid, backend="manual")
    q, k, v = (torch.randn(2, 256, 4, 8, dtype=torch.float64) for _ in range(3))
    out = module(q, k, v)
    from hilbert_lab.attention import dilated_attention

    as_grid = lambda t: t.unflatten(1, grid)  # noqa: E731
    seq = [serialize_grid(as_grid(t), "morton", grid_dims=3) for t in (q, k, v)]
    expected = deserialize_grid(dilated_attention(*seq, segment_lengths=[32, 256], dilation_rates=[1, 4],
                                                  backend="manual"), grid, "morton").flatten(1, 3)
    torch.testing.assert_close(out, expected, atol=0, rtol=0)


def test_module_on_points_and_per_branch_orderings():
    points = torch.rand(2, 40, 2, dtype=torch.float64)
    module = SerializedDilatedAttention([8, 40], [1, 2], ["hilbert", "morton-trans"], backend="manual")
    q, k, v = _qkv(2, 40, 2, 4)
    out, lse = module(q, k, v, points=points, return_lse=True)
    pairs = [serialize(points, o) for o in ("hilbert", "morton-trans")]
    # per sample, the per-branch oracle on that sample's serializations
    for b in range(2):
        pair_b = [(p[b], i[b]) for p, i in pairs]
        ref_out, ref_lse = _oracle_per_branch(q[b:b + 1], k[b:b + 1], v[b:b + 1], pair_b, module.pattern)
        torch.testing.assert_close(out[b:b + 1], ref_out, atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(lse[b:b + 1], ref_lse, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("kwargs, match", [
    (dict(ordering="peano"), "ordering must be one of"),
    (dict(ordering=["hilbert"] * 3), "one per branch"),
    (dict(ordering=["hilbert", "morton"], mode="head_groups"), "mode must be 'longnet'"),
    (dict(dropout=1.5), "dropout must be"),
])
def test_module_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SerializedDilatedAttention([8, 16], [1, 2], **kwargs)


def test_missing_points_and_bad_serialization_raise():
    q = torch.randn(1, 16, 2, 4)
    with pytest.raises(ValueError, match="points are required"):
        SerializedDilatedAttention([8], [1])(q, q, q)
    with pytest.raises(ValueError, match=r"shape \(N,\)"):
        serialized_attention(q, q, q, (torch.arange(8), torch.arange(8)), segment_lengths=[8], dilation_rates=[1])
    with pytest.raises(ValueError, match="one \\(perm, inverse\\) pair per branch"):
        pair = (torch.arange(16), torch.arange(16))
        serialized_attention(q, q, q, [pair], segment_lengths=[8, 16], dilation_rates=[1, 2])
