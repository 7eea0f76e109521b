"""Exact LRU cache simulators (Numba): miss counts, stack-distance miss curves, two-level hierarchies."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numba
import numpy as np

__all__ = [
    "CacheLevel",
    "lru_misses",
    "lru_miss_mask",
    "miss_curve",
    "reuse_distances",
    "reuse_distance_histogram",
    "simulate_hierarchy",
]

# Largest id range handled by a direct-addressed table before ids are compacted with np.unique.
_DIRECT_RANGE_LIMIT = 1 << 24


@numba.njit(cache=True, nogil=True)
def _min_max(array):  # pragma: no cover - numba
    low = array[0]
    high = array[0]
    for value in array:
        if value < low:
            low = value
        elif value > high:
            high = value
    return low, high


def _validate_trace(trace) -> tuple[np.ndarray, int, int]:
    """(trace as contiguous 1D int64 array of line ids >= 0, min id, max id); min = max = 0 if empty."""
    array = np.asarray(trace)
    if array.ndim != 1:
        raise ValueError(f"trace must be a 1D array of cache-line ids, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"trace must hold integers (cache-line ids >= 0), got dtype {array.dtype}")
    array = np.ascontiguousarray(array, dtype=np.int64)
    if array.size == 0:
        return array, 0, 0
    low, high = _min_max(array)
    if low < 0:
        raise ValueError(f"trace must hold cache-line ids >= 0, got minimum {int(low)}")
    return array, int(low), int(high)


def _validate_capacity(capacity, name: str = "capacity") -> int:
    if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity, (int, np.integer)):
        raise ValueError(f"{name} must be an integer >= 1 (cache lines), got {capacity!r}")
    if capacity < 1:
        raise ValueError(f"{name} must be an integer >= 1 (cache lines), got {capacity}")
    return int(capacity)


def _dense_ids(trace: np.ndarray, low: int, high: int) -> tuple[np.ndarray, int]:
    """Map line ids to 0..num_ids-1 (offset when the range is small, else rank via np.unique)."""
    if trace.size == 0:
        return trace, 0
    if high - low < max(_DIRECT_RANGE_LIMIT, 2 * trace.size):
        return trace - low if low else trace, high - low + 1
    unique, inverse = np.unique(trace, return_inverse=True)
    return inverse.astype(np.int64).reshape(-1), int(unique.size)


@numba.njit(cache=True, nogil=True)
def _lru_fully_associative(ids, num_ids, capacity, miss_mask, record):  # pragma: no cover - numba
    """Fully associative LRU: O(1) per access (direct-addressed slot table + doubly linked list)."""
    slot_of_id = np.full(num_ids, -1, dtype=np.int32)
    id_of_slot = np.empty(capacity, dtype=np.int64)
    previous = np.empty(capacity, dtype=np.int32)  # towards most recently used
    following = np.empty(capacity, dtype=np.int32)  # towards least recently used
    head = -1  # most recently used slot
    tail = -1  # least recently used slot
    used = 0
    misses = 0
    for position in range(ids.shape[0]):
        line = ids[position]
        slot = slot_of_id[line]
        if slot >= 0:
            if slot != head:  # unlink, then push to the front
                prev_slot = previous[slot]
                next_slot = following[slot]
                following[prev_slot] = next_slot
                if next_slot >= 0:
                    previous[next_slot] = prev_slot
                else:
                    tail = prev_slot
                previous[slot] = -1
                following[slot] = head
                previous[head] = slot
                head = slot
            continue
        misses += 1
        if record:
            miss_mask[position] = True
        if used < capacity:
            slot = used
            used += 1
            if tail < 0:
                tail = slot
        else:  # evict the least recently used line and reuse its slot
            slot = tail
            slot_of_id[id_of_slot[slot]] = -1
            tail = previous[slot]
            if tail >= 0:
                following[tail] = -1
            else:
                head = -1
        id_of_slot[slot] = line
        slot_of_id[line] = slot
        previous[slot] = -1
        following[slot] = head
        if head >= 0:
            previous[head] = slot
        head = slot
        if tail < 0:
            tail = slot
    return misses


@numba.njit(cache=True, nogil=True)
def _lru_set_associative(ids, num_sets, ways, miss_mask, record):  # pragma: no cover - numba
    """Set-associative LRU: set = line mod num_sets, LRU among `ways` entries by last-use time."""
    tags = np.full((num_sets, ways), -1, dtype=np.int64)
    last_use = np.full((num_sets, ways), -1, dtype=np.int64)
    misses = 0
    set_mask = num_sets - 1
    power_of_two = (num_sets & set_mask) == 0
    for position in range(ids.shape[0]):
        line = ids[position]
        cache_set = (line & set_mask) if power_of_two else (line % num_sets)
        victim = 0
        oldest = last_use[cache_set, 0]
        hit = False
        for way in range(ways):
            if tags[cache_set, way] == line:
                last_use[cache_set, way] = position
                hit = True
                break
            if last_use[cache_set, way] < oldest:
                oldest = last_use[cache_set, way]
                victim = way
        if hit:
            continue
        misses += 1
        if record:
            miss_mask[position] = True
        tags[cache_set, victim] = line
        last_use[cache_set, victim] = position
    return misses


def _run_lru(trace, capacity, ways, record: bool) -> tuple[int, np.ndarray]:
    lines, low, high = _validate_trace(trace)
    capacity = _validate_capacity(capacity)
    if ways is not None:
        if isinstance(ways, (bool, np.bool_)) or not isinstance(ways, (int, np.integer)) or ways < 1:
            raise ValueError(f"ways must be None (fully associative) or an integer >= 1, got {ways!r}")
        if capacity % int(ways) != 0:
            raise ValueError(
                f"ways must divide capacity (capacity / ways sets); got capacity={capacity}, ways={ways}"
            )
    miss_mask = np.zeros(lines.size if record else 0, dtype=np.bool_)
    if lines.size == 0:
        return 0, miss_mask
    if ways is None or int(ways) == capacity:  # one set holding everything is fully associative
        ids, num_ids = _dense_ids(lines, low, high)
        misses = _lru_fully_associative(ids, num_ids, min(capacity, num_ids), miss_mask, record)
    else:
        misses = _lru_set_associative(lines, capacity // int(ways), int(ways), miss_mask, record)
    return int(misses), miss_mask


def lru_misses(trace, capacity: int, *, ways: int | None = None) -> int:
    """Number of misses of an LRU cache of `capacity` lines on `trace` (1D int64 line ids >= 0).

    ways=None: fully associative (O(1) per access). ways=w: set-associative with capacity / w sets
    of w lines each, a line maps to set `line mod (capacity / w)`, LRU within the set.
    """
    return _run_lru(trace, capacity, ways, record=False)[0]


def lru_miss_mask(trace, capacity: int, *, ways: int | None = None) -> np.ndarray:
    """Boolean array (len(trace),): True where the access misses in the LRU cache of lru_misses."""
    return _run_lru(trace, capacity, ways, record=True)[1]


@numba.njit(cache=True, nogil=True)
def _stack_distances(ids, num_ids):  # pragma: no cover - numba
    """Exact LRU stack distance per access (-1 for first use): Fenwick tree over last-use slots.

    Each line's most recent access holds one set bit at its time slot; the distance of an access to
    a line last used at slot p is the number of set bits after p (distinct lines used since). Slots
    are renumbered in order when they run out, so the tree has 2 * distinct + 16 entries (distinct <=
    min(num_ids, len(ids))), not len(ids).
    """
    length = ids.shape[0]
    size = 2 * min(num_ids, length) + 16
    tree = np.zeros(size + 1, dtype=np.int32)
    line_at_slot = np.full(size, -1, dtype=np.int64)
    last_slot = np.full(num_ids, -1, dtype=np.int64)
    distances = np.empty(length, dtype=np.int64)
    distinct = 0
    now = 0
    for time in range(length):
        if now == size:  # compact: live slots keep their order and move to 0..distinct-1
            tree[:] = 0
            next_slot = 0
            for slot in range(size):
                line = line_at_slot[slot]
                if line >= 0:
                    line_at_slot[slot] = -1
                    line_at_slot[next_slot] = line
                    last_slot[line] = next_slot
                    next_slot += 1
            tree[1:next_slot + 1] = 1
            for index in range(1, size + 1):  # O(size) Fenwick build of ones at slots 0..next_slot-1
                parent = index + (index & (-index))
                if parent <= size:
                    tree[parent] += tree[index]
            now = next_slot
        line = ids[time]
        previous = last_slot[line]
        if previous < 0:
            distances[time] = -1
            distinct += 1
        else:
            prefix = 0  # set bits at slots 0..previous
            index = previous + 1
            while index > 0:
                prefix += tree[index]
                index -= index & (-index)
            distances[time] = distinct - prefix
            index = previous + 1
            while index <= size:
                tree[index] -= 1
                index += index & (-index)
            line_at_slot[previous] = -1
        index = now + 1
        while index <= size:
            tree[index] += 1
            index += index & (-index)
        line_at_slot[now] = line
        last_slot[line] = now
        now += 1
    return distances


def reuse_distances(trace) -> np.ndarray:
    """Exact LRU stack (reuse) distance of every access, int64 (len(trace),); -1 marks a first use.

    The distance is the number of distinct other lines accessed since the previous access to the
    same line; the access hits in a fully associative LRU cache of C lines iff 0 <= distance < C.
    O(n log n).
    """
    lines, low, high = _validate_trace(trace)
    if lines.size == 0:
        return np.zeros(0, dtype=np.int64)
    ids, num_ids = _dense_ids(lines, low, high)
    return _stack_distances(ids, num_ids)


def reuse_distance_histogram(trace) -> tuple[np.ndarray, int]:
    """(histogram, cold_misses): histogram[d] = accesses with stack distance d; cold = first uses."""
    distances = reuse_distances(trace)
    cold = int(np.count_nonzero(distances < 0))
    finite = distances[distances >= 0]
    histogram = np.bincount(finite) if finite.size else np.zeros(0, dtype=np.int64)
    return histogram.astype(np.int64), cold


def miss_curve(trace, capacities: Sequence[int] | np.ndarray) -> np.ndarray:
    """Misses of a fully associative LRU cache for every capacity at once, int64 (len(capacities),).

    From exact stack distances (one O(n log n) pass): misses(C) = cold misses + #(distance >= C).
    Equal to `lru_misses(trace, C)` for every C.
    """
    capacity_array = np.asarray(capacities)
    if capacity_array.ndim != 1:
        raise ValueError(f"capacities must be a 1D sequence of integers >= 1, got shape {capacity_array.shape}")
    for capacity in capacity_array.tolist():
        _validate_capacity(capacity, "capacities")
    histogram, cold = reuse_distance_histogram(trace)
    # at_least[d] = number of accesses with distance >= d, for d = 0..len(histogram)
    at_least = np.concatenate([np.cumsum(histogram[::-1])[::-1], [0]]).astype(np.int64)
    clipped = np.minimum(capacity_array.astype(np.int64), histogram.size)
    return (cold + at_least[clipped]).astype(np.int64)


@dataclass(frozen=True)
class CacheLevel:
    """One cache level: capacity and line size in bytes, ways (None = fully associative)."""

    name: str
    capacity_bytes: int
    line_bytes: int
    ways: int | None = None

    def __post_init__(self) -> None:
        if self.line_bytes < 1 or (self.line_bytes & (self.line_bytes - 1)):
            raise ValueError(f"line_bytes must be a power of two >= 1, got {self.line_bytes}")
        if self.capacity_bytes < self.line_bytes or self.capacity_bytes % self.line_bytes:
            raise ValueError(
                f"capacity_bytes must be a positive multiple of line_bytes={self.line_bytes}, "
                f"got {self.capacity_bytes}"
            )
        if self.ways is not None and (self.ways < 1 or self.num_lines % self.ways):
            raise ValueError(f"ways must be None or divide the {self.num_lines} lines, got {self.ways}")

    @property
    def num_lines(self) -> int:
        return self.capacity_bytes // self.line_bytes


def simulate_hierarchy(byte_addresses, levels: Sequence[CacheLevel]) -> list[dict]:
    """Simulate LRU levels in series (no inclusion enforced): level i sees the misses of level i-1.

    byte_addresses: 1D int64 array of byte addresses >= 0 (one per load). Each level maps addresses
    to its own lines (address // line_bytes). Returns one dict per level with name, accesses, misses,
    miss_ratio and bytes_from_next (misses * line_bytes). A line trace made with line size L feeds
    this as `lines * L`; L should be the smallest line size of the levels (a larger line then
    covers several consecutive ids, a smaller one would see only the first bytes of each line).
    """
    addresses = _validate_trace(byte_addresses)[0]
    if not levels:
        raise ValueError("levels must hold at least one CacheLevel")
    results = []
    stream = addresses
    for level in levels:
        if not isinstance(level, CacheLevel):
            raise ValueError(f"levels must hold CacheLevel objects, got {type(level).__name__}")
        lines = stream // level.line_bytes
        mask = lru_miss_mask(lines, level.num_lines, ways=level.ways)
        misses = int(mask.sum())
        results.append(
            {
                "level": level.name,
                "capacity_bytes": level.capacity_bytes,
                "line_bytes": level.line_bytes,
                "ways": level.ways,
                "accesses": int(stream.size),
                "misses": misses,
                "miss_ratio": misses / stream.size if stream.size else 0.0,
                "bytes_from_next": misses * level.line_bytes,
            }
        )
        stream = stream[mask]
    return results
