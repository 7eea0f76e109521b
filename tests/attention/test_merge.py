"""merge_lse: merging parts equals attention over the union; -inf safety in forward and backward."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention.engine import dilated_attention
from hilbert_lab.attention.merge import merge_into, merge_lse, safe_logsumexp

from ._oracle import max_diff, random_qkv


def _attend(q, k, v):
    return dilated_attention(q, k, v, segment_lengths=[k.shape[1]], dilation_rates=[1], backend="reference",
                             return_lse=True)


def _attend_keys(q, k, v, keys):
    """Every query against the keys `keys` (a dense call on the selected keys)."""
    from hilbert_lab.attention.executors.manual import eager_attention

    return eager_attention(q, k[:, keys], v[:, keys], causal=False, scale=q.shape[-1] ** -0.5)


def test_merge_of_disjoint_key_sets_equals_full_attention_with_gradients():
    q, k, v = random_qkv(2, 6, 3, 4)
    full_out, full_lse = _attend(q, k, v)
    parts = [_attend_keys(q, k, v, keys) for keys in ([0, 1], [2, 3, 4], [5])]
    out, lse = merge_lse([p[0] for p in parts], [p[1] for p in parts])
    assert max_diff(out, full_out) < 1e-12 and max_diff(lse, full_lse) < 1e-12
    upstream = (torch.randn_like(out), torch.randn_like(lse))
    expected = torch.autograd.grad((full_out, full_lse), (q, k, v), upstream)
    got = torch.autograd.grad((out, lse), (q, k, v), upstream)
    assert max(max_diff(a, b) for a, b in zip(got, expected)) < 1e-12


def test_merge_counts_a_repeated_key_set_twice():
    q, k, v = random_qkv(1, 5, 2, 3, requires_grad=False)
    out1, lse1 = _attend(q, k, v)
    out, lse = merge_lse([out1, out1], [lse1, lse1])
    assert max_diff(out, out1) < 1e-12
    assert max_diff(lse, lse1 + torch.log(torch.tensor(2.0, dtype=torch.float64))) < 1e-12


def test_merge_is_order_independent():
    gen = torch.Generator().manual_seed(3)
    outs = [torch.randn(2, 4, 3, 5, generator=gen, dtype=torch.float64) for _ in range(3)]
    lses = [torch.randn(2, 3, 4, generator=gen, dtype=torch.float64) for _ in range(3)]
    a = merge_lse(outs, lses)
    b = merge_lse(outs[::-1], lses[::-1])
    assert max_diff(a[0], b[0]) < 1e-14 and max_diff(a[1], b[1]) < 1e-14


def test_all_minus_inf_rows_give_zero_and_minus_inf_without_nan_in_backward():
    outs = [torch.randn(1, 3, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    lse_values = torch.tensor([[[0.5, float("-inf"), 1.0], [float("-inf"), float("-inf"), 2.0]]], dtype=torch.float64)
    lses = [lse_values.clone().requires_grad_(True), torch.full_like(lse_values, float("-inf")).requires_grad_(True)]
    lses[1].data[0, 0, 0] = 0.0  # row (h0, n0) has two finite parts
    out, lse = merge_lse(outs, lses)
    assert torch.isneginf(lse[0, 0, 1]) and torch.isneginf(lse[0, 1, 0]) and torch.isneginf(lse[0, 1, 1])
    assert torch.all(out[0, 1, 0] == 0) and torch.all(out[0, 0, 1] == 0) and torch.all(out[0, 1, 1] == 0)
    expected_lse = torch.logaddexp(torch.tensor(0.5, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64))
    assert abs(lse[0, 0, 0].item() - expected_lse.item()) < 1e-14
    gout, glse = torch.randn_like(out), torch.randn_like(lse)
    g = torch.autograd.grad((out, lse), outs + lses, (gout, glse))
    # reference: each row merged from its finite parts only (a row without any: out 0, lse -inf, no gradient)
    ref_out, ref_lse = torch.zeros_like(out), torch.full_like(lse, float("-inf"))
    for h in range(2):
        for n in range(3):
            finite = [i for i in range(2) if torch.isfinite(lses[i][0, h, n])]
            if finite:
                row_lse = torch.logsumexp(torch.stack([lses[i][0, h, n] for i in finite]), 0)
                ref_lse[0, h, n] = row_lse
                ref_out[0, n, h] = sum(torch.exp(lses[i][0, h, n] - row_lse) * outs[i][0, n, h] for i in finite)
    assert max_diff(out, ref_out) < 1e-14 and max_diff(lse, ref_lse) < 1e-14
    expected = torch.autograd.grad((ref_out, ref_lse), outs + lses, (gout, glse), allow_unused=True)
    for got, want in zip(g, expected):
        assert max_diff(got, torch.zeros_like(got) if want is None else want) < 1e-14
    assert torch.all(g[0][0, 1, 0] == 0) and torch.all(g[2][0, 1, 0] == 0)  # rows with no keys get no gradient


def test_merge_gradients_pass_gradcheck():
    gen = torch.Generator().manual_seed(5)
    outs = [torch.randn(1, 3, 2, 2, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    lses = [torch.randn(1, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2)]
    assert torch.autograd.gradcheck(lambda a, b, c, d: merge_lse([a, b], [c, d]), (*outs, *lses))


def test_safe_logsumexp_matches_torch_on_finite_input():
    x = torch.randn(4, 7, dtype=torch.float64)
    assert max_diff(safe_logsumexp(x, dim=-1), torch.logsumexp(x, dim=-1)) < 1e-14


def test_merge_rejects_bad_shapes():
    with pytest.raises(ValueError, match="lses"):
        merge_lse([torch.zeros(1, 2, 3, 4)], [torch.zeros(1, 2, 3)])
    with pytest.raises(ValueError, match="equal length"):
        merge_lse([torch.zeros(1, 2, 3, 4)], [])


# Scores where lse = m + log(sum) rounds away log(sum): float32 at 1e4 / 1e5 (ulp 1e-3 / 8e-3),
# float64 at 1e16 (ulp 2). Offsets are exactly representable at each scale.
LARGE = [(torch.float32, 1e4, (0.0, 0.0, -0.5)), (torch.float32, 1e5, (0.0, -0.5, 0.0)),
         (torch.float64, 1e16, (0.0, 0.0, -2.0)), (torch.float64, 2.0**60, (0.0, 0.0, 0.0))]


@pytest.mark.parametrize("dtype,level,offsets", LARGE)
def test_merge_weights_sum_to_one_at_large_scores(dtype, level, offsets):
    gen = torch.Generator().manual_seed(7)
    outs = [torch.randn(2, 5, 3, 4, generator=gen, dtype=torch.float64) for _ in offsets]
    small = [torch.full((2, 3, 5), d, dtype=torch.float64) for d in offsets]
    expected_out, expected_lse = merge_lse(outs, small)  # the merge is shift invariant: out(lse + c) = out(lse)
    out, lse = merge_lse([o.to(dtype) for o in outs], [(level + s).to(dtype) for s in small])
    tol = 1e-6 if dtype == torch.float32 else 1e-14
    assert max_diff(out, expected_out) < tol
    ulp = torch.finfo(dtype).eps * level
    assert max_diff(lse, level + expected_lse) <= ulp


@pytest.mark.parametrize("dtype,level", [(torch.float32, 1e4), (torch.float64, 1e16)])
def test_merge_at_large_scores_has_finite_gradients_that_sum_like_weights(dtype, level):
    lses = [torch.full((1, 2, 3), level, dtype=dtype, requires_grad=True) for _ in range(2)]
    outs = [torch.randn(1, 3, 2, 4, dtype=dtype, requires_grad=True) for _ in range(2)]
    out, lse = merge_lse(outs, lses)
    g = torch.autograd.grad(lse.sum(), lses)
    assert all(torch.equal(t, torch.full_like(t, 0.5)) for t in g)  # d lse / d lse_i = w_i / sum w = 1/2
    g = torch.autograd.grad(out.sum(), outs)
    assert all(torch.equal(t, torch.full_like(t, 0.5)) for t in g)


def test_merge_into_is_merge_lse_in_place_with_empty_and_nan_rows():
    """The running merge (the ring's steps): acc, acc_lse become merge_lse of themselves and a part, in place;
    a row empty on one side takes the other side, empty on both stays 0 / -inf, NaN on either side gives NaN."""
    gen = torch.Generator().manual_seed(3)
    outs = [torch.randn(2, 5, 3, 4, dtype=torch.float64, generator=gen) for _ in range(2)]
    lses = [torch.randn(2, 3, 5, dtype=torch.float64, generator=gen) for _ in range(2)]
    lses[0][0, 0, 1] = lses[1][0, 1, 2] = float("-inf")
    lses[0][1, 2, 3] = lses[1][1, 2, 3] = float("-inf")
    lses[1][1, 0, 4] = float("nan")
    expected_out, expected_lse = merge_lse(outs, lses)
    acc = torch.empty(2, 3, 5, 4, dtype=torch.float64).transpose(1, 2)  # stored (B, H, N, D)
    acc.copy_(outs[0])
    acc_lse = lses[0].clone()
    merge_into(acc, acc_lse, outs[1], lses[1])
    torch.testing.assert_close(acc, expected_out, atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(acc_lse, expected_lse, atol=0, rtol=0, equal_nan=True)
    assert acc_lse[1, 0, 4].isnan() and acc[1, 4, 0].isnan().all() and acc_lse[1, 2, 3] == float("-inf")
