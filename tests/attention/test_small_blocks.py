"""The batched pass over a plan's small blocks (ragged tails, short sequences): exact against the float64 dense
oracle, and a length a few tokens past a multiple makes no more kernel calls than the multiple."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention import DilatedPattern, dilated_attention
from hilbert_lab.attention.executors import blockwise
from hilbert_lab.attention.executors.small_blocks import SMALL_KEYS, split_small
from hilbert_lab.attention.plan import cached_plan
from hilbert_lab.attention.reference import reference_attention
from hilbert_lab.attention.views import plan_units

from ._small_cases import CASES, oracle_errors


@pytest.fixture
def passes(monkeypatch):
    """How many times the batched pass ran, forward and backward."""
    counts = {"forward": 0, "backward": 0}
    forward, backward = blockwise.small_forward, blockwise.small_backward

    def counted(name, fn):
        def run(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)
        return run

    monkeypatch.setattr(blockwise, "small_forward", counted("forward", forward))
    monkeypatch.setattr(blockwise, "small_backward", counted("backward", backward))
    return counts


@pytest.mark.parametrize("backend", ["manual", "sdpa"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_the_small_pass_is_exact_with_grouped_heads_and_an_lse_gradient(backend, case, passes):
    """Outputs, LSE and the gradients of q, k, v for a random upstream gradient of both equal the float64 dense
    oracle, with ragged tails, grouped key/value heads, fewer queries, both modes; the custom op's backward
    rebuilds the pass."""
    errors = oracle_errors(case, backend=backend)
    assert max(errors.values()) < 1e-12, errors
    assert passes["forward"] >= 1 and passes["backward"] >= 1


@pytest.mark.parametrize("causal", [False, True])
def test_fewer_queries_than_keys_read_their_small_blocks_bottom_right(causal, passes):
    """The last queries alone (decoding several tokens) through the pass equal the full computation's last rows."""
    segments, rates = [8, 16, 32], [1, 2, 4]
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 45, 6, 8, dtype=torch.float64, generator=gen) for _ in range(3))
    full, full_lse = dilated_attention(q, k, v, segment_lengths=segments, dilation_rates=rates, causal=causal,
                                       backend="manual", return_lse=True)
    last, last_lse = dilated_attention(q[:, -3:], k, v, segment_lengths=segments, dilation_rates=rates, causal=causal,
                                       backend="manual", return_lse=True)
    torch.testing.assert_close(last, full[:, -3:], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(last_lse, full_lse[:, :, -3:], rtol=1e-12, atol=1e-12)
    assert passes["forward"] >= 2


@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
@pytest.mark.parametrize("multiple,heads", [(32768, 12), (131072, 8)])
def test_a_length_five_past_a_multiple_runs_its_tails_in_the_pass(mode, multiple, heads):
    """N = m + 5 (causal, w [2K, 8K, 32K, 128K], r [1, 4, 8, 32]): every tail block is small and goes to the pass;
    the kernel calls left are those of N = m, plus one where a branch's offsets no longer share one length."""
    pattern = DilatedPattern.create([2048, 8192, 32768, 131072], [1, 4, 8, 32], mode=mode, causal=True)

    def calls(plan):
        return sum(unit.calls_per_piece for unit in plan_units(plan))

    ragged = cached_plan(pattern, multiple + 5, heads)
    large, small = split_small(ragged)
    assert small and all(blk.count == 1 and blk.length <= SMALL_KEYS for blk in small)
    assert all(blk.length > SMALL_KEYS or blk.count > 1 for blk in large.blocks)
    assert calls(large) <= calls(cached_plan(pattern, multiple, heads)) + 1 < calls(ragged)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_a_packed_row_of_many_short_documents_is_exact(causal, kv_heads, passes):
    """Documents of a packed row each end in small blocks of every branch: the pass runs after the first branch's
    calls of every document (whose shares are written) and before any other share is added; outputs and
    gradients equal the float64 oracle run document by document."""
    segments, rates = [8, 16, 64], [1, 2, 4]
    bounds = [0, 200, 205, 220, 512]  # long documents (large blocks in every branch) between short ones
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(1, 512, 4, 3, dtype=torch.float64, generator=gen).requires_grad_(True)
    k, v = (torch.randn(1, 512, kv_heads, 3, dtype=torch.float64, generator=gen).requires_grad_(True)
            for _ in range(2))
    out = dilated_attention(q, k, v, segment_lengths=segments, dilation_rates=rates, causal=causal, backend="manual",
                            cu_seqlens=bounds)
    grad_out = torch.randn_like(out)
    grads = torch.autograd.grad((out * grad_out).sum(), (q, k, v))
    pattern = DilatedPattern.create(segments, rates, causal=causal)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    groups = 4 // kv_heads
    ref = torch.cat([reference_attention(leaves[0][:, a:b], leaves[1][:, a:b].repeat_interleave(groups, 2),
                                         leaves[2][:, a:b].repeat_interleave(groups, 2), pattern)[0]
                     for a, b in zip(bounds, bounds[1:])], 1)
    ref_grads = torch.autograd.grad((ref * grad_out).sum(), leaves)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    for grad, expected in zip(grads, ref_grads):
        torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-10)
    assert passes["backward"] >= 1


def test_a_pass_whose_scores_would_exceed_the_bound_keeps_the_kernel_calls(monkeypatch, passes):
    """The pass pads every problem to the longest and to the kernels' tiles: past MAX_SCORES elements of its
    largest buffer (scores or gradient shares, `pass_elements`) the small blocks keep their own kernel calls, with
    the same result."""
    from hilbert_lab.attention import views
    from hilbert_lab.attention.executors import small_blocks

    pattern = DilatedPattern.create([8, 16, 32], [1, 2, 4], causal=True)
    plan = cached_plan(pattern, 37, 6)
    _, small = split_small(plan, 2, 8)
    needed = small_blocks.pass_elements(2 * sum(blk.num_heads for blk in small), max(blk.num_queries for blk in small),
                                        max(blk.length for blk in small), 8)
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 37, 6, 8, dtype=torch.float64, generator=gen) for _ in range(3))
    args = dict(segment_lengths=[8, 16, 32], dilation_rates=[1, 2, 4], causal=True, backend="manual")
    batched = dilated_attention(q, k, v, **args)
    assert passes["forward"] == 1
    monkeypatch.setattr(small_blocks, "MAX_SCORES", needed - 1)
    monkeypatch.setattr(views, "_CACHE", {})  # plans split anew under the lower bound
    assert split_small(plan, 2, 8) == (plan, ()) and split_small(plan, 1, 8)[1] == small
    torch.testing.assert_close(dilated_attention(q, k, v, **args), batched, rtol=1e-12, atol=1e-12)
    assert passes["forward"] == 1


def test_the_bound_counts_padded_tiles_and_the_gradient_shares():
    """A pass's largest buffer: scores padded to the kernels' 16-row tiles, or shares of width D past the tiles."""
    from hilbert_lab.attention.executors.small_blocks import pass_elements

    assert pass_elements(10, 3, 5, 8) == 10 * 16 * 16
    assert pass_elements(10, 3, 40, 8) == 10 * 64 * 64
    assert pass_elements(10, 3, 5, 128) == 10 * 16 * 128


def test_head_dims_past_the_kernels_limit_take_the_gathered_pass(monkeypatch):
    """The small-block kernels take head dims up to MAX_HEAD_DIM (at 256 their backward needs more shared memory
    than an H100 or H200 has): past it the pass runs as gathered torch operations even where the kernels could run,
    and the kernels refuse such a call naming the limit."""
    from hilbert_lab.attention.executors import small_blocks
    from hilbert_lab.kernels import triton_small_blocks

    monkeypatch.setattr(small_blocks, "runs_on", lambda device: True)  # as where Triton runs
    wide, narrow = torch.zeros(1, 4, 2, 256), torch.zeros(1, 4, 2, triton_small_blocks.MAX_HEAD_DIM)
    assert small_blocks._kernels_run(narrow) and not small_blocks._kernels_run(wide)
    rows = torch.zeros(1, 16, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="MAX_HEAD_DIM = 128 .* got 256"):
        triton_small_blocks.small_attention_backward(wide, wide, wide, wide, None, torch.zeros(1, 2, 4), None, rows,
                                                     rows, torch.ones(1, 2, dtype=torch.int32), scale=1.0,
                                                     causal=False)
