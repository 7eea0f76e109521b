"""The small-block kernels (kernels.triton_small_blocks) in interpreter mode (TRITON_INTERPRET=1, CPU, float32):
the pass they run through `dilated_attention` against the float64 dense oracle (the cases of `_small_cases`), and
the row scatter against a float64 sum with owned and added rows."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
HAVE_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed (pip install triton): its interpreter "
                                "runs them")


def _scatter() -> float:
    """The largest error of scatter_rows (two shares, owned and added rows) against a float64 sum."""
    import torch

    from hilbert_lab.kernels.triton_small_blocks import scatter_rows

    gen = torch.Generator().manual_seed(1)
    shares = [torch.randn(10, 5, generator=gen) for _ in range(2)]
    totals = [torch.randn(2, 4, 3, 5, generator=gen) for _ in range(2)]
    rows = torch.tensor([[0, 1, 2], [1, 3, 0], [1, 0, 1]], dtype=torch.int32)
    members = [[0, 4, 9], [2], [1, 3, 5, 7]]
    owned = torch.tensor([1, 0, 0], dtype=torch.int8)
    starts = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    flat = torch.tensor([m for group in members for m in group], dtype=torch.int32)
    want = [t.double().clone() for t in totals]
    for r, (b, n, h) in enumerate(rows.tolist()):
        for share, total in zip(shares, want):
            base = 0.0 if owned[r] else total[b, n, h]
            total[b, n, h] = base + share.double()[members[r]].sum(0)
    scatter_rows(tuple(shares), tuple(totals), rows, starts, flat, owned, max_count=4)
    return max((got.double() - exp).abs().max().item() for got, exp in zip(totals, want))


def _main() -> None:
    import torch

    from hilbert_lab.attention.executors import small_blocks

    sys.path.insert(0, str(HERE.parents[1]))
    from attention._small_cases import CASES, oracle_errors

    launches = []
    forward = small_blocks.small_attention_forward
    small_blocks.small_attention_forward = lambda *a, **k: (launches.append(1), forward(*a, **k))[1]
    for case in CASES:
        before = len(launches)
        errors = oracle_errors(case, backend="manual", dtype=torch.float32)
        print(json.dumps({"case": list(case), "launches": len(launches) - before, **errors}), flush=True)
    print(json.dumps({"scatter": _scatter()}), flush=True)


@pytest.fixture(scope="module")
def measured(run_interpreted):
    return run_interpreted(HERE)


@pytest.mark.slow  # the interpreter in a fresh process (8 s)
def test_the_small_block_kernels_equal_the_float64_oracle(measured):
    from ._small_cases import CASES

    results = {tuple(r["case"]): r for r in measured if "case" in r}
    assert sorted(results) == sorted(CASES)
    for case, result in results.items():
        assert result["launches"] >= 1, case  # the kernels ran the pass
        for name in ("out", "lse", "dq", "dk", "dv"):
            assert result[name] < 1e-5, (case, name, result)


@pytest.mark.slow
def test_the_row_scatter_writes_owned_rows_and_adds_the_others(measured):
    scatter = [r["scatter"] for r in measured if "scatter" in r]
    assert scatter and scatter[0] < 1e-5, scatter


def test_tiles_must_be_powers_of_two_of_at_least_16():
    import torch

    from hilbert_lab.kernels.triton_small_blocks import small_attention_forward, tile_length

    assert [tile_length(n) for n in (1, 16, 17, 64)] == [16, 16, 32, 64]
    x = torch.zeros(1, 4, 1, 8)
    rows = torch.zeros(1, 8, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="tile_length"):
        small_attention_forward(x, x, x, rows, rows, torch.zeros(1, 2, dtype=torch.int32),
                                torch.zeros(1, dtype=torch.int32), x[None], x[None, ..., 0], scale=1.0, causal=False)


if __name__ == "__main__":
    _main()
