"""The Triton decoding step (kernels.triton_decode) in interpreter mode (TRITON_INTERPRET=1, CPU, float32): each
step of rows of different prompt lengths against the float64 engine on each row's whole sequence (the cases of
test_static_cache: nested and non-dividing segments, grouped key/value heads, a whole-sequence branch), with splits
of one key, three keys and the default size, at head dims that are and are not powers of two; and the tensor-core
path (dot) in float16 at head dims 16-64, against the same engine on the float16 inputs."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
HAVE_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed (pip install triton): its interpreter "
                                "runs the step")
SPLITS, DIMS, STEPS = (None, 1, 3, None), (4, 80, 8, 8), 4  # per case of test_static_cache.CASES
DOT_SPLITS, DOT_DIMS = (None, 32, 64, None), (16, 32, 64, 16)  # the dot path: splits of whole key blocks


def _main() -> None:
    import torch

    sys.path.insert(0, str(HERE.parents[1]))
    from attention._oracle import max_diff
    from attention.test_static_cache import CASES, _decode, _engine_rows, _qkv

    from hilbert_lab.attention.static_cache import step_tables
    from hilbert_lab.kernels import triton_decode

    def kernel_step(split, dot):
        def step_of(cache):
            def step(q, k, v):
                tables = step_tables(cache.pattern, cache.num_heads, cache.capacity, cache.keys.device)
                return triton_decode.dilated_decode(q, k, v, cache.keys, cache.values, cache.positions, *tables,
                                                    cache._scale, keys_per_split=split, dot=dot)
            return step
        return step_of

    runs = [(False, torch.float32, SPLITS, DIMS), (True, torch.float16, DOT_SPLITS, DOT_DIMS)]
    for dot, dtype, splits, dims in runs:
        for index, ((segments, rates, mode, heads, kv_heads, lengths), split, dim) in enumerate(zip(CASES, splits,
                                                                                                   dims)):
            q, k, v = _qkv(len(lengths), max(lengths) + STEPS, heads, kv_heads, dim, dtype, seed=index)
            _, results = _decode(segments, rates, mode, q, k, v, lengths, STEPS, kernel_step(split, dot))
            expected = _engine_rows(segments, rates, mode, q, k, v, lengths, STEPS)
            rows_without_keys_agree = all(torch.equal(torch.isinf(lse), torch.isinf(ref))
                                          for (_, lse), (_, ref) in zip(results, expected))
            out_error = max(max_diff(out.double(), ref) for (out, _), (ref, _) in zip(results, expected))
            lse_error = max(max_diff(lse.double(), ref) for (_, lse), (_, ref) in zip(results, expected))
            print(json.dumps({"case": index, "dot": dot, "out": out_error, "lse": lse_error,
                              "rows_without_keys_agree": rows_without_keys_agree}), flush=True)


@pytest.mark.slow  # the interpreter in a fresh process (about 30 s)
def test_the_triton_step_equals_the_float64_engine(run_interpreted):
    from .test_static_cache import CASES

    results = {(r["case"], r["dot"]): r for r in run_interpreted(HERE)}
    assert sorted(results) == [(case, dot) for case in range(len(CASES)) for dot in (False, True)]
    for (case, dot), result in results.items():
        out_tolerance, lse_tolerance = (3e-3, 1e-4) if dot else (2e-5, 1e-4)  # float16 out and weights (dot)
        assert result["rows_without_keys_agree"] and result["out"] < out_tolerance and result["lse"] < lse_tolerance, \
            (case, result)


if __name__ == "__main__":
    _main()
