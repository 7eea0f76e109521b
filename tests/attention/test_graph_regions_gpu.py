"""A plan's FlashAttention-4 calls as CUDA graphs (executors.kernel.GRAPH_REGIONS): a training loop whose steps
find the same addresses runs them eagerly twice, captures them, then replays them on each step's new values, and
every step matches the float64 oracle. Packed rows (one graph per direction for all packs) and single sequences
(one for all blocks), both modes."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention import DilatedPattern, dilated_attention, reference_attention
from hilbert_lab.attention.executors import unavailable_reason
from hilbert_lab.attention.executors.kernel import GRAPH_REGIONS

from ._oracle import relative_error

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CUDA graphs)"),
]
KW = dict(segment_lengths=[16, 32, 1 << 40], dilation_rates=[1, 2, 4])
LENGTHS = (1, 9, 40, 77, 3, 130, 20)  # a packed row: length 1, shorter than one segment, several segments, ragged


@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "one sequence"])
def test_replayed_steps_compute_on_new_values(packed, mode):
    reason = unavailable_reason("fa4", "cuda", torch.bfloat16)
    if reason is not None:
        pytest.skip(f"backend unavailable on this machine: fa4: {reason}")
    gen = torch.Generator(device="cuda").manual_seed(2)
    total, steps = sum(LENGTHS), 8
    # free cached blocks left by earlier tests in this worker: from a fragmented cache the allocator may hand a step's
    # tensors addresses that cycle over a few steps, and each address set is then a key of its own
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    shapes = ((1, total, 8, 64), (1, total, 2, 64), (1, total, 2, 64), (1, total, 8, 64))
    values = [[torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for shape in shapes]
              for _ in range(steps)]
    q, k, v = (torch.empty(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for shape in shapes[:3])
    upstream = torch.empty(shapes[3], device="cuda", dtype=torch.bfloat16)
    results = [[torch.empty(shape, device="cuda", dtype=torch.bfloat16) for shape in (shapes[0], *shapes[:3])]
               for _ in range(steps)]
    bounds = [0, *torch.tensor(LENGTHS).cumsum(0).tolist()] if packed else [0, total]
    extra = dict(cu_seqlens=bounds) if packed else {}
    GRAPH_REGIONS.clear()  # the graphs earlier tests in this worker left: the kinds below are this test's
    before = dict(GRAPH_REGIONS.counts)
    for step in range(steps):  # nothing allocated between steps: each finds the addresses of the one before
        with torch.no_grad():
            for t, value in zip((q, k, v, upstream), values[step]):
                t.copy_(value)
        out = dilated_attention(q, k, v, **KW, mode=mode, causal=True, backend="fa4", **extra)
        grads = torch.autograd.grad(out, (q, k, v), upstream)
        for saved, result in zip(results[step], (out, *grads)):
            saved.copy_(result)
        del out, grads, saved, result  # a step's tensor kept into the next moves that step's addresses
    kinds = {key[0][0] for key in GRAPH_REGIONS.graphs}
    wanted = {"packs forward", "packs backward"} if packed else {"blocks forward", "blocks backward"}
    keys_seen = sum(key[0][0] in wanted for key in GRAPH_REGIONS.seen)
    state = dict(counts=GRAPH_REGIONS.counts, before=before, enabled=GRAPH_REGIONS.enabled, keys_seen=keys_seen,
                 reasons=list(GRAPH_REGIONS.reasons.values()))
    assert wanted <= kinds, state
    assert GRAPH_REGIONS.counts["replayed"] - before["replayed"] >= 6, state  # steps 6-8 replay both directions
    pattern = DilatedPattern.create(**KW, mode=mode, causal=True)
    for step in range(steps):
        x = [t.double().requires_grad_(True) for t in values[step][:3]]
        expected_out = torch.cat([reference_attention(x[0][:, a:b], x[1][:, a:b].repeat_interleave(4, 2),
                                                      x[2][:, a:b].repeat_interleave(4, 2), pattern)[0]
                                  for a, b in zip(bounds, bounds[1:])], 1)
        expected = torch.autograd.grad(expected_out, x, values[step][3].double())
        assert relative_error(results[step][0], expected_out) < 3e-2, step
        for name, got, want in zip("qkv", results[step][1:], expected):
            assert relative_error(got, want) < 5e-2, (step, f"d{name}")
