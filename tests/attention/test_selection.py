"""Backend selection: GPU description, the documented rules, and reading the stored timed selections."""
from __future__ import annotations

import functools
import itertools
import json

import pytest
import torch

from hilbert_lab.attention import dilated_attention, get_gpu_info, select_backend
from hilbert_lab.attention import selection


def test_gpu_info_and_rule_selection_on_cpu():
    info = get_gpu_info()
    if not torch.cuda.is_available():
        assert info["available"] is False and info["architecture"] is None
    assert select_backend("cpu", torch.float32) == "sdpa"
    assert selection.recommended_dtype("cpu") == torch.float32
    assert select_backend("cpu", torch.float64) == "sdpa"
    names = {(6, 1): "Pascal", (7, 0): "Volta", (7, 5): "Turing", (8, 0): "Ampere", (8, 6): "Ampere", (8, 9): "Ada",
             (9, 0): "Hopper", (10, 0): "Blackwell", (12, 0): "Blackwell"}
    for capability, name in names.items():
        assert selection.architecture_name(*capability) == name


def test_rule_picks_the_fused_kernel_where_it_was_measured_to_win():
    """Rule 3 on Hopper (pure function of the facts it reads, so it is checked without a GPU)."""
    hopper, ampere = (9, 0), (8, 0)
    rule = functools.partial(selection.rule_for, "cuda", triton_ok=True)
    for dtype in (torch.bfloat16, torch.float16):
        assert rule(hopper, dtype) == "triton"  # N unknown: the fused kernel
        assert rule(hopper, dtype, seq_len=8192, head_dim=64) == "triton"
        assert rule(hopper, dtype, seq_len=32768, head_dim=64) == "sdpa"  # in-place cuDNN from 32K on
        assert rule(hopper, dtype, seq_len=8192, head_dim=64, training=True) == "triton"
        assert rule(hopper, dtype, seq_len=8192, head_dim=128, training=True) == "sdpa"  # slow fused D=128 backward
        assert rule(hopper, dtype, seq_len=8192, head_dim=128) == "triton"
        assert rule(hopper, dtype, seq_len=1 << 22, head_dim=64, training=True, inplace_fits=False) == "triton"
    assert rule((10, 0), torch.bfloat16) == "triton"  # newer than Hopper
    with_fa4 = functools.partial(rule, hopper, torch.bfloat16, fa4_ok=True, seq_len=32768, head_dim=64)
    for mode, training in itertools.product(("longnet", "head_groups"), (False, True)):  # in place: FA4
        assert with_fa4(training=training, mode=mode) == "fa4"
    assert with_fa4(training=True, seq_len=8192) == with_fa4(seq_len=None, head_dim=None) == "fa4"  # any N
    assert with_fa4(seq_len=1 << 22, inplace_fits=False) == "triton"
    assert rule(hopper, torch.float32) == "sdpa"  # fp32: the efficient kernel
    assert rule(ampere, torch.bfloat16) == "sdpa"  # not measured there: opt-in
    assert rule(ampere, torch.bfloat16, flash_ok=True) == "flash"
    assert selection.rule_for("cuda", hopper, torch.bfloat16, triton_ok=False) == "sdpa"  # no triton / dense blocks
    assert selection.rule_for("cuda", hopper, torch.bfloat16, triton_ok=False, flash_ok=True) == "flash"
    # dense blocks (the ring's steps): FlashAttention-4 in training from a 32K shard, else the rules above
    dense = functools.partial(selection.rule_for, "cuda", hopper, torch.bfloat16, triton_ok=False, fa4_ok=True,
                              dense_blocks=True, head_dim=64)
    assert dense(training=True, seq_len=65536) == dense(training=True, seq_len=32768, mode="head_groups") == "fa4"
    assert dense(training=True, seq_len=16384) == dense(seq_len=65536) == "sdpa"
    assert dense(training=True, seq_len=65536, fa4_ok=False) == "sdpa"
    assert selection.rule_for("cuda", ampere, torch.bfloat16, fa4_ok=True, dense_blocks=True, training=True,
                              seq_len=65536) == "sdpa"
    assert selection.rule_for("cpu", None, torch.float32) == "sdpa"
    assert selection.rule_for("cpu", None, torch.int32) == "manual"


def test_the_inplace_fit_decision_is_the_memory_estimate_against_free_memory(monkeypatch):
    """Rule 3's fits-decision (no GPU needed: the device facts and its free memory are stand-ins) is
    attention.memory's estimate of "sdpa" (the in-place executor on Hopper, bf16) against 90% of the free
    memory, forward for inference and forward+backward for training; below 1 GiB the device is not asked.
    Free memory counts the blocks PyTorch's allocator holds unused (reserved, not allocated)."""
    from hilbert_lab.attention.memory import MemoryConfig, estimate_memory

    shape, lengths, rates = (1, 1 << 18, 16, 128), (4096, 16384, 65536), (1, 2, 4)
    monkeypatch.setattr(selection, "_cuda_facts", lambda device, dtype: ((9, 0), True, False, False))
    free = {"bytes": 0, "cached": 0}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["bytes"], 80 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: (1 << 30) + free["cached"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 1 << 30)
    for training in (False, True):
        estimate = estimate_memory(MemoryConfig(seq_len=shape[1], batch_size=1, num_heads=16, head_dim=128,
                                                segment_lengths=lengths, dilation_rates=rates, backend="sdpa",
                                                dtype="bfloat16", device="cuda"))
        assert estimate.executor == "sdpa"
        peak = estimate.forward_backward_bytes if training else estimate.forward_bytes
        assert peak >= selection.INPLACE_QUERY_BYTES
        pick = functools.partial(selection.rule_backend, "cuda", torch.bfloat16, shape=shape, segment_lengths=lengths,
                                 dilation_rates=rates, training=training)
        selection.clear_fit_decisions()
        free["bytes"] = int(peak / 0.9) + 1024
        assert pick() == "sdpa"  # fits: in-place cuDNN at N >= 32K
        free["bytes"] = int(peak / 0.9) - 1024
        assert pick() == "sdpa"  # decided once: a recomputed forward takes the forward's path
        selection.clear_fit_decisions()
        assert pick() == "triton"  # does not fit: the fused kernel, no per-branch buffers
        free["bytes"] = int(peak / 0.9) + 1024
        assert pick() == "triton"
        selection.clear_fit_decisions()
        free["bytes"], free["cached"] = int(peak / 0.9) // 2, int(peak / 0.9) // 2 + 2048
        assert pick() == "sdpa"  # the allocator's unused blocks make up the rest
        free["cached"] = 0
    assert estimate.forward_backward_bytes > estimate.forward_bytes  # training asks for more

    def no_query(device=None):
        raise AssertionError("the device was asked below INPLACE_QUERY_BYTES")

    monkeypatch.setattr(torch.cuda, "mem_get_info", no_query)
    selection.clear_fit_decisions()
    small = (1, 32768, 8, 64)
    assert selection.rule_backend("cuda", torch.bfloat16, shape=small, segment_lengths=(2048, 4096)) == "sdpa"


def test_engine_asks_auto_with_the_mode_and_the_ring_asks_for_dense_blocks(monkeypatch):
    """The engine tells select_backend the pattern's mode; the ring's steps ask for an executor with a dense
    kernel (whole_pattern=False), so auto never hands them the fused kernel."""
    from hilbert_lab.attention.selection import resolve_executor
    from hilbert_lab.distributed.ring import resolve_step_executor

    seen = []
    real = selection.select_backend

    def spy(*args, **kwargs):
        seen.append((kwargs.get("mode"), kwargs.get("whole_pattern")))
        return real(*args, **kwargs)

    monkeypatch.setattr(selection, "select_backend", spy)
    q, k, v = (torch.randn(1, 32, 2, 8) for _ in range(3))
    kwargs = dict(segment_lengths=[8, 16], dilation_rates=[1, 2], backend="auto")
    dilated_attention(q, k, v, mode="head_groups", **kwargs)
    dilated_attention(q, k, v, mode="longnet", **kwargs)
    assert resolve_executor("auto", q).name == "sdpa"
    assert resolve_step_executor("auto", q).name == "sdpa"
    assert seen == [("head_groups", True), ("longnet", True), ("longnet", True), ("longnet", False)]


def test_timed_selection_reads_the_stored_winner_and_falls_back_to_the_rule(tmp_path, monkeypatch):
    """select_backend(timed=True) reads what bench.selection stored: a runnable stored winner for the key,
    else the rule (unknown key, an unknown or unrunnable name, dense blocks, a broken file)."""
    monkeypatch.setenv("HILBERT_LAB_CACHE_DIR", str(tmp_path))
    shape, lengths, rates = (1, 32, 2, 8), [8, 16], [1, 2]
    kwargs = dict(shape=shape, segment_lengths=lengths, dilation_rates=rates, timed=True)
    assert select_backend("cpu", torch.float32, **kwargs) == "sdpa"  # no file: the rule
    key = selection.selection_key("cpu", torch.float32, shape, lengths, rates)
    assert key == "cpu|torch.float32|(1, 32, 2, 8)|(8, 16)|(1, 2)|longnet|False"
    path = tmp_path / "backend_selection.json"
    path.write_text(json.dumps({key: "manual"}))
    assert select_backend("cpu", torch.float32, **kwargs) == "manual"
    assert select_backend("cpu", torch.float32, **{**kwargs, "causal": True}) == "sdpa"  # another key
    assert select_backend("cpu", torch.float32, **{**kwargs, "timed": False}) == "sdpa"
    assert select_backend("cpu", torch.float32, whole_pattern=False, **kwargs) == "sdpa"
    for stored in ("no_such_backend", "flash"):  # unknown; cannot run on the CPU
        path.write_text(json.dumps({key: stored, "padding": "x" * len(stored)}))
        assert select_backend("cpu", torch.float32, **kwargs) == "sdpa", stored
    path.write_text("{not json")
    assert select_backend("cpu", torch.float32, **kwargs) == "sdpa"
    with pytest.raises(ValueError, match="shape"):
        select_backend("cpu", torch.float32, timed=True)


# Every head dim class the engine takes (it takes any D >= 1): small, odd, multiples of 8 and not, the CUDA
# kernels' limits 128 and 256 and either side of them, and far beyond.
HEAD_DIMS = sorted(set(range(1, 41)) | {48, 60, 64, 72, 96, 100, 120, 127, 128, 129, 136, 192, 200, 248, 255, 256,
                                         257, 264, 320, 512, 4096})


def test_executors_declare_the_head_dims_their_kernels_take():
    """The CUDA SDPA kernels (flash, cuDNN, efficient) take D multiple of 8 up to 256 (cuDNN here up to 128), the
    CPU flash kernel and the eager ones any D, the fused kernel any D up to 256, FlashAttention-4 multiples of 8 up
    to 256; unavailable_reason names the head dim."""
    from hilbert_lab.attention.executors import EXECUTORS, unavailable_reason

    def takes(name, device_type):
        return [d for d in HEAD_DIMS if EXECUTORS[name].capabilities.takes_head_dim(d, device_type)]

    multiples_of_8 = [d for d in HEAD_DIMS if d % 8 == 0 and d <= 256]
    for name in ("sdpa", "sdpa_flash", "sdpa_efficient", "fa4", "flash"):
        assert takes(name, "cuda") == multiples_of_8, name
    assert takes("sdpa_cudnn", "cuda") == [d for d in multiples_of_8 if d <= 128]
    assert takes("triton", "cuda") == [d for d in HEAD_DIMS if d <= 256]
    for name in ("sdpa", "sdpa_flash", "sdpa_math", "manual", "reference"):
        assert takes(name, "cpu") == HEAD_DIMS, name
    for name in ("manual", "reference", "sdpa_math"):
        assert takes(name, "cuda") == HEAD_DIMS, name
    assert takes("sdpa", None) == multiples_of_8  # on every device it runs on
    assert unavailable_reason("sdpa", "cpu", torch.bfloat16, 4) is None
    reason = EXECUTORS["sdpa"].unavailable_reason(None, torch.bfloat16, 4)
    assert reason == "head dim must be a multiple of 8 up to 256; got 4"


def test_auto_picks_an_executor_that_declares_the_head_dim():
    """For every head dim the engine takes and every combination of the facts the rules read (GPU architecture,
    dtype, which optional kernels run, mode, N, training, whether the in-place buffers fit: stand-ins, so no GPU is
    needed), auto's executor declares that head dim on the device."""
    from hilbert_lab.attention.executors import EXECUTORS

    facts = itertools.product([(7, 5), (8, 0), (8, 9), (9, 0), (10, 0)],
                              [torch.bfloat16, torch.float16, torch.float32, torch.float64],
                              [False, True], [False, True], [False, True], ["longnet", "head_groups"], [8192, 65536],
                              [False, True], [True, False])
    for capability, dtype, triton_ok, flash_ok, fa4_ok, mode, seq_len, training, fits in facts:
        for head_dim in HEAD_DIMS:
            name = selection.rule_for("cuda", capability, dtype, triton_ok=triton_ok, flash_ok=flash_ok,
                                      fa4_ok=fa4_ok, mode=mode, seq_len=seq_len, head_dim=head_dim,
                                      training=training, inplace_fits=fits)
            assert EXECUTORS[name].capabilities.takes_head_dim(head_dim, "cuda"), (name, capability, dtype, head_dim)
    for dtype, head_dim in itertools.product((torch.float32, torch.float64, torch.bfloat16), HEAD_DIMS):
        assert selection.rule_for("cpu", None, dtype, head_dim=head_dim) == "sdpa"  # the CPU flash kernel takes all


def test_auto_falls_back_where_the_head_dim_is_not_taken(monkeypatch):
    """select_backend on a stand-in Hopper with triton and flash-attn: the rule's choice where it takes D, else the
    fused kernel (whole patterns), else "sdpa", else "manual" (dense blocks: the ring's steps, decoding)."""
    monkeypatch.setattr(selection, "_cuda_facts", lambda device, dtype: ((9, 0), True, True, False))
    monkeypatch.setattr(selection, "_inplace_fits", lambda *args: True)

    def pick(head_dim, **kwargs):
        return select_backend("cuda", torch.bfloat16, shape=(1, 1024, 4, head_dim), segment_lengths=(256, 512),
                              **kwargs)

    assert [pick(d) for d in (4, 12, 64, 100, 128, 256, 264)] == ["triton"] * 6 + ["manual"]
    training = [pick(d, training=True) for d in (4, 12, 64, 100, 128, 256, 264)]
    assert training == ["triton", "triton", "triton", "triton", "sdpa", "sdpa", "manual"]
    dense = [pick(d, whole_pattern=False) for d in (4, 12, 64, 100, 128, 256, 264)]
    assert dense == ["manual", "manual", "flash", "manual", "flash", "flash", "manual"]
    assert select_backend("cuda", torch.bfloat16) == "triton"  # no shape: no head-dim rule
