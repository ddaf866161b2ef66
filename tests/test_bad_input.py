"""Bad input at every public entry point: a clear error naming the metric, or a documented result.

After an error the object is unchanged: ``to_bytes()`` (or the log file)
before and after compare equal. Documented results are checked against
plain float64 arithmetic:

- NaN/inf under ``nan="propagate"`` enter the statistics (``count`` and
  ``last`` of other samples excepted), under ``"ignore"`` they are dropped and
  counted in ``name/nan_dropped``, under ``"error"`` they raise;
- empty arrays, zero weights and all-False masks add no sample: the name is
  not in ``names`` and ``compute()`` leaves it out;
- magnitudes follow float64: sums beyond 1.8e308 overflow to inf (and a mean
  of inf/inf is NaN) while ``min``/``max``/``last`` stay exact; 1e-308 is exact.
"""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import metricsync as ms

torch = pytest.importorskip("torch")  # the numpy-only test matrix has no torch

SPECS = {
    "x": ms.Spec(("mean", "max", "min", "sum", "count", "last", "var")),
    "e": ms.Spec("mean", nan="error"),
    "i": ms.Spec(("mean", "count"), nan="ignore"),
    "q": ms.Spec(("p50", "max")),
    "a": ms.Spec("sum", across="mean"),
    "t/*": ms.Spec("max"),
}


def filled() -> ms.Metrics:
    m = ms.Metrics(SPECS)
    m.record("x", [1.0, 2.0])
    m.record("e", 1.0)
    m.record("i", [3.0, math.nan])
    m.record("q", np.arange(10.0))
    m.record("a", 4.0)
    m.record("t/step", torch.tensor([0.5, 1.5]))
    m.record("fast", 1.0)
    m.record("fast", 2.0)  # pending on the fast path when the error happens
    return m


class Weird:
    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise RuntimeError("no array here")


# (label, name, value, keyword arguments, error type); every message must name the metric
BAD_RECORDS: list[tuple[str, Any, Any, dict[str, Any], type[Exception]]] = [
    ("string", "x", "1.0", {}, TypeError),
    ("None", "x", None, {}, TypeError),
    ("complex", "x", 1j, {}, TypeError),
    ("bytes", "x", b"1", {}, TypeError),
    ("object", "x", object(), {}, TypeError),
    ("dict", "x", {"a": 1.0}, {}, TypeError),
    ("list of str", "x", ["a"], {}, TypeError),
    ("ragged list", "x", [[1.0], [1.0, 2.0]], {}, TypeError),
    ("failing __array__", "x", Weird(), {}, TypeError),
    ("numpy str", "x", np.array(["a"]), {}, TypeError),
    ("numpy complex", "x", np.array([1j]), {}, TypeError),
    ("torch complex", "x", torch.tensor([1j]), {}, TypeError),
    ("int beyond float64", "x", 10**400, {}, ValueError),
    ("NaN, nan=error", "e", math.nan, {}, ValueError),
    ("inf, nan=error", "e", -math.inf, {}, ValueError),
    ("numpy NaN, nan=error", "e", np.array([1.0, np.nan]), {}, ValueError),
    ("torch NaN, nan=error", "e", torch.tensor([1.0, math.nan]), {}, ValueError),
    ("negative weight", "x", 1.0, {"weight": -1.0}, ValueError),
    ("NaN weight", "x", 1.0, {"weight": math.nan}, ValueError),
    ("inf weight", "x", 1.0, {"weight": math.inf}, ValueError),
    ("one negative weight", "x", [1.0, 2.0], {"weight": np.array([1.0, -1e-300])}, ValueError),
    (
        "torch negative weight",
        "x",
        torch.ones(2),
        {"weight": torch.tensor([1.0, -1.0])},
        ValueError,
    ),
    ("string weight", "x", 1.0, {"weight": "1"}, TypeError),
    ("weight shape", "x", [1.0, 2.0], {"weight": [1.0, 2.0, 3.0]}, ValueError),
    ("torch weight shape", "x", torch.ones(2), {"weight": torch.ones(3)}, ValueError),
    ("mask shape", "x", [1.0, 2.0], {"mask": [True]}, ValueError),
    ("torch mask shape", "x", torch.ones(2), {"mask": torch.ones(3, dtype=torch.bool)}, ValueError),
    ("string mask", "x", 1.0, {"mask": "yes"}, TypeError),
    ("complex mask", "x", torch.ones(1), {"mask": torch.tensor([1j])}, TypeError),
]


@pytest.mark.parametrize(
    "name, value, kwargs, error", [b[1:] for b in BAD_RECORDS], ids=[b[0] for b in BAD_RECORDS]
)
def test_bad_records_raise_naming_the_metric_and_change_nothing(
    name: str, value: Any, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    m = filled()
    before = m.to_bytes()
    m.record("fast", 3.0)  # one more pending fast-path number
    before = ms.Metrics.from_bytes(m.copy().to_bytes()).to_bytes()
    with pytest.raises(error, match=repr(name)):
        m.record(name, value, **kwargs)
    assert m.to_bytes() == before
    if not kwargs:  # update checks every entry first: the good one before it is not recorded
        with pytest.raises(error, match=repr(name)):
            m.update({"fast": 4.0, "new": 1.0, name: value})
        assert m.to_bytes() == before and "new" not in m


@pytest.mark.parametrize("name", [5, None, "", ["x"], b"x"])
def test_bad_names(name: Any) -> None:
    m = filled()
    before = m.to_bytes()
    calls = [
        lambda: m.record(name, 1.0),
        lambda: m.record(name, [1.0]),
        lambda: m.define(name, ms.Spec()),
    ]
    if not isinstance(name, list):  # a list cannot be a dict key
        calls.append(lambda: m.update({name: 1.0}))
    for call in calls:
        with pytest.raises(TypeError, match="string"):
            call()
    assert m.to_bytes() == before


@pytest.mark.parametrize(
    "bad", [[("x", ms.Spec())], "x", 5, {"x": "max"}, {"": ms.Spec()}, {5: ms.Spec()}]
)
def test_bad_spec_mappings(bad: Any) -> None:
    with pytest.raises(TypeError):
        ms.Metrics(bad)


@pytest.mark.parametrize("updates", [[("x", 1.0)], None, "x=1", 5])
def test_update_takes_a_mapping(updates: Any) -> None:
    m = filled()
    before = m.to_bytes()
    with pytest.raises(TypeError, match="mapping"):
        m.update(updates)
    assert m.to_bytes() == before


@pytest.mark.parametrize(
    "args, kwargs, error",
    [
        ((5,), {}, TypeError),
        ((None,), {}, TypeError),
        ((["mean", 5],), {}, TypeError),
        (((),), {}, ValueError),
        (("median",), {}, ValueError),
        ((("mean", "mean"),), {}, ValueError),
        (("p101",), {}, ValueError),
        ((), {"across": "median"}, ValueError),
        ((), {"across": None}, ValueError),
        ((), {"fmt": 3}, TypeError),
        ((), {"fmt": "{:.3f}"}, ValueError),
        ((), {"fmt": "%d"}, ValueError),
        ((), {"nan": "skip"}, ValueError),
        (("p50",), {"accuracy": 0.0}, ValueError),
        (("p50",), {"accuracy": 1.0}, ValueError),
        (("p50",), {"accuracy": math.nan}, ValueError),
        (("p50",), {"accuracy": "fine"}, ValueError),
        (("p50",), {"accuracy": 1e-9}, ValueError),  # the sketch would not fit in 64 KiB
    ],
)
def test_bad_specs(args: tuple[Any, ...], kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        ms.Spec(*args, **kwargs)


# ------------------------------------------------------ documented results


def _record_all(name_spec: ms.Spec, calls: list[tuple[Any, dict[str, Any]]]) -> dict[str, float]:
    m = ms.Metrics({"v": name_spec})
    for value, kwargs in calls:
        m.record("v", value, **kwargs)
    return m.compute()


ALL = ms.Spec(("mean", "sum", "count", "min", "max", "last", "var", "p50"))


@pytest.mark.parametrize("kind", ["float", "numpy", "torch"], ids=lambda k: f"NaN as {k}")
def test_nan_propagates_ignores_or_raises(kind: str) -> None:
    def as_kind(values: list[float]) -> Any:
        if kind == "float":
            return values[0] if len(values) == 1 else values
        return np.array(values) if kind == "numpy" else torch.tensor(values, dtype=torch.float64)

    got = _record_all(ALL, [(as_kind([1.0]), {}), (as_kind([math.nan]), {}), (as_kind([3.0]), {})])
    assert got["v/count"] == 3.0 and got["v/last"] == 3.0
    assert all(math.isnan(got[f"v/{s}"]) for s in ("mean", "sum", "min", "max", "var", "p50"))

    ignore = ms.Spec(ALL.reduce, nan="ignore")
    got = _record_all(
        ignore, [(as_kind([1.0]), {}), (as_kind([math.nan]), {}), (as_kind([3.0]), {})]
    )
    assert got == {
        "v/mean": 2.0, "v/sum": 4.0, "v/count": 2.0, "v/min": 1.0, "v/max": 3.0,
        "v/last": 3.0, "v/var": 1.0, "v/p50": pytest.approx(np.quantile([1.0, 3.0], 0.5), rel=0.01),
        "v/nan_dropped": 1.0,
    }  # fmt: skip
    # a NaN with weight 0 is no sample: nothing to drop
    got = _record_all(ignore, [(np.array([1.0, math.nan]), {"weight": np.array([1.0, 0.0])})])
    assert got["v/nan_dropped"] == 0.0 and got["v/count"] == 1.0


def test_infinities_enter_the_statistics() -> None:
    got = _record_all(ALL, [(1.0, {}), (math.inf, {})])
    assert got["v/mean"] == got["v/sum"] == got["v/max"] == got["v/last"] == math.inf
    assert got["v/min"] == 1.0 and math.isnan(got["v/var"])
    # halfway from 1 to inf is inf (numpy's own arithmetic for it gives NaN: inf - inf)
    assert got["v/p50"] == math.inf
    got = _record_all(ms.Spec(("p99", "p0")), [(-math.inf, {}), (1.0, {}), (math.inf, {})])
    assert got == {"v/p99": math.inf, "v/p0": -math.inf}


@pytest.mark.parametrize(
    "value, kwargs",
    [
        (np.array([]), {}),
        ([], {}),
        (torch.tensor([]), {}),
        (np.zeros((0, 3)), {}),
        (5.0, {"weight": 0.0}),
        ([1.0, 2.0], {"weight": np.zeros(2)}),
        ([1.0, 2.0], {"mask": [False, False]}),
        (torch.ones(3), {"mask": torch.zeros(3, dtype=torch.bool)}),
        (torch.ones(3), {"weight": torch.zeros(3)}),
    ],
)
def test_no_samples_means_no_name_and_no_value(value: Any, kwargs: dict[str, Any]) -> None:
    m = ms.Metrics({"v": ALL})
    m.record("v", value, **kwargs)
    assert m.compute() == {} and "v" not in m and len(m) == 0 and m.format() == ""


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")
def test_magnitudes_follow_float64() -> None:
    big = _record_all(ALL, [(1e308, {}), (1e308, {})])
    assert big["v/sum"] == big["v/mean"] == 1e308 + 1e308 == math.inf  # overflow, as in float64
    assert big["v/max"] == big["v/min"] == big["v/last"] == big["v/p50"] == 1e308
    # A name's Python numbers are buffered together and fold as one array: there the
    # overflowed mean leaks into the deviations, so var is inf, not 0.
    assert big["v/var"] == math.inf
    assert _record_all(ALL, [([1e308, 1e308], {})])["v/var"] == math.inf
    # Two array records merge by Chan's formula: no overflow.
    two = _record_all(ALL, [(np.array([1e308]), {}), (np.array([1e308]), {})])
    assert two["v/var"] == 0.0 and two["v/sum"] == math.inf
    heavy = _record_all(ALL, [(10.0, {"weight": 1e308}), (10.0, {"weight": 1e308})])
    assert heavy["v/count"] == math.inf and math.isnan(heavy["v/mean"])  # inf / inf
    assert heavy["v/max"] == heavy["v/last"] == heavy["v/p50"] == 10.0
    tiny = _record_all(ALL, [(1e-308, {}), (3e-308, {})])
    p50 = tiny.pop("v/p50")
    assert tiny == {
        "v/mean": 2e-308, "v/sum": 4e-308, "v/count": 2.0, "v/min": 1e-308,
        "v/max": 3e-308, "v/last": 3e-308, "v/var": 0.0,
    }  # fmt: skip
    # below the sketch's 1e-16 the answer is clamped, then clipped into the exact [min, max]
    assert 1e-308 <= p50 <= 3e-308
    opposite = _record_all(ALL, [(1e308, {}), (-1e308, {})])
    assert opposite["v/mean"] == 0.0 and opposite["v/var"] == math.inf  # true var is 1e616


# ------------------------------------------- define, merge, sync, format


def test_define_conflicts_change_nothing() -> None:
    m = filled()
    before = m.to_bytes()
    with pytest.raises(TypeError, match="Spec"):
        m.define("x", "max")  # type: ignore[arg-type]
    with pytest.raises(ms.SpecMismatchError, match="'x'"):
        m.define("x", ms.Spec("max"))
    with pytest.raises(ms.SpecMismatchError, match="'t/step'"):
        m.define("t/s*", ms.Spec("min"))  # a longer glob would change a name holding samples
    assert m.to_bytes() == before


def test_merge_bad_operands_change_nothing() -> None:
    m, other = filled(), ms.Metrics({"x": ms.Spec("max")})
    other.record("x", 1.0)
    other.record("y", 2.0)
    before, other_before = m.to_bytes(), other.to_bytes()
    for bad in (None, {"x": 1.0}, m.compute(), "x"):
        with pytest.raises(TypeError, match="Metrics"):
            m.merge(bad)  # type: ignore[arg-type]
    with pytest.raises(ms.SpecMismatchError, match="'x'"):
        m.merge(other)
    with pytest.raises(ms.SpecMismatchError, match="'x'"):
        ms.merge([m, other])
    with pytest.raises(TypeError):
        ms.merge([m, "x"])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        ms.merge(5)  # type: ignore[arg-type]
    assert m.to_bytes() == before and other.to_bytes() == other_before
    assert ms.merge([]).compute() == {}


@pytest.mark.parametrize(
    "timeout, error",
    [
        ("5", TypeError),
        (True, TypeError),
        ([1], TypeError),
        (0, ValueError),
        (-1.0, ValueError),
        (math.nan, ValueError),
    ],
)
def test_sync_checks_its_timeout_even_without_a_process_group(
    timeout: Any, error: type[Exception]
) -> None:
    m = filled()
    before = m.to_bytes()
    with pytest.raises(error, match="timeout"):
        m.sync(timeout=timeout)
    assert m.to_bytes() == before


@pytest.mark.parametrize(
    "timeout", [None, 0.5, 60, math.inf, 1e300, timedelta(seconds=5), np.float64(2.0)]
)
def test_sync_accepts_every_kind_of_timeout(timeout: Any) -> None:
    m = filled()
    synced = m.sync(timeout=timeout)  # no process group: one rank's sync, in name order
    assert synced.compute() == m.compute() and synced.to_bytes() == m.sync().to_bytes()


def test_format_bad_and_extreme_values() -> None:
    m = filled()
    before = m.to_bytes()
    with pytest.raises(TypeError, match="mapping"):
        m.format("x=1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'x'"):
        m.format({"x": "1.0"})
    with pytest.raises(TypeError, match="'x'"):
        m.format({"x": np.ones(2)})
    assert m.to_bytes() == before
    line = m.format({"x/mean": math.nan, "x/max": math.inf, "x/min": -1e308, "x/sum": 1e-308})
    assert "x/mean=nan" in line and "x/max=inf" in line
    assert float(line.split("x/min=")[1].split()[0].replace(",", "")) == pytest.approx(-1e308)
    assert float(line.split("x/sum=")[1].split()[0]) == pytest.approx(1e-308)  # never "0.000"


# ------------------------------------------------- bytes and checkpoints


@pytest.mark.parametrize(
    "state",
    [
        None,
        [1, 2],
        {},
        {"data": b""},
        {"metricsync": 2, "data": b""},
        {"metricsync": 1},
        {"metricsync": 1, "data": 5},
        {"metricsync": 1, "data": "MSYN"},
        {"metricsync": 1, "data": b"MSYN" * 10},
    ],
)
def test_load_state_dict_rejects_anything_else_and_changes_nothing(state: Any) -> None:
    m = filled()
    before = m.to_bytes()
    with pytest.raises(ms.CodecError):
        m.load_state_dict(state)
    assert m.to_bytes() == before


@pytest.mark.parametrize("data", [None, "MSYN", 5, [1], b"", bytearray(b"\0" * 40)])
def test_from_bytes_rejects_anything_else(data: Any) -> None:
    with pytest.raises(ms.CodecError):
        ms.Metrics.from_bytes(data)


def test_from_bytes_accepts_any_bytes_like() -> None:
    blob = filled().to_bytes()
    for data in (blob, bytearray(blob), memoryview(blob), np.frombuffer(blob, np.uint8).data):
        assert ms.Metrics.from_bytes(data).to_bytes() == blob


# ------------------------------------------------------------- Tracker


@pytest.mark.parametrize(
    "values, step, error, match",
    [
        ({"loss": 1.0}, "1", TypeError, "step"),
        ({"loss": 1.0}, 1.5, TypeError, "step"),
        ({"loss": 1.0}, None, TypeError, "step"),
        ({"loss": 1.0}, True, TypeError, "step"),
        ({"loss": "1.0"}, 1, TypeError, "'loss'"),
        ({"loss": None}, 1, TypeError, "'loss'"),
        ({"loss": 1j}, 1, TypeError, "'loss'"),
        ({"loss": np.ones(2)}, 1, TypeError, "'loss'"),
        ({"loss": torch.ones(2)}, 1, TypeError, "'loss'"),
        ({"loss": 10**400}, 1, ValueError, "'loss'"),
        ({"ok": 1.0, "loss": "x"}, 1, TypeError, "'loss'"),  # nothing of the step is written
        ({1: 1.0}, 1, TypeError, "str"),
        ([("loss", 1.0)], 1, TypeError, "mapping"),
        (None, 1, TypeError, "mapping"),
    ],
)
def test_tracker_log_rejects_bad_input_and_writes_nothing(
    tmp_path: Path, values: Any, step: Any, error: type[Exception], match: str
) -> None:
    with ms.Tracker(run_dir=tmp_path) as tracker:
        tracker.log({"loss": 0.5}, step=0)
        path = tmp_path / "metrics.jsonl"
        before = path.read_bytes()
        with pytest.raises(error, match=match):
            tracker.log(values, step=step)
        assert path.read_bytes() == before
        tracker.log({"loss": 0.25}, step=1)  # and it goes on
    assert [s for s, _ in ms_read(tmp_path)] == [0, 1]


def ms_read(run_dir: Path) -> list[tuple[int, dict[str, float]]]:
    from metricsync._log._logread import read_jsonl

    return read_jsonl(run_dir)[1]


def test_tracker_log_extremes_round_trip(tmp_path: Path) -> None:
    values = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "big": 1e308, "tiny": 5e-324}
    with ms.Tracker(run_dir=tmp_path) as tracker:
        tracker.log(values, step=2**70)
        tracker.log({}, step=2**70 + 1)
        with pytest.warns(UserWarning, match="step 7 goes backwards"):
            tracker.log(
                {"np": np.float32(0.5), "t": torch.tensor(2.0), "i": np.int64(3)},
                step=np.int64(7),
            )
    steps = ms_read(tmp_path)
    assert [s for s, _ in steps] == [2**70, 2**70 + 1, 7]
    got = steps[0][1]
    assert math.isnan(got.pop("nan")) and got == {k: v for k, v in values.items() if k != "nan"}
    assert steps[1][1] == {} and steps[2][1] == {"np": 0.5, "t": 2.0, "i": 3.0}
