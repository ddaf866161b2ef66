"""Every public method of ``Metrics`` that changes it makes the kept fold stale.

A ``Metrics`` keeps the fold of its pending samples between observations
(``Store.folded``); the store's ``@changing`` methods, the one place its change
count moves, decide when it is stale. Each case here records some samples,
observes twice (the second from the kept fold), changes the object through one
public method and recording path, and observes again: the result must equal
numpy over every sample recorded so far. The recording paths are chosen so that
most leave the number buffers' lengths as they are (arrays listed per name,
reduced on arrival, weighted chunks, masked tensors): only the change count
can tell that the kept fold went stale.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import metricsync as ms

torch = pytest.importorskip("torch")

SPECS = {
    "x": ms.Spec(("sum", "count", "max", "min")),
    "w": ms.Spec(("mean", "count")),
    "z": ms.Spec(("sum", "count")),
    "new": ms.Spec(("sum", "count")),
}

#: every public method and property of Metrics: the ones that change it (each has cases
#: below) and the ones that only read it. A new public method fails
#: ``test_every_public_method_is_classified`` until it is named here.
CHANGING = {"define", "load_state_dict", "merge", "record", "reset", "timer", "update"}
READING = {
    "compute",
    "copy",
    "format",
    "from_bytes",
    "glob",
    "histograms",
    "key_formats",
    "names",
    "spec",
    "state_dict",
    "sync",
    "to_bytes",
}


class Oracle:
    """The samples recorded so far: name -> (values, weights)."""

    def __init__(self) -> None:
        self.samples: dict[str, tuple[list[float], list[float]]] = {}

    def add(self, name: str, values: object, weights: object = None) -> None:
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        w = np.ones_like(v) if weights is None else np.broadcast_to(weights, v.shape)
        got = self.samples.setdefault(name, ([], []))
        got[0].extend(v.tolist())
        got[1].extend(np.asarray(w, dtype=np.float64).tolist())

    def expected(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, (values, weights) in sorted(self.samples.items()):
            v, w = np.array(values), np.array(weights)
            if not len(v):
                continue
            if name == "x":
                out.update({"x/sum": v.sum(), "x/count": len(v), "x/max": v.max()})
                out["x/min"] = v.min()
            elif name == "w":
                out.update({"w/mean": (v * w).sum() / w.sum(), "w/count": w.sum()})
            else:
                out.update({f"{name}/sum": v.sum(), f"{name}/count": len(v)})
        return {k: float(x) for k, x in out.items()}


def _started() -> tuple[ms.Metrics, Oracle]:
    """A Metrics with folded and pending samples, observed twice (the fold is kept)."""
    m, oracle = ms.Metrics(SPECS), Oracle()
    for i in range(5000):  # past a fold of x's number buffer
        m.record("x", float(i % 7))
    oracle.add("x", [float(i % 7) for i in range(5000)])
    m.record("w", 2.0, weight=3.0)
    oracle.add("w", 2.0, 3.0)
    m.record("z", np.arange(100.0))  # listed under the name
    oracle.add("z", np.arange(100.0))
    assert m.compute() == m.compute() == oracle.expected()
    m.to_bytes()  # a second observation path, from the kept fold too
    return m, oracle


def _record(name: str, value: object, **kw: object) -> Callable[[ms.Metrics, Oracle], None]:
    def change(m: ms.Metrics, oracle: Oracle) -> None:
        m.record(name, value, **kw)  # type: ignore[arg-type]
        if isinstance(value, torch.Tensor):
            x = value.numpy()
            mask = kw.get("mask")
            oracle.add(name, x if mask is None else x[mask.numpy()])  # type: ignore[attr-defined]
        else:
            oracle.add(name, value, kw.get("weight"))

    return change


def _update(m: ms.Metrics, oracle: Oracle) -> None:
    m.update({"x": 4.0, "z": np.arange(80.0)})
    oracle.add("x", 4.0)
    oracle.add("z", np.arange(80.0))


def _merge_other(m: ms.Metrics, oracle: Oracle) -> None:
    other = ms.Metrics(SPECS)
    other.record("z", np.arange(90.0))
    other.record("w", 5.0, weight=2.0)
    m.merge(other)
    oracle.add("z", np.arange(90.0))
    oracle.add("w", 5.0, 2.0)


def _merge_itself(m: ms.Metrics, oracle: Oracle) -> None:
    m.merge(m)
    for name, (values, weights) in list(oracle.samples.items()):
        oracle.add(name, list(values), list(weights))


def _reset(m: ms.Metrics, oracle: Oracle) -> None:
    m.reset()
    oracle.samples.clear()


def _load_state_dict(m: ms.Metrics, oracle: Oracle) -> None:
    other = ms.Metrics(SPECS)
    other.record("z", np.arange(70.0))
    m.load_state_dict(other.state_dict())
    oracle.samples = {"z": (list(np.arange(70.0)), [1.0] * 70)}


def _timer(m: ms.Metrics, oracle: Oracle) -> None:
    m.define("timing", ms.Spec(("count", "max")))
    with m.timer("timing"):
        pass
    got = m.compute()
    assert got.pop("timing/count") == 1.0 and got.pop("timing/max") >= 0.0
    assert got == oracle.expected()


def _define(m: ms.Metrics, oracle: Oracle) -> None:
    m.record("q", 1.0)  # no rule: Spec()
    m.reset()  # q keeps its slot, without samples: a rule may give it another spec
    oracle.samples.clear()
    m.compute()
    m.to_bytes()
    m.define("q", ms.Spec("max"))
    assert ms.Metrics.from_bytes(m.to_bytes()).spec("q") == ms.Spec("max")


MASK = torch.arange(600) % 3 == 0
CASES: dict[str, Callable[[ms.Metrics, Oracle], None]] = {
    "record/fast number": _record("x", 9.0),
    "record/first number": _record("new", 1.5),
    "record/list": _record("x", [1.0, 8.0]),
    "record/first list": _record("new", [2.0, 3.0]),
    "record/small array": _record("x", np.arange(10.0)),
    "record/listed array": _record("x", np.arange(100.0)),
    "record/reduced array": _record("x", np.arange(1000.0)),
    "record/weighted array": _record("w", np.array([1.0, 4.0]), weight=np.array([2.0, 1.0])),
    "record/weighted number": _record("w", 7.0, weight=2.0),
    "record/0-d tensor": _record("x", torch.tensor(6.0, dtype=torch.float64)),
    "record/small tensor": _record("z", torch.arange(100.0, dtype=torch.float64)),
    "record/masked tensor": _record("z", torch.arange(600.0), mask=MASK),
    "record/masked small tensor": _record("z", torch.arange(6.0), mask=torch.arange(6) < 4),
    "update": _update,
    "merge/other": _merge_other,
    "merge/itself": _merge_itself,
    "reset": _reset,
    "load_state_dict": _load_state_dict,
    "timer": _timer,
    "define": _define,
}


def test_every_public_method_is_classified() -> None:
    public = {name for name in dir(ms.Metrics) if not name.startswith("_")}
    assert public == CHANGING | READING
    assert not CHANGING & READING
    covered = {case.split("/")[0] for case in CASES}
    assert covered == CHANGING


@pytest.mark.parametrize("case", list(CASES))
def test_a_change_makes_the_kept_fold_stale(case: str) -> None:
    m, oracle = _started()
    CASES[case](m, oracle)
    want = oracle.expected()
    got = m.compute()
    if case == "timer":
        got.pop("timing/count"), got.pop("timing/max")
    assert got == pytest.approx(want, rel=1e-12)
    again = ms.Metrics.from_bytes(m.to_bytes()).compute()
    if case == "timer":
        again.pop("timing/count"), again.pop("timing/max")
    assert again == got
