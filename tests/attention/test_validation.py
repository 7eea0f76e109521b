"""validate_attention_inputs: the one input check of the engine and the ring."""
from __future__ import annotations

import math

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
