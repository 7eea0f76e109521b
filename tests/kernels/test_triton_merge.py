"""The Triton LSE merges (merge_partials, accumulate) in interpreter mode (TRITON_INTERPRET=1, CPU) against
the library's float64 merge: random partials, rows with -inf on one or every side, large score scales; the merge
over the first part against the merge into fresh buffers, alone and in the engine's forward."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
HAVE_TRITON = importlib.util.find_spec("triton") is not None

SCRIPT = r'''
import torch
from hilbert_lab.attention.merge import merge_lse
from hilbert_lab.kernels import triton_merge

gen = torch.Generator().manual_seed(0)
rows, dim = 37, 24
for scale in (1.0, 1e4):
    outs = torch.randn(3, rows, dim, generator=gen)
    lses = torch.randn(3, rows, generator=gen) * scale
    lses[0, :5] = float("-inf")          # one side empty
    lses[:, 5:8] = float("-inf")          # every side empty
    outs[lses == float("-inf")] = float("nan")  # never read
    as_bnhd = lambda t: t.double().reshape(1, rows, 1, dim)
    as_bhn = lambda t: t.double().reshape(1, 1, rows)
    want_out, want_lse = merge_lse([as_bnhd(torch.nan_to_num(o)) for o in outs], [as_bhn(l) for l in lses])
    want_out, want_lse = want_out.reshape(rows, dim), want_lse.reshape(rows)
    out, lse = torch.empty(rows, dim), torch.empty(rows)
    triton_merge.merge_partials(outs.contiguous(), lses.contiguous(), out, lse)
    acc, acc_lse = torch.nan_to_num(outs[0]).clone(), lses[0].clone()
    for p in (1, 2):
        triton_merge.accumulate(acc, acc_lse, outs[p].contiguous(), lses[p].contiguous())
    for name, got, got_lse in (("merge_partials", out, lse), ("accumulate", acc, acc_lse)):
        assert torch.equal(torch.isinf(got_lse), torch.isinf(want_lse)), name
        finite = torch.isfinite(want_lse)
        assert (got.double() - want_out).abs().max() < 1e-5, (name, scale)
        assert (got_lse[finite].double() - want_lse[finite]).abs().max() <= 1e-6 * max(1.0, scale), (name, scale)
        assert not torch.isnan(got).any(), name

# over the first part: rows it alone holds (7 of them, one of those NaN in another part, so not its alone) are left
# as they are, every other row gets the same bits as the merge into fresh buffers
for dtype in (torch.float32, torch.bfloat16):
    outs = torch.randn(3, rows, dim, generator=gen).to(dtype)
    lses = torch.randn(3, rows, generator=gen) * 30
    lses[1:, 10:17] = float("-inf")
    lses[2, 16] = float("nan")
    lses[1:, 20:22] = float("-inf")
    lses[0, 20], lses[0, 21] = float("-inf"), float("inf")  # empty or infinite first parts: merged as before
    lses[0, 25:27] = float("-inf")
    outs[lses == float("-inf")] = float("nan")  # never read
    want, want_lse = torch.empty(rows, dim, dtype=dtype), torch.empty(rows)
    triton_merge.merge_partials(outs, lses, want, want_lse)
    first_alone = torch.zeros(rows, dtype=torch.bool)
    first_alone[10:16] = True
    outs[0, first_alone] = 7.0  # not what the merge would write there: shows the rows were left alone
    lses[0, first_alone] = 3.0
    got, got_lse = outs.clone(), lses.clone()
    triton_merge.merge_partials(got, got_lse, got[0], got_lse[0], over_first=True)
    same = lambda a, b: torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())  # noqa: E731
    assert same(got[0, ~first_alone], want[~first_alone]) and torch.equal(got[0, first_alone], outs[0, first_alone])
    assert same(got_lse[0, ~first_alone], want_lse[~first_alone]) and bool((got_lse[0, first_alone] == 3.0).all())
    assert same(got[1:], outs[1:]) and same(got_lse[1:], lses[1:])  # the other parts are read, not written

# the engine with the fused merge: a forward no backward keeps merges over its first slot (its result a view of the
# slots), with the bits of a forward that keeps a backward (merged into buffers of its own)
from hilbert_lab.attention import dilated_attention, merge
merge.FUSED_MERGE_DEVICES = ("cpu",)
q, k, v = (torch.randn(2, 70, 4, 8, generator=gen) for _ in range(3))
for backend, mode in (("manual", "longnet"), ("sdpa", "longnet"), ("manual", "head_groups")):
    kw = dict(segment_lengths=[8, 16, 32], dilation_rates=[1, 2, 4], mode=mode, causal=True, backend=backend,
              return_lse=True)
    with torch.no_grad():
        out, lse = dilated_attention(q, k, v, **kw)
    kept, kept_lse = dilated_attention(q.clone().requires_grad_(), k, v, **kw)
    assert torch.equal(out, kept.detach()) and torch.equal(lse, kept_lse.detach()), (backend, mode)
    in_slots = out.untyped_storage().nbytes() > out.numel() * out.element_size()
    assert in_slots == (mode == "longnet") and kept.untyped_storage().nbytes() == kept.numel() * 4, (backend, mode)
print("ok")
'''


@pytest.mark.slow  # 7-15 s of CPU: make test-all
@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed (pip install triton); its CPU interpreter runs these checks")
def test_triton_merges_match_the_float64_merge():
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=str(HERE.parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]


RANDOM_PATTERNS = r'''
import random
import torch
from hilbert_lab.attention import dilated_attention, merge
merge.FUSED_MERGE_DEVICES = ("cpu",)
rng = random.Random(0)
checked = 0
for case in range(32):
    count = rng.randint(2, 4)
    segments = sorted(rng.choice([4, 8, 12, 16, 32, 64]) for _ in range(count))
    rates = [rng.choice([r for r in (1, 2, 3, 4) if r <= w]) for w in segments]
    heads = rng.choice([2, 4, 6])
    kv_heads = rng.choice([h for h in (1, 2, heads) if heads % h == 0])
    length = rng.randint(5, 90)
    queries = length if rng.random() < 0.7 else rng.randint(1, length)
    kw = dict(segment_lengths=segments, dilation_rates=rates, mode=rng.choice(["longnet", "head_groups"]),
              causal=rng.random() < 0.5, return_lse=True)
    if rng.random() < 0.3 and queries == length:
        kw["cu_seqlens"] = [0, *sorted(rng.sample(range(1, length), min(3, length - 1))), length]
    batch = 1 if "cu_seqlens" in kw else rng.randint(1, 2)
    gen = torch.Generator().manual_seed(case)
    q = torch.randn(batch, queries, heads, 8, generator=gen)
    k, v = (torch.randn(batch, length, kv_heads, 8, generator=gen) for _ in range(2))
    with torch.no_grad():
        out, lse = dilated_attention(q, k, v, backend="manual", **kw)
        want, want_lse = dilated_attention(q.double(), k.double(), v.double(), backend="reference", **kw)
    finite = torch.isfinite(want_lse)
    assert (out.double() - want).abs().max() < 1e-5, (case, kw)
    assert torch.equal(torch.isinf(lse), ~finite) and (lse.double() - want_lse)[finite].abs().max() < 1e-5, (case, kw)
    checked += out.untyped_storage().nbytes() > out.numel() * out.element_size()  # merged over the first slot
assert checked >= 8, checked
print("ok")
'''


@pytest.mark.slow  # 10 s of CPU: make test-all
@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed (pip install triton); its CPU interpreter runs these checks")
def test_forwards_merged_over_the_first_slot_match_the_float64_reference_on_random_patterns():
    """Random patterns (2-4 branches, LongNet or head_groups, causal or not), grouped-query heads, fewer queries and
    packed documents: the forward without a backward, its merge the fused one over the first slot (the interpreter
    on the CPU), against the float64 reference executor, out and LSE."""
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=str(HERE.parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", RANDOM_PATTERNS], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-4000:]


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
def test_accumulate_rejects_bad_shapes():
    import torch

    from hilbert_lab.kernels import triton_merge

    with pytest.raises(ValueError, match="shapes must be"):
        triton_merge.accumulate(torch.zeros(4, 2), torch.zeros(3), torch.zeros(4, 2), torch.zeros(4))
    with pytest.raises(ValueError, match="contiguous"):
        triton_merge.accumulate(torch.zeros(4, 2, dtype=torch.float64), torch.zeros(4), torch.zeros(4, 2), torch.zeros(4))


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
def test_a_merge_over_the_first_part_needs_the_first_part_itself():
    import torch

    from hilbert_lab.kernels import triton_merge

    outs, lses = torch.zeros(2, 4, 8), torch.zeros(2, 4)
    with pytest.raises(ValueError, match="over_first=True needs out and lse to be outs\\[0\\] and lses\\[0\\]"):
        triton_merge.merge_partials(outs, lses, torch.zeros(4, 8), torch.zeros(4), over_first=True)
    with pytest.raises(ValueError, match="over_first=True"):
        triton_merge.merge_partials(outs, lses, outs[0], torch.zeros(4), over_first=True)
