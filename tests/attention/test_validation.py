"""validate_attention_inputs: the one input check of the engine and the ring; pattern arguments given as numpy
values; a module and its input on different devices."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from hilbert_lab.attention import dilated_attention, validate_attention_inputs


def _qkv(shape=(1, 8, 2, 4), dtype=torch.float64):
    return tuple(torch.randn(shape, dtype=dtype) for _ in range(3))


@pytest.mark.parametrize("scale", [-1.0, 0.0, math.inf, -math.inf, math.nan, True, "0.5"])
def test_bad_scale_is_rejected_by_the_check_and_the_engine(scale):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="scale must be None .* finite float > 0"):
        validate_attention_inputs(q, k, v, scale=scale)
    with pytest.raises(ValueError, match="scale"):
        dilated_attention(q, k, v, segment_lengths=[4], dilation_rates=[1], scale=scale)


def test_returns_the_scale_to_use():
    q, k, v = _qkv()
    assert validate_attention_inputs(q, k, v) == 4 ** -0.5
    scale = validate_attention_inputs(q, k, v, scale=2)
    assert scale == 2.0 and isinstance(scale, float)


@pytest.mark.parametrize("make, needle", [
    (lambda q: (q.long(), q.long(), q.long()), "floating dtype"),
    (lambda q: (q[:, :0], q[:, :0], q[:, :0]), "non-empty"),
    (lambda q: (q[0], q[0], q[0]), "4D tensor"),
    (lambda q: (q, q[:, :4], q), "same shape"),
    (lambda q: (q, q.float(), q), "share a dtype"),
])
def test_bad_tensors_name_the_problem(make, needle):
    q, _, _ = _qkv()
    with pytest.raises(ValueError, match=needle):
        validate_attention_inputs(*make(q))


def test_shape_name_appears_in_the_message():
    q, _, _ = _qkv()
    with pytest.raises(ValueError, match=r"\(B, N/P, H, D\)"):
        validate_attention_inputs(q[0], q[0], q[0], shape="(B, N/P, H, D)")


@pytest.mark.parametrize("dropout_p", [-0.1, 1.0, math.nan, True])
def test_bad_dropout_is_rejected(dropout_p):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="dropout_p"):
        validate_attention_inputs(q, k, v, dropout_p=dropout_p)


def test_meta_sparse_and_complex_inputs_are_refused_naming_the_argument():
    import pytest
    import torch

    from hilbert_lab.attention import dilated_attention

    good = torch.randn(1, 8, 2, 4)
    kwargs = dict(segment_lengths=[4], dilation_rates=[1])
    with pytest.raises(ValueError, match="q must hold data"):
        dilated_attention(good.to("meta"), good, good, **kwargs)
    with pytest.raises(ValueError, match="k must be a dense"):
        dilated_attention(good, good.to_sparse(), good, **kwargs)
    with pytest.raises(ValueError, match="v must have a floating dtype"):
        dilated_attention(good, good, good.to(torch.complex64), **kwargs)


# ---------------------------------------------------------------- segment_lengths / dilation_rates as numpy values

def _pattern_takers():
    """Every public constructor of a dilated pattern, as (segment_lengths, dilation_rates) -> result."""
    from hilbert_lab.attention import DilatedKVCache, MultiheadDilatedAttention
    from hilbert_lab.attention.pattern import DilatedPattern
    from hilbert_lab.models import LongNetLM

    q = torch.randn(1, 8, 2, 4, generator=torch.Generator().manual_seed(0))
    return {
        "DilatedPattern.create": lambda s, r: DilatedPattern.create(s, r),
        "dilated_attention": lambda s, r: dilated_attention(q, q, q, segment_lengths=s, dilation_rates=r),
        "MultiheadDilatedAttention": lambda s, r: MultiheadDilatedAttention(8, 2, s, r),
        "DilatedKVCache": lambda s, r: DilatedKVCache(s, r),
        "LongNetLM": lambda s, r: LongNetLM(16, 8, 1, 2, s, r, max_seq_len=16),
    }


@pytest.mark.parametrize("taker", list(_pattern_takers()))
@pytest.mark.parametrize("name, value", [("segment_lengths", np.array(4)), ("dilation_rates", np.array(1)),
                                         ("segment_lengths", np.array([[4, 8]])), ("dilation_rates", np.array([[1]]))])
def test_an_array_that_is_not_1d_is_refused_naming_the_argument(taker, name, value):
    arguments = {"segment_lengths": [4], "dilation_rates": [1], name: value}
    with pytest.raises(ValueError, match=f"{name} must be a non-empty list \\(or 1-D array\\) of positive integers, "
                                         f"got a {value.ndim}-d array"):
        _pattern_takers()[taker](arguments["segment_lengths"], arguments["dilation_rates"])


def test_numpy_1d_arrays_and_numpy_integers_are_the_same_pattern_as_python_ints():
    from hilbert_lab.attention.pattern import DilatedPattern
    from hilbert_lab.models import LongNetLM

    want = DilatedPattern.create([4, 8], [1, 2])
    for segments, rates in ((np.array([4, 8]), np.array([1, 2], dtype=np.int32)),
                            ([np.int64(4), np.int16(8)], (np.uint8(1), 2))):
        assert DilatedPattern.create(segments, rates) == want
        model = LongNetLM(16, 8, 1, 2, segments, rates, max_seq_len=16)
        assert model.config["segment_lengths"] == [4, 8] and model.config["dilation_rates"] == [1, 2]
        assert all(type(x) is int for x in model.config["segment_lengths"] + model.config["dilation_rates"])
    assert DilatedPattern.create(np.int64(4), np.int32(1)) == DilatedPattern.create([4], [1])
    for segment, rate in ((4, 1), (np.int64(4), np.int32(1))):  # one integer: one branch, everywhere
        assert LongNetLM(16, 8, 1, 2, segment, rate, max_seq_len=16).config["segment_lengths"] == [4]
    q, k, v = _qkv()
    torch.testing.assert_close(dilated_attention(q, k, v, segment_lengths=np.array([4, 8]),
                                                 dilation_rates=np.array([1, 2])),
                               dilated_attention(q, k, v, segment_lengths=[4, 8], dilation_rates=[1, 2]),
                               rtol=0, atol=0)


# ---------------------------------------------------------------- module parameters and input on different devices

def test_a_module_on_another_device_than_its_input_names_both_devices():
    from hilbert_lab.attention import MultiheadDilatedAttention

    module = MultiheadDilatedAttention(8, 2, [4], [1], device="meta")
    x = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match="query on device 'cpu' does not match the module's parameters on device "
                                         "'meta'"):
        module(x)
    with pytest.raises(ValueError, match="key on device 'meta' does not match the module's parameters on device "
                                         "'cpu'"):
        MultiheadDilatedAttention(8, 2, [4], [1])(x, x.to("meta"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_module_on_the_gpu_called_with_cpu_input_names_both_devices():
    from hilbert_lab.attention import MultiheadDilatedAttention

    module = MultiheadDilatedAttention(8, 2, [4], [1]).cuda()
    with pytest.raises(ValueError, match="query on device 'cpu' does not match the module's parameters on device "
                                         "'cuda:0'"):
        module(torch.randn(1, 4, 8))


@pytest.mark.parametrize("values, q_shape, k_shape, expected", [
    ([0, 3, 3, 8], (1, 8, 2, 4), (1, 8, 2, 4), ((0, 3), (3, 5))),  # a repeated boundary: an empty document dropped
    ([0, 8], (1, 8, 2, 4), (1, 8, 2, 4), None),                      # one document: None
    ([0, 5, 3, 8], (1, 8, 2, 4), (1, 8, 2, 4), "must be non-decreasing"),
    ([1, 8], (1, 8, 2, 4), (1, 8, 2, 4), "must start at 0, got 1"),
    ([0, 4, 7], (1, 8, 2, 4), (1, 8, 2, 4), r"must end at N = 8 \(q's sequence length\), got 7"),
    ([0, 4, 8], (2, 8, 2, 4), (2, 8, 2, 4), r"must be \(1, N, H, D\), got batch 2"),
    ([0, 4, 8], (1, 6, 2, 4), (1, 8, 2, 4), "needs q, k, v of one length"),
])
def test_the_memoized_boundary_check_gives_the_documents_or_names_what_is_wrong(values, q_shape, k_shape, expected):
    """packed_row_documents (the engine's and the op's check) against the expected documents or ValueError, and the
    documents validate_cu_seqlens (the ring's check) gives for the same row; dilated_attention raises the same."""
    from hilbert_lab.attention.validation import packed_row_documents, validate_cu_seqlens

    q, k = torch.randn(q_shape), torch.randn(k_shape)
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            packed_row_documents(tuple(values), q.shape[0], q.shape[1], k.shape[1])
        with pytest.raises(ValueError, match=expected):
            dilated_attention(q, k, k, segment_lengths=[4], dilation_rates=[1], cu_seqlens=torch.tensor(values))
        return
    assert packed_row_documents(tuple(values), q.shape[0], q.shape[1], k.shape[1]) == expected
    assert validate_cu_seqlens(values, k) == validate_cu_seqlens(torch.tensor(values, dtype=torch.int32), k) == expected
