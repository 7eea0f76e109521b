"""The fa4 executor's glue on the CPU: FlashAttention-4's entry points replaced by a float64 stand-in with their
call semantics (`_fa4_standin`), so that views, outputs written in place, gradient shares written into the
caller's views or added, and the LSE handling are checked against the float64 dense oracle without a GPU (the GPU
tests run the real kernels)."""
from __future__ import annotations

import pytest

from ._fa4_standin import CPU_FA4, install_fa4_standin
from ._small_cases import CASES, oracle_errors


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_the_fa4_executor_matches_the_oracle(case, monkeypatch):
    """Ragged tails, grouped key/value heads, fewer queries than keys, both modes, causal or not: out, LSE and
    every gradient for random upstream gradients of both."""
    install_fa4_standin(monkeypatch)
    errors = oracle_errors(case, backend=CPU_FA4)
    assert errors["out"] < 1e-12 and errors["lse"] < 1e-12, errors
    # the backward hands the kernel its LSE in float32, as FlashAttention-4 takes it: probabilities to ~1e-7
    assert max(errors[name] for name in ("dq", "dk", "dv")) < 1e-6, errors
