"""The decoding step's tensor-core path as Triton compiles it for an H100/H200 (sm90), on the host, no GPU needed:
at a 1B-class layer's arguments (integers divisible by 16 specialised, as a launch does) its key and value loads
become asynchronous copies into shared memory, the pipeline its loop asks for; without it they would be plain
loads, each waiting for memory before the next starts."""
from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed: it "
                                "compiles the kernel")

H, D, C = 16, 128, 131072
POINTERS = {"q_ptr": "*bf16", "knew_ptr": "*bf16", "vnew_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16",
            "pos_ptr": "*i64", "br_ptr": "*i32", "off_ptr": "*i32", "out_ptr": "*fp32",
            "lse_ptr": "*fp32"}
INTEGERS = dict(sq_b=H * D, sq_h=D, sn_b=H * D, sn_h=D, svn_b=H * D, svn_h=D, sk_b=C * H * D, sk_n=H * D, sk_h=D,
                sv_b=C * H * D, sv_n=H * D, sv_h=D, capacity=C, heads=H, kv_heads=H, group=1, branches=4, rows=H,
                keys_per_split=512)


def _compiled_ttgir(dot: bool) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from hilbert_lab.kernels import triton_decode

    tuned = triton_decode.DOT_TUNING if dot else triton_decode.REDUCE_TUNING
    constants = dict(BLOCK_B=4, BLOCK_H=H, BLOCK_KV=H, DIM=D, BLOCK_D=D, BLOCK_N=tuned["block_keys"], STAGES=tuned["stages"], EVEN_D=True,
                     APPEND=True, DOT=dot)
    kernel = triton_decode._partial_kernel
    names = kernel.arg_names
    signature = {name: POINTERS.get(name) or ("constexpr" if name in constants else "fp32" if name == "scale_log2"
                                              else "i32") for name in names}
    aligned = [name for name in names if name in POINTERS or INTEGERS.get(name, 1) % 16 == 0]
    source = ASTSource(kernel, signature, constexprs={(names.index(k),): v for k, v in constants.items()},
                       attrs={(names.index(name),): [["tt.divisibility", 16]] for name in aligned})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": tuned["warps"]})
    return compiled.asm["ttgir"]


@pytest.mark.slow  # a Triton compile (about 5 s)
def test_the_tensor_core_step_loads_keys_and_values_by_asynchronous_copies_on_sm90():
    ttgir = _compiled_ttgir(dot=True)
    assert ttgir.count("async_copy_global_to_local") >= 2  # keys and values, in the loop's pipeline
    assert "tt.dot" in ttgir or "warp_group_dot" in ttgir
