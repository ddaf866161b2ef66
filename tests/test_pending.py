"""Pending host samples read out as a batch: every sample once, in its run, at its time.

Found by a mutation sweep of ``metricsync/_record/_pending.py`` and ``metricsync/_record/_runs.py``:
each test pins a behaviour no other test checked. The oracle is the raw samples
themselves: a batch's runs, expanded, hold exactly the samples recorded since the
previous consuming read (each with its weight), under the slot of their name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest

import metricsync._state._algebra as al
from metricsync._record._fold import Batch
from metricsync._record._pending import Held, HostPending
from metricsync._state._spec import Spec

INDEX = {"x": 0, "y": 1, "z": 2, "w": 3}


@contextlib.contextmanager
def clock() -> Iterator[list[float]]:
    """A recording clock the test sets: ``now[0]`` microseconds until changed."""
    now = [1.0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(al, "now_us", lambda: now[0])
        yield now


def samples(batch: Batch | None) -> dict[int, list[tuple[float, float]]]:
    """The batch's runs expanded: slot -> sorted (value, weight) pairs."""
    out: dict[int, list[tuple[float, float]]] = {}
    if batch is None:
        return out
    n = len(batch.values)
    weights = np.ones(n) if batch.weights is None else batch.weights
    assert len(weights) == n
    assert int(batch.length.sum()) == n  # the runs cover the values, none twice
    for slot, start, length in zip(
        batch.slot.tolist(), batch.start.tolist(), batch.length.tolist()
    ):
        run = zip(batch.values[start : start + length].tolist(), weights[start : start + length])
        out.setdefault(slot, []).extend((v, float(w)) for v, w in run)
    return {slot: sorted(pairs) for slot, pairs in out.items()}


def stamped(batch: Batch | None) -> dict[int, list[tuple[float, float, float]]]:
    """The batch's runs expanded with their times: slot -> sorted (value, weight, time)."""
    out: dict[int, list[tuple[float, float, float]]] = {}
    if batch is None:
        return out
    weights = np.ones(len(batch.values)) if batch.weights is None else batch.weights
    for slot, start, length, stamp in zip(
        batch.slot.tolist(), batch.start.tolist(), batch.length.tolist(), batch.stamp.tolist()
    ):
        for i in range(start, start + length):
            out.setdefault(slot, []).append((float(batch.values[i]), float(weights[i]), stamp))
    return {slot: sorted(triples) for slot, triples in out.items()}


def ones(*values: float) -> list[tuple[float, float]]:
    return sorted((float(v), 1.0) for v in values)


def test_a_number_appended_to_a_buffer_held_across_a_fold_folds_at_the_next_one() -> None:
    pending = HostPending()
    pending.open("x", Spec("sum"))
    held = pending.fast["x"]  # a recording thread fetched the buffer before the fold
    held.append(1.0)
    assert samples(pending.take(INDEX, consume=True)) == {0: ones(1.0)}
    held.append(2.0)  # its append lands after the fold, in the buffer it holds
    pending.fast["x"].append(3.0)
    assert samples(pending.take(INDEX, consume=True)) == {0: ones(2.0, 3.0)}
    held.append(4.0)  # still held: still read, past what was read already
    assert samples(pending.take(INDEX, consume=True)) == {0: ones(4.0)}
    del held  # the thread let go: nothing more can land there
    assert samples(pending.take(INDEX, consume=True)) == {}
    assert pending.empty()


def test_an_observation_keeps_the_late_numbers_of_a_buffer_nobody_holds_any_more() -> None:
    pending = HostPending()
    pending.open("x", Spec("sum"))
    held = pending.fast["x"]
    held.append(1.0)
    assert samples(pending.take(INDEX, consume=True)) == {0: ones(1.0)}
    held.append(2.0)
    del held  # released before anything reads the late number
    assert samples(pending.take(INDEX, consume=False)) == {0: ones(2.0)}
    assert samples(pending.take(INDEX, consume=True)) == {0: ones(2.0)}
    assert samples(pending.take(INDEX, consume=True)) == {}


def test_arrays_listed_under_a_name_fold_once() -> None:
    pending = HostPending()
    pending.open("x", Spec("sum"))
    big = np.arange(100.0)  # more than joins the number buffer: listed under the name
    assert pending.extend("x", big)
    assert samples(pending.take(INDEX, consume=True)) == {0: ones(*big)}
    assert samples(pending.take(INDEX, consume=True)) == {}
    assert pending.empty()


def test_a_weighted_number_appended_to_a_pair_held_across_a_fold_folds_at_the_next_one() -> None:
    pending = HostPending()
    pending.open_weighted("x", Spec("mean"))
    held = pending.weighted["x"]  # fetched by a thread before the fold
    held.extend((1.0, 2.0))
    assert samples(pending.take(INDEX, consume=True)) == {0: [(1.0, 2.0)]}
    held.extend((3.0, 4.0))  # lands after the fold
    pending.weighted["x"].extend((5.0, 6.0))
    assert samples(pending.take(INDEX, consume=True)) == {0: [(3.0, 4.0), (5.0, 6.0)]}
    del held
    assert samples(pending.take(INDEX, consume=True)) == {}
    assert pending.empty()


def test_an_empty_buffer_held_during_a_fold_keeps_the_number_appended_to_it() -> None:
    pending = HostPending()
    for name in ("x", "y"):
        pending.open(name, Spec("sum"))
    held = pending.fast["y"]  # empty when the fold comes: fetched by a recording thread
    pending.fast["x"].append(1.0)
    assert samples(pending.take(INDEX, consume=True)) == {0: ones(1.0)}
    held.append(2.0)  # the thread's append, after the fold
    del held
    assert samples(pending.take(INDEX, consume=True)) == {1: ones(2.0)}


def test_a_consuming_fold_nobody_races_leaves_nothing_pending() -> None:
    pending = HostPending()
    pending.open("x", Spec("sum"))
    pending.open_weighted("y", Spec("mean"))
    pending.fast["x"].append(1.0)
    pending.weighted["y"].extend((2.0, 3.0))
    pending.extend("x", np.arange(100.0))
    pending.add(2, np.array([4.0, 5.0]), np.array([1.0, 0.5]), 7.0)
    got = samples(pending.take(INDEX, consume=True))
    assert got == {0: ones(1.0, *range(100)), 1: [(2.0, 3.0)], 2: [(4.0, 1.0), (5.0, 0.5)]}
    assert pending.empty() and not pending.held() and not pending.chunk_slots()
    assert pending.appended() == 0
    assert pending.take(INDEX, consume=True) is None


def test_a_capture_reads_what_an_observation_at_that_moment_reads() -> None:
    with clock() as now:
        pending = HostPending()
        pending.open("x", Spec("last"))  # keeps the time of its latest number
        pending.open("y", Spec("sum"))
        pending.open_weighted("w", Spec("mean"))
        held_x, held_y = pending.fast["x"], pending.fast["y"]  # fetched before a fold
        held_w = pending.weighted["w"]
        now[0] = 2.0
        held_x.append(1.0), held_y.append(2.0)
        held_w.extend((3.0, 0.5))
        pending.take(INDEX, consume=True)  # the three are still held
        now[0] = 4.0
        held_x.append(5.0), held_y.append(6.0)  # late numbers: the buffers are still theirs
        held_w.extend((7.0, 2.0))
        now[0] = 6.0
        pending.fast["x"].append(8.0), pending.fast["y"].append(9.0)
        pending.weighted["w"].extend((10.0, 3.0))
        pending.extend("z", np.arange(100.0))  # no buffer for z: refused
        pending.open("z", Spec("sum"))
        pending.extend("z", np.arange(100.0))
        pending.add(3, np.array([11.0, 12.0]), np.array([1.0, 4.0]), 5.0)
        now[0] = 8.0
        expected = stamped(pending.take(INDEX, consume=False))
        captured = pending.capture(INDEX)
        now[0] = 10.0  # recorded after the capture: not in it
        for buf in (held_x, held_y, pending.fast["x"], pending.fast["y"]):
            buf.append(-1.0)
        for pair in (held_w, pending.weighted["w"]):
            pair.extend((-1.0, 1.0))
        pending.extend("z", np.arange(100.0))
        pending.add(3, np.array([-1.0]), None, 10.0)
        got = stamped(captured.batch(INDEX))
    assert got == expected
    assert got[0] == [(5.0, 1.0, 6.0), (8.0, 1.0, 6.0)]  # x: the time of its latest number
    assert got[1] == [(6.0, 1.0, 8.0), (9.0, 1.0, 8.0)]  # y: the time of the read
    assert got[3] == [(7.0, 2.0, 8.0), (10.0, 3.0, 8.0), (11.0, 1.0, 5.0), (12.0, 4.0, 5.0)]
    assert got[2] == [(float(v), 1.0, 8.0) for v in sorted(range(100))]


def test_restored_retired_numbers_fold_once_as_their_own_runs() -> None:
    # checkpoints of earlier versions carry numbers read apart from their name's buffer
    held = Held(
        retired=[
            ("x", np.array([1.0, 2.0]), None, None),
            ("w", np.array([3.0]), np.array([2.0]), None),
            ("y", np.array([4.0]), None, 7.0),  # a ``last`` buffer's time
        ]
    )
    pending = HostPending()
    specs = {"x": Spec("sum"), "w": Spec("mean"), "y": Spec("last")}
    pending.restore(held, specs)
    assert not pending.empty() and pending.held() == {"x", "w", "y"}
    again = pending.export().retired
    assert [(n, v.tolist(), None if w is None else w.tolist(), t) for n, v, w, t in again] == [
        ("x", [1.0, 2.0], None, None),
        ("w", [3.0], [2.0], None),
        ("y", [4.0], None, 7.0),
    ]
    with clock():
        want = {0: [(1.0, 1.0, 1.0), (2.0, 1.0, 1.0)], 1: [(4.0, 1.0, 7.0)], 3: [(3.0, 2.0, 1.0)]}
        assert stamped(pending.take(INDEX, consume=False)) == want
        assert stamped(pending.take(INDEX, consume=True)) == want
    assert pending.empty() and pending.take(INDEX, consume=True) is None
