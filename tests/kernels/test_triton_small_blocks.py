"""The small-block kernels (kernels.triton_small_blocks) in interpreter mode (TRITON_INTERPRET=1, CPU, float32).

The pass they run (executors.small_blocks) is checked through `dilated_attention` against the float64 dense oracle:
outputs, LSE and the gradients of q, k, v for random upstream gradients of both, ragged tails, both modes, causal or
not, grouped key/value heads and fewer queries than keys. The row scatter is checked against a float64 sum with owned
and added rows."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
HAVE_TRITON = importlib.util.find_spec("triton") is not None
CASES = [  # (mode, causal, N, H, H_kv, queries)
    ("longnet", True, 37, 6, 6, 37), ("longnet", False, 133, 6, 3, 133), ("longnet", True, 70, 6, 1, 70),
    ("head_groups", True, 37, 6, 6, 37), ("head_groups", False, 133, 6, 6, 133), ("longnet", True, 45, 6, 2, 3),
]


def _finite(x):
    import torch

    return torch.where(torch.isinf(x), torch.zeros((), dtype=x.dtype), x)


def _measure(case) -> dict:
    import torch

    from hilbert_lab.attention import DilatedPattern, dilated_attention
    from hilbert_lab.attention.executors import small_blocks
    from hilbert_lab.attention.reference import reference_attention

    launches = []
    forward = small_blocks.small_attention_forward
    small_blocks.small_attention_forward = lambda *a, **k: (launches.append(1), forward(*a, **k))[1]
    mode, causal, seq_len, heads, kv_heads, queries = case
    segments, rates = [8, 16, 32], [1, 2, 4]
    gen = torch.Generator().manual_seed(seq_len + heads + kv_heads)
    full_q = torch.randn(2, seq_len, heads, 8, generator=gen)
    q = full_q[:, seq_len - queries:].clone().requires_grad_(True)
    k, v = (torch.randn(2, seq_len, kv_heads, 8, generator=gen).requires_grad_(True) for _ in range(2))
    out, lse = dilated_attention(q, k, v, segment_lengths=segments, dilation_rates=rates, mode=mode, causal=causal,
                                 backend="manual", return_lse=True)
    grad_out, grad_lse = torch.randn_like(out), torch.randn_like(lse)
    grads = torch.autograd.grad((out * grad_out).sum() + (_finite(lse) * grad_lse).sum(), (q, k, v))
    pattern = DilatedPattern.create(segments, rates, mode=mode, causal=causal)
    leaves = [t.detach().double().requires_grad_(True) for t in (full_q, k, v)]
    groups = heads // kv_heads
    ref_out, ref_lse = reference_attention(leaves[0], leaves[1].repeat_interleave(groups, 2),
                                           leaves[2].repeat_interleave(groups, 2), pattern)
    ref_out, ref_lse = ref_out[:, seq_len - queries:], ref_lse[..., seq_len - queries:]
    ref_grads = list(torch.autograd.grad((ref_out * grad_out.double()).sum()
                                         + (_finite(ref_lse) * grad_lse.double()).sum(), leaves))
    ref_grads[0] = ref_grads[0][:, seq_len - queries:]
    result = {"case": list(case), "launches": len(launches), "out": (out.double() - ref_out).abs().max().item(),
              "lse": (_finite(lse).double() - _finite(ref_lse)).abs().max().item()}
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
        result[name] = (got.double() - want).abs().max().item()
    return result


def _scatter() -> dict:
    """scatter_rows of two shares into totals with owned rows (written) and others (added), against float64."""
    import torch

    from hilbert_lab.kernels.triton_small_blocks import scatter_rows

    gen = torch.Generator().manual_seed(1)
    shares = [torch.randn(10, 5, generator=gen) for _ in range(2)]
    totals = [torch.randn(2, 4, 3, 5, generator=gen) for _ in range(2)]
    rows = torch.tensor([[0, 1, 2], [1, 3, 0], [1, 0, 1]], dtype=torch.int32)
    members = [[0, 4, 9], [2], [1, 3, 5, 7]]
    owned = torch.tensor([1, 0, 0], dtype=torch.int8)
    starts = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    flat = torch.tensor([m for group in members for m in group], dtype=torch.int32)
    want = [t.double().clone() for t in totals]
    for r, (b, n, h) in enumerate(rows.tolist()):
        for share, total in zip(shares, want):
            base = 0.0 if owned[r] else total[b, n, h]
            total[b, n, h] = base + share.double()[members[r]].sum(0)
    scatter_rows(tuple(shares), tuple(totals), rows, starts, flat, owned, max_count=4)
    return {"scatter": max((got.double() - exp).abs().max().item() for got, exp in zip(totals, want))}


@pytest.fixture(scope="module")
def measured():
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=str(HERE.parents[2]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(HERE)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow  # the interpreter in a fresh process (8 s)
@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed (pip install triton): its interpreter runs them")
def test_the_small_block_kernels_equal_the_float64_oracle(measured):
    results = {tuple(r["case"]): r for r in measured if "case" in r}
    assert sorted(results) == sorted(CASES)
    for case, result in results.items():
        assert result["launches"] >= 1, case  # the kernels ran the pass
        for name in ("out", "lse", "dq", "dk", "dv"):
            assert result[name] < 2e-5, (case, name, result)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed (pip install triton): its interpreter runs them")
def test_the_row_scatter_writes_owned_rows_and_adds_the_others(measured):
    scatter = [r for r in measured if "scatter" in r]
    assert scatter and scatter[0]["scatter"] < 1e-5, scatter


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
def test_tiles_must_be_powers_of_two_of_at_least_16():
    import torch

    from hilbert_lab.kernels.triton_small_blocks import small_attention_forward, tile_length

    assert [tile_length(n) for n in (1, 16, 17, 64)] == [16, 16, 32, 64]
    x = torch.zeros(1, 4, 1, 8)
    rows = torch.zeros(1, 8, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="tile_length"):
        small_attention_forward(x, x, x, rows, rows, torch.zeros(1, 2, dtype=torch.int32),
                                torch.zeros(1, dtype=torch.int32), x[None], x[None, ..., 0], scale=1.0, causal=False)


if __name__ == "__main__":
    for case in CASES:
        print(json.dumps(_measure(case)), flush=True)
    print(json.dumps(_scatter()), flush=True)
