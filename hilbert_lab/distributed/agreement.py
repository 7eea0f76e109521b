"""The configuration agreement of a ring or head-parallel call: every rank of the group stops together on a mismatch.

Before any data moves, one all_gather over the whole group, on the host (over gloo, so that no rank waits
for its queued kernels), of a fixed-size int64 row per rank (posted first: post_agreement; the ring queues the
work that moves no data, its local part or the one-rank shortcut, while the rows travel, and waits before its
first exchange and before it returns): an error flag and the error's text, then per field of the configuration
a digest and the value's text.
A rank that rejected its inputs raises its own error, the others a ValueError naming it; ranks that hold
different values of a field (pattern, dtype, scale, shard shape, layout, ring_size, backend; the packed row's
cu_seqlens among the ranks of one ring, each ring holding its own sequence) all raise the same ValueError
naming the field and which ranks hold which value. The wait is bounded (comm.wait_bounded: RingTimeoutError).
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import math
from typing import TYPE_CHECKING, Any, Sequence

import torch
import torch.distributed as dist

from hilbert_lab.distributed.comm import wait_bounded

if TYPE_CHECKING:
    from hilbert_lab.attention.executors import Executor
    from hilbert_lab.attention.pattern import DilatedPattern

FIELDS = ("segment_lengths", "dilation_rates", "mode", "causal", "dtype", "scale", "shard shape", "layout",
          "ring_size", "backend", "cu_seqlens", "global_heads")
PER_RING = ("cu_seqlens",)  # compared among the ranks of one ring only (each ring holds its own sequence)
_VALUE_BYTES = 64  # each field's value travels as text (truncated) so that the error can show every rank's
_ERROR_BYTES = 512  # the first bytes of a rank's own input error
_ABSENT: Any = object()  # a field configuration_fields leaves out (the caller does not agree on it)


def describe(value) -> str:
    """Text of an argument, the same on every rank for equal arguments."""
    if isinstance(value, (list, tuple)):
        return repr(tuple(value))
    return repr(value)


def describe_shapes(q, k) -> str:
    """The shard shape for the agreement (with k's where it has fewer heads)."""
    if not isinstance(q, torch.Tensor):
        return type(q).__name__
    if not isinstance(k, torch.Tensor) or k.shape == q.shape:
        return str(tuple(q.shape))
    return f"{tuple(q.shape)}; k, v {tuple(k.shape)}"


def describe_documents(cu_seqlens, documents, error: Exception | None) -> str:
    """Text of a packed row's documents ((start, length), ...) for the agreement: its entries' count and a
    digest of their values first (the text travels cut to 64 bytes), then the values ("None" without
    cu_seqlens; "not checked" on a rank that rejected its inputs, whose error is reported instead)."""
    if cu_seqlens is None:
        return "None"
    if documents is None:
        return "not checked"
    bounds = [0] + [start + length for start, length in documents]
    return f"{len(bounds)} entries, digest {_digest(repr(bounds)) & (2**64 - 1):016x}: {bounds}"


def configuration_fields(q: Any, k: Any, pattern: DilatedPattern | None, *, segment_lengths: Sequence[int],
                         dilation_rates: Sequence[int], mode: str, causal: bool, scale: Any, layout: str,
                         backend: str | Executor, cu_seqlens: torch.Tensor | None,
                         documents: tuple[tuple[int, int], ...] | None, error: Exception | None,
                         placement: dict[str, str] | None = None, resolved: Executor | None = None,
                         return_lse: Any = _ABSENT, global_heads: Any = _ABSENT) -> dict[str, str]:
    """The fields every rank must agree on (agree_on_configuration), in the order they are compared: the pattern
    (`pattern`'s values once it is valid, else the raw arguments), dtype, scale (resolved), shard shape, layout,
    then `placement` (e.g. {"ring_size": ...} or {"mesh": ...}), backend (`resolved`'s name and device type
    where an executor was resolved), return_lse if given, cu_seqlens, global_heads if given."""
    fields = {
        "segment_lengths": describe(pattern.segment_lengths if pattern is not None else segment_lengths),
        "dilation_rates": describe(pattern.dilation_rates if pattern is not None else dilation_rates),
        "mode": describe(pattern.mode if pattern is not None else mode),
        "causal": describe(pattern.causal if pattern is not None else causal),
        "dtype": str(getattr(q, "dtype", type(q).__name__)),
        "scale": describe(scale),
        "shard shape": describe_shapes(q, k),
        "layout": describe(layout),
        **(placement or {}),
        "backend": (f"{resolved.name} on {q.device.type}" if resolved is not None else
                    describe(getattr(backend, "name", backend))),
    }
    if return_lse is not _ABSENT:
        fields["return_lse"] = describe(return_lse)
    fields["cu_seqlens"] = describe_documents(cu_seqlens, documents, error)
    if global_heads is not _ABSENT:
        fields["global_heads"] = describe(global_heads)
    return fields


def _text_row(text: str, size: int) -> list[int]:
    """`text` as UTF-8, cut or zero-padded to `size` bytes, as size/8 int64 values."""
    raw = text.encode("utf-8")[:size].ljust(size, b"\0")
    return torch.frombuffer(bytearray(raw), dtype=torch.int64).tolist()


def _row_text(values: torch.Tensor) -> str:
    return values.cpu().contiguous().numpy().tobytes().rstrip(b"\0").decode("utf-8", errors="replace")


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little", signed=True)


@functools.lru_cache(maxsize=256)
def _fields_row(values: tuple[str, ...]) -> list[int]:
    """Per field value: its digest, then its text (cached: a model calls with few configurations)."""
    row = []
    for text in values:
        row += [_digest(text)] + _text_row(text, _VALUE_BYTES)
    return row


_HOST_GROUPS: dict[object, dist.ProcessGroup] = {}  # a group without gloo -> a gloo group of the same ranks


def _registered(group: dist.ProcessGroup) -> bool:
    try:
        dist.get_process_group_ranks(group)
    except (KeyError, ValueError, RuntimeError):
        return False
    return True


def _has_gloo(group: dist.ProcessGroup | None) -> bool:
    return "gloo" in str(dist.get_backend(group))


def host_group(group: dist.ProcessGroup | None, timeout_s: float) -> dist.ProcessGroup | None:
    """A group over the same ranks whose collectives take CPU tensors: `group` itself where it has gloo, else
    a gloo group made once (by its members only, at their first call) and kept. The agreement's rows are host
    data: gathering them over NCCL would make the host wait for every kernel queued before the call."""
    if _has_gloo(group) or not dist.is_gloo_available():  # a torch built without gloo: gather over the group
        return group
    key = dist.group.WORLD if group is None else group
    found = _HOST_GROUPS.get(key)
    if found is None or not _registered(found):
        bound = {} if math.isinf(timeout_s) else {"timeout": datetime.timedelta(seconds=timeout_s)}
        found = dist.new_group(dist.get_process_group_ranks(key), backend="gloo", use_local_synchronization=True,
                               **bound)
        _HOST_GROUPS[key] = found
    return found


def _mismatches(table: torch.Tensor, ranks: list[int], names: tuple[str, ...]) -> list[str]:
    """'field: rank a: value; ranks b, c: value' for every field of `names` the ranks (of one ring, for
    PER_RING fields) disagree on."""
    words = _VALUE_BYTES // 8
    base = 1 + _ERROR_BYTES // 8
    problems = []
    for index, name in enumerate(names):
        start = base + index * (1 + words)
        rings: dict[int, dict[int, list[int]]] = {}
        for rank, line in zip(ranks, table):
            ring = int(line[-1]) if name in PER_RING else 0
            rings.setdefault(ring, {}).setdefault(int(line[start]), []).append(rank)
        holders = next((found for found in rings.values() if len(found) > 1), {})
        if len(holders) > 1:
            values = []
            for members in holders.values():
                text = _row_text(table[ranks.index(members[0])][start + 1: start + 1 + words])
                values.append(f"rank{'s' if len(members) > 1 else ''} {', '.join(map(str, members))}: {text}")
            hint = (" (all ranks must hold equal shards: the sequence length N must be divisible by the number of "
                    "ranks P)") if name == "shard shape" else ""
            problems.append(f"{name}{hint}: " + "; ".join(values))
    return problems


class PendingAgreement:
    """The configuration gather of one call, posted (post_agreement); `wait()` raises on every rank as
    agree_on_configuration does, else returns (once it has passed, later calls return at once)."""

    def __init__(self, work, rows: list[torch.Tensor], ranks: list[int], names: tuple[str, ...],
                 error: Exception | None, timeout_s: float, caller: str, members: str) -> None:
        self._work, self._rows, self._ranks, self._names = work, rows, ranks, names
        self._error, self._timeout_s, self._caller, self._members = error, timeout_s, caller, members
        self._passed = False

    def wait(self) -> None:
        if self._passed:
            return
        ranks, members = self._ranks, self._members
        wait_bounded([(self._work, f"gather the configuration of the ranks {ranks}")], self._timeout_s,
                     f"rank {dist.get_rank()}: {members} configuration check")
        table = torch.stack(self._rows).cpu()
        rejected = [rank for rank, line in zip(ranks, table) if line[0] != 0]
        if rejected:
            if self._error is not None:
                raise self._error
            first = table[ranks.index(rejected[0])]
            others = f" (and ranks {rejected[1:]})" if len(rejected) > 1 else ""
            raise ValueError(f"rank {rejected[0]}{others} of the {members} rejected its inputs, so every rank "
                             f"stops: {_row_text(first[1: 1 + _ERROR_BYTES // 8])}")
        problems = _mismatches(table, ranks, self._names)
        if problems:
            raise ValueError(f"the ranks of the {members} disagree on their configuration (every rank must call "
                             f"{self._caller} with the same arguments, dtype and shard shape): " + " | ".join(problems))
        self._passed = True


def post_agreement(fields: dict[str, str], error: Exception | None, group: dist.ProcessGroup | None,
                   timeout_s: float, ring: int = 0, *, caller: str = "ring_dilated_attention",
                   members: str = "ring") -> PendingAgreement:
    """Post the agreement's gather (the arguments as agree_on_configuration's) and return at once: the caller
    queues work that moves no data while the rows travel, and waits (PendingAgreement.wait) before its first
    exchange and before it returns."""
    names = tuple(fields)
    row = [int(error is not None)] + _text_row("" if error is None else str(error), _ERROR_BYTES)
    row += _fields_row(tuple(fields[name] for name in names)) + [int(ring)]
    gather = host_group(group, timeout_s)
    device = "cpu" if _has_gloo(gather) else torch.device("cuda", torch.cuda.current_device())
    mine = torch.tensor(row, dtype=torch.int64, device=device)
    world = dist.get_world_size(group)
    rows = [torch.empty_like(mine) for _ in range(world)]
    work = dist.all_gather(rows, mine, group=gather, async_op=True)
    ranks = [dist.get_global_rank(group, r) if group is not None else r for r in range(world)]
    return PendingAgreement(work, rows, ranks, names, error, timeout_s, caller, members)


def agree_on_configuration(fields: dict[str, str], error: Exception | None, group: dist.ProcessGroup | None,
                           timeout_s: float, ring: int = 0, *, caller: str = "ring_dilated_attention",
                           members: str = "ring") -> None:
    """Raise on every rank of `group` unless all ranks hold equal `fields` (built by configuration_fields; the
    ring's: every name of FIELDS; another caller's: its own names, in one order on every rank; those of PER_RING
    equal among the ranks of one `ring`, e.g. its first global rank) and none rejected its inputs (`error`); see
    the module docstring. caller / members: the function and the ranks ("ring", "group") the errors name."""
    post_agreement(fields, error, group, timeout_s, ring, caller=caller, members=members).wait()
