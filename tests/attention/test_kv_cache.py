"""DilatedKVCache: decoding equals the engine on the whole sequence (float64, outputs and LSE), a step reads
exactly the keys its query sees (not N), the storage stays within the longest segment, non-finite values land
where the engine puts them, bad input is refused; random patterns decoded in random chunks (hypothesis)."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention import DilatedKVCache, MultiheadDilatedAttention, dilated_attention
from hilbert_lab.attention.pattern import DilatedPattern

from property_testing import given, settings, st

from ._decoding_patterns import decoding_patterns
from ._oracle import max_diff

TOL = 1e-10


pytestmark = pytest.mark.usefixtures("single_thread")  # decoding steps are tiny ops


def _qkv(seq_len, heads, kv_heads, seed=0, batch=2):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq_len, heads, 4, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(batch, seq_len, kv_heads, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    return q, k, v


def _decode(cache, q, k, v, prompt, chunk=1):
    """The prompt, then chunks of new tokens: (out (B, N, H, D), lse (B, H, N))."""
    outs, lses = [], []
    start, stop = 0, prompt
    while start < q.shape[1]:
        out, lse = cache.attend(q[:, start:stop], k[:, start:stop], v[:, start:stop], return_lse=True)
        outs.append(out)
        lses.append(lse)
        start, stop = stop, min(stop + chunk, q.shape[1])
    return torch.cat(outs, 1), torch.cat(lses, 2)


def _engine(segments, rates, mode, q, k, v):
    groups = q.shape[2] // k.shape[2]
    return dilated_attention(q, k.repeat_interleave(groups, 2), v.repeat_interleave(groups, 2),
                             segment_lengths=segments, dilation_rates=rates, mode=mode, causal=True,
                             backend="reference", return_lse=True)


CASES = [  # segments, rates, mode, heads, kv heads, prompt, chunk
    ([4, 8, 16], [1, 2, 4], "longnet", 6, 6, 5, 1),  # nested segments; 6 heads, rate 4: residue 3 has no head
    ([4, 8, 16], [1, 2, 4], "head_groups", 6, 3, 1, 1),  # a one-token prompt, grouped key/value heads
    ([4, 6, 9], [1, 2, 3], "longnet", 4, 2, 7, 1),  # segments that do not divide each other
    ([4, 8, 1 << 40], [1, 2, 4], "longnet", 8, 2, 3, 1),  # a whole-sequence branch
    ([4, 8, 16], [1, 2, 4], "longnet", 6, 6, 16, 3),  # chunks of 3 new tokens after a prompt of a whole segment
    ([4, 6, 9], [1, 2, 3], "head_groups", 6, 2, 2, 5),
]


@pytest.mark.parametrize("segments,rates,mode,heads,kv_heads,prompt,chunk", CASES)
def test_decoding_equals_the_engine_on_the_whole_sequence(segments, rates, mode, heads, kv_heads, prompt, chunk):
    q, k, v = _qkv(45, heads, kv_heads)
    cache = DilatedKVCache(segments, rates, mode=mode, backend="sdpa")
    out, lse = _decode(cache, q, k, v, prompt, chunk)
    want_out, want_lse = _engine(segments, rates, mode, q, k, v)
    assert max_diff(out, want_out) < TOL and max_diff(lse, want_lse) < TOL
    assert cache.length == 45


@st.composite
def decodings(draw):
    """A random causal pattern, grouped or not, decoded as a prompt and then chunks of 1 to 5 tokens."""
    return dict(draw(decoding_patterns()), prompt=draw(st.integers(1, 30)),
                chunks=draw(st.lists(st.sampled_from([1, 1, 2, 5]), min_size=1, max_size=10)),
                max_length=draw(st.booleans()), backend=draw(st.sampled_from(["sdpa", "manual", "auto"])))


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(decodings())
def test_random_decodings_equal_the_engine_on_the_whole_sequence(case):
    total = case["prompt"] + sum(case["chunks"])
    q, k, v = _qkv(total, case["heads"], case["kv_heads"], seed=total)
    cache = DilatedKVCache(case["segments"], case["rates"], mode=case["mode"], backend=case["backend"],
                           max_length=total if case["max_length"] else None)
    outs, lses, start = [], [], 0
    for length in (case["prompt"], *case["chunks"]):
        out, lse = cache.attend(*(t[:, start:start + length] for t in (q, k, v)), return_lse=True)
        outs.append(out)
        lses.append(lse)
        start += length
    want_out, want_lse = _engine(case["segments"], case["rates"], case["mode"], q, k, v)
    assert max_diff(torch.cat(outs, 1), want_out) < TOL and max_diff(torch.cat(lses, 2), want_lse) < TOL
    assert cache.length == total


@pytest.mark.parametrize("backend", ["manual", "reference"])
def test_other_dense_executors_decode_the_same(backend):
    q, k, v = _qkv(21, 4, 4, seed=1, batch=1)
    cache = DilatedKVCache([4, 8], [1, 2], backend=backend)
    assert max_diff(_decode(cache, q, k, v, 6)[0], _engine([4, 8], [1, 2], "longnet", q, k, v)[0]) < TOL


def test_a_step_reads_the_keys_its_query_sees_whatever_the_length():
    """keys_read (key rows x query heads of one step) equals what the query sees in the pattern, summed over
    heads and branches, and is the same at position p and p + 4 * 64 (the cost does not grow with N)."""
    segments, rates, heads = [8, 16, 64], [1, 2, 4], 4
    pattern = DilatedPattern.create(segments, rates, causal=True)
    seen = pattern.multiplicity(200, heads).sum(dim=(0, 2))  # (N,): keys the query at each position sees
    q, k, v = _qkv(400, heads, heads, batch=1)
    cache = DilatedKVCache(segments, rates)
    cache.attend(q[:, :10], k[:, :10], v[:, :10])
    reads = []
    for p in range(10, 400):
        cache.attend(q[:, p:p + 1], k[:, p:p + 1], v[:, p:p + 1])
        reads.append(cache.keys_read)
    assert reads[:190] == seen[10:200].tolist()
    assert reads[:130] == reads[256:386]
    assert cache.capacity == 64 and cache.memory_bytes() == 2 * 64 * 4 * 4 * 8  # the longest segment
    assert cache.start == 384


def test_storage_is_the_longest_segment_and_grows_only_for_a_whole_sequence_branch():
    q, k, v = _qkv(300, 2, 2, batch=1)
    bounded = DilatedKVCache([4, 6, 10], [1, 2, 2])  # not nested: twice the longest at most
    whole = DilatedKVCache([4, 1 << 40], [1, 2])
    for cache in (bounded, whole):
        cache.attend(q[:, :3], k[:, :3], v[:, :3])
        for p in range(3, 300):
            cache.attend(q[:, p:p + 1], k[:, p:p + 1], v[:, p:p + 1])
    assert bounded.capacity <= 20 and bounded.start >= 300 - bounded.capacity
    assert whole.capacity >= 300 and whole.start == 0
    sized = DilatedKVCache([4, 1 << 40], [1, 2], max_length=300)
    sized.attend(q[:, :3], k[:, :3], v[:, :3])
    assert sized.capacity == 300  # allocated once for the known length


def test_non_finite_values_land_where_the_engine_puts_them():
    q, k, v = _qkv(30, 4, 4, batch=1)
    v[0, 12, 1, 2] = float("nan")  # seen by later queries of its segments only
    k[0, 21, 0, 0] = float("inf")
    out, lse = _decode(DilatedKVCache([4, 8, 16], [1, 2, 4]), q, k, v, 3)
    want_out, want_lse = _engine([4, 8, 16], [1, 2, 4], "longnet", q, k, v)
    assert max_diff(out, want_out) < TOL and max_diff(lse, want_lse) < TOL
    assert out.isnan().any()


def test_for_module_and_bad_input():
    layer = MultiheadDilatedAttention(16, 4, [4, 8], [1, 2], causal=True, backend="manual")
    cache = DilatedKVCache.for_module(layer)
    assert cache.pattern.segment_lengths == (4, 8) and cache.backend == "manual"
    with pytest.raises(ValueError, match="module must be"):
        DilatedKVCache.for_module(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="max_length"):
        DilatedKVCache([4], [1], max_length=0)
    with pytest.raises(ValueError, match="dilation_rates"):
        DilatedKVCache([4], [8])
    q, k, v = _qkv(8, 4, 2)
    with pytest.raises(ValueError, match="multiple of H_kv"):
        cache.attend(q[:, :0], k[:, :0], v[:, :0])
    with pytest.raises(ValueError, match="multiple of H_kv"):
        cache.attend(q, k[:, :4], v[:, :4])
    cache.attend(q[:, :4], k[:, :4], v[:, :4])
    with pytest.raises(ValueError, match="reset"):
        cache.attend(q[:1, 4:5], k[:1, 4:5], v[:1, 4:5])
    cache.reset()
    assert cache.length == 0 and cache.memory_bytes() == 0


GPU_BACKENDS = ["auto", "sdpa", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "fa4", "triton"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (GPU executors)")
@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_gpu_decoding_in_bf16_matches_the_float64_engine(backend):
    """bf16 decoding on every GPU executor (a whole-pattern one runs the prompt, auto's dense kernel the steps)
    against the float64 engine: relative error of bf16; the queries-fewer-than-keys engine path alike. Head dim
    64, which every GPU kernel takes (auto at other head dims: test_gpu.py)."""
    from hilbert_lab.attention.executors import unavailable_reason

    head_dim = 64
    reason = unavailable_reason(backend, "cuda", torch.bfloat16, head_dim) if backend != "auto" else None
    if reason is not None:
        pytest.skip(f"{backend}: {reason}")
    segments, rates = [16, 32, 64], [1, 2, 4]
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 150, 8, head_dim, device="cuda", dtype=torch.float64, generator=gen) for _ in range(3))
    want, _ = _engine(segments, rates, "longnet", q, k, v)
    low = [t.to(torch.bfloat16) for t in (q, k, v)]
    out, _ = _decode(DilatedKVCache(segments, rates, backend=backend), *low, 70, 1)
    scale = want.abs().max()
    assert ((out.double() - want).abs().max() / scale) < 3e-2
    if backend != "triton":
        last = dilated_attention(low[0][:, -5:], low[1], low[2], segment_lengths=segments, dilation_rates=rates,
                                 causal=True, backend=backend)
        assert ((last.double() - want[:, -5:]).abs().max() / scale) < 3e-2


def test_steps_leave_cudnn_for_a_kernel_without_per_shape_set_up():
    """Each decoding step sees one key more: cuDNN would build an execution graph per step (tens to hundreds of
    ms), so its kernel declares the flash kernel for such calls, and the steps take it."""
    from types import SimpleNamespace

    from hilbert_lab.attention.executors.sdpa import KERNELS
    from hilbert_lab.attention.kv_cache import step_kernel

    q = torch.zeros(1, 1, 2, 8)
    assert step_kernel(SimpleNamespace(kernel_for=lambda q: KERNELS["cudnn"]), q) is KERNELS["flash"]
    for name in ("flash", "efficient", "math"):
        assert step_kernel(SimpleNamespace(kernel_for=lambda q, name=name: KERNELS[name]), q) is KERNELS[name]


# ---------------------------------------------------------------- storage that cannot fit is refused before allocating

def test_a_max_length_whose_storage_cannot_fit_is_refused_naming_it_the_bytes_and_the_limit():
    """2**40 rows of keys and values (70 TB) would fail in the allocator: refused by name before any work."""
    from hilbert_lab.attention.kv_cache import available_bytes

    q = torch.randn(1, 2, 2, 4)
    cache = DilatedKVCache([4, 2**40], [1, 2], max_length=2**40)
    needed = 2 * 1 * 2**40 * 2 * 4 * 4
    with pytest.raises(ValueError, match=f"max_length={2**40} needs a cache of {needed} bytes") as error:
        cache.attend(q, q, q)
    assert "available on cpu" in str(error.value) and needed > available_bytes(torch.device("cpu"))
    assert cache.length == 0 and cache.keys is None  # nothing ran, nothing was stored


def test_the_room_check_counts_exactly_the_bytes_allocated(monkeypatch):
    """With the device limit at exactly the bytes a cache allocates it runs; one byte less is refused, by
    max_length when it is given, else by the sequence length a whole-sequence branch would keep."""
    from hilbert_lab.attention import kv_cache

    q, k, v = _qkv(40, 2, 2, batch=1)  # float64, (1, 40, 2, 4)
    row = 2 * 2 * 4 * 8  # keys and values of one position
    limit = {"bytes": 40 * row}
    monkeypatch.setattr(kv_cache, "available_bytes", lambda device: limit["bytes"])
    out, lse = _decode(DilatedKVCache([4, 1 << 40], [1, 2], max_length=40), q, k, v, 5)
    want_out, want_lse = _engine([4, 1 << 40], [1, 2], "longnet", q, k, v)
    assert max_diff(out, want_out) < TOL and max_diff(lse, want_lse) < TOL
    limit["bytes"] = 40 * row - 1
    with pytest.raises(ValueError, match=f"max_length=40 needs a cache of {40 * row} bytes .* more than the "
                                         f"{40 * row - 1} bytes"):
        DilatedKVCache([4, 1 << 40], [1, 2], max_length=40).attend(q[:, :5], k[:, :5], v[:, :5])
    limit["bytes"] = 20 * row  # growing without max_length: 64 rows first (at most the limit's 20 rows: refused)
    with pytest.raises(ValueError, match="a sequence of 5 tokens"):
        DilatedKVCache([4, 1 << 40], [1, 2]).attend(q[:, :5], k[:, :5], v[:, :5])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_max_length_beyond_the_gpu_is_refused_naming_it_and_the_device():
    q = torch.randn(1, 2, 2, 4, device="cuda")
    cache = DilatedKVCache([4, 2**40], [1, 2], max_length=2**40)
    with pytest.raises(ValueError, match=f"max_length={2**40} needs a cache of {2 * 2**40 * 2 * 4 * 4} bytes") as error:
        cache.attend(q, q, q)
    assert f"available on {q.device}" in str(error.value) and cache.keys is None
