"""Gradient shares of later branches added into strided totals by one launch (`kernels.triton_rows.add_views`) and
the entries no block writes filled by one (`kernels.triton_fill.fill_unselected`), under
Triton's interpreter (TRITON_INTERPRET=1, CPU, float32): `add_views` against torch on strided views, and the
blockwise executor of a kernel declaring `graphs` (whose adds take that launch) against the float64 oracle."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
HAVE_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed (pip install triton): its interpreter "
                                "runs the kernel")
# (batch, document lengths, heads, kv heads, segments, rates, mode, causal): LongNet, so branches past the first add
CASES = {
    "longnet+gqa": (2, None, 6, 2, [4, 8, 16], [1, 2, 4], "longnet", True),
    "longnet-ragged": (1, (301,), 4, 4, [8, 1 << 40], [1, 4], "longnet", False),  # whole-row branch: 75-76 keys
    "head_groups+gqa": (2, None, 6, 2, [4, 8, 16], [1, 2, 4], "head_groups", True),  # shared K/V heads add
    "head_groups": (2, None, 6, 6, [4, 8, 16], [1, 2, 4], "head_groups", True),
}


def _add_views_error() -> float:
    """add_views on strided (B, L, h, D) views of bigger float32 totals, three pairs of two lengths and head counts
    (one share strided too): the largest difference of the whole totals from torch adding the same."""
    import torch

    from hilbert_lab.kernels.triton_rows import add_views

    gen = torch.Generator().manual_seed(3)
    bases = [torch.randn(2, 40, 6, 5, generator=gen) for _ in range(3)]
    expected = [b.clone() for b in bases]
    pick = [lambda t: t[:, 1::3, 1:4], lambda t: t[:, 2::4, ::3], lambda t: t[:, 0::4, 4:6]]  # 13 or 10 rows
    shares = [torch.randn(2, 13, 3, 5, generator=gen), torch.randn(2, 10, 4, 5, generator=gen)[:, :, 1:3],
              torch.randn(2, 10, 2, 5, generator=gen)]
    for view_of, want, share in zip(pick, expected, shares):
        view_of(want).add_(share)
    add_views([(view_of(base), share) for view_of, base, share in zip(pick, bases, shares)])
    return max((base - want).abs().max().item() for base, want in zip(bases, expected))


def _fill_errors() -> dict:
    """fill_unselected on a strided (B, N, H, D) view of a bigger tensor, per-head rows of every kind (a ragged last
    segment, w not a multiple of r, a head in no branch, one fully selected), float32 and bfloat16: the largest
    difference of the whole tensor from torch writing the same entries, and the entries it wrote."""
    import torch

    from hilbert_lab.kernels.triton_fill import fill_unselected, head_table

    rows = ((1, 1, 0), (6, 2, 1), (6, 2, 0), (10, 3, 2), (1, 1, -1), (25, 4, 3))
    errors = {}
    for dtype in (torch.float32, torch.bfloat16):
        base = torch.randn(2, 25, 8, 5, generator=torch.Generator().manual_seed(5)).to(dtype)
        want = base.clone()
        for h, (w, r, o) in enumerate(rows):
            for p in range(23):
                if (p % w) % r != o:
                    want[:, 1 + p, 1 + h] = -2.5
        fill_unselected(base[:, 1:24, 1:7], head_table(rows, base.device), -2.5)
        errors[str(dtype)] = (base.float() - want.float()).abs().max().item()
    return errors


def _main() -> None:
    import torch

    sys.path.insert(0, str(HERE.parents[1]))
    from attention import test_packed
    from hilbert_lab.attention.executors import base
    from hilbert_lab.attention.executors.blockwise import blockwise_executor
    from hilbert_lab.attention.executors.manual import EAGER_CAPABILITIES, MANUAL_KERNEL

    calls = []
    add = base.add_views
    base.add_views = lambda pairs: (calls.append(len(pairs)), add(pairs))[1]
    kernel = dataclasses.replace(MANUAL_KERNEL, graphs=True)  # replayed calls: their shares added in one launch
    executor = blockwise_executor("graphed manual", lambda q: kernel, EAGER_CAPABILITIES)
    for case, spec in CASES.items():
        calls.clear()
        errors = test_packed.relative_errors(spec, executor, torch.float32)
        print(json.dumps({"case": case, "launches": len(calls), "pairs": sum(calls), **errors}), flush=True)
    print(json.dumps({"add_views_error": _add_views_error()}), flush=True)
    print(json.dumps({"fill_errors": _fill_errors()}), flush=True)


@pytest.fixture(scope="module")
def measured(run_interpreted):
    return run_interpreted(HERE)


@pytest.mark.slow  # the interpreter in a fresh process
def test_add_views_adds_strided_shares_into_strided_totals(measured):
    errors = [r["add_views_error"] for r in measured if "add_views_error" in r]
    assert errors and errors[0] == 0.0, errors  # bitwise torch's float32 add, nothing else touched


@pytest.mark.slow
def test_fill_unselected_writes_exactly_the_unselected_entries(measured):
    errors = [r["fill_errors"] for r in measured if "fill_errors" in r]
    assert errors and errors[0] == {"torch.float32": 0.0, "torch.bfloat16": 0.0}, errors


@pytest.mark.slow
def test_later_branches_added_in_one_launch_per_call_equal_the_oracle(measured):
    results = {r["case"]: r for r in measured if "case" in r}
    assert sorted(results) == sorted(CASES)
    for case in ("longnet+gqa", "longnet-ragged", "head_groups+gqa"):
        assert results[case]["launches"] >= 1 and results[case]["pairs"] == 3 * results[case]["launches"], results
    assert results["head_groups"]["launches"] == 0  # head groups: every share is written, none added
    for case, result in results.items():
        for name in ("out", "lse", "dq", "dk", "dv"):
            assert result[name] < 1e-5, (case, name, result)


def test_fill_unselected_refuses_what_it_cannot_take():
    import torch

    from hilbert_lab.kernels.triton_fill import fill_unselected

    x = torch.zeros(2, 4, 3, 8)
    table = torch.ones(3, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="contiguous last dim"):
        fill_unselected(x.double(), table)
    with pytest.raises(ValueError, match="contiguous last dim"):
        fill_unselected(x.transpose(1, 3), table)
    with pytest.raises(ValueError, match=r"\(3, 3\) int32"):
        fill_unselected(x, table[:2])


def test_add_views_refuses_pairs_it_cannot_take():
    import torch

    from hilbert_lab.kernels.triton_rows import add_views

    x = torch.zeros(2, 4, 2, 8)
    with pytest.raises(ValueError, match="one to three"):
        add_views([(x, x)] * 4)
    with pytest.raises(ValueError, match="one shape"):
        add_views([(x, torch.zeros(2, 4, 3, 8))])
    with pytest.raises(ValueError, match="totals of"):
        add_views([(x.double(), x.double())])
    with pytest.raises(ValueError, match="one B and D"):
        add_views([(x, x), (torch.zeros(3, 4, 2, 8), torch.zeros(3, 4, 2, 8))])


if __name__ == "__main__":
    _main()
