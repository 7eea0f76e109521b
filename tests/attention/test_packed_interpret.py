"""Packed rows' row writes and adds under Triton's interpreter (TRITON_INTERPRET=1, CPU, float32): `put_rows` against
torch on strided totals, and a packed row through the FlashAttention-4 stand-in, whose LSEs `put_rows` writes and
whose later branches' gradient shares it adds at the runs' rows, against the float64 oracle per document."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
HAVE_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed (pip install triton): its interpreter "
                                "runs the kernel")


def _put_rows_error() -> float:
    """put_rows on strided views of bigger float32 totals: adding three pairs of (R, h, D) (two head counts, one share
    strided too), then writing a (R, h) pair read through a transpose (an LSE): the largest difference of the whole
    totals from torch doing the same at the listed rows (the other rows, and the rest of each total, unchanged)."""
    import torch

    from hilbert_lab.kernels.triton_rows import put_rows

    gen = torch.Generator().manual_seed(2)
    bases = [torch.randn(39, 6, 5, generator=gen) for _ in range(3)]
    expected = [b.clone() for b in bases]
    pick = [lambda t: t[1::3, 1:4], lambda t: t[2::3, ::3], lambda t: t[0::3, 4:6]]  # rows 3 apart; 3, 2, 2 heads
    shares = [torch.randn(13, 3, 5, generator=gen), torch.randn(13, 4, 5, generator=gen)[:, 1:3],
              torch.randn(13, 2, 5, generator=gen)]
    rows = torch.tensor([0, 2, 3, 7, 12])
    for view_of, want, share in zip(pick, expected, shares):
        view_of(want)[rows] += share[rows]
    put_rows([(view_of(base), share) for view_of, base, share in zip(pick, bases, shares)], rows)
    lse_base, lse = torch.randn(40, 4, generator=gen), torch.randn(3, 13, generator=gen)  # the kernel's (h, rows)
    lse_want = lse_base.clone()
    lse_want[1::3, 1:][rows] = lse.t()[rows]
    put_rows([(lse_base[1::3, 1:].unsqueeze(-1), lse.t().unsqueeze(-1))], rows, accumulate=False)
    return max((base - want).abs().max().item() for base, want in zip([*bases, lse_base], [*expected, lse_want]))


def _main() -> None:
    import torch

    sys.path.insert(0, str(HERE.parents[1]))
    from attention import test_packed
    from attention._fa4_standin import install_fa4_standin
    from hilbert_lab.attention.executors import varlen
    from hilbert_lab.attention.executors.fa4 import FA4_VARLEN

    calls = []  # the adds put_rows makes
    put = varlen.put_rows
    varlen.put_rows = lambda *a, accumulate=True: (calls.append(1) if accumulate else None,
                                                   put(*a, accumulate=accumulate))[1]
    executor = test_packed._varlen_executor(FA4_VARLEN)  # the manual kernel's units, FlashAttention-4's packs
    patch = pytest.MonkeyPatch()
    install_fa4_standin(patch)
    for case in ("documents+gqa", "documents"):
        calls.clear()
        errors = test_packed.relative_errors(test_packed.CASES[case], executor, torch.float32)
        print(json.dumps({"case": case, "adds": len(calls), **errors}), flush=True)
    patch.undo()
    print(json.dumps({"put_rows_error": _put_rows_error()}), flush=True)


@pytest.fixture(scope="module")
def measured(run_interpreted):
    return run_interpreted(HERE)


@pytest.mark.slow  # the interpreter in a fresh process
def test_put_rows_adds_and_writes_the_listed_rows_of_strided_totals(measured):
    errors = [r["put_rows_error"] for r in measured if "put_rows_error" in r]
    assert errors and errors[0] == 0.0, errors  # bitwise torch's float32 add, nothing else touched


@pytest.mark.slow
def test_a_packed_row_written_and_added_by_rows_equals_the_oracle(measured):
    results = {r["case"]: r for r in measured if "case" in r}
    assert sorted(results) == ["documents", "documents+gqa"]
    assert results["documents+gqa"]["adds"] >= 1  # later branches' shares went through the kernel
    assert results["documents"]["adds"] == 0  # head groups: every share is written, none added
    for case, result in results.items():
        for name in ("out", "lse", "dq", "dk", "dv"):
            assert result[name] < 1e-5, (case, name, result)



def test_put_rows_refuses_pairs_it_cannot_take():
    import torch

    from hilbert_lab.kernels.triton_rows import put_rows

    rows = torch.tensor([0])
    x = torch.zeros(4, 2, 8)
    with pytest.raises(ValueError, match="one to three"):
        put_rows([(x, x)] * 4, rows)
    with pytest.raises(ValueError, match="one shape"):
        put_rows([(x, torch.zeros(4, 3, 8))], rows)
    with pytest.raises(ValueError, match="totals of"):
        put_rows([(x.double(), x.double())], rows)


if __name__ == "__main__":
    _main()
