"""The decoding step (kernels.triton_decode.dilated_decode) under Triton's interpreter (TRITON_INTERPRET=1, CPU)
against the same step in float64 torch (attention.static_cache's torch path): patterns whose rates leave some heads
without a branch at some positions, grouped key/value heads, rows at different positions, splits of 1, 3 and the
default number of keys, the new key appended or already stored; the outputs, the LSEs, the appended rows and the
advanced positions."""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve()
HAVE_TRITON = importlib.util.find_spec("triton") is not None
PATTERNS = [  # segments, rates, mode, heads, kv heads, capacity
    ([4, 8, 16], [1, 2, 4], "longnet", 6, 6, 16),  # 6 heads at rate 4: residue 3 has no head
    ([4, 8, 16], [2, 4, 8], "longnet", 4, 2, 16),  # no rate-1 branch: heads that see nothing at some positions
    ([4, 6, 9], [1, 2, 3], "head_groups", 4, 2, 9),  # segments that do not divide each other
]

SPLITS = ((1, True), (3, False), (None, True), (None, False))  # keys per program (None: the default), append
QUICK_SPLITS = ((3, True), (None, False))
INTERPRETER = "triton not installed (pip install triton); its CPU interpreter runs these checks"
QUICK = "HILBERT_LAB_DECODE_QUICK"  # set to 1: the pattern with blind heads, two split sizes


def _errors() -> None:
    """Per pattern, split size and append: steps at positions 0 .. C - 1 and 5 .. C + 4 (two rows, the second
    wrapping around the storage) against
    the torch step in float64; one JSON line each with the largest errors."""
    from hilbert_lab.attention.pattern import DilatedPattern
    from hilbert_lab.attention.static_cache import _step_torch, step_tables
    from hilbert_lab.kernels.triton_decode import dilated_decode

    gen = torch.Generator().manual_seed(0)
    quick = os.environ.get(QUICK) == "1"
    for segments, rates, mode, heads, kv_heads, capacity in PATTERNS[1:2] if quick else PATTERNS:
        pattern = DilatedPattern.create(segments, rates, mode=mode, causal=True)
        tables = step_tables(pattern, heads, capacity, "cpu")
        for keys_per_split, append in QUICK_SPLITS if quick else SPLITS:
            dim = 8
            keys = torch.randn(2, capacity, kv_heads, dim, generator=gen)
            values = torch.randn(2, capacity, kv_heads, dim, generator=gen)
            ref_keys, ref_values = keys.double(), values.double()
            positions = torch.tensor([0, 5])
            ref_positions = positions.clone()
            worst = {"out": 0.0, "lse": 0.0, "cache": 0.0, "positions": 0}
            for _ in range(capacity):
                q = torch.randn(2, heads, dim, generator=gen)
                k_new, v_new = (torch.randn(2, kv_heads, dim, generator=gen) for _ in range(2))
                if not append:  # the caller stored the new key and value at row p % C already
                    rows = torch.arange(2)
                    keys[rows, positions % capacity], values[rows, positions % capacity] = k_new, v_new
                    ref_keys[rows, ref_positions % capacity] = k_new.double()
                    ref_values[rows, ref_positions % capacity] = v_new.double()
                out, lse = dilated_decode(q, k_new if append else None, v_new if append else None, keys, values,
                                          positions, *tables, 0.7, keys_per_split=keys_per_split)
                ref_out, ref_lse = _step_torch(pattern, q.double(), ref_keys, ref_values, ref_positions, 0.7,
                                               k_new.double() if append else None,
                                               v_new.double() if append else None, tables[1], True)
                finite = torch.isfinite(ref_lse)
                assert torch.equal(finite, torch.isfinite(lse))
                worst["out"] = max(worst["out"], (out.double() - ref_out).abs().max().item())
                worst["lse"] = max(worst["lse"], (lse.double() - ref_lse)[finite].abs().max().item())
                worst["cache"] = max(worst["cache"], (keys.double() - ref_keys).abs().max().item(),
                                     (values.double() - ref_values).abs().max().item())
                worst["positions"] = max(worst["positions"], int((positions - ref_positions).abs().max()))
            print(json.dumps({"case": [segments, rates, mode, keys_per_split, append], **worst,
                              "blind_heads": int((~finite).sum())}))


def _check(results: list[dict], cases: int) -> None:
    assert len(results) == cases
    for result in results:
        assert result["out"] < 1e-5 and result["lse"] < 1e-5 and result["cache"] < 1e-6, result
        assert result["positions"] == 0, result
    assert any(r["blind_heads"] for r in results if r["case"][1] == [2, 4, 8])  # heads with no branch were checked


@pytest.mark.skipif(not HAVE_TRITON, reason=INTERPRETER)
def test_the_one_launch_step_matches_the_float64_torch_step(run_interpreted, monkeypatch):
    """The pattern whose heads see no branch at some positions, splits of 3 keys and the default (a minute on a 2-core
    CPU for every pattern and split: the slow test below)."""
    monkeypatch.setenv(QUICK, "1")
    _check(run_interpreted(HERE), len(QUICK_SPLITS))


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TRITON, reason=INTERPRETER)
def test_the_one_launch_step_matches_the_float64_torch_step_for_every_pattern_and_split(run_interpreted, monkeypatch):
    monkeypatch.delenv(QUICK, raising=False)
    _check(run_interpreted(HERE), len(PATTERNS) * len(SPLITS))


if __name__ == "__main__":
    _errors()
