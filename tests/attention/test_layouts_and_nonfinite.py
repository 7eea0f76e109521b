"""Families of inputs that once gave silently wrong results: every stride pattern a user can hand in, and
NaN/inf placed in attended and unattended queries, keys and values, for every CPU executor."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention import dilated_attention
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.reference import reference_attention

from ._oracle import max_diff

B, N, H, D = 2, 24, 4, 8
PATTERN = dict(segment_lengths=[8, 24], dilation_rates=[1, 4])
DIFFERENTIABLE = ["reference", "manual", "sdpa", "sdpa_flash", "sdpa_math"]
CPU_EXECUTORS = DIFFERENTIABLE + ["flex"]

LAYOUTS = {  # (B, N, H, D) -> the same shape in another memory layout, by differentiable view/copy ops
    "contiguous": lambda x: x,
    "heads first, transposed": lambda x: x.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3),
    "channel first (last dim not contiguous)": lambda x: x.flatten(2).transpose(1, 2).contiguous().transpose(1, 2)
    .unflatten(-1, x.shape[2:]),
    "stepped slice of the last dim": lambda x: torch.stack([x, x], -1).flatten(-2)[..., ::2],
    "stepped slice of the tokens": lambda x: torch.stack([x, x], 2).flatten(1, 2)[:, ::2],
    "D outermost": lambda x: x.permute(3, 0, 1, 2).contiguous().permute(1, 2, 3, 0),
    "expanded batch": lambda x: x[:1].expand(x.shape),
    "expanded heads": lambda x: x[:, :, :1].expand(x.shape),
}


def _leaves(seed: int):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, N, H, D, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3)]


# FlexAttention compiles per stride pattern on the CPU (seconds each): beyond contiguous inputs it is in the slow tier
LAYOUT_CASES = [pytest.param(layout, executor, marks=pytest.mark.slow if executor == "flex" and layout != "contiguous"
                             else ()) for layout in LAYOUTS for executor in CPU_EXECUTORS]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layout, executor", LAYOUT_CASES)
def test_every_layout_matches_the_oracle_with_gradients(executor, causal, layout):
    """q alone, then q, k and v in the layout: output and LSE equal the float64 oracle on the same values;
    gradients (through the layout, to contiguous leaves) too, with an upstream gradient in a strided layout."""
    pattern = DilatedPattern.create(PATTERN["segment_lengths"], PATTERN["dilation_rates"], causal=causal)
    upstream = torch.randn(B, N, H, D, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    upstream = upstream.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)
    for which in ("q", "qkv"):
        leaves = _leaves(len(layout))
        inputs = [LAYOUTS[layout](t) if name in which else t for name, t in zip("qkv", leaves)]
        out, lse = dilated_attention(*inputs, **PATTERN, causal=causal, backend=executor, return_lse=True)
        expected_out, expected_lse = reference_attention(*(t.contiguous() for t in inputs), pattern)
        assert max_diff(out, expected_out) < 1e-12 and max_diff(lse, expected_lse) < 1e-12, which
        if executor in DIFFERENTIABLE:
            got = torch.autograd.grad(out, leaves, upstream)
            expected = torch.autograd.grad(expected_out, leaves, upstream)
            assert max(max_diff(a, b) for a, b in zip(got, expected)) < 1e-11, which


def _clean_rows(result: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(result) & torch.isfinite(clean)


@pytest.mark.parametrize("executor, mode, causal", [
    pytest.param(executor, mode, causal, marks=pytest.mark.slow if executor == "flex" and (mode, causal) != (
        "longnet", False) else ()) for executor in CPU_EXECUTORS for mode in ("longnet", "head_groups")
    for causal in (False, True)])
def test_nonfinite_inputs_change_only_the_rows_that_attend_them(executor, mode, causal):
    """NaN / +inf / -inf in one query row, one key row or one value entry (a future token's value under
    causal attention included): every executor equals the oracle, whose rows depend only on the keys they
    attend (checked against the clean result); a row without keys stays 0 and -inf."""
    pattern = DilatedPattern.create(PATTERN["segment_lengths"], PATTERN["dilation_rates"], mode=mode, causal=causal)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, N, H, D, generator=gen, dtype=torch.float64) for _ in range(3))
    clean_out, clean_lse = reference_attention(q, k, v, pattern)
    attends = pattern.dense_mask(N, H)  # (H, N, N): query n attends key m
    kwargs = dict(**PATTERN, mode=mode, causal=causal, backend=executor, return_lse=True)
    for value in (float("nan"), float("inf"), float("-inf")):
        for target, position in (("q", 5), ("k", 9), ("v", 9), ("v", 17)):
            inputs = {"q": q.clone(), "k": k.clone(), "v": v.clone()}
            head = 1
            if target == "v":
                inputs["v"][0, position, head, 2] = value
            else:
                inputs[target][0, position, head] = value
            out, lse = dilated_attention(inputs["q"], inputs["k"], inputs["v"], **kwargs)
            expected_out, expected_lse = reference_attention(inputs["q"], inputs["k"], inputs["v"], pattern)
            label = (target, position, value)
            assert torch.equal(out.isnan(), expected_out.isnan()) and torch.equal(lse.isnan(), expected_lse.isnan()), label
            assert torch.equal(out.isinf(), expected_out.isinf()) and torch.equal(lse.isneginf(), expected_lse.isneginf()), label
            finite = torch.isfinite(expected_out)
            assert (out[finite] - expected_out[finite]).abs().max() < 1e-12, label
            # the oracle's locality: only the rows that attend the token changed
            touched = torch.zeros(H, N, dtype=torch.bool)
            touched[head] = (torch.arange(N) == position) if target == "q" else attends[head, :, position]
            untouched = ~touched.T  # (N, H)
            assert torch.equal(expected_out[0][untouched], clean_out[0][untouched]), label
            assert torch.equal(expected_lse[0].T[untouched], clean_lse[0].T[untouched]), label
            rows = touched.T & attends.any(-1).T
            assert not torch.isfinite(expected_out[0][rows]).all(), label  # every touched row shows it
            if target == "v":  # a value entry: only its dimension, the LSE unchanged
                assert torch.equal(expected_lse, clean_lse), label
                others = torch.ones(D, dtype=torch.bool)
                others[2] = False
                assert torch.isfinite(expected_out[0][..., others]).all(), label


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_backward_lse_guard_turns_only_rows_without_keys_to_plus_inf(dtype):
    """Rows without keys (-inf) read +inf in the kernels' backward (so p = exp(s - lse) = 0); NaN, +inf and every
    finite value stay as they are, and the token-major layout of the op's LSE is kept (no copy after it)."""
    from hilbert_lab.attention.executors.kernel import guard_lse

    inf = float("inf")
    values = torch.tensor([[1.5, -inf, inf], [float("nan"), -3.0, torch.finfo(dtype).max]], dtype=dtype)
    lse = values.reshape(1, 2, 3).transpose(1, 2)  # (B, H, Nq) stored (B, Nq, H)
    guarded = guard_lse(lse)
    expected = torch.tensor([[1.5, inf, inf], [float("nan"), -3.0, torch.finfo(dtype).max]], dtype=dtype)
    assert torch.equal(guarded.transpose(1, 2).reshape(2, 3).nan_to_num(7.0), expected.nan_to_num(7.0))
    assert guarded.isnan().sum() == 1 and guarded.dtype == dtype
    assert guarded.stride() == lse.stride()
