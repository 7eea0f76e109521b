"""A run of a layer's heads (global_heads): exactly those heads' slice of the whole layer's attention."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention.engine import dilated_attention
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.plan import build_plan
from hilbert_lab.attention.reference import reference_attention

from ._oracle import max_diff, random_qkv

ATOL = 1e-10
SEGMENTS, RATES, SEQ_LEN, HEADS = [4, 8, 16], [1, 2, 4], 16, 6


def _reference_with_grads(q, k, v, pattern, g_out, g_lse):
    out, lse = reference_attention(q, k, v, pattern)
    return (out, lse) + torch.autograd.grad((out, lse), (q, k, v), (g_out, g_lse))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
@pytest.mark.parametrize("backend", ["sdpa", "manual"])
def test_a_run_of_heads_is_the_slice_of_the_whole_layer(mode, causal, backend):
    q, k, v = random_qkv(2, SEQ_LEN, HEADS, 4, seed=3)
    pattern = DilatedPattern.create(SEGMENTS, RATES, mode=mode, causal=causal)
    gen = torch.Generator().manual_seed(4)
    g_out = torch.randn(q.shape, generator=gen, dtype=torch.float64)
    g_lse = torch.randn((2, HEADS, SEQ_LEN), generator=gen, dtype=torch.float64)
    out, lse, dq, dk, dv = _reference_with_grads(q, k, v, pattern, g_out, g_lse)
    for start, stop in ((0, 2), (2, 5), (3, 6), (5, 6)):
        parts = [t.detach()[:, :, start:stop].clone().requires_grad_(True) for t in (q, k, v)]
        got_out, got_lse = dilated_attention(*parts, segment_lengths=SEGMENTS, dilation_rates=RATES, mode=mode,
                                             causal=causal, backend=backend, return_lse=True,
                                             global_heads=(start, HEADS))
        assert max_diff(got_out, out[:, :, start:stop]) < ATOL, (start, stop)
        assert max_diff(got_lse, lse[:, start:stop]) < ATOL, (start, stop)
        grads = torch.autograd.grad((got_out, got_lse), parts, (g_out[:, :, start:stop], g_lse[:, start:stop]))
        for name, got, expected in zip("qkv", grads, (dq, dk, dv)):
            assert max_diff(got, expected[:, :, start:stop]) < ATOL, (name, start, stop)


@pytest.mark.parametrize("mode", ["longnet", "head_groups"])
def test_grouped_heads_pair_locally(mode):
    """Heads [4, 8) of 8 with 2 key/value heads of 4: local query head j reads local key/value head j // 2."""
    q, k, v = random_qkv(1, SEQ_LEN, 8, 4, seed=5, requires_grad=False)
    k_kv, v_kv = k[:, :, ::2], v[:, :, ::2]  # 4 key/value heads: query head h reads h // 2
    pattern = DilatedPattern.create(SEGMENTS, RATES, mode=mode, causal=True)
    out, lse = reference_attention(q, k_kv.repeat_interleave(2, 2), v_kv.repeat_interleave(2, 2), pattern)
    got, got_lse = dilated_attention(q[:, :, 4:], k_kv[:, :, 2:], v_kv[:, :, 2:], segment_lengths=SEGMENTS,
                                     dilation_rates=RATES, mode=mode, causal=True, return_lse=True,
                                     global_heads=(4, 8))
    assert max_diff(got, out[:, :, 4:]) < ATOL and max_diff(got_lse, lse[:, 4:]) < ATOL


def test_the_plan_of_a_run_keeps_the_global_offsets():
    pattern = DilatedPattern.create(SEGMENTS, RATES)
    plan = build_plan(pattern, SEQ_LEN, 2, global_heads=(3, 6))  # heads 3 and 4 of 6
    for local, whole in zip(plan.head_offsets(), pattern.head_offsets(6)):
        assert local.tolist() == whole[3:5].tolist()
    blocks = {(b.branch, b.offset, b.heads.start, b.heads.stop) for b in plan.blocks}
    assert blocks == {(0, 0, 0, 2), (1, 1, 0, 2), (2, 1, 0, 1), (2, 2, 1, 2)}


@pytest.mark.parametrize("bad", [(5, 6), (-1, 6), (0, 1), "0:2", (0, 2, 3), (0.0, 2), (True, 4)])
def test_bad_global_heads_are_refused(bad):
    q, k, v = random_qkv(1, 8, 2, 4, requires_grad=False)
    with pytest.raises(ValueError, match="global_heads"):
        dilated_attention(q, k, v, segment_lengths=[4], dilation_rates=[1], global_heads=bad)


_FUSED_SCRIPT = """
import torch
from hilbert_lab.attention.engine import dilated_attention
from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.reference import reference_attention
torch.manual_seed(0)
for mode in ("longnet", "head_groups"):
    q, k, v = (torch.randn(1, 16, 6, 16) for _ in range(3))
    pattern = DilatedPattern.create([4, 8, 16], [1, 2, 4], mode=mode, causal=True)
    ref, ref_lse = reference_attention(q, k, v, pattern)
    for a, b in ((0, 2), (2, 5), (3, 6)):
        part = [t[:, :, a:b].contiguous() for t in (q, k, v)]
        out, lse = dilated_attention(*part, segment_lengths=[4, 8, 16], dilation_rates=[1, 2, 4], mode=mode,
                                     causal=True, backend="triton", return_lse=True, global_heads=(a, 6))
        assert (out.double() - ref[:, :, a:b]).abs().max() < 1e-5, (mode, a, b)
        assert torch.equal(lse.isinf(), ref_lse[:, a:b].isinf()), (mode, a, b)
        assert (lse.double() - ref_lse[:, a:b]).nan_to_num(0).abs().max() < 1e-5, (mode, a, b)
print("ok")
"""


@pytest.mark.slow  # the Triton interpreter
def test_the_fused_kernel_reads_the_global_offsets():
    import importlib.util
    import os
    import subprocess
    import sys
    from pathlib import Path

    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton not installed; its CPU interpreter runs this check")
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _FUSED_SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]
