"""The decoding step with its output projection in the second launch (kernels.triton_decode.dilated_decode_projected)
under Triton's interpreter (TRITON_INTERPRET=1, CPU), against the same step in float64 torch
(attention.static_cache's torch path) followed by the projection in float64: grouped key/value heads, rows at
different positions (one wrapping around the storage), more outputs than one program's block (the last block
partial), with and without a bias; the outputs, the appended rows and the advanced positions. Bad arguments get a
ValueError naming them."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve()
HAVE_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed (pip install triton): its interpreter "
                                "runs the step")


def _errors() -> None:
    """Steps at positions 0 .. C - 1 and 5 .. C + 4 (two rows), one JSON line per bias case with the largest errors."""
    from hilbert_lab.attention.pattern import DilatedPattern
    from hilbert_lab.attention.static_cache import _step_torch, step_tables
    from hilbert_lab.kernels.triton_decode import PROJECT_BLOCK, dilated_decode_projected

    gen = torch.Generator().manual_seed(0)
    segments, rates, heads, kv_heads, capacity, dim = [4, 8, 16], [2, 4, 8], 4, 2, 16, 8
    outputs = PROJECT_BLOCK + 3  # two blocks, the second of 3 rows
    pattern = DilatedPattern.create(segments, rates, mode="longnet", causal=True)
    tables = step_tables(pattern, heads, capacity, "cpu")
    for with_bias in (True, False):
        keys = torch.randn(2, capacity, kv_heads, dim, generator=gen)
        values = torch.randn(2, capacity, kv_heads, dim, generator=gen)
        weight = torch.randn(outputs, heads * dim, generator=gen)
        bias = torch.randn(outputs, generator=gen) if with_bias else None
        ref_keys, ref_values = keys.double(), values.double()
        positions = torch.tensor([0, 5])
        ref_positions = positions.clone()
        worst = {"out": 0.0, "cache": 0.0, "positions": 0}
        for _ in range(capacity):
            q = torch.randn(2, heads, dim, generator=gen)
            k_new, v_new = (torch.randn(2, kv_heads, dim, generator=gen) for _ in range(2))
            residual = torch.randn(2, outputs, generator=gen)
            got = dilated_decode_projected(q, k_new, v_new, keys, values, positions, *tables, 0.7, weight, bias,
                                           residual)
            ref_out, _ = _step_torch(pattern, q.double(), ref_keys, ref_values, ref_positions, 0.7, k_new.double(),
                                     v_new.double(), tables[1], True)
            expected = residual.double() + ref_out.flatten(-2) @ weight.double().T
            if bias is not None:
                expected = expected + bias.double()
            worst["out"] = max(worst["out"], (got.double() - expected).abs().max().item())
            worst["cache"] = max(worst["cache"], (keys.double() - ref_keys).abs().max().item(),
                                 (values.double() - ref_values).abs().max().item())
            worst["positions"] = max(worst["positions"], int((positions - ref_positions).abs().max()))
        print(json.dumps({"bias": with_bias, **worst}))


@pytest.mark.slow  # about 15 s on a 2-core CPU
def test_the_projected_step_matches_the_float64_step_and_projection(run_interpreted):
    results = run_interpreted(HERE)
    assert [r["bias"] for r in results] == [True, False]
    for result in results:
        assert result["out"] < 1e-4 and result["cache"] < 1e-6 and result["positions"] == 0, result


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
def test_bad_projections_are_refused_by_name():
    from hilbert_lab.attention.pattern import DilatedPattern
    from hilbert_lab.attention.static_cache import step_tables
    from hilbert_lab.kernels.triton_decode import dilated_decode_projected

    pattern = DilatedPattern.create([4, 8], [1, 2], mode="longnet", causal=True)
    tables = step_tables(pattern, 2, 8, "cpu")
    q, k_new = torch.zeros(1, 2, 8), torch.zeros(1, 2, 8)
    keys = torch.zeros(1, 8, 2, 8)
    with pytest.raises(ValueError, match="weight must be"):
        dilated_decode_projected(q, k_new, k_new, keys, keys.clone(), torch.zeros(1, dtype=torch.int64), *tables,
                                 1.0, torch.zeros(4, 15), None, torch.zeros(1, 4))
    with pytest.raises(ValueError, match="power of two"):
        dilated_decode_projected(torch.zeros(1, 2, 6), torch.zeros(1, 2, 6), torch.zeros(1, 2, 6),
                                 torch.zeros(1, 8, 2, 6), torch.zeros(1, 8, 2, 6), torch.zeros(1, dtype=torch.int64),
                                 *tables, 1.0, torch.zeros(4, 12), None, torch.zeros(1, 4))


if __name__ == "__main__":
    _errors()
