"""The decoding kernels as torch.library ops (hilbert_lab::gemv, hilbert_lab::dilated_decode) under
torch.compile(fullgraph=True), run by Triton's interpreter (TRITON_INTERPRET=1, CPU): a compiled step of a GEMV with
the folded norm, rotation and residual, the decoding step appending its key and value, and a GEMV after it equals
the same step run eagerly on a copy of the cache, writes the cache's storage in place (a strided view of a larger
buffer, as a caller's own cache is) and advances the positions; the ops' fake implementations give the real
outputs' shapes and dtypes."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve()
HAVE_TRITON = importlib.util.find_spec("triton") is not None


def _main() -> None:
    from hilbert_lab.attention.pattern import DilatedPattern
    from hilbert_lab.attention.static_cache import step_tables
    from hilbert_lab.kernels.triton_decode import dilated_decode
    from hilbert_lab.kernels.triton_gemv import fold_layer_norm, gemv
    from hilbert_lab.models.rotary import inverse_frequencies

    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, capacity, model = 4, 2, 16, 16, 32
    pattern = DilatedPattern.create([4, 8, 16], [1, 2, 4], mode="longnet", causal=True)
    tables = step_tables(pattern, heads, capacity, torch.device("cpu"))
    rows = (heads + 2 * kv_heads) * dim
    weight, bias, sums = fold_layer_norm(torch.randn(rows, model, generator=gen) * model ** -0.5,
                                         torch.randn(rows, generator=gen), torch.rand(model, generator=gen) + 0.5,
                                         torch.randn(model, generator=gen))
    out_weight = torch.randn(model, heads * dim, generator=gen) * (heads * dim) ** -0.5

    def step(x, storage, positions):
        keys, values = storage[0, :, :, 1:1 + kv_heads], storage[1, :, :, 1:1 + kv_heads]  # strided views
        qkv = gemv(x, weight, bias, normalize=(sums, 1e-5),
                   rotation=(positions, inverse_frequencies(dim, 10000.0, positions.device), (heads + kv_heads) * dim))
        q, k, v = qkv.split((heads * dim, kv_heads * dim, kv_heads * dim), -1)
        out, lse = dilated_decode(q.reshape(1, heads, dim), k.reshape(1, kv_heads, dim), v.reshape(1, kv_heads, dim),
                                  keys, values, positions, *tables, dim ** -0.5)
        return gemv(out.reshape(1, heads * dim), out_weight, residual=x), lse

    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    storage = torch.randn(2, 1, capacity, kv_heads + 2, dim, generator=gen)
    eager_storage, positions, eager_positions = storage.clone(), torch.tensor([5]), torch.tensor([5])
    pointer = storage.data_ptr()
    for _ in range(3):
        x = torch.randn(1, model, generator=gen)
        got, got_lse = compiled(x, storage, positions)
        want, want_lse = step(x, eager_storage, eager_positions)
        print(json.dumps({"out": (got - want).abs().max().item(), "lse": (got_lse - want_lse).abs().max().item(),
                          "storage": (storage - eager_storage).abs().max().item(),
                          "positions": [positions.item(), eager_positions.item()],
                          "same_storage": storage.data_ptr() == pointer}))


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed (pip install triton); its CPU interpreter runs the ops")
def test_a_compiled_decoding_step_equals_the_eager_one_and_writes_the_cache_in_place(run_interpreted):
    results = run_interpreted(HERE)
    assert len(results) == 3
    for step, result in enumerate(results):
        assert result["out"] <= 1e-5 and result["lse"] <= 1e-5 and result["storage"] == 0.0, result
        assert result["positions"] == [6 + step, 6 + step] and result["same_storage"], result


def test_the_ops_fake_implementations_give_the_outputs_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from hilbert_lab.kernels.triton_decode import decode_op, read_op
    from hilbert_lab.kernels.triton_gemv import gemv_op

    with FakeTensorMode():
        x, weight = torch.empty(3, 64, dtype=torch.bfloat16), torch.empty(96, 64, dtype=torch.bfloat16)
        y = gemv_op(x, weight, None, None, None, None, None, 0.0, 0, False, 1, 64, 4)
        q = torch.empty(2, 4, 16, dtype=torch.float16)
        keys = torch.empty(2, 8, 2, 16, dtype=torch.float16)
        out, lse = decode_op(q, None, None, keys, keys, torch.empty(2, dtype=torch.int64),
                             torch.empty(1, 4, dtype=torch.int32), torch.empty(1, 4, dtype=torch.int32), [4], [8],
                             0.25, 8, 8, 2, 1, True, True)
        read = read_op(q, keys, keys, torch.empty(2, dtype=torch.int64), torch.empty(1, 4, dtype=torch.int32),
                       torch.empty(1, 4, dtype=torch.int32), [4], [8], 0.25, 8, 8, 2, 1, True)
    assert (tuple(y.shape), y.dtype) == ((3, 96), torch.bfloat16)
    assert (tuple(out.shape), out.dtype, tuple(lse.shape), lse.dtype) == ((2, 4, 16), torch.float16, (2, 4),
                                                                          torch.float32)
    assert [(tuple(t.shape), t.dtype) for t in read] == [((2, 4, 16), torch.float16), ((2, 4), torch.float32)]


def test_a_step_that_writes_nothing_runs_the_op_that_declares_no_mutation(monkeypatch):
    """A caller's own cache (no k_new, positions kept) goes to hilbert_lab::dilated_decode_read, whose schema mutates
    nothing (a compiled caller's CUDA graphs skip graphs with mutated inputs); appending or advancing goes to
    hilbert_lab::dilated_decode, which declares keys, values and positions written."""
    from hilbert_lab.kernels import triton_decode

    assert not triton_decode.read_op._schema.is_mutable and triton_decode.decode_op._schema.is_mutable
    called = []
    monkeypatch.setattr(triton_decode, "read_op", lambda *a: called.append("read") or (None, None))
    monkeypatch.setattr(triton_decode, "decode_op", lambda *a: called.append("decode") or (None, None))
    monkeypatch.setattr(triton_decode, "require_triton", lambda name: None)
    q, keys = torch.zeros(1, 2, 16), torch.zeros(1, 8, 2, 16)
    tables = (torch.zeros(1, 4, dtype=torch.int32), torch.zeros(1, 2, dtype=torch.int32), ((2, 8),))
    positions = torch.zeros(1, dtype=torch.int64)
    triton_decode.dilated_decode(q, None, None, keys, keys, positions, *tables, 0.25, advance=False)
    triton_decode.dilated_decode(q, None, None, keys, keys, positions, *tables, 0.25)
    triton_decode.dilated_decode(q, keys[:, 0], keys[:, 0], keys, keys, positions, *tables, 0.25, advance=False)
    assert called == ["read", "decode", "decode"]


if __name__ == "__main__":
    _main()
