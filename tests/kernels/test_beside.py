"""kernels.beside: work run beside the current stream. On the GPU a fill of exactly the entries a long kernel does
not write runs beside it (eagerly and inside a captured CUDA graph, replayed on new values) and, once joined, every
entry holds what the two wrote, as in line; elsewhere `run` calls in line."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.kernels import beside as beside_module
from hilbert_lab.kernels.beside import Beside


def test_run_in_line_off_the_gpu():
    x = torch.ones(4, 3)
    side = Beside(x.device)
    assert side.run(torch.Tensor.mul_, x, 2.0) is x  # the call's own value, made before run returns
    side.join()
    assert torch.equal(x, torch.full((4, 3), 2.0))


def _write_both(x: torch.Tensor, source: torch.Tensor, side: Beside) -> None:
    """Even rows of x from a chain of matmuls on the current stream, odd rows set to -1 beside them."""
    side.run(lambda: x[1::2].fill_(-1.0))
    y = source
    for _ in range(20):  # long enough that the fill, issued first, runs while these do
        y = torch.tanh(y @ source)
    x[0::2].copy_(y)
    side.join()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (streams)")
@pytest.mark.parametrize("enabled", [True, False])
def test_fill_beside_a_kernel_equals_in_line_on_the_gpu(enabled, monkeypatch):
    monkeypatch.setattr(beside_module, "enabled", enabled)
    gen = torch.Generator(device="cuda").manual_seed(0)
    sources = [torch.randn(1024, 1024, device="cuda", generator=gen) / 32 for _ in range(4)]
    expected = []
    for source in sources:
        y = source
        for _ in range(20):
            y = torch.tanh(y @ source)
        want = torch.full((2048, 1024), -1.0, device="cuda")
        want[0::2] = y
        expected.append(want)
    x = torch.full((2048, 1024), 7.0, device="cuda")
    source = sources[0].clone()
    side = Beside(x.device)
    assert (side.side is not None) == enabled
    _write_both(x, source, side)
    assert torch.equal(x, expected[0])
    graph = torch.cuda.CUDAGraph()
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        x.fill_(7.0)
        with torch.cuda.graph(graph, stream=capture):
            _write_both(x, source, Beside(x.device))
    torch.cuda.current_stream().wait_stream(capture)
    for index in (1, 2, 3):  # replays on new values
        x.fill_(7.0)
        source.copy_(sources[index])
        graph.replay()
        assert torch.equal(x, expected[index]), index
