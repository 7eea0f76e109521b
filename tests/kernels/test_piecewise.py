"""Checks in bounded pieces: the same verdicts as the whole-tensor checks, each piece within the limit."""
from __future__ import annotations

import pytest
import torch

from hilbert_lab.kernels.piecewise import close_piecewise, holds_everywhere, pieces


@pytest.mark.parametrize("shape", [(), (5,), (3, 7), (2, 3, 5, 4), (1, 40)])
@pytest.mark.parametrize("limit", [1, 6, 7, 1000])
def test_pieces_cover_each_entry_once_and_stay_within_the_limit(shape, limit):
    a = torch.arange(int(torch.tensor(shape).prod()) if shape else 1, dtype=torch.float64).reshape(shape)
    b = -a
    seen = []
    for x, y in pieces(a, b, limit):
        assert x.numel() <= max(limit, 1) or x.dim() == 0
        torch.testing.assert_close(y, -x, rtol=0, atol=0)  # b's piece is the same piece
        seen.extend(x.reshape(-1).tolist())
    assert sorted(seen) == a.reshape(-1).tolist()


def test_pieces_of_a_strided_view_are_views_of_it():
    base = torch.randn(6, 8, 4)
    view = base[:, ::2, 1:3]  # a strided view, as a kernel call's output is
    assert all(x.untyped_storage().data_ptr() == base.untyped_storage().data_ptr() for x, _ in pieces(view, limit=5))
    assert torch.cat([x.reshape(-1) for x, _ in pieces(view, limit=5)]).tolist() == view.reshape(-1).tolist()


@pytest.mark.parametrize("limit", [3, 1 << 24])
def test_close_piecewise_gives_the_whole_tensor_verdicts(limit, monkeypatch):
    from hilbert_lab.kernels import piecewise

    monkeypatch.setattr(piecewise, "PIECE_ELEMENTS", limit)
    a = torch.randn(4, 5, dtype=torch.float32)
    assert close_piecewise(a, a.clone(), 0.0)
    b = a.clone()
    b[3, 4] += 1e-3 * a.abs().max()
    assert not close_piecewise(a, b, 0.0) and close_piecewise(a, b, 2e-3) and not close_piecewise(a, b, 5e-4)
    c = a.clone()
    c[2, 1] = float("nan")
    assert not close_piecewise(a, c, 1.0)  # NaN where a has none
    a_nan = a.clone()
    a_nan[2, 1] = float("nan")
    assert close_piecewise(a_nan, c, 0.0)  # NaN in the same entries, the rest equal
    assert not close_piecewise(a, a.double(), 1.0) and not close_piecewise(a, a[:, :4], 1.0)
    ints = torch.arange(20).reshape(4, 5)
    other = ints.clone()
    other[0, 0] = 7
    assert close_piecewise(ints, ints.clone(), 0.0) and not close_piecewise(ints, other, 1.0)


def test_holds_everywhere_reads_every_piece(monkeypatch):
    from hilbert_lab.kernels import piecewise

    monkeypatch.setattr(piecewise, "PIECE_ELEMENTS", 4)
    flat = torch.full((11,), float("nan"))
    assert holds_everywhere(flat, lambda piece: torch.isnan(piece).all())
    flat[10] = 0.0  # the last piece alone differs
    assert not holds_everywhere(flat, lambda piece: torch.isnan(piece).all())
    assert holds_everywhere(torch.empty(0), lambda piece: torch.isnan(piece).all())
    with pytest.raises(ValueError, match="limit must be at least 1"):
        next(pieces(flat, limit=0))
