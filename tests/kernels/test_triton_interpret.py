"""The fused Triton dilated-attention kernel in interpreter mode (TRITON_INTERPRET=1, CPU, float32)
against the engine's float64 reference: outputs, LSE, gradients (random upstream gradients for out
and lse), -inf rows, on tiny shapes covering both modes, causal, ragged N, w > N, odd dilations."""
from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
HAVE_TRITON = importlib.util.find_spec("triton") is not None


def _interpret(*args: str, timeout: float = 600) -> list[dict]:
    """The JSON lines of `_attention_cases.py ARGS` under Triton's interpreter, in a fresh process."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(HERE.parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(HERE / "_attention_cases.py"), *args], capture_output=True, text=True,
                          env=env, cwd=str(HERE), timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def interpreted_results():
    return _interpret()


def _assert_matches(results: list[dict], context: str = "") -> None:
    for result in results:
        label = (context, result["case"]) if context else result["case"]
        assert result["finite"], label
        assert result["neg_inf_rows_match"], label
        assert result["no_keys_rows_zero"], label
        assert result["out"] < 1e-5, (label, result["out"])
        assert result["lse"] < 1e-5, (label, result["lse"])
        for name in ("dq", "dk", "dv"):
            assert result[name] < 1e-5, (label, name, result[name])


@pytest.mark.slow  # the interpreter runs every case (half a minute); make test keeps the interpreted merges
@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed (pip install triton); its CPU interpreter runs these checks")
def test_interpreted_kernel_matches_float64_reference(interpreted_results):
    sys.path.insert(0, str(HERE))
    from _attention_cases import INTERPRET_CASES

    assert len(interpreted_results) == len(INTERPRET_CASES)
    _assert_matches(interpreted_results)


@pytest.mark.slow  # about 2 s a case under the interpreter
@pytest.mark.property  # make fuzz: HILBERT_LAB_FUZZ_EXAMPLES / 20 cases of a seed drawn anew (2000: 100, ~4 min)
@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed (pip install triton); its CPU interpreter runs these checks")
def test_interpreted_kernel_matches_float64_reference_on_random_patterns():
    examples = os.environ.get("HILBERT_LAB_FUZZ_EXAMPLES")
    count, seed = (max(4, int(examples) // 20), random.SystemRandom().randrange(2 ** 31)) if examples else (4, 0)
    results = _interpret(str(count), str(seed), timeout=600 + 10 * count)
    assert len(results) == count, f"seed {seed}: {len(results)} of {count} cases ran"
    _assert_matches(results, f"seed {seed}")


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed")
def test_bad_inputs_raise_value_error():
    import torch

    from hilbert_lab.kernels import triton_dilated as td

    q = torch.zeros(1, 8, 2, 16)
    offsets = torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="share one shape"):
        td.dilated_attention_forward(q, q[:, :4], q, segment_lengths=[8], dilation_rates=[1], head_offsets=offsets)
    with pytest.raises(ValueError, match="dtype"):
        td.dilated_attention_forward(q.double(), q.double(), q.double(), segment_lengths=[8], dilation_rates=[1],
                                     head_offsets=offsets)
    with pytest.raises(ValueError, match="head_offsets"):
        td.dilated_attention_forward(q, q, q, segment_lengths=[8, 4], dilation_rates=[1, 2], head_offsets=offsets)
    with pytest.raises(ValueError, match="dilation"):
        td.dilated_attention_forward(q, q, q, segment_lengths=[2], dilation_rates=[4], head_offsets=offsets)
    for bad_scale in (0.0, -0.5, float("nan")):
        with pytest.raises(ValueError, match="scale"):
            td.dilated_attention_forward(q, q, q, segment_lengths=[8], dilation_rates=[1], head_offsets=offsets,
                                         scale=bad_scale)
    if not td.interpreting():
        with pytest.raises(ValueError, match="CUDA"):
            td.dilated_attention_forward(q, q, q, segment_lengths=[8], dilation_rates=[1], head_offsets=offsets)


@pytest.mark.parametrize("rates,expected", [([1, 2, 4], 4), ([1, 3, 2], 6), ([1], 1), ([7, 9, 11], 1)])
def test_stream_stride(rates, expected):
    from hilbert_lab.kernels.triton_dilated import stream_stride

    assert stream_stride([64] * len(rates), rates, 4096) == expected


@pytest.mark.skipif(not HAVE_TRITON, reason="triton not installed (pip install triton)")
def test_kernels_compile_for_sm90_without_a_gpu():
    """Triton compiles the three kernels for Hopper (sm_90) here, so a broken kernel fails CI; the
    forward must use Hopper's asynchronous matrix instructions (wgmma) and 16-byte async copies."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from hilbert_lab.kernels import triton_dilated as td

    pointers = {name: "*bf16" for name in ("Q", "K", "V", "Out", "dO", "dK", "dV", "dQ")}
    pointers.update({"Lse": "*fp32", "Delta": "*fp32", "Seg": "*i32", "Dil": "*i32", "Off": "*i32"})
    fwd_tma = {"USE_TMA": True, "DIAG": 0}
    variants = ((td._fwd_kernel, 128, 64, {"USE_TMA": False, "DIAG": 0}), (td._fwd_kernel, 128, 64, fwd_tma),
                (td._bwd_dkdv_kernel, 32, 128, {}), (td._bwd_dq_kernel, 128, 32, {}))
    for kernel, block_m, block_n, extra in variants:
        consts = {"CAUSAL": True, "BLOCK_D": 64, "HEAD_DIM": 64, "IEEE": False, "BLOCK_M": block_m, "BLOCK_N": block_n,
                  **extra}
        signature = {name: ("constexpr" if name in consts else pointers.get(name, "fp32" if name.endswith("scale") else "i32"))
                     for name in kernel.arg_names}
        divisible = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in kernel.arg_names
                     if n in pointers or n.startswith("stride_")}
        source = ASTSource(fn=kernel, signature=signature, attrs=divisible,
                           constexprs={(kernel.arg_names.index(k),): v for k, v in consts.items()})
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3})
        ptx = compiled.asm["ptx"]
        assert "wgmma.mma_async" in ptx, kernel.__name__
        assert "cp.async" in ptx, kernel.__name__
        if extra.get("USE_TMA"):  # full key blocks through the tensor-memory accelerator
            assert "cp.async.bulk.tensor" in ptx, kernel.__name__
