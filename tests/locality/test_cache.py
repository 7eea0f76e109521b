"""LRU simulators, stack distances and the two-level hierarchy against plain-Python references."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from hilbert_lab.locality import (
    CacheLevel,
    cache_levels,
    cache_table,
    lru_miss_mask,
    lru_misses,
    miss_curve,
    reuse_distance_histogram,
    reuse_distances,
    simulate_hierarchy,
)

from property_testing import given, settings, st


def reference_miss_mask(trace, capacity, ways=None):
    """Plain-Python LRU: one OrderedDict per set, set = line mod (capacity / ways)."""
    num_sets = 1 if ways is None else capacity // ways
    set_size = capacity if ways is None else ways
    sets = [OrderedDict() for _ in range(num_sets)]
    mask = []
    for line in trace:
        cache = sets[int(line) % num_sets]
        if line in cache:
            cache.move_to_end(line)
            mask.append(False)
        else:
            mask.append(True)
            cache[line] = None
            if len(cache) > set_size:
                cache.popitem(last=False)
    return np.array(mask, dtype=bool)


def reference_distances(trace):
    """Distinct other lines since the previous access of the same line; -1 on first use."""
    out = []
    for time, line in enumerate(trace):
        previous = [t for t in range(time) if trace[t] == line]
        out.append(-1 if not previous else len(set(trace[previous[-1] + 1:time]) - {line}))
    return np.array(out, dtype=np.int64)


def adversarial_traces():
    """Cyclic scans at, just above and well above capacity, strided scans and a mixed workload."""
    traces = {}
    for length in (3, 4, 5, 8, 9, 17):
        traces[f"cycle{length}"] = np.tile(np.arange(length), 6)
        traces[f"backforth{length}"] = np.tile(np.r_[np.arange(length), np.arange(length)[::-1]], 4)
    traces["stride8"] = np.tile(np.arange(0, 8 * 12, 8), 5)  # all lines in one set for 8 sets
    traces["hot_cold"] = np.array([0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 1, 2, 3, 4, 5, 0] * 4)
    return traces


@pytest.mark.parametrize("name", sorted(adversarial_traces()))
def test_lru_and_miss_curve_match_ordereddict_on_adversarial_traces(name):
    trace = adversarial_traces()[name]
    capacities = list(range(1, 20))
    curve = miss_curve(trace, capacities)
    for capacity in capacities:
        expected = reference_miss_mask(list(trace), capacity)
        assert lru_misses(trace, capacity) == expected.sum()
        assert curve[capacity - 1] == expected.sum()
        np.testing.assert_array_equal(lru_miss_mask(trace, capacity), expected)
        for ways in (1, 2, 4, 8):
            if capacity % ways == 0:
                expected_set = reference_miss_mask(list(trace), capacity, ways)
                assert lru_misses(trace, capacity, ways=ways) == expected_set.sum(), (capacity, ways)
                np.testing.assert_array_equal(lru_miss_mask(trace, capacity, ways=ways), expected_set)


def test_cyclic_scan_just_above_capacity_misses_every_access():
    capacity = 64
    trace = np.tile(np.arange(capacity + 1), 10)
    assert lru_misses(trace, capacity) == trace.size  # the LRU pathology
    assert lru_misses(trace, capacity + 1) == capacity + 1  # only cold misses


def test_random_traces_all_capacities_and_associativities(rng):
    for _ in range(12):
        length = int(rng.integers(1, 300))
        alphabet = int(rng.integers(1, 40))
        trace = rng.integers(0, alphabet, length)
        capacities = np.arange(1, 45)
        curve = miss_curve(trace, capacities)
        for capacity in capacities.tolist():
            expected = reference_miss_mask(trace.tolist(), capacity).sum()
            assert lru_misses(trace, capacity) == expected == curve[capacity - 1]
            for ways in (1, 2, 3, 4):
                if capacity % ways == 0:
                    assert lru_misses(trace, capacity, ways=ways) == reference_miss_mask(trace.tolist(), capacity, ways).sum()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=0, max_size=80), st.integers(1, 14))
def test_property_lru_equals_reference(trace, capacity):
    trace_array = np.array(trace, dtype=np.int64)
    expected = reference_miss_mask(trace, capacity)
    assert lru_misses(trace_array, capacity) == expected.sum()
    assert miss_curve(trace_array, [capacity])[0] == expected.sum()


def test_miss_curve_long_trace_with_many_slot_compactions(rng):
    # 50 distinct lines over 20000 accesses: 116 Fenwick slots are renumbered every <= 66 accesses (~300 times)
    trace = np.concatenate([rng.integers(0, 50, 10000), np.tile(np.arange(37), 270)])
    capacities = np.arange(1, 52)
    expected = [lru_misses(trace, capacity) for capacity in capacities.tolist()]
    np.testing.assert_array_equal(miss_curve(trace, capacities), expected)
    reference = reference_miss_mask(trace.tolist(), 36)
    assert expected[35] == reference.sum()


def test_set_associative_non_power_of_two_sets(rng):
    trace = rng.integers(0, 200, 2000)
    for capacity, ways in ((12, 4), (20, 4), (18, 6), (36, 3)):  # 3, 5, 3, 12 sets
        assert lru_misses(trace, capacity, ways=ways) == reference_miss_mask(trace.tolist(), capacity, ways).sum()


def test_sparse_huge_line_ids_take_the_compaction_path(rng):
    base = rng.integers(0, 30, 500)
    huge = base * (1 << 40) + 7  # id range far above the direct-addressed table
    for capacity in (1, 5, 17, 31):
        assert lru_misses(huge, capacity) == lru_misses(base, capacity) == reference_miss_mask(base.tolist(), capacity).sum()
    np.testing.assert_array_equal(reuse_distances(huge), reuse_distances(base))


def test_reuse_distances_match_definition(rng):
    trace = rng.integers(0, 9, 120)
    np.testing.assert_array_equal(reuse_distances(trace), reference_distances(trace.tolist()))
    histogram, cold = reuse_distance_histogram(trace)
    distances = reference_distances(trace.tolist())
    assert cold == np.count_nonzero(distances < 0) == np.unique(trace).size
    np.testing.assert_array_equal(histogram, np.bincount(distances[distances >= 0]))


def test_known_small_trace():
    trace = np.array([1, 2, 3, 1, 2, 4, 1])
    np.testing.assert_array_equal(reuse_distances(trace), [-1, -1, -1, 2, 2, -1, 2])
    np.testing.assert_array_equal(miss_curve(trace, [1, 2, 3, 4]), [7, 7, 4, 4])


def test_plain_lists_and_narrow_integer_dtypes_are_accepted():
    trace = [5, 1, 5, 2, 1, 5]
    expected = reference_miss_mask(trace, 2).sum()
    assert lru_misses(trace, 2) == lru_misses(np.array(trace, dtype=np.uint8), 2) == expected == 5
    np.testing.assert_array_equal(reuse_distances(np.array(trace, dtype=np.int16)), [-1, -1, 1, -1, 2, 2])


def test_empty_trace():
    assert lru_misses(np.zeros(0, dtype=np.int64), 4) == 0
    np.testing.assert_array_equal(miss_curve(np.zeros(0, dtype=np.int64), [1, 8]), [0, 0])


def reference_hierarchy(addresses, levels):
    stream = list(addresses)
    out = []
    for line_bytes, capacity_lines, ways in levels:
        mask = reference_miss_mask([a // line_bytes for a in stream], capacity_lines, ways)
        out.append(int(mask.sum()))
        stream = [a for a, miss in zip(stream, mask) if miss]
    return out


def test_two_level_hierarchy_matches_serial_reference(rng):
    addresses = rng.integers(0, 64 * 1024, 3000) // 4 * 4
    levels = [CacheLevel("L1", 2048, 64, 4), CacheLevel("L2", 16384, 128, None)]
    result = simulate_hierarchy(addresses, levels)
    expected = reference_hierarchy(addresses.tolist(), [(64, 32, 4), (128, 128, None)])
    assert [level["misses"] for level in result] == expected
    assert result[1]["accesses"] == result[0]["misses"]
    assert result[1]["bytes_from_next"] == expected[1] * 128


def test_hardware_table_levels_are_consistent():
    table = cache_table()
    assert set(table["device"]) >= {"H100-SXM5", "A100", "CPU-Zen4-core"}
    assert (table["source"].str.len() > 10).all()
    h100 = {level.name.split()[-1]: level for level in cache_levels("H100-SXM5")}
    assert h100["L2"].capacity_bytes == 50 * 1024 * 1024 and h100["L2"].num_lines == 409600
    with pytest.raises(ValueError, match="device"):
        cache_levels("GTX-9999")


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: lru_misses(np.array([1, -2, 3]), 4), "trace"),
        (lambda: lru_misses(np.array([1, 2]), 0), "capacity"),
        (lambda: lru_misses(np.array([1, 2]), -3), "capacity"),
        (lambda: lru_misses(np.array([1, 2]), 6, ways=4), "ways"),
        (lambda: lru_misses(np.array([1, 2]), 8, ways=0), "ways"),
        (lambda: lru_misses(np.array([[1, 2]]), 8), "trace"),
        (lambda: lru_misses(np.array([1.5, 2.0]), 8), "trace"),
        (lambda: miss_curve(np.array([1, 2]), [4, 0]), "capacities"),
        (lambda: miss_curve(np.array([-1]), [4]), "trace"),
        (lambda: reuse_distances(np.array([3, -1])), "trace"),
        (lambda: CacheLevel("L1", 1000, 64), "capacity_bytes"),
        (lambda: CacheLevel("L1", 1024, 48), "line_bytes"),
        (lambda: CacheLevel("L1", 1024, 64, ways=3), "ways"),
        (lambda: simulate_hierarchy(np.array([1]), []), "levels"),
    ],
)
def test_bad_input_raises_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
