"""GraphRegions: a region runs eagerly twice, is captured the third time its key is seen and replayed after, on whatever
its tensors hold then; other addresses, host reads, captures of the caller and the cache's size. On the CPU the same
policy runs with PyTorch's CUDA calls stood in for."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.kernels.graph_regions import GraphRegions


def _region(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor):
    def launch():
        temporary = a * 2.0 + b.sin()  # allocated inside the region
        out.copy_(temporary @ b.T)
    return launch


def _expected(a, b):
    return ((a.double() * 2 + b.double().sin()) @ b.double().T).float()


def test_off_cuda_every_run_is_eager_and_exact():
    regions = GraphRegions()
    a, b = torch.randn(8, 4), torch.randn(8, 4)
    out = torch.empty(8, 8)
    for _ in range(3):
        a.normal_()
        regions.run(("r",), (a, b, out), _region(a, b, out))
        torch.testing.assert_close(out, _expected(a, b))
    assert regions.counts == {"eager": 3, "captured": 0, "replayed": 0, "refused": 0} and not regions.graphs


def test_max_graphs_must_be_positive():
    with pytest.raises(ValueError, match="max_graphs"):
        GraphRegions(max_graphs=0)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CUDA graphs)")


@pytest.mark.gpu
@needs_cuda
def test_a_replay_computes_on_the_values_the_tensors_hold_now():
    regions = GraphRegions()
    gen = torch.Generator(device="cuda").manual_seed(0)
    a, b = (torch.randn(64, 32, device="cuda", generator=gen) for _ in range(2))
    out = torch.empty(64, 64, device="cuda")
    for _ in range(5):
        a.normal_(generator=gen)
        b.normal_(generator=gen)
        regions.run(("r",), (a, b, out), _region(a, b, out))
        torch.testing.assert_close(out, _expected(a, b), rtol=1e-4, atol=1e-4)
    assert regions.counts == {"eager": 2, "captured": 1, "replayed": 2, "refused": 0}


@pytest.mark.gpu
@needs_cuda
def test_other_addresses_or_keys_are_other_regions_and_the_oldest_graph_goes():
    regions = GraphRegions(max_graphs=1)
    a, b, c = (torch.randn(16, 8, device="cuda") for _ in range(3))
    out = torch.empty(16, 16, device="cuda")
    for _ in range(3):
        regions.run(("r",), (a, b, out), _region(a, b, out))
    assert len(regions.graphs) == 1
    for _ in range(3):  # c in a's place: a new key, eager twice, then captured; the cache keeps one graph
        regions.run(("r",), (c, b, out), _region(c, b, out))
        torch.testing.assert_close(out, _expected(c, b), rtol=1e-4, atol=1e-4)
    assert regions.counts["captured"] == 2 and len(regions.graphs) == 1
    regions.run(("other key",), (c, b, out), _region(c, b, out))
    assert regions.counts["eager"] == 5


@pytest.mark.gpu
@needs_cuda
def test_a_region_that_reads_a_device_value_on_the_host_stays_eager():
    regions = GraphRegions()
    a = torch.randn(32, device="cuda")
    out = torch.empty(32, device="cuda")

    def launch():
        out.copy_(a * float(a.abs().max()))  # a host read: not capturable

    for _ in range(4):
        a.normal_()
        regions.run(("host read",), (a, out), launch)
        torch.testing.assert_close(out, a * a.abs().max())
    assert regions.counts == {"eager": 4, "captured": 0, "replayed": 0, "refused": 1} and not regions.graphs
    assert "synchronizing" in next(iter(regions.reasons.values()))
    for _ in range(3):  # another region captures and replays as before
        regions.run(("r",), (a, out), lambda: out.copy_(a * 3))
    a.normal_()
    regions.run(("r",), (a, out), lambda: out.copy_(a * 3))
    torch.testing.assert_close(out, a * 3)
    assert regions.counts["replayed"] == 1


def _cuda_case():
    """A fresh cache and a region's inputs a, b (16, 8) and output (16, 16) on the GPU."""
    a, b = (torch.randn(16, 8, device="cuda") for _ in range(2))
    return GraphRegions(), a, b, torch.empty(16, 16, device="cuda")


@pytest.mark.gpu
@needs_cuda
def test_inside_the_callers_capture_the_launches_join_its_graph():
    regions, a, b, out = _cuda_case()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            regions.run(("r",), (a, b, out), _region(a, b, out))
    torch.cuda.current_stream().wait_stream(side)
    outer = torch.cuda.CUDAGraph()
    with torch.cuda.graph(outer):
        regions.run(("r",), (a, b, out), _region(a, b, out))
    a.normal_()
    outer.replay()
    torch.testing.assert_close(out, _expected(a, b), rtol=1e-4, atol=1e-4)
    assert regions.counts["eager"] == 3  # the first two sightings, and the run inside the caller's capture


@pytest.mark.gpu
@needs_cuda
def test_a_region_run_on_another_stream_is_another_region():
    """The current stream is part of a region's key: a capture made on one stream is not replayed on another."""
    regions, a, b, out = _cuda_case()
    for _ in range(3):
        regions.run(("r",), (a, b, out), _region(a, b, out))
    assert regions.counts["captured"] == 1
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        a.normal_()
        regions.run(("r",), (a, b, out), _region(a, b, out))
    torch.cuda.current_stream().wait_stream(side)
    assert regions.counts["replayed"] == 0 and regions.counts["eager"] == 3
    torch.testing.assert_close(out, _expected(a, b), rtol=1e-4, atol=1e-4)
    a.normal_()
    regions.run(("r",), (a, b, out), _region(a, b, out))
    assert regions.counts["replayed"] == 1
    torch.testing.assert_close(out, _expected(a, b), rtol=1e-4, atol=1e-4)


class _FakeGraph:
    """A CUDA graph stand-in: what the region launched while "capturing" runs again at each replay."""

    capturing: list = []

    def __init__(self):
        self.launches, self.pool = [], None

    def capture_begin(self, pool=None, capture_error_mode="global"):
        self.pool = pool
        _FakeGraph.capturing.append(self)

    def capture_end(self):
        _FakeGraph.capturing.pop()

    def replay(self):
        for launch in self.launches:
            launch()


@pytest.fixture
def fake_cuda(monkeypatch):
    """GraphRegions' CUDA calls on the CPU: a region's work is recorded while "capturing" and rerun per replay."""
    import hilbert_lab.kernels.graph_regions as module

    class Stream:
        cuda_stream = 7

        def __init__(self, *args):
            pass

        def wait_stream(self, other):
            pass

    pools = iter(range(1000))
    monkeypatch.setattr(module.GraphRegions, "_may_capture", lambda self, device: self.enabled)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(module, "_raw_stream", lambda index: Stream.cuda_stream)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: torch.no_grad())
    monkeypatch.setattr(torch.cuda, "device", lambda device: torch.no_grad())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, next(pools)))
    monkeypatch.setattr(module, "_synchronizes", lambda launch: launch() or getattr(launch, "reads_device", False))
    return module


def _recorded(a: torch.Tensor, out: torch.Tensor, factor: float):
    """A region out = a * factor whose capture records the work, as a CUDA graph holds launches, not values."""
    def work():
        out.copy_(a * factor)

    def launch():
        if _FakeGraph.capturing:
            _FakeGraph.capturing[-1].launches.append(work)
        else:
            work()
    return launch


def test_the_policy_eager_twice_then_captured_then_replayed(fake_cuda):
    regions = fake_cuda.GraphRegions()
    a, out = torch.randn(5), torch.empty(5)
    for _ in range(5):
        a.normal_()
        regions.run(("r",), (a, out), _recorded(a, out, 2.0))
        torch.testing.assert_close(out, a * 2)
    assert regions.counts == {"eager": 2, "captured": 1, "replayed": 2, "refused": 0}


def test_counting_gives_what_the_regions_did_inside_the_block_alone(fake_cuda):
    regions = fake_cuda.GraphRegions()
    a, out = torch.randn(5), torch.empty(5)
    regions.run(("r",), (a, out), _recorded(a, out, 2.0))  # before the block: eager once
    with regions.counting() as done:
        assert done == {"eager": 0, "captured": 0, "replayed": 0, "refused": 0}
        for _ in range(4):
            regions.run(("r",), (a, out), _recorded(a, out, 2.0))
    assert done == {"eager": 1, "captured": 1, "replayed": 2, "refused": 0}
    assert regions.counts == {"eager": 2, "captured": 1, "replayed": 2, "refused": 0}


def test_a_region_that_synchronizes_on_its_second_run_is_never_captured(fake_cuda):
    regions = fake_cuda.GraphRegions()
    a, out = torch.randn(5), torch.empty(5)
    launch = _recorded(a, out, 3.0)
    launch.reads_device = True
    for _ in range(4):
        a.normal_()
        regions.run(("r",), (a, out), launch)
        torch.testing.assert_close(out, a * 3)
    assert regions.counts == {"eager": 4, "captured": 0, "replayed": 0, "refused": 1} and not regions.graphs


def test_a_failed_capture_runs_eagerly_and_the_next_capture_takes_a_fresh_pool(fake_cuda):
    regions = fake_cuda.GraphRegions()
    a, out = torch.randn(5), torch.empty(5)
    calls = []

    def failing():
        calls.append(1)
        if _FakeGraph.capturing:
            raise RuntimeError("not capturable")
        out.copy_(a)

    for _ in range(4):
        regions.run(("failing",), (a, out), failing)
    assert regions.counts["refused"] == 1 and "not capturable" in next(iter(regions.reasons.values()))
    assert len(calls) == 5 and not regions._pools  # 2 eager, the capture, its eager rerun, then eager again
    for _ in range(4):
        a.normal_()
        regions.run(("r",), (a, out), _recorded(a, out, 1.5))
        torch.testing.assert_close(out, a * 1.5)
    assert regions.counts["replayed"] == 1 and len(regions._pools) == 1


def test_the_cache_keeps_max_graphs_and_a_disabled_cache_runs_eagerly(fake_cuda):
    regions = fake_cuda.GraphRegions(max_graphs=1)
    a, b, out = torch.randn(5), torch.randn(5), torch.empty(5)
    for x in (a, b):
        for _ in range(3):
            regions.run(("r",), (x, out), _recorded(x, out, 2.0))
    assert len(regions.graphs) == 1 and regions.counts["captured"] == 2
    regions.enabled = False
    regions.run(("r",), (a, out), _recorded(a, out, 5.0))
    torch.testing.assert_close(out, a * 5)
    assert regions.counts["replayed"] == 0


def test_addresses_that_alternate_between_steps_make_two_graphs_both_replayed(fake_cuda):
    """A loop that keeps one step's tensor into the next gets a step's addresses from two sets in turn: each set is
    a key of its own, captured on its third sighting (steps 5 and 6) and replayed on its values from then on."""
    regions = fake_cuda.GraphRegions()
    a, b, out = torch.randn(5), torch.randn(5), torch.empty(5)
    for step in range(10):
        x = a if step % 2 == 0 else b
        x.normal_()
        regions.run(("r",), (x, out), _recorded(x, out, 2.0))
        torch.testing.assert_close(out, x * 2)
    assert regions.counts == {"eager": 4, "captured": 2, "replayed": 4, "refused": 0} and len(regions.graphs) == 2


def test_a_key_dropped_from_the_cache_that_comes_back_is_captured_again_and_replayed(fake_cuda):
    """A steady loop's key evicted by a phase of other keys (an evaluation, other lengths) is captured again on its
    return and replayed on its values after, not left eager."""
    regions = fake_cuda.GraphRegions(max_graphs=1)
    a, b, out = torch.randn(5), torch.randn(5), torch.empty(5)
    for x in (a, b):  # a captured, then b's capture drops it
        for _ in range(3):
            regions.run(("r",), (x, out), _recorded(x, out, 2.0))
    with regions.counting() as done:
        for factor in (3.0, 4.0, 5.0):
            a.normal_()
            regions.run(("r",), (a, out), _recorded(a, out, factor))
            torch.testing.assert_close(out, a * 3.0)  # the capture's launches (factor 3), on a's values now
    assert done == {"eager": 0, "captured": 1, "replayed": 2, "refused": 0}
    assert not regions.reasons and len(regions.drops) == 2 and set(regions.drops.values()) == {1}


def test_a_key_dropped_more_than_max_recaptures_times_stays_eager(fake_cuda):
    """Two keys in turn through a cache of one graph: each is captured 1 + max_recaptures times, and a key dropped
    once more runs eagerly (on its values) instead of being captured again on every call."""
    regions = fake_cuda.GraphRegions(max_graphs=1, max_recaptures=1)
    a, b, out = torch.randn(5), torch.randn(5), torch.empty(5)
    for x in (a, b):
        for _ in range(3):
            regions.run(("r",), (x, out), _recorded(x, out, 2.0))
    for factor in (3.0, 4.0, 5.0, 6.0):
        for x in (a, b):
            x.normal_()
            regions.run(("r",), (x, out), _recorded(x, out, factor))
            # at factor 3 each is captured again (a's capture drops b, b's drops a a second time); after, a runs
            # eagerly on each call's factor and b replays its graph of factor 3 (the one graph in the cache)
            expected = factor if x is a and factor > 3.0 else 3.0
            torch.testing.assert_close(out, x * expected)
    assert regions.counts["captured"] == 4 and sorted(regions.drops.values()) == [1, 2]
    assert list(regions.reasons.values()) == ["dropped from the cache 2 times: more keys in use than max_graphs (1)"]


def test_max_recaptures_must_not_be_negative():
    with pytest.raises(ValueError, match="max_recaptures"):
        GraphRegions(max_recaptures=-1)


def test_keep_given_as_a_function_is_called_after_the_capture_and_kept_with_the_graph(fake_cuda):
    regions = fake_cuda.GraphRegions()
    a, out = torch.randn(5), torch.empty(5)
    cached = {}

    def launch():
        cached["metadata"] = torch.arange(3)  # what a capture reads from a cache
        _recorded(a, out, 2.0)()

    for _ in range(3):
        regions.run(("r",), (a, out), launch, keep=lambda: cached["metadata"])
    (graph, kept), = regions.graphs.values()
    assert kept is cached["metadata"]


def test_keys_seen_and_refused_stay_bounded(fake_cuda):
    regions = fake_cuda.GraphRegions(max_graphs=1)
    a, out = torch.randn(5), torch.empty(5)
    launch = _recorded(a, out, 3.0)
    launch.reads_device = True
    for index in range(10):
        for _ in range(2):
            regions.run(("r", index), (a, out), launch)
    assert len(regions.seen) <= 4 and len(regions.reasons) <= 4 and regions.counts["refused"] == 10
