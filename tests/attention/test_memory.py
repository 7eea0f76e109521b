"""estimate_memory: agrees with measured CPU peaks (fresh subprocesses) within 20%, and behaves sensibly."""
from __future__ import annotations

import pytest

from hilbert_lab.bench.cases import CASE_TARGET, normalize_case, worker_env
from hilbert_lab.attention.memory import MemoryConfig, estimate_memory
from hilbert_lab.bench.isolate import run_isolated
from hilbert_lab.bench.measure import reset_cpu_peak

MEASURED_CASES = [
    # manual, LSE merge of 2 branches, several score chunks
    {"backend": "manual", "seq_len": 8192, "segment_lengths": [512, 1024], "dilation_rates": [1, 2],
     "num_heads": 4, "head_dim": 32},
    # manual float64, causal, ragged N with B=2 (block reads are copies)
    {"backend": "manual", "seq_len": 3000, "batch_size": 2, "segment_lengths": [256, 512], "dilation_rates": [1, 2],
     "num_heads": 4, "head_dim": 32, "dtype": "float64", "causal": True},
    # sdpa (CPU flash kernel), 3 branches, Hilbert layout
    {"backend": "sdpa", "seq_len": 8192, "segment_lengths": [1024, 2048, 4096], "dilation_rates": [1, 2, 4],
     "num_heads": 8, "head_dim": 64, "ordering": "hilbert"},
    # sdpa, two undilated branches: the merge runs while a full-size block output is still alive
    {"backend": "sdpa", "seq_len": 8192, "segment_lengths": [1024, 4096], "dilation_rates": [1, 1],
     "num_heads": 8, "head_dim": 64},
    # sdpa, head_groups (no merge), ragged N
    {"backend": "sdpa", "seq_len": 6000, "batch_size": 2, "segment_lengths": [512, 1024, 2048],
     "dilation_rates": [1, 2, 4], "num_heads": 6, "head_dim": 64, "mode": "head_groups"},
]


@pytest.mark.skipif(not reset_cpu_peak(), reason="needs /proc/self/clear_refs to measure a CPU peak")
@pytest.mark.parametrize("params", MEASURED_CASES, ids=lambda p: f"{p['backend']}-N{p['seq_len']}")
def test_estimate_within_20_percent_of_measured_cpu_peak(params):
    case = normalize_case({"kind": "memory", "threads": 1, **params})
    outcome = run_isolated(CASE_TARGET, case, timeout_s=600, env=worker_env(case))
    assert outcome.ok, (outcome.status, outcome.error, outcome.stderr_tail)
    result = outcome.result
    estimate = estimate_memory(MemoryConfig.from_case(case))
    assert result["estimated_forward_bytes"] == estimate.forward_bytes  # the worker used the same model
    for measured, estimated in ((result["forward_peak_bytes"], estimate.forward_bytes),
                                (result["forward_backward_peak_bytes"], estimate.forward_backward_bytes)):
        assert measured > 8 << 20, "case too small to measure"
        assert 0.8 <= estimated / measured <= 1.2, (estimated, measured)


def _estimate(**fields):
    base = dict(seq_len=1 << 16, num_heads=8, head_dim=64, segment_lengths=(2048, 4096), dilation_rates=(1, 2),
                backend="sdpa")
    base.update(fields)
    return estimate_memory(MemoryConfig(**base))


def test_estimate_scales_linearly_in_sequence_length_for_fixed_segments():
    small, large = _estimate(seq_len=1 << 16), _estimate(seq_len=1 << 18)
    assert large.forward_bytes == 4 * small.forward_bytes
    assert large.forward_backward_bytes == 4 * small.forward_backward_bytes
    assert large.inputs_bytes == 4 * small.inputs_bytes == 4 * 3 * (1 << 16) * 8 * 64 * 4


def test_merge_free_head_groups_and_fused_kernels_need_less():
    longnet, head_groups = _estimate(mode="longnet"), _estimate(mode="head_groups")
    assert head_groups.forward_bytes < longnet.forward_bytes
    fused, eager = _estimate(backend="sdpa"), _estimate(backend="manual")
    assert fused.forward_bytes <= eager.forward_bytes  # both may be bounded by the LSE merge
    assert fused.forward_backward_bytes < eager.forward_backward_bytes
    assert _estimate(dtype="bfloat16").inputs_bytes * 2 == _estimate(dtype="float32").inputs_bytes
    training = _estimate()
    assert training.forward_backward_bytes > training.forward_bytes
    assert training.total_forward_backward_bytes == training.inputs_bytes + training.forward_backward_bytes


def test_ring_per_rank_estimate_shrinks_with_world_size():
    full = _estimate(seq_len=1 << 18)
    per_rank = _estimate(seq_len=1 << 18, world_size=8)
    assert per_rank.per_rank and per_rank.inputs_bytes * 8 == full.inputs_bytes
    assert per_rank.forward_backward_bytes < full.forward_backward_bytes


@pytest.mark.parametrize("fields, name", [
    ({"dtype": "int8"}, "dtype"), ({"backend": "magic"}, "backend"), ({"mode": "sparse"}, "mode"),
    ({"seq_len": 0}, "seq_len"), ({"world_size": 3}, "world_size"), ({"head_dim": -1}, "head_dim"),
    ({"segment_lengths": (4,), "dilation_rates": (8,)}, "dilation_rates"), ({"executor": "fused"}, "executor"),
])
def test_estimate_rejects_bad_configs_naming_the_field(fields, name):
    with pytest.raises(ValueError, match=name):
        _estimate(**fields)


@pytest.mark.parametrize("seq_len, batch, heads, segments, dilations, mode", [
    (3000, 2, 4, (256, 512), (1, 2), "longnet"), (6000, 2, 6, (512, 1024, 2048), (1, 2, 4), "head_groups"),
    (100, 1, 5, (64, 256), (2, 3), "longnet"), (77, 3, 7, (8, 16, 32), (1, 2, 4), "head_groups"),
])
def test_estimator_blocks_match_the_pattern_groups(seq_len, batch, heads, segments, dilations, mode):
    """The estimator's blocks (from the public plan) are the pattern's groups split into runs."""
    from hilbert_lab.attention.pattern import DilatedPattern
    from hilbert_lab.attention.memory_blocks import engine_blocks

    config = MemoryConfig(seq_len=seq_len, batch_size=batch, num_heads=heads, segment_lengths=segments,
                          dilation_rates=dilations, mode=mode)
    expected = []
    for group in DilatedPattern.create(segments, dilations, mode=mode).groups(seq_len, heads):
        full = seq_len // group.segment_length
        rows = group.index[:full] if full else group.index[:0]
        if full:
            expected.append((batch * full, int(rows.shape[1]), len(group.heads)))
        if seq_len % group.segment_length:
            ragged = int((group.index[-1] >= 0).sum())
            if ragged:
                expected.append((batch, ragged, len(group.heads)))
    blocks, _ = engine_blocks(config, seq_len)
    assert sorted((b.batch, b.length, b.heads) for b in blocks) == sorted(expected)


@pytest.mark.parametrize("seq_len, batch, segments, dilations", [
    (64, 2, (16, 32), (1, 2)), (70, 2, (16, 32), (1, 2)), (70, 1, (16, 32), (1, 2)), (40, 3, (8, 64), (2, 4)),
])
def test_estimator_copies_exactly_the_blocks_the_engine_copies(seq_len, batch, segments, dilations):
    """Block.copied (memory_blocks) is whether Block.read of a contiguous (B, N, H, D) input returns a copy."""
    import torch

    from hilbert_lab.attention import DilatedPattern, cached_plan
    from hilbert_lab.attention.memory_blocks import engine_blocks

    config = MemoryConfig(seq_len=seq_len, batch_size=batch, num_heads=4, head_dim=8, segment_lengths=segments,
                          dilation_rates=dilations)
    x = torch.zeros(batch, seq_len, 4, 8)
    plan = cached_plan(DilatedPattern.create(segments, dilations), seq_len, 4)
    engine = [blk.read(x).untyped_storage().data_ptr() != x.untyped_storage().data_ptr() for blk in plan.blocks]
    blocks, _ = engine_blocks(config, seq_len)
    assert [b.copied for b in blocks] == engine
    assert any(engine) == (batch > 1 and seq_len % segments[0] != 0)  # only runs before a ragged tail, B > 1


def test_estimate_of_a_billion_tokens_is_cheap():
    """No O(N) index tensors: estimating N = 2^30 must not allocate gigabytes (it would OOM the runner)."""
    from hilbert_lab.bench.measure import PeakMeter

    with PeakMeter("cpu") as meter:
        estimate = _estimate(seq_len=1 << 30, backend="manual")
    assert meter.peak_bytes < 64 << 20
    assert estimate.inputs_bytes == 3 * (1 << 30) * 8 * 64 * 4


@pytest.mark.skipif(not reset_cpu_peak(), reason="needs /proc/self/clear_refs to measure a CPU peak")
def test_ring_per_rank_estimate_matches_two_gloo_ranks(tmp_path):
    """benchmarks/validate_memory.py --ring 2 on the case whose second branch spans both ranks."""
    import json
    import os
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "ring.json"
    proc = subprocess.run([sys.executable, os.path.join(repo, "benchmarks", "validate_memory.py"), "--ring", "2",
                           "--cases", "1", "--timeout", "300", "--out", str(out)],
                          cwd=repo, capture_output=True, text=True, timeout=600)
    assert out.exists(), proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["status"] == "ok", row["error"]
    assert row["params"]["world_size"] == 2 and row["params"]["segment_lengths"][1] > row["params"]["seq_len"] // 2
    assert 0.8 <= row["ratio_forward"] <= 1.2 and 0.8 <= row["ratio_forward_backward"] <= 1.2, row


def test_ring_estimate_rejects_segments_that_do_not_tile_shards():
    with pytest.raises(ValueError, match="segment_lengths"):
        _estimate(seq_len=1 << 16, world_size=4, segment_lengths=(3072,), dilation_rates=(1,))


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["sdpa", "manual"])
def test_estimate_within_20_percent_of_cuda_max_memory_allocated(backend):
    """GPU variant: torch.cuda.max_memory_allocated over the inputs, in a fresh subprocess."""
    case = normalize_case({"kind": "memory", "backend": backend, "device": "cuda", "dtype": "bfloat16",
                           "seq_len": 16384, "batch_size": 2, "num_heads": 8, "head_dim": 64,
                           "segment_lengths": [2048, 4096], "dilation_rates": [1, 2]})
    outcome = run_isolated(CASE_TARGET, case, timeout_s=600, env=worker_env(case))
    assert outcome.ok, (outcome.status, outcome.error, outcome.stderr_tail)
    estimate = estimate_memory(MemoryConfig.from_case(case))
    assert 0.8 <= estimate.forward_bytes / outcome.result["forward_peak_bytes"] <= 1.2
    assert 0.8 <= estimate.forward_backward_bytes / outcome.result["forward_backward_peak_bytes"] <= 1.2


def test_cuda_sdpa_flash_backward_terms_match_hand_computation():
    """The CUDA-only backward terms of the block executor (reports/results/memory_estimate_gpu_h100.json,
    longnet row N=16384, measured before the engine ran "sdpa" in place).

    Largest backward block: branch 0 (w=2048, r=1, all 12 heads), 2 * 8 segments -> size = B*N*H*D = T.
    CUDA flash backward of that block: 5 adapter .contiguous() copies (dO, q, k, v, out) + 2 aten
    copies (dO, out) in bf16, a float32 dQ accumulator (T * 4) and softmax_d (16 * 12 * 2048 * 4),
    on top of the 3 bf16 gradient outputs and the block's float32 LSE (the CPU kernel takes strided
    inputs and keeps no such buffers).
    """
    from hilbert_lab.attention.memory_blocks import Block, cuda_fused_backward_work

    fields = dict(seq_len=16384, batch_size=2, num_heads=12, head_dim=64, segment_lengths=(2048, 4096, 8192),
                  dilation_rates=(1, 2, 4), mode="longnet", dtype="bfloat16", backend="sdpa", executor="blocks")
    tokens = 2 * 16384 * 12 * 64
    block_rows = 16 * 12 * 2048  # (B * segments, h, L) of the block
    cuda_work = 7 * tokens * 2 + tokens * 4 + block_rows * 4
    cuda = estimate_memory(MemoryConfig(device="cuda", **fields))
    cpu = estimate_memory(MemoryConfig(device="cpu", **fields))
    block_io = 3 * tokens * 2 + block_rows * 4
    assert cpu.forward_backward_bytes < cuda.forward_backward_bytes  # no copies/accumulators on the CPU
    assert cuda.breakdown["forward_backward"]["largest_block"] == block_io + cuda_work
    kept, accumulators = tokens * 2 + 2 * 12 * 16384 * 4, 3 * tokens * 4
    assert cuda.forward_backward_bytes == kept + accumulators + block_io + cuda_work == 961_019_904
    assert 0.8 <= cuda.forward_backward_bytes / 1_013_455_872 <= 1.2  # measured on the H100

    # ragged length: the kernel's buffers are rounded up to 128 rows
    block = Block(batch=3, length=1000, heads=4, copied=False)
    config = MemoryConfig(seq_len=3000, device="cuda", dtype="float16", head_dim=64, backend="sdpa")
    size = 3 * 1000 * 4 * 64
    assert cuda_fused_backward_work(block, config, "sdpa") == 7 * size * 2 + 3 * 4 * 1024 * (64 + 1) * 4
    assert cuda_fused_backward_work(block, config, "flex") == size * 4


# ---------------------------------------------------------------- the in-place executor's buffers

def _allocation_peak(fn) -> int:
    """Peak bytes of CPU allocations above the start while fn runs (the profiler's memory events)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for event in events:
        live += event.nbytes()
        peak = max(peak, live)
    return peak


def _cuda_kernel_stand_ins(monkeypatch, kernel: str) -> None:
    """Run attention.inplace on the CPU with stand-ins for the CUDA calls that allocate what those calls
    allocate: the forward's output (input dtype) and LSE (float32; cuDNN only when asked), the backward's
    three gradients and its workspace (cuDNN: the float32 dQ accumulator of the call; flash: packed
    (B, L, h, D) copies of dO and out, dQ accumulator and softmax_d over L rounded up to 128), and the
    fused Triton merge (writes into buffers the executor made). Values are not computed."""
    import torch

    from hilbert_lab.attention import engine, inplace

    def forward(name, q, k, v, causal, scale, need_lse=True):
        lse = torch.empty(q.shape[:3], dtype=torch.float32) if need_lse or name == "flash" else None
        return torch.empty(q.shape, dtype=q.dtype), lse, (None,) * 6

    def backward(name, grad_out, q, k, v, out, lse, aux, causal, scale):
        batch, heads, length, dim = q.shape
        if name == "cudnn":
            workspace = [torch.empty(q.shape, dtype=torch.float32)]
        else:
            rounded = -(-length // 128) * 128
            workspace = [grad_out.transpose(1, 2).contiguous(), out.transpose(1, 2).contiguous(),
                         torch.empty((batch, rounded, heads, dim), dtype=torch.float32),
                         torch.empty((batch, heads, rounded), dtype=torch.float32)]
        shares = tuple(torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v))
        del workspace
        return shares

    monkeypatch.setattr(inplace, "_forward_kernel", forward)
    monkeypatch.setattr(inplace, "_backward_kernel", backward)
    monkeypatch.setattr(inplace.triton_merge, "HAVE_TRITON", True)
    monkeypatch.setattr(inplace, "FUSED_MERGE_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(inplace.triton_merge, "merge_partials", lambda *args: None)
    monkeypatch.setattr(engine, "inplace_kernel", lambda name, q: kernel)


INPLACE_CASES = [
    # longnet, two branches merged, B = 2 with a ragged tail: runs before it are one call per batch element
    dict(seq_len=1000, batch_size=2, num_heads=4, segment_lengths=(256, 512), dilation_rates=(1, 2)),
    # head_groups (no merge), ragged: the broadcast LSE row is copied for each unit split by batch
    dict(seq_len=1000, batch_size=2, num_heads=6, segment_lengths=(128, 256, 512), dilation_rates=(1, 2, 4),
         mode="head_groups"),
    # B = 1, offsets of a branch grouped into one view (2 heads per offset < 4 offsets), merged
    dict(seq_len=2048, batch_size=1, num_heads=8, segment_lengths=(512, 1024), dilation_rates=(1, 4)),
    # a single branch (no merge), causal
    dict(seq_len=1536, batch_size=3, num_heads=2, segment_lengths=(512,), dilation_rates=(2,), causal=True),
]


@pytest.mark.parametrize("kernel", ["cudnn", "flash"])
@pytest.mark.parametrize("fields", INPLACE_CASES, ids=lambda f: f"{f.get('mode', 'longnet')}-B{f['batch_size']}-N{f['seq_len']}")
def test_inplace_estimate_counts_the_buffers_the_executor_allocates(monkeypatch, fields, kernel):
    """The in-place model against the allocations of attention.inplace's own code (CPU, bf16, stand-ins
    for the CUDA kernels): forward without LSE (inference) and forward+backward, exactly."""
    import torch

    from hilbert_lab.attention import dilated_attention

    _cuda_kernel_stand_ins(monkeypatch, kernel)
    config = MemoryConfig(head_dim=64, dtype="bfloat16", device="cuda", backend=f"sdpa_{kernel}",
                          executor="inplace", **fields)
    estimate = estimate_memory(config)
    assert estimate.executor == "inplace"
    shape = (config.batch_size, config.seq_len, config.num_heads, config.head_dim)
    q, k, v = (torch.randn(shape, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    upstream = torch.randn(shape, dtype=torch.bfloat16)
    kwargs = dict(segment_lengths=config.segment_lengths, dilation_rates=config.dilation_rates, mode=config.mode,
                  causal=config.causal, backend="sdpa")

    def training():
        dilated_attention(q, k, v, **kwargs).backward(upstream)

    def inference():
        with torch.no_grad():
            dilated_attention(q, k, v, **kwargs)

    training()  # plan and view geometry cached, as after a warm-up
    q.grad = k.grad = v.grad = None
    forward = _allocation_peak(inference)
    forward_backward = _allocation_peak(training)  # the gradients left in q.grad, k.grad, v.grad count
    assert (forward, forward_backward) == (estimate.forward_bytes, estimate.forward_backward_bytes), estimate.breakdown


def test_inplace_estimate_by_hand_for_one_small_plan():
    """One branch w = N = 1024, r = 1, H = 4, B = 2, D = 64, bf16, cuDNN: one call on (2, 4, 1024, 64)."""
    config = MemoryConfig(seq_len=1024, batch_size=2, num_heads=4, head_dim=64, segment_lengths=(1024,),
                          dilation_rates=(1,), dtype="bfloat16", device="cuda", backend="sdpa_cudnn")
    estimate = estimate_memory(config)
    tokens, rows = 2 * 1024 * 4 * 64, 2 * 1024 * 4
    assert estimate.executor == "inplace"
    # forward, no LSE wanted: the output buffer, the kernel's output (then copied into it) and the one
    # float32 -inf row that stands in for the LSE buffer
    assert estimate.forward_bytes == 2 * tokens * 2 + 4
    # training forward: + LSE buffer and the kernel's LSE; backward: out + lse kept, dq/dk/dv in bf16,
    # packed dO/out/LSE, three shares and the float32 dQ workspace of the one call
    backward = (tokens * 2 + rows * 4) + 3 * tokens * 2 + (2 * tokens * 2 + rows * 4 + 3 * tokens * 2 + tokens * 4)
    assert estimate.forward_backward_bytes == backward
    blocks = estimate_memory(MemoryConfig(**{**config.__dict__, "executor": "blocks"}))
    assert blocks.executor == "blocks" and blocks.forward_backward_bytes > estimate.forward_backward_bytes


@pytest.mark.parametrize("fields", [
    dict(device="cpu", dtype="bfloat16"), dict(device="cuda", dtype="float32"), dict(device="cuda", backend="manual"),
    dict(device="cuda", ordering="hilbert"), dict(device="cuda", head_dim=60), dict(world_size=2),
])
def test_inplace_executor_only_where_the_engine_runs_it(fields):
    base = dict(seq_len=4096, num_heads=4, head_dim=64, dtype="bfloat16", backend="sdpa", executor="inplace")
    with pytest.raises(ValueError, match="executor"):
        estimate_memory(MemoryConfig(**{**base, **fields}))
    auto = estimate_memory(MemoryConfig(**{**base, **fields, "executor": "auto"}))
    assert auto.executor == "blocks"


@pytest.mark.parametrize("name, dtype, head_dim, capability, cudnn, expected", [
    ("sdpa", "bfloat16", 64, (9, 0), True, "cudnn"), ("sdpa", "float16", 128, (9, 0), False, "flash"),
    ("sdpa", "bfloat16", 192, (9, 0), True, "flash"), ("sdpa", "bfloat16", 64, (8, 0), True, "flash"),
    ("sdpa_cudnn", "bfloat16", 256, (9, 0), True, None), ("sdpa_flash", "bfloat16", 256, (9, 0), True, "flash"),
    ("sdpa", "float32", 64, (9, 0), True, None), ("sdpa", "bfloat16", 60, (9, 0), True, None),
    ("sdpa", "bfloat16", 64, (7, 5), True, None), ("sdpa_efficient", "bfloat16", 64, (9, 0), True, None),
    ("flash", "bfloat16", 64, (9, 0), True, None), ("manual", "bfloat16", 64, (9, 0), True, None),
])
def test_inplace_kernel_choice_without_a_device(name, dtype, head_dim, capability, cudnn, expected):
    """attention.inplace.kernel_for: the engine's in-place kernel choice, which the estimate reads."""
    import torch

    from hilbert_lab.attention.inplace import kernel_for

    assert kernel_for(name, getattr(torch, dtype), head_dim, capability, cudnn) == expected
