"""The measurement kit: timing summaries, useful FLOPs from the plan, anchors against the oracle."""
from __future__ import annotations

import sys

import pytest
import torch

from hilbert_lab.attention import DilatedPattern, cached_plan, dilated_attention
from hilbert_lab.bench import anchors
from hilbert_lab.bench.flops import attention_flops, useful_pairs
from hilbert_lab.bench.timing import (MIN_BURST_CALLS, SIZING_CALLS, graphed, round_orders, summarize, time_function,
                                      time_interleaved, time_pair)


def test_summarize_orders_and_picks_percentiles():
    timing = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (timing.median, timing.low, timing.high) == (3.0, 1.0, 5.0)
    with pytest.raises(ValueError, match="samples_ms"):
        summarize([])


def test_time_function_counts_calls_and_rejects_bad_counts():
    calls = []
    timing = time_function(lambda: calls.append(1), warmup=2, repeats=5)
    assert len(calls) == 7 and len(timing.samples) == 5 and timing.median >= 0
    with pytest.raises(ValueError, match="repeats"):
        time_function(lambda: None, repeats=0)


def test_time_interleaved_runs_the_rounds_of_round_orders_and_restores_threads():
    calls: list[str] = []
    before = torch.get_num_threads()
    result = time_interleaved({name: (lambda name=name: calls.append(name)) for name in "abc"}, warmup=1, rounds=4,
                              threads=before + 1, max_seconds=float("inf"))  # another count than the current one
    assert calls == list("abc") + [name for order in round_orders(list("abc"), 4) for name in order]  # warm-up first
    assert calls[3:] == list("abc") + list("cba") + list("cab") + list("cba")
    assert {name: len(t.samples) for name, t in result.items()} == {"a": 4, "b": 4, "c": 4}
    assert all(s >= 0 for t in result.values() for s in t.samples)
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="rounds"):
        time_interleaved({"a": lambda: None}, rounds=0)
    with pytest.raises(ValueError, match="threads"):
        time_interleaved({"a": lambda: None}, threads=0)


def test_time_interleaved_measures_each_variant_not_its_neighbour():
    """A variant that sleeps 20 ms and one that returns at once: each median belongs to its own variant."""
    import time

    result = time_interleaved({"slow": lambda: time.sleep(0.02), "fast": lambda: None}, warmup=0, rounds=3)
    assert result["slow"].median >= 19.0 and result["fast"].median < 5.0


def test_time_interleaved_bursts_size_each_variant_from_its_warm_calls():
    """burst_ms: a sample is the median of a burst of calls lasting about burst_ms, sized per variant from the fastest
    of SIZING_CALLS calls after the warm-up (a 4 ms call gets 5 calls in 20 ms, a call of nothing the most)."""
    import time

    calls = {"slow": 0, "fast": 0}

    def variant(name, sleep_s):
        def call():
            calls[name] += 1
            time.sleep(sleep_s)
        return call

    result = time_interleaved({"slow": variant("slow", 0.004), "fast": variant("fast", 0.0)}, warmup=1, rounds=3,
                              burst_ms=20.0, max_seconds=float("inf"))
    assert 1 + SIZING_CALLS + 3 * 3 <= calls["slow"] <= 1 + SIZING_CALLS + 3 * 5  # warm-up, sizing, 3 bursts of ~5
    assert calls["fast"] > 100 and len(result["slow"].samples) == len(result["fast"].samples) == 3
    assert result["slow"].median >= 3.9 and result["fast"].median < 1.0
    with pytest.raises(ValueError, match="burst_ms"):
        time_interleaved({"a": lambda: None}, burst_ms=0)


def test_time_interleaved_sizes_bursts_past_a_slow_first_call():
    """A variant whose first call after the warm-up takes 120 ms (a CUDA graph region captures on a key's third
    call) and every later call 8 ms: its bursts of 40 ms hold about 5 calls, sized from its fastest sizing call, not
    one (which would give the fewest, MIN_BURST_CALLS)."""
    import time

    calls = []

    def call():
        calls.append(1)
        time.sleep(0.12 if len(calls) == 2 else 0.008)

    result = time_interleaved({"captures": call}, warmup=1, rounds=3, burst_ms=40.0, max_seconds=float("inf"))
    assert MIN_BURST_CALLS < 4 and 1 + SIZING_CALLS + 3 * 4 <= len(calls) <= 1 + SIZING_CALLS + 3 * 5
    assert 7.9 <= result["captures"].median < 40.0


def test_time_interleaved_bursts_hold_enough_calls_that_the_median_is_not_the_first():
    """A variant of 12 ms calls timed in bursts of 5 ms: each burst still holds MIN_BURST_CALLS calls, and where a
    burst's first call takes 40 ms (it waits for the host after the sync) the sample is the later calls' 12 ms."""
    import time

    calls = []
    before_bursts = 1 + SIZING_CALLS  # warm-up, then the sizing calls

    def call():
        calls.append(1)
        late = len(calls) - before_bursts
        time.sleep(0.04 if late > 0 and (late - 1) % MIN_BURST_CALLS == 0 else 0.012)

    result = time_interleaved({"v": call}, warmup=1, rounds=3, burst_ms=5.0, max_seconds=float("inf"))
    assert MIN_BURST_CALLS >= 3 and len(calls) == before_bursts + 3 * MIN_BURST_CALLS
    assert all(11.5 <= sample < 30.0 for sample in result["v"].samples)


def test_time_pair_gives_first_over_second_from_the_paired_rounds():
    """Two sleeps of 4 and 2 ms timed together: the ratio is the first's time over the second's (about 2), inside
    its interval, over exactly the asked rounds; anything but two variants is refused."""
    import time

    pair = time_pair({"slow": lambda: time.sleep(0.004), "fast": lambda: time.sleep(0.002)}, rounds=4, warmup=0,
                     burst_ms=10.0)
    assert pair["of"] == "slow / fast" and pair["rounds"] == 4 and len(pair["slow"]["samples"]) == 4
    assert 1.5 < pair["ratio"] < 2.5 and pair["interval"][0] <= pair["ratio"] <= pair["interval"][1]
    with pytest.raises(ValueError, match="two variants"):
        time_pair({"a": lambda: None})

def test_useful_pairs_count_the_pattern_by_brute_force():
    pattern = DilatedPattern.create([8, 16], [1, 2], mode="longnet", causal=True)
    mask = pattern.multiplicity(40, 3)  # (H, N, N): branch pairs per query/key
    assert useful_pairs(pattern, 40, 3) == int(mask.sum())
    assert attention_flops(pattern, 2, 40, 3, 16) == 4 * 16 * 2 * int(mask.sum())
    assert attention_flops(pattern, 2, 40, 3, 16, backward=True) == int(3.5 * 4 * 16 * 2 * int(mask.sum()))


@pytest.mark.parametrize("causal", [False, True])
def test_anchors_compute_the_pattern(causal):
    """The strided-view composition (head_groups) and the torchscale-style composition (longnet, weights
    under no_grad) compute the same outputs as the float64 oracle (forward)."""
    q, k, v = (torch.randn(2, 40, 6, 8, dtype=torch.float64) for _ in range(3))
    kw = dict(segment_lengths=[8, 16], dilation_rates=[1, 2], causal=causal)
    head_groups = DilatedPattern.create(kw["segment_lengths"], kw["dilation_rates"], mode="head_groups", causal=causal)
    expected = dilated_attention(q, k, v, mode="head_groups", backend="reference", **kw)
    got = anchors.strided_composition(q, k, v, head_groups, scale=8**-0.5, kernel="math")
    assert (got - expected).abs().max() < 1e-12
    blocks = anchors.gather_blocks(q, k, v, head_groups)
    assert sum(b[0].shape[0] * b[0].shape[2] for b in blocks) == 2 * sum(
        blk.count * blk.length * blk.num_heads for blk in cached_plan(head_groups, q.shape[1], q.shape[2]).blocks)
    with pytest.raises(ValueError, match="no merge"):
        anchors.strided_composition(q, k, v, DilatedPattern.create([8, 16], [1, 2]), scale=0.3)


def test_time_function_time_limit_stops_early_unless_infinite():
    assert len(time_function(lambda: None, warmup=0, repeats=6, max_seconds=0.0).samples) == 3
    assert len(time_function(lambda: None, warmup=0, repeats=6, max_seconds=float("inf")).samples) == 6


def test_environment_records_the_variables_that_change_results(monkeypatch):
    from hilbert_lab.bench.env import collect_environment, device_description, environment_variables

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("UNRELATED_VARIABLE_FOR_TEST", "x")
    found = environment_variables()
    assert found["OMP_NUM_THREADS"] == "3"
    assert "CUDA_VISIBLE_DEVICES" not in found and "UNRELATED_VARIABLE_FOR_TEST" not in found
    assert device_description("cpu")["device"] == "cpu"
    env = collect_environment("cpu")
    assert {"packages", "git", "cpu", "device", "variables"} <= set(env)
    assert env["packages"]["torch"] == torch.__version__.split("+")[0] or env["packages"]["torch"] == torch.__version__


def test_graphed_needs_a_cuda_device():
    with pytest.raises(ValueError, match="device must be a CUDA device"):
        graphed(lambda: None, device="cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CUDA graphs)")
def test_graphed_replays_the_kernels_on_new_data():
    x = torch.randn(1000, device="cuda")
    y = torch.empty_like(x)
    replay = graphed(lambda: torch.mul(x, 3, out=y), device="cuda")
    x.copy_(torch.arange(1000, device="cuda", dtype=x.dtype))
    replay()
    torch.cuda.synchronize()
    assert torch.equal(y, 3 * torch.arange(1000, device="cuda", dtype=x.dtype))


@pytest.mark.parametrize("causal", [False, True])
def test_fa4_floor_computes_head_groups_in_as_few_calls_as_the_fa4_executor(monkeypatch, causal):
    """The FlashAttention-4 floor (FA4 stood in for in float64) writes the head_groups output and gradients of the
    float64 reference wherever they are not zero, in the fa4 executor's own calls (a branch's offsets folded into
    one call)."""
    from attention._fa4_standin import CPU_FA4, install_fa4_standin

    install_fa4_standin(monkeypatch)
    interface = sys.modules["flash_attn.cute.interface"]
    shapes = []
    forward = interface._flash_attn_fwd

    def recorded(q, *args, **kwargs):
        shapes.append(q.shape)
        return forward(q, *args, **kwargs)

    monkeypatch.setattr(interface, "_flash_attn_fwd", recorded)
    gen = torch.Generator().manual_seed(3)
    q, k, v, grad = (torch.randn(2, 48, 12, 8, dtype=torch.float64, generator=gen) for _ in range(4))
    kw = dict(segment_lengths=[4, 8, 16], dilation_rates=[1, 2, 4], mode="head_groups", causal=causal)
    pattern = DilatedPattern.create(kw["segment_lengths"], kw["dilation_rates"], mode="head_groups", causal=causal)
    outs, grads = anchors.fa4_floor(q, k, v, pattern, scale=8**-0.5, grad_out=grad)
    floor_calls, shapes[:] = list(shapes), []
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = dilated_attention(*inputs, backend="reference", **kw)
    expected_grads = torch.autograd.grad(expected, inputs, grad)
    covered = expected != 0  # the floor leaves the rows a head's offset skips unwritten (torch.empty)
    assert (outs[0] - expected)[covered].abs().max() < 1e-12
    for got, want in zip(grads[0], expected_grads):
        assert (got - want)[want != 0].abs().max() < 1e-12 and (want != 0).float().mean() > 0.4
    with torch.no_grad():
        dilated_attention(q, k, v, backend=CPU_FA4, **kw)
    assert floor_calls == shapes and len(floor_calls) == 4
    assert anchors.fa4_floor(q, k, v, pattern, scale=8**-0.5)[1] is None


@pytest.mark.parametrize("mode, backward, wanted", [("head_groups", False, False), ("longnet", False, True),
                                                    ("head_groups", True, True)])
def test_fa4_floor_asks_for_lses_where_a_merge_or_the_backward_reads_them(monkeypatch, mode, backward, wanted):
    """The floor's forward writes the LSEs an exact result needs: for branches that merge (LongNet) or for the
    backward, not for head_groups alone (whose forward without a backward writes none in ours either)."""
    from attention._fa4_standin import install_fa4_standin

    install_fa4_standin(monkeypatch)
    interface = sys.modules["flash_attn.cute.interface"]
    asked = []
    forward = interface._flash_attn_fwd

    def recorded(*args, return_lse, **kwargs):
        asked.append(return_lse)
        return forward(*args, return_lse=return_lse, **kwargs)

    monkeypatch.setattr(interface, "_flash_attn_fwd", recorded)
    q, k, v, grad = (torch.randn(1, 32, 4, 8, dtype=torch.float64) for _ in range(4))
    pattern = DilatedPattern.create([4, 8], [1, 2], mode=mode, causal=True)
    anchors.fa4_floor(q, k, v, pattern, scale=8**-0.5, grad_out=grad if backward else None)
    assert asked and set(asked) == {wanted}


@pytest.mark.parametrize("count", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("rounds", [8, 12, 13])
def test_round_orders_put_each_name_after_every_other_alike(count, rounds):
    """Every round runs each name once; across the whole sequence of calls (a round's first call counts as following
    the round before's last) the ordered pairs (x right after y) differ in count by at most 1, and over an even
    number of rounds x follows y as often as y follows x."""
    from collections import Counter

    names = [chr(ord("a") + i) for i in range(count)]
    orders = round_orders(names, rounds)
    assert len(orders) == rounds and all(sorted(order) == names for order in orders)
    calls = [name for order in orders for name in order]
    pairs = Counter((x, y) for x, y in zip(calls, calls[1:]) if x != y)
    counts = [pairs[x, y] for x in names for y in names if x != y]
    assert max(counts) - min(counts) <= 1 and min(counts) >= 1, pairs
    if rounds % 2 == 0:
        assert all(pairs[x, y] == pairs[y, x] for x, y in pairs), pairs


@pytest.mark.parametrize("count", [7, 8, 11])
def test_round_orders_of_many_names_follow_a_williams_design(count):
    """From 7 names on (candidates: a Williams design's rows, rotations and their reversals): every name once per
    round, and over 2 x count rounds every name right after every other, the counts within 3 of each other."""
    from collections import Counter

    names = [f"n{i}" for i in range(count)]
    orders = round_orders(names, 2 * count)
    assert all(sorted(order) == sorted(names) for order in orders)
    calls = [name for order in orders for name in order]
    pairs = Counter((x, y) for x, y in zip(calls, calls[1:]) if x != y)
    counts = [pairs[x, y] for x in names for y in names if x != y]
    assert min(counts) >= 1 and max(counts) - min(counts) <= 3, sorted(counts)
    assert round_orders([], 3) == [[], [], []] and round_orders(["x"], 2) == [["x"], ["x"]]


def test_a_call_slowed_by_the_call_before_it_slows_both_of_a_pair_alike():
    """Two variants that each run 10 ms slower right after the other (as two calls of one executor on a GPU): with
    the orders balanced each is slowed in half its rounds and their means agree, where a plain rotation (a always
    right before b) slows only b."""
    import time

    last: list[str] = []

    def variant(name: str):
        def run():
            slow = bool(last) and last[-1] in "ab" and last[-1] != name
            time.sleep(0.011 if slow else 0.001)
            last.append(name)
        return run

    timings = time_interleaved({name: variant(name) for name in "abc"}, warmup=0, rounds=8,
                               max_seconds=float("inf"))
    means = {name: sum(timings[name].samples) / len(timings[name].samples) for name in "ab"}
    assert abs(means["a"] - means["b"]) < 3.0  # each slowed in 4 of 8 rounds; a plain rotation: b in 5, a in none
