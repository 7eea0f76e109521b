"""Ring safety: bounded waits (a stalled, raising or exiting rank makes the others fail in seconds, naming
rank, branch and step), and the timeout setting itself. Each world takes a few seconds (its ranks are forked
from the fork server, then wait out the ring timeout): `make test` keeps one stall of 2 ranks; `make test-all` runs
them all."""
from __future__ import annotations

import datetime
import math
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))

from hilbert_lab.distributed import RingCommError, RingTimeoutError  # noqa: E402
from hilbert_lab.distributed.comm import (  # noqa: E402
    DEFAULT_TIMEOUT_S, DEFERRED_STEPS, TIMEOUT_ENV, resolve_timeout, settle_transfers, wait_bounded,
)
from ring_faults import FAULTY, GROUP_TIMEOUT_S, RING_TIMEOUT_S, run_faulty_world  # noqa: E402

NO_GLOO = not dist.is_available() or not dist.is_gloo_available()
gloo = pytest.mark.skipif(NO_GLOO, reason="torch.distributed with gloo is not available in this torch build")

# A healthy rank may complete a step or two before the one that waits for the faulty rank.
BOUND_S = 3 * RING_TIMEOUT_S + 5


def _healthy(outcomes, world):
    assert set(outcomes) >= {r for r in range(world) if r != FAULTY}, f"ranks that never reported: {outcomes}"
    return [outcomes[r] for r in range(world) if r != FAULTY]


@gloo
@pytest.mark.parametrize("world, fault, where", [
    (2, "stall_forward", r"forward/branch1 step \d"),
    pytest.param(3, "stall_forward", r"forward/branch1 step \d", marks=pytest.mark.slow),
    pytest.param(2, "stall_before", "ring configuration check", marks=pytest.mark.slow),
    pytest.param(2, "raise_forward", r"forward/branch1 step \d", marks=pytest.mark.slow),
    pytest.param(2, "stall_backward", r"backward/branch1 step \d", marks=pytest.mark.slow),
    pytest.param(3, "stall_before", "ring configuration check", marks=pytest.mark.slow),
    pytest.param(3, "raise_forward", r"forward/branch1 step \d", marks=pytest.mark.slow),
])
@pytest.mark.slow  # worlds of gloo ranks waiting out a stalled one (seconds each); make test keeps one ring
def test_a_stalled_or_raising_rank_times_the_others_out(tmp_path, world, fault, where):
    import re

    outcomes = run_faulty_world(world, tmp_path, fault)
    for outcome in _healthy(outcomes, world):
        assert outcome["status"] == "raised", outcome
        assert "RingTimeoutError" in outcome["kinds"] and "TimeoutError" in outcome["kinds"], outcome
        message = outcome["message"]
        assert message.startswith(f"rank {outcome['rank']}") and re.search(where, message), message
        assert f"{RING_TIMEOUT_S:g} s" in message and "rank" in message.split("waiting to", 1)[-1], message
        assert outcome["seconds"] < BOUND_S < GROUP_TIMEOUT_S, outcome
    if fault.startswith("stall") and FAULTY in outcomes:  # it resumes after the others gave up: fails fast too
        late = outcomes[FAULTY]
        assert late["status"] == "raised" and "RingCommError" in late["kinds"], late
        assert late["seconds"] < BOUND_S, late
    if fault.startswith("raise"):
        assert "injected failure" in outcomes[FAULTY]["message"]


@gloo
@pytest.mark.parametrize("world", [pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)])
def test_a_rank_that_exits_makes_the_others_fail_fast(tmp_path, world):
    outcomes = run_faulty_world(world, tmp_path, "exit_forward")
    assert FAULTY not in outcomes  # it died without a word
    for outcome in _healthy(outcomes, world):
        assert outcome["status"] == "raised" and "RingCommError" in outcome["kinds"], outcome
        assert outcome["message"].startswith(f"rank {outcome['rank']}") and "forward/branch1" in outcome["message"]
        assert outcome["seconds"] < BOUND_S, outcome


def test_timeout_setting(monkeypatch):
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert resolve_timeout() == DEFAULT_TIMEOUT_S <= 120
    assert resolve_timeout(2.5) == 2.5 and math.isinf(resolve_timeout(math.inf))
    monkeypatch.setenv(TIMEOUT_ENV, "7")
    assert resolve_timeout() == 7.0 and resolve_timeout(1) == 1.0
    for bad in (0, -1, math.nan, True, "5"):
        with pytest.raises(ValueError, match="timeout_s must be a number of seconds > 0"):
            resolve_timeout(bad)
    monkeypatch.setenv(TIMEOUT_ENV, "soon")
    with pytest.raises(ValueError, match=f"{TIMEOUT_ENV} must be a number"):
        resolve_timeout()


class _Work:
    """A stand-in for a torch.distributed work handle whose wait fails like gloo's (a timed wait) and which may
    still be running on the device (`completed`)."""

    def __init__(self, error: str | None = None, completed: bool = False) -> None:
        self.error, self.timeouts, self.completed = error, [], completed

    def wait(self, timeout=None):
        self.timeouts.append(timeout)
        if self.error and timeout is not None:
            raise RuntimeError(self.error)
        return True

    def is_completed(self) -> bool:
        return self.completed


def test_wait_bounded_names_what_is_missing():
    done, late = _Work(), _Work("[gloo/unbound_buffer.cc:78] Timed out waiting 2000ms for recv operation to complete")
    with pytest.raises(RingTimeoutError, match=r"rank 3: forward/branch2 step 4: no progress within 2 s waiting "
                                               r"to receive from rank 1 \(then: send to rank 2\)"):
        wait_bounded([(done, "send to rank 0"), (late, "receive from rank 1"), (_Work(), "send to rank 2")], 2.0,
                     "rank 3: forward/branch2 step 4")
    assert isinstance(done.timeouts[0], datetime.timedelta) and 0 < done.timeouts[0].total_seconds() <= 2
    closed = _Work("[gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:5000")
    with pytest.raises(RingCommError, match=r"backward/branch0 step 1: failed waiting to receive from rank 0 "
                                            r"\(.*Connection closed by peer") as info:
        wait_bounded([(closed, "receive from rank 0")], 5.0, "rank 1: backward/branch0 step 1")
    assert not isinstance(info.value, TimeoutError)
    unbounded = _Work()
    wait_bounded([(unbounded, "receive from rank 0")], math.inf, "x")
    assert unbounded.timeouts == [None]


def test_device_side_waits_let_the_host_run_ahead_and_check_each_step_bounded_later():
    """NCCL steps: the stream waits at once (no timeout), the host checks a step only once DEFERRED_STEPS later
    steps are posted or it has completed, and settle_transfers checks the rest; a stalled step still raises,
    naming itself, at a later step."""
    settle_transfers()
    running = [_Work() for _ in range(DEFERRED_STEPS + 1)]
    for index, work in enumerate(running):
        wait_bounded([(work, f"receive from rank {index}")], 2.0, f"step {index}", on_device=True)
    assert running[0].timeouts[0] is None and len(running[0].timeouts) == 2  # the stream's wait, then the host's
    assert all(work.timeouts == [None] for work in running[1:])  # not yet checked on the host
    done = _Work(completed=True)
    running[1].completed = True
    wait_bounded([(done, "send to rank 0")], 2.0, "later", on_device=True)
    assert len(running[1].timeouts) == 2 and len(done.timeouts) == 1  # completed steps are checked in order
    settle_transfers()
    assert len(running[2].timeouts) == 2 and len(done.timeouts) == 2
    stalled = _Work("[c10d] Work timed out", completed=False)
    wait_bounded([(stalled, "receive from rank 1")], 2.0, "rank 0: forward/branch1 step 1", on_device=True)
    with pytest.raises(RingTimeoutError, match=r"forward/branch1 step 1: no progress within 2 s waiting to receive"):
        for step in range(DEFERRED_STEPS):
            wait_bounded([(_Work(), "send")], 2.0, f"step {step}", on_device=True)
    settle_transfers()
    unbounded = _Work()
    wait_bounded([(unbounded, "receive from rank 0")], math.inf, "x", on_device=True)
    assert unbounded.timeouts == [None]
    settle_transfers()
