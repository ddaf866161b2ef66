"""Several threads on one ``Metrics``: no sample of a returned ``record`` lost, no exception.

Recording threads use every path (Python numbers without a lock, weighted
numbers, arrays, ``update``) while other threads call ``compute``,
``state_dict``, ``to_bytes``, ``copy``, ``names``, ``sync`` (no process group:
a copy), ``merge`` (into the shared object and out of it) and ``reset`` (on a
second object). The interpreter switches threads every microsecond, so a
thread is interrupted between almost any two bytecodes. Every sample is
counted: the final sums equal what the threads recorded, plus what merges
added.

The same with a process group (a thread recording while the main thread
syncs) is in ``tests/distributed/test_sync_timeouts.py``.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
from array import array
from collections.abc import Iterator

import numpy as np
import pytest
from _threads import run_threads, switching_every_microsecond

import metricsync as ms

RECORDERS = 4
ROUNDS = 3000  # per recording thread; a fold every 4096 numbers of a name


@pytest.fixture
def switch_every_microsecond() -> Iterator[None]:
    with switching_every_microsecond():
        yield


SPECS = {
    "n": ms.Spec(("sum", "count", "max")),  # fast path
    "w": ms.Spec(("sum", "count")),  # weighted fast path
    "a": ms.Spec(("sum", "count", "p50")),  # arrays, through the sketch
    "lr": ms.Spec(("last", "count")),  # stamped fast path
    "u": ms.Spec(("sum", "count")),  # update, numbers
    "v": ms.Spec(("sum", "count")),  # update, arrays
}


def test_records_from_many_threads_while_others_observe_and_merge(
    switch_every_microsecond: None,
) -> None:
    m = ms.Metrics(SPECS)
    done = threading.Event()
    one = ms.Metrics(SPECS)
    one.record("n", 1.0)
    merges = [0]
    observed = [0]

    def recorder(k: int) -> None:
        ones = np.ones(3)
        for i in range(ROUNDS):
            m.record("n", 1.0)
            m.record("w", 2.0, weight=0.5)
            m.record("lr", float(k))
            if i % 8 == 0:
                m.record("a", ones)
                m.update({"u": 1.0, "v": ones[:2]})

    def observer() -> None:
        while not done.is_set():
            m.compute()
            m.state_dict()
            assert ms.Metrics.from_bytes(m.to_bytes()).names is not None
            m.copy().compute()
            _ = m.names
            m.sync().compute()
            ms.Metrics(SPECS).merge(m).compute()  # m read while it is written
            observed[0] += 1

    def merger() -> None:
        while not done.is_set():
            m.merge(one)
            merges[0] += 1

    recorders = [lambda k=k: recorder(k) for k in range(RECORDERS)]

    def all_recorders() -> None:
        try:
            assert not run_threads(recorders)
        finally:
            done.set()

    errors = run_threads([all_recorders, observer, observer, merger])
    assert not errors, errors[:3]
    assert observed[0] > 0 and merges[0] > 0

    got = m.compute()
    recorded = RECORDERS * ROUNDS
    batches = RECORDERS * len(range(0, ROUNDS, 8))
    assert got["n/count"] == recorded + merges[0]
    assert got["n/sum"] == recorded + merges[0]
    assert got["w/count"] == 0.5 * recorded and got["w/sum"] == recorded
    assert got["lr/count"] == recorded and got["lr/last"] in range(RECORDERS)
    assert got["a/count"] == 3 * batches and got["a/sum"] == 3 * batches
    assert got["u/count"] == batches and got["v/count"] == 2 * batches
    # and every copy path sees the same
    assert ms.Metrics.from_bytes(m.to_bytes()).compute() == got
    assert m.copy().compute() == got


def test_reset_from_another_thread_never_raises(switch_every_microsecond: None) -> None:
    m = ms.Metrics(SPECS)
    done = threading.Event()
    resets = [0]

    reset_once = threading.Event()

    def recorder() -> None:
        try:
            rounds = 0
            # keep recording until the resetter has interleaved at least one
            # reset: a fast recorder must not finish before it ever ran
            while rounds < ROUNDS or not reset_once.wait(0):
                m.record("n", 1.0)
                m.record("w", 3.0, weight=2.0)
                m.record("a", [1.0, 2.0])
                rounds += 1
        finally:
            done.set()

    def resetter() -> None:
        while not done.is_set():
            m.reset()
            m.compute()
            resets[0] += 1
            reset_once.set()

    assert not run_threads([recorder, resetter])
    assert resets[0] > 0
    # what is left is a whole number of records of each path, never a torn one
    got = m.compute()
    assert got.get("w/sum", 0.0) == 3 * got.get("w/count", 0.0)
    assert got.get("a/sum", 0.0) == 1.5 * got.get("a/count", 0.0)
    m.reset()
    m.record("n", 1.0)
    assert m.compute()["n/count"] == 1.0


_IMPORT_RACE = """
import sys, threading
import metricsync as ms
assert "torch" not in sys.modules
sys.setswitchinterval(1e-6)
m = ms.Metrics({"x": ms.Spec(("mean", "count"))})
stop, started, errors, n = threading.Event(), threading.Event(), [], [0]
def recorder():
    try:
        while not stop.is_set():
            m.record("x", [1.0, 2.0])  # a list asks whether it is a tensor
            n[0] += 1
            started.set()
    except BaseException as exc:
        errors.append(repr(exc))
    finally:
        started.set()
t = threading.Thread(target=recorder)
t.start()
started.wait(60)  # the thread is recording before the import begins
m.sync()  # the first sync imports torch while the thread records
stop.set()
t.join()
assert "torch" in sys.modules and not errors, errors
got = m.compute()
assert n[0] > 0 and got["x/mean"] == 1.5 and got["x/count"] == 2 * n[0], (n, got)
print(n[0])
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_recording_while_another_thread_imports_torch() -> None:
    # a fresh interpreter: torch is imported (by the first sync) while a thread records
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_RACE], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout) > 0


class _AppendedMeanwhile(array):  # type: ignore[type-arg,unused-ignore]
    """A number buffer whose length is read before a number lands: its last number is
    one the fold's length count missed (an append between the count and the copy)."""

    def __len__(self) -> int:
        return max(array.__len__(self) - 1, 0)


def test_a_number_appended_while_buffers_are_read_is_counted() -> None:
    from metricsync._record._runs import Runs

    plain = [array("d", [1.0, 2.0]), array("d"), array("d", [3.0])]
    bufs = [*plain[:2], _AppendedMeanwhile("d", [3.0, 4.0, 5.0])]
    runs = Runs()
    counts = runs.read_bulk(bufs, np.arange(3), np.zeros(3))
    assert counts.tolist() == [2, 0, 3]  # every number, the late one too
    [(data, held, slots, _)] = runs.bulk
    assert np.frombuffer(data).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert held.tolist() == [2, 3] and slots.tolist() == [0, 2]
    runs = Runs()  # without a late number: one read, the same numbers
    assert runs.read_bulk(plain, np.arange(3), np.zeros(3)).tolist() == [2, 0, 1]
    assert np.frombuffer(runs.bulk[0][0]).tolist() == [1.0, 2.0, 3.0]
