"""Four threads record into the same names while another folds: every sample counted once.

The lock-free record path appends to the one buffer a name keeps; a fold
copies each buffer in one call and deletes exactly the numbers the copy held
(``metricsync._record._pending``). Here four threads record Python numbers, lists of
them and weighted numbers (a weight of their own each, so a value paired with
another thread's weight changes the sum) into the same three names, filling
the buffers many times over (a fold every 4,096 numbers), while a fifth
thread observes without a sync in a loop (``compute``, ``to_bytes``,
``copy``) and a sixth records arrays of 256 samples under a fourth name, which
folds every buffer each 256 of them (the buffered array samples fill). The
interpreter switches threads every microsecond. The final counts and sums
must equal what the threads recorded, exactly: small integers in float64, so
no rounding. Deleting a whole buffer at a fold instead of the numbers its copy
held fails it (numbers appended between the copy and the deletion are lost).

0-d accelerator tensors take the same kind of path: an append to their device's
inbox (``Lane.take``), moved into the pending records under the lock (CPU tensors
stand in for an accelerator's).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _threads import run_threads, switching_every_microsecond

import metricsync as ms
import metricsync._facade._metrics as metrics_module
import metricsync._record._pending as pending_module
import metricsync._record._runs as runs_module
import metricsync._record._store as store_module
from metricsync._record._pending import HostPending
from metricsync._state._spec import Spec

THREADS = 4
ROUNDS = 6000  # per thread: about 6 folds of each name's buffer
SPECS = {
    "n": ms.Spec(("sum", "count", "max")),
    "l": ms.Spec(("sum", "count")),
    "w": ms.Spec(("sum", "count", "mean")),
    "a": ms.Spec(("sum", "count")),
}


@pytest.fixture
def switch_every_microsecond() -> Iterator[None]:
    with switching_every_microsecond():
        yield


@pytest.fixture
def small_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fold every 64 numbers of a name (every 32 weighted ones): many more folds, each
    a chance for a thread to append between a fold's copy of a buffer and its deletion."""
    for module in (metrics_module, store_module):
        monkeypatch.setattr(module, "FAST_LIMIT", 64)
        monkeypatch.setattr(module, "PAIR_LIMIT", 64)


@pytest.mark.parametrize("limits", ["as shipped", "small buffers", "small buffers, no GIL read"])
def test_four_threads_recording_the_same_names_while_another_folds(
    switch_every_microsecond: None,
    limits: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if limits.startswith("small buffers"):
        request.getfixturevalue("small_buffers")
    if limits.endswith("no GIL read"):  # the read a free-threaded build takes: copy each
        monkeypatch.setattr(runs_module, "_gil_enabled", lambda: False)
    m = ms.Metrics(SPECS)
    for name in ("n", "l"):  # the names' buffers open: every record below takes the fast path
        m.record(name, 0.0)
    m.record("w", 0.0, weight=0.0)
    m.record("a", 1.0)
    done = threading.Event()
    observed, folding = [0], [0]

    def recorder(k: int) -> None:
        value = float(k + 1)
        pair = [value, 2.0 * value]
        for _ in range(ROUNDS):
            m.record("n", value)
            m.record("l", pair)
            m.record("w", value, weight=value)  # a weight of its own: sum of w*v is 10/16ths

    def observer() -> None:
        while not done.is_set() or not observed[0]:
            m.compute()
            m.to_bytes()
            m.copy().compute()
            observed[0] += 1

    def folder() -> None:
        block = np.ones(256)
        while not done.is_set() or folding[0] <= 256:  # a count, whatever the scheduling
            m.record("a", block)
            folding[0] += 1

    def recorders() -> None:
        try:
            assert not run_threads([lambda k=k: recorder(k) for k in range(THREADS)])
        finally:
            done.set()

    errors = run_threads([recorders, observer, folder])
    assert not errors, errors[:3]
    assert observed[0] > 0 and folding[0] > 256
    values = [float(k + 1) for k in range(THREADS)]
    want = {
        "n/sum": ROUNDS * sum(values),
        "n/count": 1.0 + ROUNDS * THREADS,
        "n/max": max(values),
        "l/sum": ROUNDS * sum(3.0 * v for v in values),
        "l/count": 1.0 + 2 * ROUNDS * THREADS,
        "w/sum": ROUNDS * sum(v * v for v in values),  # sum of weight * value
        "w/count": ROUNDS * sum(values),  # the weights' sum
        "a/sum": 1.0 + 256 * folding[0],
        "a/count": 1.0 + 256 * folding[0],
    }
    got = m.compute()
    assert got.pop("w/mean") == pytest.approx(want["w/sum"] / want["w/count"], rel=1e-12)
    assert got == want
    assert ms.Metrics.from_bytes(m.to_bytes()).compute() == m.compute()


def test_a_number_appended_between_a_folds_copy_and_its_deletion_folds_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pending = HostPending()
    pending.open("x", Spec("sum"))
    pending.open_weighted("w", Spec("mean"))
    buf, pair = pending.fast["x"], pending.weighted["w"]
    buf.append(5.0)
    pair.extend((5.0, 2.0))
    delete = pending_module._delete

    def late(bufs: list[array], counts: list[int] | None) -> None:
        for held in bufs:  # another thread's append, after the fold's copy
            held.append(1.0)
        delete(bufs, counts)

    monkeypatch.setattr(pending_module, "_delete", late)
    first = pending.take({"x": 0, "w": 1}, consume=True)
    monkeypatch.undo()
    assert first is not None and sorted(first.values.tolist()) == [5.0, 5.0]
    assert buf.tolist() == [1.0]  # the late number stays, in the buffer the thread holds
    pair.append(3.0)  # the weighted buffer's late float and this one: a pair
    assert pending.fast["x"] is buf and pending.weighted["w"] is pair
    second = pending.take({"x": 0, "w": 1}, consume=True)
    assert second is not None and sorted(second.values.tolist()) == [1.0, 1.0]
    assert second.weights is not None and sorted(second.weights.tolist()) == [1.0, 3.0]
    assert pending.empty()


@pytest.mark.parametrize("ref_limit", [1024, 16])
def test_four_threads_recording_0d_device_tensors_while_another_observes(
    switch_every_microsecond: None, ref_limit: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 0-d tensors of an accelerator go to their name's lane without the lock: an append to
    # the device's inbox, which folds (every ``ref_limit``) and observations move under
    # the lock. CPU tensors stand in for an accelerator's.
    torch = pytest.importorskip("torch")
    from metricsync._record import _convert
    from metricsync._record import _device as device_module

    monkeypatch.setattr(_convert, "HOST_DEVICE_TYPES", frozenset())
    monkeypatch.setattr(device_module, "REF_LIMIT", ref_limit)
    m = ms.Metrics({"d": ms.Spec(("sum", "count", "max")), "e": ms.Spec(("sum", "count"))})
    m.record("d", torch.tensor(0.0))  # the names' lanes open
    m.record("e", torch.tensor(0.0))
    rounds = 1500
    done = threading.Event()
    observed = [0]

    def recorder(k: int) -> None:
        values = [torch.tensor(float(k + 1)) for _ in range(8)]  # each recorded many times
        for i in range(rounds):
            m.record("d", values[i % 8])
            m.record("e", values[(i + 1) % 8])

    def observer() -> None:
        while not done.is_set() or not observed[0]:
            m.compute()
            m.copy().compute()
            observed[0] += 1

    def recorders() -> None:
        try:
            assert not run_threads([lambda k=k: recorder(k) for k in range(THREADS)])
        finally:
            done.set()

    errors = run_threads([recorders, observer])
    assert not errors, errors[:3]
    total = rounds * sum(float(k + 1) for k in range(THREADS))
    want = {"d/sum": total, "d/count": 1.0 + rounds * THREADS, "d/max": float(THREADS)}
    want |= {"e/sum": total, "e/count": 1.0 + rounds * THREADS}
    assert m.compute() == want


def _late_inbox() -> tuple[Any, Any]:
    """A CPU device state holding one record of a ``(sum, count)`` row, and its lane, whose
    inbox lets another thread's record in as a slice of it is read (``inbox.late = lane``:
    the next slice read appends 100.0 through that lane)."""
    torch = pytest.importorskip("torch")
    from metricsync._record._device import DeviceState
    from metricsync._record._device_refs import Lane

    class Late(list[Any]):
        late: Lane | None = None

        def __getitem__(self, i: Any) -> Any:
            out = super().__getitem__(i)
            if isinstance(i, slice) and self.late is not None:
                lane, self.late = self.late, None
                assert lane.take(torch.tensor(100.0))
            return out

    state = DeviceState(torch.device("cpu"))
    row = state.add(0, Spec(("sum", "count")), torch.tensor(1.0), None, None, now=1.0)
    state.inbox = Late()
    return state, Lane(state, row)


def test_a_reference_appended_to_the_inbox_while_it_drains_folds_next() -> None:
    torch = pytest.importorskip("torch")
    from metricsync._state import _algebra as al

    state, lane = _late_inbox()
    assert lane.take(torch.tensor(2.0))
    state.inbox.late = lane
    state.drain()
    assert len(state.inbox) == 1 and state.appended() == 2  # the late one stays, counted
    cols = state.snapshot()[1]
    assert (cols[al.S][0], cols[al.W][0]) == (103.0, 3.0)


def test_a_reference_appended_to_the_inbox_while_an_observation_pins_it_is_read_next() -> None:
    # an observation pins the inbox's first n references where they are; one a lane
    # appends meanwhile stays after them, unpinned, and the next observation reads it
    # (writing the pinned ones back over the whole inbox would drop it)
    torch = pytest.importorskip("torch")
    from metricsync._state import _algebra as al

    state, lane = _late_inbox()
    kept = torch.tensor(2.0)
    assert lane.take(kept)
    state.inbox.late = lane
    cols = state.snapshot()[1]
    assert (cols[al.S][0], cols[al.W][0]) == (3.0, 2.0)  # the late one is not in this one
    assert len(state.inbox) == 2 and state.inbox[0][1] is not kept  # pinned where it was
    kept.add_(10.0)  # after the observation read it: changes nothing
    cols = state.snapshot()[1]
    assert (cols[al.S][0], cols[al.W][0]) == (103.0, 3.0)
    state.commit()
    assert not state.inbox and state.appended() == 2
    cols = state.snapshot()[1]
    assert (cols[al.S][0], cols[al.W][0]) == (103.0, 3.0)
