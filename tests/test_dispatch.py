"""``record`` and ``update`` route every kind of value alike (``metricsync/_record/_dispatch.py``).

``record`` applies a record at once (an open name's Python number inline, every other
value by the route of its class, a name's first number, or the checked path); ``update``
checks each entry before it applies any. Hypothesis draws a sequence of values of every
kind (first records and later ones, under specs with ``last`` and ``nan="error"``, on
the host or with CPU tensors taking the accelerator path) and feeds it to one
``Metrics`` by ``record`` and to another by ``update``: the same results (NaN equal to
NaN), the same names, and the same errors naming the metric, with nothing recorded.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metricsync as ms

torch = pytest.importorskip("torch")

SPECS = {
    "mean": ms.Spec(("mean", "min", "max", "count")),
    "last": ms.Spec(("last", "sum")),
    "error": ms.Spec(("mean", "max"), nan="error"),
    "quantiles": ms.Spec(("mean", "p50", "p90"), nan="ignore"),
}
NAMES = ["a", "b", "c"]


def _value(kind: str, rng: np.random.Generator) -> Any:
    """One value of ``kind`` (samples drawn from ``rng``, now and then a NaN)."""
    x = float(rng.normal(10.0, 3.0))
    if rng.random() < 0.1:
        x = math.nan
    n = int(rng.integers(1, 12))
    big = int(rng.integers(257, 5000))  # past the bound below which arrays are buffered
    values: dict[str, Any] = {
        "float": lambda: x,
        "int": lambda: int(rng.integers(-100, 100)),
        "int beyond float64": lambda: 2**1100,
        "bool": lambda: bool(rng.random() < 0.5),
        "np.float64": lambda: np.float64(x),
        "np.float32": lambda: np.float32(x),
        "np.int64": lambda: np.int64(rng.integers(-100, 100)),
        "list": lambda: rng.normal(size=n).tolist(),
        "list of ints": lambda: rng.integers(-9, 9, size=n).tolist(),
        "list with a string": lambda: [1.0, "x"],
        "tuple": lambda: tuple(rng.normal(size=n).tolist()),
        "empty list": lambda: [],
        "numpy": lambda: rng.normal(size=n),
        "numpy, large": lambda: rng.normal(size=big),
        "numpy int8": lambda: rng.integers(-128, 127, size=n, dtype=np.int8),
        "numpy 2-d": lambda: rng.normal(size=(2, n)),
        "numpy of strings": lambda: np.array(["x"] * n),
        "0-d tensor": lambda: torch.tensor(x),
        "0-d int8 tensor": lambda: torch.tensor(int(rng.integers(-128, 127)), dtype=torch.int8),
        "0-d bfloat16 tensor": lambda: torch.tensor(x, dtype=torch.bfloat16),
        "0-d tensor in a graph": lambda: torch.tensor(x, requires_grad=True) * 2,
        "0-d complex tensor": lambda: torch.tensor(complex(x, 1.0)),
        "tensor": lambda: torch.from_numpy(rng.normal(size=n)),
        "tensor, large": lambda: torch.from_numpy(rng.normal(size=big).astype(np.float32)),
        "int64 tensor": lambda: torch.from_numpy(rng.integers(0, 99, size=n)),
        "tensor in a graph": lambda: torch.ones(n, requires_grad=True) * x,
        "empty tensor": lambda: torch.zeros(0),
        "parameter": lambda: torch.nn.Parameter(torch.full((n,), x)),
        "string": lambda: "2.0",
        "None": lambda: None,
    }
    return values[kind]()


KINDS = [
    "float", "int", "int beyond float64", "bool", "np.float64", "np.float32", "np.int64",
    "list", "list of ints", "list with a string", "tuple", "empty list", "numpy",
    "numpy, large", "numpy int8", "numpy 2-d", "numpy of strings", "0-d tensor",
    "0-d int8 tensor", "0-d bfloat16 tensor", "0-d tensor in a graph", "0-d complex tensor",
    "tensor", "tensor, large", "int64 tensor", "tensor in a graph", "empty tensor",
    "parameter", "string", "None",
]  # fmt: skip


def _nan_equal(a: Any, b: Any) -> bool:
    return (
        isinstance(a, dict)
        and isinstance(b, dict)
        and a.keys() == b.keys()
        and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)
    )


def _outcome(apply: Any, *args: Any) -> tuple[str, str] | None:
    """None, or the error ``apply(*args)`` raised (its type and message)."""
    try:
        apply(*args)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)
    return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.fixed_dictionaries({n: st.sampled_from(sorted(SPECS)) for n in NAMES}),
    records=st.lists(
        st.tuples(st.sampled_from(NAMES), st.sampled_from(KINDS), st.integers(0, 2**32 - 1)),
        min_size=1,
        max_size=12,
    ),
    device=st.booleans(),
)
def test_record_and_update_give_the_same_state_for_every_kind(
    specs: dict[str, str], records: list[tuple[str, str, int]], device: bool
) -> None:
    rules = {name: SPECS[key] for name, key in specs.items()}
    by_record, by_update = ms.Metrics(rules), ms.Metrics(rules)
    with pytest.MonkeyPatch.context() as mp:
        if device:  # CPU tensors take the accelerator path (lanes, references)
            mp.setattr("metricsync._record._convert.HOST_DEVICE_TYPES", frozenset())
        for name, kind, seed in records:
            value = _value(kind, np.random.default_rng(seed))
            twin = _value(kind, np.random.default_rng(seed))  # a fresh one (graphs, views)
            got = _outcome(by_record.record, name, value)
            want = _outcome(by_update.update, {name: twin})
            assert got == want, (name, kind, got, want)
            if got is not None:
                assert repr(name) in got[1]  # the error names the metric
        # a device record's NaN under nan="error" raises at the read, on both sides alike
        computed = _computed(by_record), _computed(by_update)
    assert computed[0] == computed[1] or _nan_equal(*computed), computed
    assert by_record.names == by_update.names


def _computed(m: ms.Metrics) -> Any:
    try:
        return m.compute()
    except ValueError as exc:
        return str(exc)


def test_an_update_applies_nothing_when_one_entry_is_bad() -> None:
    """``update`` checks every entry before it applies any: values of every route (an open
    name's float, a list, an array, a 0-d tensor) beside a bad one record nothing."""
    m = ms.Metrics()
    good = {"f": 1.0, "l": [2.0, 3.0], "a": np.ones(3), "t": torch.tensor(4.0)}
    m.update(good)  # every name open: the next ones take the routes of open names
    before = m.compute()
    with pytest.raises(TypeError, match="metric 'z'"):
        m.update({**good, "z": "bad"})
    assert m.compute() == before
