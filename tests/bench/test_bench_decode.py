"""benchmarks/bench_decode.py's static-cache methods on the CPU (eager steps): the 8 left-padded rows give the tokens
each gives alone, and a step's bytes are the weights plus the key and value rows its branches see."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from hilbert_lab.attention.pattern import DilatedPattern
from hilbert_lab.attention.static_cache import keys_seen

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_decode.py"


def test_static_and_batch_methods_on_the_cpu(bench, tmp_path):
    out = tmp_path / "decode.json"
    args = bench.parse_args(["--device", "cpu", "--dim", "32", "--depth", "2", "--heads", "4", "--vocab", "32",
                             "--segment-lengths", "16,64", "--dilation-rates", "1,4", "--dtype", "fp32", "--steps", "6",
                             "--static", "128", "--batch", "128", "--contexts", "0", "--recompute", "0", "--dense", "0",
                             "--hf-dilated", "0", "--cache-backends", "", "--out", str(out)])
    report = bench.run(args, lambda data: out.write_text(json.dumps(data)))
    static, batch = report["results"]
    assert static["status"] == "ok" and batch["status"] == "ok", report["results"]
    assert batch["same_tokens_per_row"] == [True] * 8 and batch["lengths"] == [128 - 8 * i for i in range(8)]
    pattern = DilatedPattern.create([16, 64], [1, 4], causal=True)
    rows = statistics.mean(keys_seen(pattern, 4, p) for p in range(128 - 2 * 6 - 1, 128))  # both phases' steps
    assert static["steps_at"] == [128 - 2 * 6 - 1, 127] and static["key_rows_x_heads_per_layer"] == rows
    assert static["ms_per_token_synced"] > 0 and len(static["ahead_ms"]) == 6
    assert static["ms_per_token"] == pytest.approx(statistics.median(static["ahead_ms"]), abs=1e-4)
    assert static["kv_bytes"] == int(2 * rows * 8 * 4 * 2)  # keys and values, head dim 8, float32, 2 layers
    model = bench.longnet(args, 128, torch.device("cpu"))
    assert static["weight_bytes"] == sum(p.numel() * p.element_size() for p in model.parameters())
    assert static["cache_rows"] == 64 and "limit_ms" not in static  # no HBM bandwidth on the CPU
    assert json.loads(out.read_text())["results"] == report["results"]  # every finished result written


@pytest.mark.slow  # inductor's code generation for two step shapes: about a minute on a 2-core CPU
def test_the_compiled_batch_method_compiles_each_step_once(bench, tmp_path):
    """--compile-step: the batched rows and each row alone step through torch.compile (each row its own prompt
    length): one graph for the batched step and one for the one-row step, each with its greedy pick inside, not
    one per run; the rows give their own tokens."""
    args = bench.parse_args(["--device", "cpu", "--dim", "32", "--depth", "2", "--heads", "4", "--vocab", "32",
                             "--segment-lengths", "16,64", "--dilation-rates", "1,4", "--dtype", "fp32", "--steps", "6",
                             "--static", "0", "--batch", "128", "--contexts", "0", "--recompute", "0", "--dense", "0",
                             "--hf-dilated", "0", "--cache-backends", "", "--compile-step", "--out",
                             str(tmp_path / "decode.json")])
    (batch,) = bench.run(args, lambda data: None)["results"]
    assert batch["status"] == "ok" and batch["compile_step"], batch
    assert batch["same_tokens_per_row"] == [True] * 8
    assert batch["compiled_graphs"] == 2


def test_two_phases_time_the_host_running_ahead_then_each_token_waited_for(bench):
    """Gaps 4 warm, 3 ahead, 1 left out, 3 synced: each phase's median is of its own gaps."""
    synced, count = bench.two_phases(4, 3)
    assert list(synced) == [8, 9, 10, 11] and count == 12
    clock = bench.Clock(torch.device("cpu"), synced)
    gaps = [9.0] * 4 + [1.0, 2.0, 3.0] + [50.0] + [10.0, 20.0, 40.0]
    clock.times = [sum(gaps[:i]) for i in range(count)]
    medians = bench.phase_medians(clock, 4, 3)
    assert medians == {"ms_per_token": 2e3, "ms_per_token_min": 1e3, "ms_per_token_max": 3e3,
                       "ms_per_token_synced": 20e3, "ahead_ms": [1e3, 2e3, 3e3]}


@pytest.mark.parametrize("dilated", [False, True])
def test_filled_anchor_loop_on_a_prefilled_static_cache_gives_generates_tokens(bench, dilated):
    """The filled anchors' loop (explicit cache positions on transformers' StaticCache), after a real prefill of the
    cache, continues exactly as transformers' greedy generate with its static cache: the dense Llama, and the Llama
    on dilated attention through register(); --llama-intermediate sets its MLP width."""
    pytest.importorskip("transformers")
    args = bench.parse_args(["--device", "cpu", "--dim", "32", "--depth", "2", "--heads", "4", "--vocab", "32",
                             "--segment-lengths", "8,16", "--dilation-rates", "1,2", "--dtype", "fp32", "--steps", "6",
                             "--llama-intermediate", "40", "--out", "unused.json"])
    device = torch.device("cpu")
    model = bench.llama(args, 64, device, dilated=dilated)
    assert model.config.intermediate_size == 40
    assert getattr(model.config, "dilated_segment_lengths", None) == ([8, 16] if dilated else None)
    prompt = bench.prompt_of(args, 20, device)
    with torch.inference_mode():
        expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, min_new_tokens=6,
                                  do_sample=False, pad_token_id=0, cache_implementation="static")[:, 20:]
        cache = bench.dense_static_cache(model, 40)
        first = model(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(20),
                      use_cache=True).logits[:, -1:].argmax(-1)
        tokens = [first]
        bench.dense_steps(model, cache, first, 20, 5, tokens.append)
    assert torch.equal(torch.cat(tokens, 1), expected), (tokens, expected)


def test_kernel_kinds_name_each_part_of_a_step(bench):
    kinds = {"_partial_kernel": "decode", "_merge_kernel": "decode", "_gemv_kernel": "gemv",
             "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_bias_TNT": "gemm", "void cublasLt::splitKreduce_kernel<32>": "gemm",
             "triton_red_fused_add_native_layer_norm_view_9": "inductor",
             "void at::native::reduce_kernel<512, 1, ArgMaxOps>": "other", "Memcpy DtoD (Device -> Device)": "other"}
    assert {name: bench.kernel_kind(name) for name in kinds} == kinds


def test_profiled_clock_sums_kernels_per_token(bench, monkeypatch):
    """The summary over the profiled tokens: wall time between the clock's marks, the CUDA events' time per kind
    and per name (CPU events left out), the GPU's time without a kernel."""
    from types import SimpleNamespace

    monkeypatch.setattr(bench.torch.profiler, "profile", lambda **kwargs: SimpleNamespace(start=None, stop=None))
    clock = bench.ProfiledClock(torch.device("cpu"), start=2, count=2)
    clock.times = [0.0, 1.0, 1.004, 1.010, 2.0]  # profiling from the mark of token 1 to that of token 3: 10 ms
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(name, us, device=cuda):
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(elapsed_us=lambda: us))

    events = [event("_gemv_kernel", 1000), event("_gemv_kernel", 1000), event("_partial_kernel", 3000),
              event("triton_poi_fused_gelu_6", 1000), event("aten::mm", 9000, cpu)]
    clock.profiler = SimpleNamespace(events=lambda: events)
    summary = clock.summary()
    assert summary["tokens"] == 2 and summary["wall_ms_per_token"] == pytest.approx(5.0)
    assert summary["kernel_ms_per_token"] == pytest.approx(3.0) and summary["idle_ms_per_token"] == pytest.approx(2.0)
    assert summary["kinds"] == {"decode": {"kernels_per_token": 0.5, "ms_per_token": pytest.approx(1.5)},
                                "gemv": {"kernels_per_token": 1.0, "ms_per_token": pytest.approx(1.0)},
                                "inductor": {"kernels_per_token": 0.5, "ms_per_token": pytest.approx(0.5)}}
    assert [row["name"] for row in summary["dearest"]] == ["_partial_kernel", "_gemv_kernel", "triton_poi_fused_gelu_6"]


def test_profile_tokens_are_refused_below_zero(bench, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(["--profile-tokens", "-1", "--out", "unused.json"])
    assert stop.value.code == 2 and "--profile-tokens must be >= 0" in capsys.readouterr().err


def test_warm_tokens_are_refused_below_four(bench, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(["--warm-tokens", "3", "--out", "unused.json"])
    assert stop.value.code == 2 and "--warm-tokens must be >= 4" in capsys.readouterr().err


def test_chunk_method_times_a_chunk_beside_its_steps(bench, tmp_path):
    """--chunk: a chunk of tokens after a filled context and its one-token steps, both timed; their logits agree
    (float32 on the CPU)."""
    out = tmp_path / "decode.json"
    args = bench.parse_args(["--device", "cpu", "--dim", "32", "--depth", "2", "--heads", "4", "--vocab", "32",
                             "--segment-lengths", "16,64", "--dilation-rates", "1,4", "--dtype", "fp32",
                             "--static", "0", "--batch", "0", "--contexts", "0", "--recompute", "0", "--dense", "0",
                             "--hf-dilated", "0", "--cache-backends", "", "--chunk", "100", "--chunk-tokens", "37",
                             "--out", str(out)])
    (entry,) = bench.run(args, lambda data: out.write_text(json.dumps(data)))["results"]
    assert entry["method"] == "longnet_static_chunk" and entry["status"] == "ok", entry
    assert entry["chunk_tokens"] == 37 and entry["chunk_s"] > 0 and entry["steps_s"] > 0
    assert entry["max_logit_difference"] < 1e-4
    with pytest.raises(SystemExit):
        bench.parse_args(["--chunk-tokens", "1", "--out", "unused.json"])
