"""Token positions of a forward pass: checked positions, and a packed row's boundaries (in host memory) and each
token's position in its document."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hilbert_lab.attention.validation import check_cu_seqlens_tensor, host_boundaries


def values_readable(x: torch.Tensor) -> bool:
    """Whether x's values may be read on the host to check them: not while torch.compile traces and not
    while a CUDA graph captures (a read would synchronise); the checks then fall to the first eager call."""
    return not torch.compiler.is_compiling() and not (x.is_cuda and torch.cuda.is_current_stream_capturing())


def check_positions(positions: torch.Tensor | None, length: int, max_seq_len: float, device: Any,
                    packed: bool = False) -> torch.Tensor:
    """positions (N,) on `device` (default arange(N)), ValueError unless an integer tensor of shape (length,) with
    values in [0, max_seq_len) (read where values_readable) and length <= max_seq_len (packed: a row of documents
    may be longer)."""
    if length > max_seq_len and not packed:  # a packed row may be longer; its documents' positions are checked
        raise ValueError(f"sequence length must be <= max_seq_len={max_seq_len}, got {length}")
    if positions is None:
        return torch.arange(length, device=device)
    if positions.shape != (length,) or positions.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"positions must be an integer tensor of shape (N,) = ({length},), got "
            f"{tuple(positions.shape)} {positions.dtype}"
        )
    if values_readable(positions) and length and (
        int(positions.min()) < 0 or int(positions.max()) >= max_seq_len
    ):
        raise ValueError(
            f"positions must lie in [0, max_seq_len={max_seq_len}), got "
            f"[{int(positions.min())}, {int(positions.max())}]"
        )
    return positions.to(device)


def document_positions(cu_seqlens: torch.Tensor | Sequence[int], device: Any = None,
                       length: int | None = None, max_length: float = float("inf")) -> torch.Tensor:
    """int64 (N,): each token's position inside its document of a packed row, for cu_seqlens
    [0, n1, n1 + n2, ..., N] (positions restart at 0 at every document start): a 1-D integer tensor or host
    integers; on `device` (default the tensor's, the CPU for host integers). length: N where the caller knows it
    (then nothing is read back while compiling); max_length: the longest document allowed (a model's
    max_seq_len). The values are checked where they can be read (ValueError naming cu_seqlens)."""
    if isinstance(cu_seqlens, torch.Tensor):
        check_cu_seqlens_tensor(cu_seqlens)
        cu = cu_seqlens.to(torch.int64)
    else:
        cu = host_boundaries(cu_seqlens)
    lengths = cu[1:] - cu[:-1]
    if values_readable(cu) and (int(cu[0]) != 0 or bool((lengths < 0).any())
                                 or (length is not None and int(cu[-1]) != length)):
        raise ValueError(f"cu_seqlens must start at 0, be non-decreasing and end at N"
                         f"{'' if length is None else f' = {length}'}, got {cu.tolist()[:12]}")
    if values_readable(cu) and max_length < float("inf") and int(lengths.max()) > max_length:
        raise ValueError(f"positions must lie in [0, max_seq_len={max_length}): cu_seqlens holds a document of "
                         f"{int(lengths.max())} tokens")
    total = int(cu[-1]) if length is None else length
    positions = torch.arange(total, device=cu.device) - torch.repeat_interleave(cu[:-1], lengths, output_size=total)
    return positions if device is None else positions.to(device)
