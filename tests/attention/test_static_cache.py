"""DilatedStaticCache: each step equals the float64 engine on the whole sequence (outputs and LSE), rows of
different prompt lengths decode each as if alone, the storage is min(longest segment, max_length) rows whatever
the length, bad input is refused; on the GPU the Triton step matches the float64 engine at every head dim in
every float dtype, and a step captured in a CUDA graph replays as eager steps run; random patterns over rows of random
prompt lengths (hypothesis)."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.attention import DilatedStaticCache, dilated_attention
from hilbert_lab.attention.static_cache import decode_step, step_tables
from hilbert_lab.kernels import triton_decode

from property_testing import given, settings, st

from ._decoding_patterns import decoding_patterns
from ._oracle import max_diff

pytestmark = pytest.mark.usefixtures("single_thread")  # decoding steps are tiny ops

CASES = [  # segments, rates, mode, heads, kv heads, prompt lengths (one per row)
    ([4, 8, 16], [1, 2, 4], "longnet", 6, 6, [5, 5]),  # nested; 6 heads, rate 4: residue 3 has no head
    ([4, 8, 16], [1, 2, 4], "head_groups", 6, 3, [1, 9]),  # grouped key/value heads, rows of different lengths
    ([4, 6, 9], [1, 2, 3], "longnet", 4, 2, [7, 2, 12]),  # segments that do not divide each other
    ([4, 8, 1 << 40], [1, 2, 4], "longnet", 8, 2, [3, 3]),  # a whole-sequence branch: storage of max_length
]


def _qkv(batch, seq_len, heads, kv_heads, dim=4, dtype=torch.float64, device="cpu", seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(batch, seq_len, heads, dim, generator=gen, dtype=dtype, device=device)
    k, v = (torch.randn(batch, seq_len, kv_heads, dim, generator=gen, dtype=dtype, device=device) for _ in range(2))
    return q, k, v


def _left_padded(t, lengths):
    """Row b of t (B, N, ...) as the prompt of a row of length lengths[b], left-padded to max(lengths)."""
    width = max(lengths)
    out = torch.zeros((t.shape[0], width, *t.shape[2:]), dtype=t.dtype, device=t.device)
    for row, n in enumerate(lengths):
        out[row, width - n:] = t[row, :n]
    return out


def _decode(segments, rates, mode, q, k, v, lengths, steps, step_of=None):
    """Prompts of `lengths` (left-padded), then `steps` tokens per row -> per step (out (B, H, D), lse (B, H)); row
    b's step s holds position lengths[b] + s, read from q[b, lengths[b] + s]; step_of(cache): the step function
    (default cache.step_with_lse)."""
    batch, _, heads, dim = q.shape
    cache = DilatedStaticCache(segments, rates, mode=mode, batch_size=batch, max_length=max(lengths) + steps,
                               num_heads=heads, num_kv_heads=k.shape[2], head_dim=dim, dtype=q.dtype,
                               device=q.device, backend="sdpa" if q.device.type == "cpu" else "auto",
                               prompt_lengths=lengths)
    cache.attend(*(_left_padded(t, lengths) for t in (q, k, v)))
    rows = torch.arange(batch, device=q.device)
    results = []
    for s in range(steps):
        at = torch.tensor(lengths, device=q.device) + s
        results.append((step_of or (lambda c: c.step_with_lse))(cache)(q[rows, at], k[rows, at], v[rows, at]))
    return cache, results


def _engine_rows(segments, rates, mode, q, k, v, lengths, steps):
    """Per step (out (B, H, D), lse (B, H)) of the float64 engine on each row's whole sequence."""
    outs, lses = [], []
    groups = q.shape[2] // k.shape[2]
    for row, n in enumerate(lengths):
        end = n + steps
        out, lse = dilated_attention(*(t[row:row + 1, :end].double() for t in (q,)),
                                     k[row:row + 1, :end].double().repeat_interleave(groups, 2),
                                     v[row:row + 1, :end].double().repeat_interleave(groups, 2),
                                     segment_lengths=segments, dilation_rates=rates, mode=mode, causal=True,
                                     backend="reference", return_lse=True)
        outs.append(out[0, n:])
        lses.append(lse[0, :, n:].transpose(0, 1))
    return [(torch.stack([o[s] for o in outs]), torch.stack([lse[s] for lse in lses])) for s in range(steps)]


@st.composite
def batches(draw):
    """A random causal pattern, grouped or not, over 1-3 rows of different prompt lengths (left-padded)."""
    return dict(draw(decoding_patterns()),
                lengths=draw(st.lists(st.integers(1, 30), min_size=1, max_size=3)), steps=draw(st.integers(1, 20)))


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(batches())
def test_random_batches_decode_each_row_as_the_engine_on_its_whole_sequence(case):
    segments, rates, mode, lengths, steps = (case[name] for name in ("segments", "rates", "mode", "lengths", "steps"))
    q, k, v = _qkv(len(lengths), max(lengths) + steps, case["heads"], case["kv_heads"], seed=sum(lengths))
    _, results = _decode(segments, rates, mode, q, k, v, lengths, steps)
    expected = _engine_rows(segments, rates, mode, q, k, v, lengths, steps)
    for (out, lse), (ref_out, ref_lse) in zip(results, expected):
        assert max_diff(out, ref_out) < 1e-10 and max_diff(lse, ref_lse) < 1e-10  # -inf rows agree too


@pytest.mark.parametrize("segments,rates,mode,heads,kv_heads,lengths", CASES)
def test_each_step_equals_the_engine_on_each_rows_whole_sequence(segments, rates, mode, heads, kv_heads, lengths):
    steps = 40
    q, k, v = _qkv(len(lengths), max(lengths) + steps, heads, kv_heads)
    cache, results = _decode(segments, rates, mode, q, k, v, lengths, steps)
    expected = _engine_rows(segments, rates, mode, q, k, v, lengths, steps)
    for (out, lse), (ref_out, ref_lse) in zip(results, expected):
        assert max_diff(out, ref_out) < 1e-10
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))  # heads that see no key: -inf in both
        finite = torch.isfinite(ref_lse)
        assert max_diff(lse[finite], ref_lse[finite]) < 1e-10
    longest = min(max(segments), max(lengths) + steps)
    assert cache.keys.shape[1] == longest and cache.memory_bytes() == 2 * cache.keys.numel() * 8
    assert cache.positions.tolist() == [n + steps for n in lengths]


def test_the_prompt_output_is_the_engine_on_each_row_and_zero_at_padding():
    lengths = [6, 2, 9]
    q, k, v = _qkv(3, 9, 4, 2)
    cache = DilatedStaticCache([4, 8], [1, 2], batch_size=3, max_length=12, num_heads=4, num_kv_heads=2, head_dim=4,
                               dtype=torch.float64, backend="sdpa", prompt_lengths=lengths)
    out = cache.attend(*(_left_padded(t, lengths) for t in (q, k, v)))
    for row, n in enumerate(lengths):
        ref = dilated_attention(q[row:row + 1, :n], k[row:row + 1, :n], v[row:row + 1, :n], segment_lengths=[4, 8],
                                dilation_rates=[1, 2], causal=True, backend="reference")
        assert max_diff(out[row, 9 - n:], ref[0]) < 1e-12
        assert torch.equal(out[row, :9 - n], torch.zeros_like(out[row, :9 - n]))
    assert cache.token_positions(1).tolist() == [[6], [2], [9]]


def test_prompt_positions_are_each_rows_own():
    cache = DilatedStaticCache([4], [1], batch_size=2, max_length=8, num_heads=2, head_dim=4, prompt_lengths=[3, 5])
    assert cache.token_positions(5).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


@pytest.mark.parametrize("call,needle", [
    (lambda c, t: c.step(*t(1)), "step needs a prompt first"),
    (lambda c, t: (c.attend(*t(3)), c.attend(*t(6))), r"must be <= max_length=8 of the static cache, got 3 cached \+ 6"),
    (lambda c, t: c.attend(*(x.float() for x in t(3))), r"q, k, v must be torch.float64 on cpu \(the cache's\)"),
    (lambda c, t: c.attend(*(x[:1] for x in t(3))), r"q must be \(B, T, H, D\) = \(2, T, 4, 4\)"),
    (lambda c, t: c.prefill(*t(3), lengths=[3, 4]), r"lengths must hold 2 prompt lengths in \[1, 3\]"),
    (lambda c, t: c.attend(*t(9)), "prompt length must be <= max_length=8"),
    (lambda c, t: (c.attend(*t(8)), c.attend(*t(1))), r"must be <= max_length=8 of the static cache, got 8 cached"),
    (lambda c, t: c.mark_filled([3]), r"lengths must hold 2 lengths in \[1, 8\], got \[3\]"),
    (lambda c, t: c.mark_filled([3, 9]), r"lengths must hold 2 lengths in \[1, 8\], got \[3, 9\]"),
])
def test_bad_use_is_refused_naming_what_is_wrong(call, needle):
    cache = DilatedStaticCache([4, 8], [1, 2], batch_size=2, max_length=8, num_heads=4, num_kv_heads=2, head_dim=4,
                               dtype=torch.float64)

    def tensors(steps):
        return _qkv(2, steps, 4, 2)

    with pytest.raises(ValueError, match=needle):
        call(cache, tensors)


def test_storage_marked_filled_steps_as_after_the_prompt_that_filled_it():
    """Keys and values written by the caller, then mark_filled(lengths): the next call is a step (not a prompt) and
    equals the step after a prompt that stored the same keys and values; positions are the lengths."""
    segments, rates, lengths, heads, kv_heads = [4, 8, 16], [1, 2, 4], [7, 12], 4, 2
    q, k, v = _qkv(2, 14, heads, kv_heads)
    made = dict(batch_size=2, max_length=14, num_heads=heads, num_kv_heads=kv_heads, head_dim=4, dtype=q.dtype,
                backend="sdpa")
    prompted = DilatedStaticCache(segments, rates, prompt_lengths=lengths, **made)
    prompted.attend(*(_left_padded(t, lengths) for t in (q, k, v)))
    filled = DilatedStaticCache(segments, rates, **made)
    filled.keys.copy_(prompted.keys)
    filled.values.copy_(prompted.values)
    filled.mark_filled(lengths)
    assert filled.positions.tolist() == lengths and filled.length == 12
    rows = torch.arange(2)
    at = torch.tensor(lengths)
    new = [t[rows, at][:, None] for t in (q, k, v)]
    assert torch.equal(filled.attend(*new), prompted.attend(*new))
    assert torch.equal(filled.keys, prompted.keys) and filled.positions.tolist() == [8, 13]


@pytest.mark.parametrize("arguments,needle", [
    (dict(batch_size=0), "batch_size must be a positive integer"),
    (dict(max_length=True), "max_length must be a positive integer"),
    (dict(num_kv_heads=3), "num_heads must be a multiple of num_kv_heads, got 4 and 3"),
    (dict(dtype=torch.int32), "dtype must be a floating torch.dtype"),
    (dict(scale=-1.0), "scale"),
])
def test_bad_construction_is_refused_naming_the_argument(arguments, needle):
    base = dict(batch_size=1, max_length=8, num_heads=4, head_dim=4)
    with pytest.raises(ValueError, match=needle):
        DilatedStaticCache([4], [1], **{**base, **arguments})


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the Triton decoding step)")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.float16, 4e-3), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("dim", [4, 8, 64, 80, 128, 256])
def test_gpu_triton_step_matches_the_float64_engine(dtype, tol, dim):
    if not triton_decode.HAVE_TRITON:
        pytest.skip("triton is not installed")
    for segments, rates, mode, heads, kv_heads, lengths in CASES:
        steps = 24
        q, k, v = _qkv(len(lengths), max(lengths) + steps, heads, kv_heads, dim, dtype, "cuda")
        cache, results = _decode(segments, rates, mode, q, k, v, lengths, steps)
        assert cache.uses_triton
        expected = _engine_rows(segments, rates, mode, q, k, v, lengths, steps)
        for (out, lse), (ref_out, ref_lse) in zip(results, expected):
            assert out.dtype == dtype and max_diff(out.double(), ref_out) < tol
            assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
            finite = torch.isfinite(ref_lse)
            assert max_diff(lse[finite].double(), ref_lse[finite]) < 1e-4


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("dim", [8, 64, 128])
def test_gpu_chunks_match_the_float64_engine(dtype, tol, dim):
    """Chunks after the prompt on the GPU (dilated_attention with backend auto over the window, then the storage
    the Triton steps read) match the float64 engine on each row's whole sequence."""
    for segments, rates, mode, heads, kv_heads, lengths in CASES:
        chunks = [5, 19, 1, 1]
        steps = sum(chunks)
        q, k, v = _qkv(len(lengths), max(lengths) + steps, heads, kv_heads, dim, dtype, "cuda")
        cache = DilatedStaticCache(segments, rates, mode=mode, batch_size=len(lengths),
                                   max_length=max(lengths) + steps, num_heads=heads, num_kv_heads=kv_heads,
                                   head_dim=dim, dtype=dtype, device="cuda", prompt_lengths=lengths)
        cache.attend(*(_left_padded(t, lengths) for t in (q, k, v)))
        rows, done, outs = torch.arange(len(lengths), device="cuda")[:, None], 0, []
        for chunk in chunks:
            at = torch.tensor(lengths, device="cuda")[:, None] + done + torch.arange(chunk, device="cuda")
            outs.append(cache.attend(q[rows, at], k[rows, at], v[rows, at]))
            done += chunk
        got = torch.cat(outs, 1)
        expected = _engine_rows(segments, rates, mode, q, k, v, lengths, steps)
        assert got.dtype == dtype
        assert max(max_diff(got[:, s].double(), ref) for s, (ref, _) in enumerate(expected)) < tol, segments


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("keys_per_split", [1, 3, 64])
def test_gpu_splits_of_any_size_give_the_same_step(keys_per_split):
    """Branches read by many programs (splits of 1 and 3 keys) merge to the one-split result."""
    if not triton_decode.HAVE_TRITON:
        pytest.skip("triton is not installed")
    segments, rates, lengths, steps = [16, 64, 256], [1, 2, 4], [200, 37], 30
    q, k, v = _qkv(2, max(lengths) + steps, 8, 4, 64, torch.float32, "cuda")

    def split_step(cache):
        def step(qs, ks, vs):
            tables = step_tables(cache.pattern, cache.num_heads, cache.capacity, cache.keys.device)
            return triton_decode.dilated_decode(qs, ks, vs, cache.keys, cache.values, cache.positions, *tables,
                                                cache._scale, keys_per_split=keys_per_split)
        return step

    _, results = _decode(segments, rates, "longnet", q, k, v, lengths, steps, split_step)
    expected = _engine_rows(segments, rates, "longnet", q, k, v, lengths, steps)
    for (out, _), (ref, _) in zip(results, expected):
        assert max_diff(out.double(), ref) < 2e-5


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("keys_per_split", [3, None])
def test_gpu_the_tensor_core_step_compiled_equals_the_engine_and_the_eager_step(keys_per_split):
    """The dot path (bfloat16, D 128) launched by torch.compile(fullgraph=True), whose float arguments reach the
    kernel as fp64, gives the eager step's outputs and both match the float64 engine; splits of 3 keys and the
    default size."""
    if not triton_decode.HAVE_TRITON:
        pytest.skip("triton is not installed")
    segments, rates, lengths, steps = [16, 64, 256], [1, 2, 4], [200, 37], 8
    q, k, v = _qkv(2, max(lengths) + steps, 8, 4, 128, torch.bfloat16, "cuda")
    compiled = {}

    def split_step(compile_it):
        def step_of(cache):
            tables = step_tables(cache.pattern, cache.num_heads, cache.capacity, cache.keys.device)

            def step(qs, ks, vs):
                return triton_decode.dilated_decode(qs, ks, vs, cache.keys, cache.values, cache.positions, *tables,
                                                    cache._scale, keys_per_split=keys_per_split, dot=True)
            if not compile_it:
                return step
            return compiled.setdefault(id(cache), torch.compile(step, fullgraph=True, dynamic=False))
        return step_of

    _, eager = _decode(segments, rates, "longnet", q, k, v, lengths, steps, split_step(False))
    _, from_compiled = _decode(segments, rates, "longnet", q, k, v, lengths, steps, split_step(True))
    expected = _engine_rows(segments, rates, "longnet", q, k, v, lengths, steps)
    for (out, lse), (out_c, lse_c), (ref, ref_lse) in zip(eager, from_compiled, expected):
        assert max_diff(out.double(), ref) < 3e-2 and max_diff(out_c.double(), out.double()) < 1e-2
        assert max_diff(lse.double(), ref_lse) < 1e-4 and max_diff(lse_c.double(), lse.double()) < 1e-5


def test_the_tensor_core_step_refuses_what_it_cannot_run():
    if not triton_decode.HAVE_TRITON:
        pytest.skip("triton is not installed")
    tables = step_tables(DilatedStaticCache([4, 8], [1, 2], batch_size=1, max_length=8, num_heads=2,
                                            head_dim=4).pattern, 2, 8, "cpu")
    for dtype, dim in ((torch.float32, 16), (torch.float16, 8), (torch.float16, 48)):
        q = torch.zeros(1, 2, dim, dtype=dtype)
        keys = torch.zeros(1, 8, 2, dim, dtype=dtype)
        with pytest.raises(ValueError, match="dot=True needs q in float16 or bfloat16"):
            triton_decode.dilated_decode(q, None, None, keys, keys, torch.zeros(1, dtype=torch.long), *tables, 1.0,
                                         dot=True)


def test_the_step_refuses_bounds_that_do_not_match_its_branches():
    """The launch is sized by the host bounds: one per branch, each (heads >= 1, keys >= 1), or a ValueError."""
    if not triton_decode.HAVE_TRITON:
        pytest.skip("triton is not installed")
    branches, offsets, bounds = step_tables(DilatedStaticCache([4, 8], [1, 2], batch_size=1, max_length=8,
                                                               num_heads=2, head_dim=4).pattern, 2, 8, "cpu")
    q = torch.zeros(1, 2, 4)
    keys = torch.zeros(1, 8, 2, 4)
    for wrong, message in ((bounds[:1], "P bounds; got"), (((0, 4), bounds[1]), r"bounds must be \(heads >= 1")):
        with pytest.raises(ValueError, match=message):
            triton_decode.dilated_decode(q, None, None, keys, keys, torch.zeros(1, dtype=torch.long), branches,
                                         offsets, wrong, 1.0)



def test_the_step_refuses_one_new_tensor_without_the_other_and_new_keys_of_the_wrong_shape():
    if not triton_decode.HAVE_TRITON:
        pytest.skip("triton is not installed")
    tables = step_tables(DilatedStaticCache([4, 8], [1, 2], batch_size=1, max_length=8, num_heads=2,
                                            head_dim=4).pattern, 2, 8, "cpu")
    q, keys, positions = torch.zeros(1, 2, 4), torch.zeros(1, 8, 2, 4), torch.zeros(1, dtype=torch.long)
    with pytest.raises(ValueError, match="k_new and v_new must both be tensors or both be None"):
        triton_decode.dilated_decode(q, torch.zeros(1, 2, 4), None, keys, keys, positions, *tables, 1.0)
    with pytest.raises(ValueError, match=r"k_new, v_new \(B, H_kv, D\).*\[\(1, 2, 4\), \(1, 3, 4\)\]"):
        triton_decode.dilated_decode(q, torch.zeros(1, 2, 4), torch.zeros(1, 3, 4), keys, keys, positions, *tables,
                                     1.0)

@pytest.mark.gpu
@gpu
def test_gpu_a_step_captured_in_a_cuda_graph_replays_as_eager_steps_run():
    if not triton_decode.HAVE_TRITON:
        pytest.skip("triton is not installed")
    segments, rates, lengths, steps = [8, 32, 128], [1, 2, 4], [50, 20], 20
    q, k, v = _qkv(2, max(lengths) + steps, 8, 2, 64, torch.bfloat16, "cuda")
    _, eager = _decode(segments, rates, "longnet", q, k, v, lengths, steps)
    cache = DilatedStaticCache(segments, rates, batch_size=2, max_length=max(lengths) + steps, num_heads=8,
                               num_kv_heads=2, head_dim=64, dtype=torch.bfloat16, device="cuda", prompt_lengths=lengths)
    cache.attend(*(_left_padded(t, lengths) for t in (q, k, v)))
    rows = torch.arange(2, device="cuda")
    inputs = [t[rows, torch.tensor(lengths, device="cuda")].clone() for t in (q, k, v)]
    cache.step_with_lse(*inputs)  # compile outside the capture, then put the position back
    cache.positions -= 1
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = cache.step_with_lse(*inputs)
    for s in range(steps):
        at = torch.tensor(lengths, device="cuda") + s
        for buffer, t in zip(inputs, (q, k, v)):
            buffer.copy_(t[rows, at])
        graph.replay()
        assert torch.equal(out, eager[s][0]) and torch.equal(lse, eager[s][1])


@pytest.mark.parametrize("segments,rates,mode", [([4, 8, 16], [1, 2, 4], "longnet"), ([4, 6, 9], [1, 2, 3], "head_groups")])
def test_keys_seen_counts_the_pattern_rows_keys(segments, rates, mode):
    from hilbert_lab.attention.pattern import DilatedPattern
    from hilbert_lab.attention.static_cache import keys_seen

    pattern = DilatedPattern.create(segments, rates, mode=mode, causal=True)
    multiplicity = pattern.multiplicity(40, 6)
    for position in range(40):
        assert keys_seen(pattern, 6, position) == int(multiplicity[:, position].sum())


def test_chunks_after_the_prompt_equal_their_steps():
    """T new tokens per row in one call give the T one-token steps' outputs; the positions follow each row."""
    lengths = [9, 4]
    q, k, v = _qkv(2, 30, 4, 2)
    outs = []
    for chunk in (1, 7):
        cache = DilatedStaticCache([4, 8, 16], [1, 2, 4], batch_size=2, max_length=30, num_heads=4, num_kv_heads=2,
                                   head_dim=4, dtype=torch.float64, backend="sdpa", prompt_lengths=lengths)
        cache.attend(*(_left_padded(t, lengths) for t in (q, k, v)))
        assert cache.token_positions(3).tolist() == [[9, 10, 11], [4, 5, 6]]
        rows = torch.arange(2)[:, None]
        steps = []
        for first in range(0, 14, chunk):
            at = torch.tensor(lengths)[:, None] + first + torch.arange(chunk)
            steps.append(cache.attend(q[rows, at], k[rows, at], v[rows, at]))
        outs.append(torch.cat(steps, 1))
        assert cache.length == 9 + 14 and cache.positions.tolist() == [23, 18]
    assert max_diff(outs[0], outs[1]) < 1e-12


@pytest.mark.parametrize("segments,rates,mode,heads,kv_heads,lengths", CASES + [
    ([6, 10], [1, 2], "longnet", 4, 4, [13, 8]),  # segments that do not divide: each branch from its own start
    ([4, 8, 16], [1, 2, 4], "longnet", 4, 2, [3, 40]),  # one row far past the storage of 16 rows
])
@pytest.mark.parametrize("chunks", [[2, 5, 17], [40], [1, 3, 1, 9]])
def test_chunks_equal_the_engine_on_each_rows_whole_sequence(segments, rates, mode, heads, kv_heads, lengths, chunks,
                                                             monkeypatch):
    """Chunks of T tokens per row (each branch's plan per group of rows at one position, over the keys its segments
    reach; a chunk longer than the storage included) equal the float64 engine on each row's whole sequence, and
    later one-token steps still do (the chunks' keys stored where the steps read them)."""
    ran = []
    chunk_of = DilatedStaticCache._chunk
    monkeypatch.setattr(DilatedStaticCache, "_chunk", lambda self, *a: ran.append(a[0].shape[1]) or chunk_of(self, *a))
    steps = sum(chunks) + 4
    q, k, v = _qkv(len(lengths), max(lengths) + steps, heads, kv_heads, seed=len(chunks))
    cache = DilatedStaticCache(segments, rates, mode=mode, batch_size=len(lengths), max_length=max(lengths) + steps,
                               num_heads=heads, num_kv_heads=kv_heads, head_dim=4, dtype=torch.float64,
                               backend="sdpa", prompt_lengths=lengths)
    cache.attend(*(_left_padded(t, lengths) for t in (q, k, v)))
    rows, done, outs = torch.arange(len(lengths))[:, None], 0, []
    for chunk in chunks + [1] * 4:
        at = torch.tensor(lengths)[:, None] + done + torch.arange(chunk)
        outs.append(cache.attend(q[rows, at], k[rows, at], v[rows, at]))
        done += chunk
    expected = _engine_rows(segments, rates, mode, q, k, v, lengths, steps)
    got = torch.cat(outs, 1)
    for s, (ref_out, _) in enumerate(expected):
        assert max_diff(got[:, s], ref_out) < 1e-10, s
    assert cache.length == max(lengths) + steps and cache.positions.tolist() == [n + steps for n in lengths]
    assert ran == [c for c in chunks if c > 1]  # every chunk of more than one token ran as one


def test_a_chunk_over_segments_of_a_long_common_multiple_equals_the_engine():
    """Segments 7, 11, 13 (least common multiple 1001, past the sequence): each branch reads from its own segment
    start, so nothing needs their common alignment."""
    q, k, v = _qkv(1, 200, 2, 2)
    cache = DilatedStaticCache([7, 11, 13], [1, 1, 1], batch_size=1, max_length=200, num_heads=2, head_dim=4,
                               dtype=torch.float64, backend="sdpa")
    cache.attend(q[:, :150], k[:, :150], v[:, :150])
    out = cache.attend(q[:, 150:180], k[:, 150:180], v[:, 150:180])
    expected = _engine_rows([7, 11, 13], [1, 1, 1], "longnet", q, k, v, [150], 30)
    assert max(max_diff(out[:, s], ref) for s, (ref, _) in enumerate(expected)) < 1e-10


@pytest.mark.parametrize("segments,rates,mode,heads,kv_heads,lengths", CASES)
def test_a_step_over_storage_that_already_holds_the_new_key_equals_the_engine(segments, rates, mode, heads, kv_heads,
                                                                              lengths):
    """decode_step with no k_new over head-major storage of every position (transformers' static cache, read in
    place as a (B, C, H_kv, D) view): each position's output equals the engine's; positions stay unless advanced."""
    steps = 20
    n = max(lengths) + steps
    q, k, v = _qkv(len(lengths), n, heads, kv_heads)
    storage_k, storage_v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()  # (B, H_kv, N, D)
    expected = _engine_rows(segments, rates, mode, q, k, v, lengths, steps)
    pattern = DilatedStaticCache(segments, rates, mode=mode, batch_size=1, max_length=n, num_heads=heads,
                                 num_kv_heads=kv_heads, head_dim=4).pattern
    rows = torch.arange(len(lengths))
    for s, (ref_out, ref_lse) in enumerate(expected):
        at = torch.tensor(lengths) + s
        positions = at.clone()
        out, lse = decode_step(pattern, q[rows, at], storage_k.transpose(1, 2), storage_v.transpose(1, 2), positions,
                               4 ** -0.5, span=1 << (n - 1).bit_length(), advance=False)
        assert max_diff(out, ref_out) < 1e-10 and torch.equal(positions, at)
        finite = torch.isfinite(ref_lse)
        assert torch.equal(torch.isinf(lse), ~finite) and max_diff(lse[finite], ref_lse[finite]) < 1e-10


@pytest.mark.parametrize("segments, rates, mode, heads, span", [
    ([256, 1024, 4096, 16384], [1, 2, 4, 8], "longnet", 16, 16384),  # the 1B-class layer's pattern, 8x shorter
    ([4, 8, 16], [1, 2, 4], "longnet", 6, 64),  # rate 4 over 6 heads: one residue has no head, two have two
    ([4, 8, 16], [1, 2, 4], "head_groups", 6, 12),  # a segment clipped to the span
    ([4, 6, 9], [1, 2, 3], "longnet", 4, 40),
])
def test_step_tables_bound_each_branch_by_the_heads_and_keys_of_any_position(segments, rates, mode, heads, span):
    """The launch's per-branch bounds: the most heads any position's residue selects and the most keys one head
    sees, counted by brute force over every position below the span; the device table holds the same."""
    from hilbert_lab.attention.pattern import DilatedPattern

    pattern = DilatedPattern.create(segments, rates, mode=mode, causal=True)
    branches, offsets, bounds = step_tables(pattern, heads, span, "cpu")
    expected = []
    for w, r, row in zip(segments, rates, pattern.head_offsets(heads)):
        w = min(w, span)
        counts = [[(p % w - o) // r + 1 if o >= 0 and (p % w) % r == o else 0 for o in row] for p in range(span)]
        expected.append((max(sum(c > 0 for c in per_head) for per_head in counts), max(map(max, counts))))
    assert bounds == tuple(expected)
    assert branches.tolist() == [[min(w, span), r, h, n] for w, r, (h, n) in zip(segments, rates, expected)]
    assert offsets.tolist() == [list(row) for row in pattern.head_offsets(heads)]
