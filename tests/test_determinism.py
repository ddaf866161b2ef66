"""Bit-exact replay: results depend on the records alone.

A ``Metrics`` checkpointed with ``state_dict()`` and restored into a new one, or
``reset()`` and fed again, must give bit for bit the ``compute()`` of one that
was never interrupted (or of a fresh one), whatever was buffered, folded or
observed before: summation order follows the records, not the buffers' history.
The oracle is an uninterrupted ``Metrics`` fed the same records (a fresh one
after a reset); equality is exact, NaN equal to NaN.
"""

from __future__ import annotations

import math
import pickle
from typing import Any

import numpy as np
import pytest
from _compare import same
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metricsync as ms

torch = pytest.importorskip("torch")

SPECS = {
    "mean": ms.Spec(),
    "stats": ms.Spec(("mean", "std", "sum", "min", "max", "p50", "p90"), ddof=1),
    "drop": ms.Spec(("sum", "var", "p10"), nan="ignore"),
    "last": ms.Spec(("last", "mean")),
    "strict": ms.Spec(("mean", "var"), nan="error"),
    "across": ms.Spec(("sum", "mean"), across="mean"),
    "w/*": ms.Spec(("mean", "var", "p50")),
}
NAMES = ["mean", "stats", "drop", "last", "strict", "across", "w/a", "w/b", "plain", "stats"]

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)
anything = st.one_of(finite, st.sampled_from([math.nan, math.inf, -math.inf, 0.0, 1e300]))


@st.composite
def record(draw: Any) -> tuple[Any, ...]:
    name = draw(st.sampled_from(NAMES))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    noise = st.just(float(rng.normal(0.0, 10.0 ** rng.integers(-3, 6))))  # rounds in sums
    value = st.one_of(noise, finite if name == "strict" else anything)
    kind = draw(
        st.sampled_from(
            [
                "float",
                "int",
                "np",
                "weighted",
                "weighted",
                "list",
                "list",
                "array",
                "big",
                "tensor",
                "masked",
                "warray",
                "numbers",
                "update",
                "merge",
            ]
        )
    )
    n = draw(st.integers(0, 80))
    if kind == "float":
        return ("float", name, draw(value))
    if kind == "int":
        return ("float", name, draw(st.integers(-(10**6), 10**6)))
    if kind == "np":
        return ("float", name, draw(st.sampled_from([np.float64, np.float32]))(draw(finite)))
    if kind == "weighted":
        weight = draw(st.one_of(st.floats(0, 1e3), st.integers(0, 10)))
        return ("weighted", name, draw(value), weight)
    if kind == "list":
        return ("float", name, [draw(value) for _ in range(n % 20)] + rng.normal(size=n).tolist())
    if kind == "array":
        return ("float", name, rng.normal(3.0, 10.0, draw(st.integers(1, 300))))
    if kind == "big":  # reduced on arrival, with its sketch cells
        return ("float", name, rng.lognormal(0.0, 2.0, draw(st.integers(257, 6000))))
    if kind == "tensor":
        size = draw(st.sampled_from([0, 1, 5, 300]))
        return ("float", name, torch.tensor(rng.normal(size=size)) if size else torch.tensor(1.5))
    if kind == "masked":
        size = draw(st.integers(1, 6000))
        return ("masked", name, rng.normal(size=size), rng.random(size) < 0.6)
    if kind == "warray":
        size = draw(st.integers(1, 400))
        return ("warray", name, rng.normal(size=size), rng.random(size) * 3)
    if kind == "numbers":  # enough Python numbers to fill a buffer and fold
        return ("numbers", name, rng.normal(size=draw(st.integers(1, 5000))).tolist())
    if kind == "update":
        return ("update", {name: draw(value), "plain": float(n), "w/b": [1.0, 2.0]})
    return ("merge", name, rng.normal(size=n % 7 + 1).tolist())


def apply(m: ms.Metrics, op: tuple[Any, ...]) -> None:
    kind = op[0]
    if kind == "float":
        m.record(op[1], op[2])
    elif kind == "weighted":
        m.record(op[1], op[2], weight=op[3])
    elif kind == "masked":
        m.record(op[1], torch.tensor(op[2]), mask=torch.tensor(op[3]))
    elif kind == "warray":
        m.record(op[1], op[2], weight=op[3])
    elif kind == "numbers":
        for x in op[2]:
            m.record(op[1], x)
    elif kind == "update":
        m.update(op[1])
    else:
        other = ms.Metrics(SPECS)
        other.record(op[1], op[2])
        m.merge(other)


def restored(m: ms.Metrics) -> ms.Metrics:
    """``m`` through a checkpoint, as a training job would save and load it."""
    back = ms.Metrics({"unrelated": ms.Spec("min")})
    back.load_state_dict(pickle.loads(pickle.dumps(m.state_dict())))
    return back


event = st.sampled_from(["checkpoint", "reset", "observe"])
script = st.lists(st.one_of(record(), record(), event), min_size=4, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script)
def test_checkpoints_and_resets_replay_bit_for_bit(ops: list[Any]) -> None:
    """Checkpoint (restore into a new object), reset or observe at any point: the
    results equal an uninterrupted object's (a fresh one's after a reset), bit for bit."""
    reference, subject = ms.Metrics(SPECS), ms.Metrics(SPECS)
    for op in ops:
        if op == "checkpoint":
            subject = restored(subject)
        elif op == "reset":
            subject.reset()
            reference = ms.Metrics(SPECS)
        elif op == "observe":
            subject.compute()
        else:
            apply(reference, op)
            apply(subject, op)
    assert same(subject.compute(), reference.compute())
    assert subject.to_bytes() == reference.to_bytes() or same(
        ms.Metrics.from_bytes(subject.to_bytes()).compute(), reference.compute()
    )


def test_a_resumed_run_equals_the_uninterrupted_one_bit_for_bit() -> None:
    """The issue's case: weighted numbers and lists on both sides of a checkpoint."""
    rng = np.random.default_rng(7)
    ops: list[tuple[Any, ...]] = []
    for _ in range(300):
        name = str(rng.choice(["stats", "w/a", "mean"]))
        if rng.random() < 0.5:
            ops.append(("weighted", name, float(rng.normal()), float(rng.random() * 3)))
        else:
            ops.append(("float", name, rng.normal(size=int(rng.integers(1, 90))).tolist()))
    whole = ms.Metrics(SPECS)
    for op in ops:
        apply(whole, op)
    for split in (1, 37, 150, 299):
        m = ms.Metrics(SPECS)
        for op in ops[:split]:
            apply(m, op)
        m = restored(m)
        for op in ops[split:]:
            apply(m, op)
        assert same(m.compute(), whole.compute()), split


def test_a_reset_metrics_equals_a_fresh_one_bit_for_bit() -> None:
    rng = np.random.default_rng(8)
    used = ms.Metrics(SPECS)
    for _ in range(50):
        used.record("w/a", float(rng.normal()), weight=2.0)
        used.record("stats", rng.normal(size=70).tolist())
    used.reset()
    fresh = ms.Metrics(SPECS)
    for m in (used, fresh):
        for i in range(200):
            m.record("w/a", float(i % 13) / 7, weight=float(i % 5) / 3)
            m.record("stats", [i / 3, i / 7])
    assert same(used.compute(), fresh.compute())


def test_state_dict_keeps_its_data_for_readers_of_data_alone() -> None:
    """``"data"`` still holds every sample (what ``to_bytes()`` gives): a reader of
    ``"data"`` alone (an earlier version) loads the same results."""
    m = ms.Metrics(SPECS)
    m.record("stats", [1.0, 2.0, 4.0])
    m.record("w/a", 3.0, weight=2.0)
    state = m.state_dict()
    assert set(state) == {"metricsync", "data", "resume"}
    assert state["data"] == m.to_bytes()
    assert ms.Metrics.from_bytes(state["data"]).compute() == m.compute()
    again = ms.Metrics()
    again.load_state_dict({"metricsync": 1, "data": state["data"]})
    assert again.compute() == m.compute()
