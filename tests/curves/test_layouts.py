"""curves.layouts: layout permutations against per-block references, permute_sequence against index_select
(values and gradients, float64), the per-block autograd Function on a CPU model of the CUDA kernel, and the
CUDA kernel path itself (GPU tests)."""
from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from hilbert_lab.curves import (
    LAYOUTS,
    SERIALIZATIONS,
    grid_layout,
    inverse_permutation,
    layout_permutation,
    permute_sequence,
    segment_permutation,
    serialize,
)
from hilbert_lab.curves import layouts

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def reference_layout(seq_len: int, block: int, ordering: str, dilation_rate: int = 1) -> np.ndarray:
    """Block by block: segment_permutation of each block's length (dilation_major: a stable sort by residue)."""
    perm = []
    for start in range(0, seq_len, block):
        length = min(block, seq_len - start)
        if ordering == "dilation_major":
            local = sorted(range(length), key=lambda j: (j % dilation_rate, j))
        else:
            local = segment_permutation(length, ordering)[0]
        perm.extend(start + int(j) for j in local)
    return np.array(perm, dtype=np.int64)


def block_kernel_model(x: torch.Tensor, local: torch.Tensor, block: int, *, tail_perm=None, out=None,
                       validate: bool = False) -> torch.Tensor:
    """What cuda_curves.apply_segment_permutation computes: out[:, s*L + j] = x[:, s*L + local[j]], tail by tail_perm."""
    seq_len = x.shape[1]
    full = seq_len // block * block
    source = (torch.arange(seq_len // block)[:, None] * block + local.cpu()[None, :]).reshape(-1)
    if full < seq_len:
        source = torch.cat([source, full + tail_perm.cpu()])
    return x[:, source.to(x.device)].clone()


class _ModelKernels:
    calls = 0

    @classmethod
    def apply_segment_permutation(cls, *args, **kwargs):
        cls.calls += 1
        return block_kernel_model(*args, **kwargs)


# ------------------------------------------------------------------ layout_permutation
@pytest.mark.parametrize("ordering", LAYOUTS)
@pytest.mark.parametrize(("seq_len", "block"), [(64, 16), (100, 30), (97, 32), (24, 16), (10, 64), (1, 1), (50, 50)])
def test_layout_permutation_matches_the_per_block_reference(ordering, seq_len, block):
    perm, inverse = layout_permutation(seq_len, block, ordering, dilation_rate=3)
    expected = reference_layout(seq_len, min(block, seq_len), ordering, dilation_rate=3)
    assert perm.dtype == inverse.dtype == torch.int64
    np.testing.assert_array_equal(perm.numpy(), expected)
    np.testing.assert_array_equal(inverse.numpy()[expected], np.arange(seq_len))
    # every token stays inside its block
    np.testing.assert_array_equal(perm.numpy() // block, np.arange(seq_len) // block)


def test_layouts_really_move_tokens_and_dilation_rate_only_matters_for_dilation_major():
    for ordering in ("hilbert", "morton", "snake", "dilation_major"):
        assert not torch.equal(layout_permutation(64, 16, ordering, dilation_rate=4)[0], torch.arange(64)), ordering
    assert torch.equal(layout_permutation(64, 16, "identity")[0], torch.arange(64))
    assert layout_permutation(64, 16, "hilbert", dilation_rate=4)[0] is layout_permutation(64, 16, "hilbert")[0]
    assert not torch.equal(layout_permutation(64, 16, "dilation_major", dilation_rate=2)[0],
                           layout_permutation(64, 16, "dilation_major", dilation_rate=4)[0])


def test_layout_permutation_is_cached_per_device():
    perm, inverse = layout_permutation(96, 32, "hilbert")
    again = layout_permutation(96, 32, "hilbert", device=torch.device("cpu"))
    assert again[0] is perm and again[1] is inverse
    assert layout_permutation(96, 64, "hilbert", device="cpu")[0] is not perm


@pytest.mark.parametrize(("call", "match"), [
    (lambda: layout_permutation(64, 16, "zigzag"), "ordering must be one of"),
    (lambda: layout_permutation(64, 16, "rowmajor"), "ordering"),
    (lambda: layout_permutation(0, 16, "hilbert"), "seq_len"),
    (lambda: layout_permutation(64, 0, "hilbert"), "block"),
    (lambda: layout_permutation(64, 16.0, "hilbert"), "block"),
    (lambda: layout_permutation(64, 16, "dilation_major", dilation_rate=0), "dilation_rate"),
    (lambda: layout_permutation(64, 16, "hilbert", device="gpu7"), "device"),
    (lambda: grid_layout((4,), "hilbert"), "shape"),
    (lambda: grid_layout(4, "hilbert"), "shape"),
    (lambda: grid_layout((4, 0), "hilbert"), "shape"),
    (lambda: grid_layout((4, 4), "zigzag"), "ordering"),
    (lambda: permute_sequence(torch.zeros(1, 4, 1, 1), torch.arange(5)), "perm"),
    (lambda: permute_sequence(torch.zeros(1, 4, 1, 1), torch.arange(4.0)), "perm"),
    (lambda: permute_sequence(torch.zeros(1, 4, 1, 1), torch.arange(4), dim=4), "dim"),
    (lambda: permute_sequence(np.zeros((1, 4, 1, 1)), torch.arange(4)), "x must be a tensor"),
])
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------ grid_layout, inverse_permutation
@pytest.mark.parametrize("ordering", SERIALIZATIONS)
@pytest.mark.parametrize("shape", [(6, 10), (3, 4, 5)])
def test_grid_layout_is_serialize_as_tensors(ordering, shape):
    perm, inverse = grid_layout(shape, ordering)
    expected_perm, expected_inverse = serialize(shape, ordering)
    np.testing.assert_array_equal(perm.numpy(), expected_perm)
    np.testing.assert_array_equal(inverse.numpy(), expected_inverse)
    assert grid_layout(list(shape), ordering)[0] is perm


def test_inverse_permutation_numpy_and_torch(rng):
    perm = rng.permutation(1000)
    inverse = inverse_permutation(perm)
    np.testing.assert_array_equal(perm[inverse], np.arange(1000))
    np.testing.assert_array_equal(inverse_permutation(torch.from_numpy(perm)).numpy(), inverse)


# ------------------------------------------------------------------ permute_sequence (CPU: index_select)
def _random_layout_cases(rng):
    yield layout_permutation(100, 32, "hilbert")
    yield layout_permutation(64, 64, "snake")
    perm = torch.from_numpy(rng.permutation(100))
    yield perm, inverse_permutation(perm)


def test_permute_sequence_values_and_gradients_match_index_select(rng):
    for perm, inverse in _random_layout_cases(rng):
        n = perm.shape[0]
        x = torch.randn(2, n, 3, 5, dtype=torch.float64, requires_grad=True)
        upstream = torch.randn(2, n, 3, 5, dtype=torch.float64)
        got = permute_sequence(x, perm)
        assert torch.equal(got, x.detach()[:, perm])
        assert torch.equal(permute_sequence(got, inverse), x)
        (grad,) = torch.autograd.grad(got, x, upstream)
        (expected,) = torch.autograd.grad(x.index_select(1, perm), x, upstream)
        assert torch.equal(grad, expected)
        assert torch.equal(grad, upstream[:, inverse])


def test_permute_sequence_other_dims_and_ranks():
    perm, inverse = layout_permutation(40, 16, "morton")
    lse = torch.randn(2, 3, 40, dtype=torch.float64)
    assert torch.equal(permute_sequence(lse, perm, dim=2), lse[:, :, perm])
    assert torch.equal(permute_sequence(lse, perm, dim=-1), lse[:, :, perm])
    assert torch.equal(permute_sequence(permute_sequence(lse, perm, dim=2), inverse, dim=2), lse)


# ------------------------------------------------------------------ the per-block path on a CPU model of the kernel
@pytest.mark.parametrize(("seq_len", "block", "ordering"), [(100, 32, "hilbert"), (96, 32, "snake"), (64, 64, "morton"),
                                                            (50, 16, "dilation_major")])
def test_block_path_values_and_gradients_on_a_model_of_the_kernel(monkeypatch, seq_len, block, ordering):
    monkeypatch.setattr(layouts, "_cuda_kernels", lambda: _ModelKernels)
    _ModelKernels.calls = 0
    perm, inverse = layout_permutation(seq_len, block, ordering, dilation_rate=4)
    x = torch.randn(2, seq_len, 3, 4, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(2, seq_len, 3, 4, dtype=torch.float64, requires_grad=True)
    got = layouts._permute_blocks(x, perm)
    assert _ModelKernels.calls == 1
    assert torch.equal(got, x.detach().index_select(1, perm))
    (grad,) = torch.autograd.grad(got, x, upstream, create_graph=True)
    assert _ModelKernels.calls == 2  # backward is the kernel again, with the inverse's blocks
    (expected,) = torch.autograd.grad(x.index_select(1, perm), x, upstream)
    assert torch.equal(grad, expected)
    assert torch.equal(layouts._permute_blocks(got, inverse), x)
    # the backward is differentiable too: grad = upstream[:, inverse], so d<grad, w>/d upstream = w[:, perm]
    weight = torch.randn_like(upstream)
    (second,) = torch.autograd.grad((grad * weight).sum(), upstream)
    assert torch.equal(second, weight.index_select(1, perm))


def test_block_path_is_only_taken_for_layout_permutations(monkeypatch, rng):
    """The layout tensor itself runs the kernel (once, with x permuted); an equal copy, another permutation or a
    missing extension run no kernel (None: permute_sequence falls back to index_select)."""
    monkeypatch.setattr(layouts, "_cuda_kernels", lambda: _ModelKernels)
    monkeypatch.setattr(_ModelKernels, "calls", 0)
    x = torch.randn(1, 64, 2, 2)
    perm, _ = layout_permutation(64, 16, "hilbert")
    assert torch.equal(layouts._permute_blocks(x, perm), x.index_select(1, perm)) and _ModelKernels.calls == 1
    assert layouts._permute_blocks(x, perm.clone()) is None  # equal values, not a layout tensor
    assert layouts._permute_blocks(x, torch.from_numpy(rng.permutation(64))) is None
    monkeypatch.setattr(layouts, "_cuda_kernels", lambda: None)  # the extension could not load
    assert layouts._permute_blocks(x, perm) is None
    assert _ModelKernels.calls == 1


def test_a_layout_tensor_changed_in_place_is_read_as_it_now_is(monkeypatch):
    """The block kernel path knows a layout tensor's structure as made; after an in-place change it is not
    taken, and the permutation is the tensor's new content (index_select)."""
    monkeypatch.setattr(layouts, "_cuda_kernels", lambda: _ModelKernels)
    layouts._cached_layout.cache_clear()
    try:
        x = torch.randn(1, 64, 2, 2)
        perm, _ = layout_permutation(64, 16, "hilbert")
        assert torch.equal(layouts._permute_blocks(x, perm), x.index_select(1, perm))  # the block path, as made
        perm[[0, 1]] = perm[[1, 0]]  # two positions swapped in place
        assert layouts._permute_blocks(x, perm) is None
        assert torch.equal(permute_sequence(x, perm), x.index_select(1, perm))
    finally:
        layouts._cached_layout.cache_clear()  # the changed tensor must not serve later calls


def test_a_layout_first_made_under_inference_mode_serves_training_later():
    """Layouts are cached and shared: one first asked for inside torch.inference_mode (a generate loop) is an
    ordinary tensor, so a later training step can save it for its backward."""
    layouts._cached_layout.cache_clear()
    try:
        with torch.inference_mode():
            perm, _ = layout_permutation(64, 16, "hilbert")
        x = torch.randn(1, 64, 2, 2, requires_grad=True)
        upstream = torch.randn(1, 64, 2, 2)
        (grad,) = torch.autograd.grad((permute_sequence(x, perm) * upstream).sum(), x)
        assert not perm.is_inference()
        assert torch.equal(grad, torch.zeros_like(upstream).index_add_(1, perm, upstream))
    finally:
        layouts._cached_layout.cache_clear()


def test_block_registry_forgets_evicted_layouts():
    layouts._cached_layout.cache_clear()
    perm, inverse = layout_permutation(48, 16, "snake")
    assert id(perm) in layouts._BLOCKS and id(inverse) in layouts._BLOCKS
    keys = (id(perm), id(inverse))
    del perm, inverse
    layouts._cached_layout.cache_clear()
    gc.collect()
    assert not any(key in layouts._BLOCKS for key in keys)


@pytest.fixture
def fresh_kernel_lookup():
    """layouts' remembered CUDA kernel module (or None after a failed build), forgotten before and after the test:
    a failure that a test patches in is not kept for later tests."""
    layouts._cuda_kernels.cache_clear()
    yield
    layouts._cuda_kernels.cache_clear()


@pytest.mark.parametrize("error", [NotImplementedError("could not build hilbert_lab CUDA kernels: no nvcc"),
                                   ImportError("no nvcc: undefined symbol in hilbert_lab_cuda.so")])
def test_failed_extension_build_falls_back_with_one_warning(monkeypatch, fresh_kernel_lookup, error):
    from hilbert_lab.kernels import cuda_build

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(cuda_build, "load_extension", fail)
    with pytest.warns(RuntimeWarning, match="no nvcc"):
        assert layouts._cuda_kernels() is None
    assert layouts._cuda_kernels() is None  # remembered: no second build attempt


def test_a_build_failure_patched_in_at_first_import_ends_with_the_patch(monkeypatch, fresh_kernel_lookup):
    """cuda_curves imported for the first time while load_extension fails (as in the test above) calls the
    load_extension of the moment afterwards, not the failing one."""
    import importlib
    import sys

    from hilbert_lab import kernels
    from hilbert_lab.kernels import cuda_build

    def fail(*args, **kwargs):
        raise NotImplementedError("could not build hilbert_lab CUDA kernels: no nvcc")

    monkeypatch.delitem(sys.modules, "hilbert_lab.kernels.cuda_curves", raising=False)
    monkeypatch.delattr(kernels, "cuda_curves", raising=False)
    with monkeypatch.context() as patch:
        patch.setattr(cuda_build, "load_extension", fail)
        with pytest.warns(RuntimeWarning, match="no nvcc"):
            assert layouts._cuda_kernels() is None
        fresh = importlib.import_module("hilbert_lab.kernels.cuda_curves")
    seen = []

    class Extension:
        @staticmethod
        def curve_launch_config(*args):
            seen.append(args)

    monkeypatch.setattr(cuda_build, "load_extension", lambda: Extension)
    fresh.set_launch_config(items=2, threads=64)
    assert seen == [(2, 64, 4, 2)]


def test_engine_permutes_through_permute_sequence(monkeypatch):
    from hilbert_lab.attention import engine, layout

    calls = []

    def counting(x, perm, dim=1):
        calls.append(dim)
        return permute_sequence(x, perm, dim)

    monkeypatch.setattr(layout, "permute_sequence", counting)  # engine reads q, k, v through attention.layout
    q, k, v = (torch.randn(1, 40, 2, 4, dtype=torch.float64) for _ in range(3))
    kwargs = dict(segment_lengths=[8, 16], dilation_rates=[1, 2], backend="manual")
    ordered = engine.dilated_attention(q, k, v, ordering="hilbert", **kwargs)
    assert calls == [1] * 6  # q, k, v into the layout, then read back through it
    assert torch.allclose(ordered, engine.dilated_attention(q, k, v, **kwargs), atol=1e-13, rtol=0)


# ------------------------------------------------------------------ CUDA
@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize(("seq_len", "block"), [(4096, 1024), (5000, 1024), (300, 512)])
def test_cuda_kernel_path_values_and_gradients(monkeypatch, dtype, seq_len, block):
    from hilbert_lab.kernels import cuda_curves

    calls = []
    kernel = cuda_curves.apply_segment_permutation
    monkeypatch.setattr(cuda_curves, "apply_segment_permutation", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    perm, inverse = layout_permutation(seq_len, block, "hilbert", device="cuda")
    assert perm.is_cuda
    x = torch.randn(2, seq_len, 4, 64, device="cuda", dtype=dtype, requires_grad=True)
    upstream = torch.randn_like(x)
    got = permute_sequence(x, perm)
    assert len(calls) == 1, "the CUDA kernel path was not taken"
    assert torch.equal(got, x.detach().index_select(1, perm))
    (grad,) = torch.autograd.grad(got, x, upstream)
    assert len(calls) == 2
    (expected,) = torch.autograd.grad(x.index_select(1, perm), x, upstream)
    assert torch.equal(grad, expected)
    assert torch.equal(permute_sequence(got, inverse), x)


@pytest.mark.gpu
@needs_cuda
def test_cuda_other_permutations_use_index_select(monkeypatch):
    from hilbert_lab.kernels import cuda_curves

    calls = []
    monkeypatch.setattr(cuda_curves, "apply_segment_permutation", lambda *a, **k: calls.append(1))
    x = torch.randn(2, 256, 4, 8, device="cuda")
    perm = torch.randperm(256, device="cuda")
    assert torch.equal(permute_sequence(x, perm), x[:, perm])
    cpu_layout, _ = layout_permutation(256, 64, "hilbert")  # a CPU layout tensor for a CUDA x
    assert torch.equal(permute_sequence(x, cpu_layout), x[:, cpu_layout.cuda()])
    assert calls == []


@pytest.mark.gpu
@needs_cuda
def test_cuda_engine_ordering_runs_the_kernel_and_keeps_the_result(monkeypatch):
    from hilbert_lab.attention import dilated_attention
    from hilbert_lab.kernels import cuda_curves

    calls = []
    kernel = cuda_curves.apply_segment_permutation
    monkeypatch.setattr(cuda_curves, "apply_segment_permutation", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    q, k, v = (torch.randn(1, 1000, 4, 32, device="cuda", dtype=torch.float64, requires_grad=True) for _ in range(3))
    kwargs = dict(segment_lengths=[128, 256], dilation_rates=[1, 2], backend="manual")
    upstream = torch.randn(1, 1000, 4, 32, device="cuda", dtype=torch.float64)
    ordered = dilated_attention(q, k, v, ordering="hilbert", **kwargs)
    # q, k and v are stored in the layout and read back through its index map: two kernel calls each
    assert len(calls) == 6
    grads = torch.autograd.grad(ordered, (q, k, v), upstream)
    assert len(calls) == 12  # and two each for their gradients
    plain = dilated_attention(q, k, v, **kwargs)
    expected = torch.autograd.grad(plain, (q, k, v), upstream)
    assert torch.allclose(ordered, plain, atol=1e-12, rtol=0)
    assert all(torch.allclose(g, e, atol=1e-12, rtol=0) for g, e in zip(grads, expected))
