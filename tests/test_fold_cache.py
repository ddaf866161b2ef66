"""Observing again without a record between folds nothing again, and never goes stale.

A ``Metrics`` keeps the fold of its pending samples from one observation to
the next while nothing changes (``Store.folded``). The oracle for staleness is
a fresh ``Metrics`` that replays the same operations and is observed once:
every observation of the cached one must equal it exactly, whatever
recording path, reset or merge came between.
"""

from __future__ import annotations

import pickle
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metricsync as ms
import metricsync._record._convert as convert
import metricsync._record._store as store_module
import metricsync._state._algebra as al
from metricsync._record._pending import StampedBuffer

torch = pytest.importorskip("torch")

SPECS = {
    "a": ms.Spec(),
    "b": ms.Spec(("mean", "max", "p50")),
    "c": ms.Spec("last"),
    "d": ms.Spec("std", nan="ignore"),
    "e": ms.Spec("sum", across="mean"),
}
NAMES = [*sorted(SPECS), "f"]  # "f" has no spec: a weighted mean

finite = st.floats(-1e6, 1e6, allow_nan=False)
name = st.sampled_from(NAMES)
record_ops = st.one_of(
    st.tuples(st.just("num"), name, finite),
    st.tuples(st.just("weighted"), st.sampled_from(["a", "f"]), finite, st.floats(0, 10)),
    st.tuples(st.just("array"), name, st.lists(finite, min_size=1, max_size=12)),
    st.tuples(st.just("masked"), st.sampled_from(["a", "b"]), st.integers(0, 2**31)),
    st.tuples(st.just("tensor0d"), name, finite),
    st.tuples(st.just("device0d"), name, finite),
    st.tuples(st.just("update"), name, finite),
    st.tuples(st.just("merge"), name, finite),
    st.tuples(st.just("reset")),
)
observe_ops = st.tuples(
    st.just("observe"), st.sampled_from(["compute", "names", "bytes", "sync", "copy", "pickle"])
)
programs = st.lists(st.one_of(record_ops, observe_ops), min_size=1, max_size=30)


def _apply(m: ms.Metrics, op: tuple) -> None:
    kind = op[0]
    if kind == "num":
        m.record(op[1], op[2])
    elif kind == "weighted":
        m.record(op[1], op[2], weight=op[3])
    elif kind == "array":
        m.record(op[1], np.array(op[2]))
    elif kind == "masked":  # a per-token CPU tensor large enough for the masked path
        rng = np.random.default_rng(op[2])
        values = torch.from_numpy(rng.normal(size=(2, 300)))
        m.record(op[1], values, mask=torch.from_numpy(rng.random((2, 300)) < 0.5))
    elif kind == "tensor0d":
        m.record(op[1], torch.tensor(op[2], dtype=torch.float64))
    elif kind == "device0d":  # a CPU tensor down the device path: from the name's second
        # such record on, its lane takes it without the lock (no change count moves)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(convert, "HOST_DEVICE_TYPES", frozenset())
            m.record(op[1], torch.tensor(op[2], dtype=torch.float64))
    elif kind == "update":
        m.update({op[1]: op[2]})
    elif kind == "merge":
        other = ms.Metrics(SPECS)
        other.record(op[1], op[2])
        m.merge(other)
    elif kind == "reset":
        m.reset()


def _observe(m: ms.Metrics, how: str) -> object:
    if how == "names":
        return m.names
    if how == "bytes":
        return ms.Metrics.from_bytes(m.to_bytes()).compute()
    if how == "sync":
        return m.sync().compute()
    if how == "copy":
        return m.copy().compute()
    if how == "pickle":
        return pickle.loads(pickle.dumps(m)).compute()
    return m.compute()


def _check(program: list[tuple]) -> None:
    """Run ``program`` on one Metrics; each observation must equal a fresh replay's."""
    m = ms.Metrics(SPECS)
    done: list[tuple] = []
    for op in program:
        if op[0] != "observe":
            _apply(m, op)
            done.append(op)
            continue
        fresh = ms.Metrics(SPECS)
        for earlier in done:
            _apply(fresh, earlier)
        np.testing.assert_equal(_observe(m, op[1]), _observe(fresh, op[1]))


@settings(max_examples=150, deadline=None)
@given(programs)
def test_every_observation_equals_a_fresh_replay(program: list[tuple]) -> None:
    _check([*program, ("observe", "compute")])


def _count_calls(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """A list that gains an item at each call of ``metricsync._record._store``'s ``name``."""
    calls: list[int] = []
    real = getattr(store_module, name)

    def counting(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(store_module, name, counting)
    return calls


def test_observing_again_folds_nothing_again(monkeypatch: pytest.MonkeyPatch) -> None:
    folds = _count_calls(monkeypatch, "fold")
    m = ms.Metrics(SPECS)
    m.record("a", 1.0)
    m.record("b", [3.0, 4.0])
    first = m.compute()
    assert len(folds) == 1
    assert m.compute() == first and m.sync().compute() == first
    m.to_bytes(), m.names, m.copy()
    assert len(folds) == 1  # every observation read the same fold
    m.record("a", 3.0)  # the lock-free path: no change counted, a longer buffer
    assert m.compute()["a"] == 2.0
    assert len(folds) == 2
    m.reset()
    assert m.compute() == {}
    m.record("b", 5.0)
    assert m.compute() == {"b/mean": 5.0, "b/max": 5.0, "b/p50": pytest.approx(5.0, rel=0.01)}


def test_names_and_compute_share_a_fold_with_device_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``names`` reads no device, so it folds without device states. Once ``compute()``
    has kept a fold with them, ``names`` reads that one (device slots count either way)
    rather than folding again and evicting it."""

    fresh = ms.Metrics(SPECS)  # the oracle: the same records on the host path
    for args in (("a", 1.0), ("b", [2.0, float("nan")]), ("d", float("nan"))):
        fresh.record(*args)
    fresh.record("f", 3.0, weight=2.0)
    want = fresh.compute()
    monkeypatch.setattr(convert, "HOST_DEVICE_TYPES", frozenset())  # CPU tensors: device path
    folds = _count_calls(monkeypatch, "fold")
    reads = _count_calls(monkeypatch, "merge_devices")
    m = ms.Metrics(SPECS)
    m.record("a", 1.0)
    m.record("b", torch.tensor([2.0, float("nan")]))
    m.record("d", torch.tensor(float("nan")))  # dropped on the device: still a name held
    m.record("f", 3.0, weight=2.0)
    first = m.names
    assert first == ["a", "b", "d", "f"]  # a device record counts, even one a fold drops
    for _ in range(3):
        assert m.names == first  # the same, whichever fold it read
        got = m.compute()
        assert got.keys() == want.keys()
        assert all(np.isclose(got[k], want[k], equal_nan=True) for k in want)
    assert (len(folds), len(reads)) == (2, 1)  # names once without devices, compute once
    m.record("a", 2.0)
    assert m.names == ["a", "b", "d", "f"] and m.compute()["a"] == 1.5
    assert (len(folds), len(reads)) == (4, 2)  # a record: each folds again, once


def test_a_copy_handed_out_is_the_callers_to_change() -> None:
    m = ms.Metrics(SPECS)
    m.record("a", 1.0)
    before = m.compute()
    c = m.copy()
    c.record("a", 100.0)  # changes the copy, not the fold the original keeps
    c.merge(m)
    assert m.compute() == before
    assert c.compute() == {"a": pytest.approx(34.0)}


def test_each_compute_returns_a_dict_of_its_own() -> None:
    """compute() copies a dict of the keys each plan keeps: changing one result, keys
    and all, changes neither the next result nor its key order."""
    m = ms.Metrics({"s": ms.Spec(("mean", "max"))})
    m.record("a", 1.0)
    m.record("s", 2.0)
    want = None
    for observe in [m.compute, m.compute, m.copy().compute, m.compute]:
        result = observe()
        want = want or list(result.items())
        assert list(result.items()) == want
        result["a"] = -1.0
        result["new"] = 0.0
        del result["s/max"]
    m.record("a", 3.0)  # the same keys, new values
    assert m.compute() == {"a": 2.0, "s/mean": 2.0, "s/max": 2.0}


PATH_OPS = {
    "num": lambda x: ("num", "b", x),
    "weighted": lambda x: ("weighted", "f", x, 2.0),
    "array": lambda x: ("array", "b", [x, x + 1.0]),
    "masked": lambda x: ("masked", "a", int(x)),
    "tensor0d": lambda x: ("tensor0d", "d", x),
    "device0d": lambda x: ("device0d", "b", x),
    "update": lambda x: ("update", "a", x),
    "merge": lambda x: ("merge", "e", x),
}


@pytest.mark.parametrize("path", sorted(PATH_OPS))
def test_each_recording_path_after_an_observation(path: str) -> None:
    """Record, observe, record again by the same path (its fast path by now), observe;
    then the same after a reset, which brings the buffers back to the same lengths."""
    make = PATH_OPS[path]
    program = [make(1.0), make(2.0), ("observe", "compute"), make(3.0), ("observe", "sync")]
    program += [("reset",), make(4.0), make(5.0), ("observe", "compute")]
    program += [("reset",), make(6.0), make(7.0), ("observe", "compute")]
    _check(program)


def test_a_fold_kept_during_a_last_record_does_not_outlive_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another thread observes while a ``last`` number is being recorded, and another
    Metrics records in between: once the record returns, the kept fold must carry the
    record's own time, so that a merge picks the number recorded last."""
    m = ms.Metrics({"c": ms.Spec("last")})
    other = ms.Metrics({"c": ms.Spec("last")})
    m.record("c", 1.0)  # opens the buffer: the next number takes the lock-free path
    real = al.now_us
    hooked: list[bytes] = []

    def now_us() -> float:
        if threading.current_thread().name == "recorder" and not hooked:
            observer = threading.Thread(target=lambda: hooked.append(m.to_bytes()))
            observer.start()
            observer.join()
            time.sleep(0.002)
            other.record("c", 5.0)  # after the observation, before the record's time
            time.sleep(0.002)
        return real()

    monkeypatch.setattr(al, "now_us", now_us)
    recorder = threading.Thread(target=m.record, args=("c", 2.0), name="recorder")
    recorder.start()
    recorder.join()
    monkeypatch.setattr(al, "now_us", real)
    assert hooked  # the observation ran inside the record
    assert m.compute() == {"c": 2.0}
    assert ms.merge([other, m]).compute() == {"c": 2.0}
    assert ms.merge([m, other]).compute() == {"c": 2.0}


def test_a_number_that_does_not_fit_leaves_a_last_buffers_time_alone() -> None:
    buf = StampedBuffer("d")
    buf.append(1.0)
    stamp = buf.stamp
    with pytest.raises(OverflowError):
        buf.append(10**400)  # the time is written first, then taken back
    assert buf.stamp == stamp and buf.tolist() == [1.0]
