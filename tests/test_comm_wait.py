"""How a sync waits for its collectives: host ones are polled, then waited for within the
deadline; failures become ``SyncError`` and mark the group out of step.

A fake ``dist`` hands out works that count how they are asked; no process group is made.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from metricsync import SyncError
from metricsync._sync import _comm
from metricsync._sync._comm import POLL_SECONDS, Comm, poll
from metricsync._sync._group import GroupContext, GroupMemory
from metricsync._sync._layout import GroupState

torch = pytest.importorskip("torch")  # the numpy-only test matrix has no torch


class _Work:
    """Completes after ``ready`` checks (never with None); ``wait`` may raise."""

    def __init__(self, ready: int | None, error: Exception | None = None) -> None:
        self.ready, self.error = ready, error
        self.checks = 0
        self.waits: list[Any] = []

    def is_completed(self) -> bool:
        self.checks += 1
        return self.ready is not None and self.checks > self.ready

    def wait(self, timeout: Any = None) -> bool:
        self.waits.append(timeout)
        if self.error is not None:
            raise self.error
        return True


class _Dist:
    def __init__(self, work: Any) -> None:
        self.work = work

    def all_reduce(self, tensor: Any, op: Any, group: Any, async_op: bool) -> Any:
        assert async_op
        return self.work


def _ctx(work: Any, state: GroupState, device: str = "cpu") -> GroupContext:
    """A group of two ranks on ``device`` whose collectives hand out ``work``."""
    memory = GroupMemory(0, 2, "fake", (0, 1), state)
    return GroupContext(_Dist(work), None, 0, 2, "fake", torch.device(device), memory)


def _reduce(work: Any, device: str = "cpu", deadline: float | None = None) -> GroupState:
    state = GroupState()
    comm = Comm(_ctx(work, state, device), deadline)
    out = comm.all_reduce(np.arange(3.0), "sum", "the test reduce")
    assert out.tolist() == [0.0, 1.0, 2.0]
    assert comm.count == 1
    return state


def test_a_host_collective_is_polled_until_it_completes_then_waited_for_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_comm, "POLL_SECONDS", 60.0)  # a loaded machine never runs it out
    work = _Work(ready=5)
    _reduce(work)
    assert work.checks == 6  # five times not yet, then done
    assert work.waits == [None]  # no deadline: a plain wait, which returns at once


@pytest.mark.parametrize("left", [30.0, 2e-3])  # above and below twice the poll's length
def test_a_poll_that_runs_out_leaves_the_wait_the_rest_of_the_deadline(
    left: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_comm, "remaining", lambda deadline: left)  # no clock: exact figures
    work = _Work(ready=None)  # never completes while polled
    _reduce(work, deadline=1.0)
    assert work.checks >= 1  # how many fit in the poll depends on the machine's load
    (timeout,) = work.waits
    polled = min(POLL_SECONDS, left / 2)  # a short deadline polls for half of it at most
    assert timeout.total_seconds() == pytest.approx(left - polled, abs=1e-6)


def test_a_poll_stops_at_its_budget() -> None:
    work = _Work(ready=None)
    assert poll(work, 0.0, lambda: None) is False
    assert work.checks == 1


def test_a_failed_wait_raises_sync_error_and_marks_the_group() -> None:
    work = _Work(ready=0, error=RuntimeError("peer went away"))
    with pytest.raises(SyncError, match="the test reduce did not complete: peer went away"):
        _reduce(work)
    assert work.checks == 1
    state = GroupState()
    comm = Comm(_ctx(work, state), None)
    with pytest.raises(SyncError):
        comm.all_reduce(np.zeros(1), "sum", "again")
    assert state.broken is not None and "peer went away" in state.broken


def test_a_poll_that_raises_is_a_failed_collective_too() -> None:
    class Broken(_Work):
        def is_completed(self) -> bool:
            raise RuntimeError("connection reset")

    state = GroupState()
    comm = Comm(_ctx(Broken(ready=0), state), None)
    with pytest.raises(SyncError, match="connection reset"):
        comm.all_reduce(np.zeros(1), "sum", "the test reduce")
    assert state.broken is not None


def test_device_collectives_async_syncs_and_works_without_a_completion_check_are_not_polled() -> (
    None
):
    work = _Work(ready=0)
    comm = Comm(_ctx(work, GroupState(), "meta"), None)
    with pytest.raises(NotImplementedError):  # the wait is over; a meta result has no data
        comm.all_reduce(np.zeros(1), "sum", "the test reduce")
    assert work.checks == 0 and work.waits == [None]

    work = _Work(ready=0)  # an async sync's thread: host collectives, not polled
    Comm(_ctx(work, GroupState()), None, poll=False).all_reduce(
        np.zeros(1), "sum", "the test reduce"
    )
    assert work.checks == 0 and work.waits == [None]

    class Plain:
        waited = 0

        def wait(self, timeout: Any = None) -> None:
            Plain.waited += 1

    assert poll(Plain(), 1.0, lambda: None) is False
    _reduce(Plain())
    assert Plain.waited == 1


def _poll_calls(rank: int, world: int) -> tuple[int, int]:
    import metricsync as ms

    calls: list[int] = []
    polled = _comm.poll

    def counted(*args: Any) -> bool:
        calls.append(1)
        return polled(*args)

    m = ms.Metrics()
    m.record("x", float(rank))
    m.sync(timeout=60)  # the first sync agrees on the layout: more collectives
    _comm.poll = counted
    try:
        assert m.sync(timeout=60).compute() == {"x": (world - 1) / 2}
        blocking = len(calls)
        assert m.sync(timeout=60, async_op=True).wait().compute() == {"x": (world - 1) / 2}
        return blocking, len(calls) - blocking
    finally:
        _comm.poll = polled


def test_blocking_syncs_poll_their_gather_and_async_syncs_do_not() -> None:
    from metricsync.testing import run_distributed

    for blocking, async_ in run_distributed(_poll_calls, 2, timeout=120):
        assert blocking == 1  # a steady sync's one gather, polled
        assert async_ == 0  # on the async thread, which would take the GIL at every check
