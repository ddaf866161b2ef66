"""The Metrics container: recording, bad input, nan policies, lifecycle, memory, checkpoints.

Expected values come from numpy over the raw samples.
"""

from __future__ import annotations

import math
import pickle
from typing import Any

import numpy as np
import pytest
from _compare import same

import metricsync as ms

torch = pytest.importorskip("torch")  # the numpy-only test matrix has no torch

ALL_PLAIN = ("mean", "sum", "count", "min", "max", "last", "std", "var")


def weighted_mean(x: Any, w: Any) -> float:
    x = np.asarray(x, dtype=np.float64)
    w = np.broadcast_to(np.asarray(w, dtype=np.float64), x.shape)
    return float(np.sum(w * x) / np.sum(w))


# ------------------------------------------------------- values and types


def test_scalars_of_every_kind() -> None:
    m = ms.Metrics({"x": ms.Spec(ALL_PLAIN)})
    values: list[Any] = [
        1.5,
        2,
        True,
        np.float64(3.5),
        np.float32(4.5),
        np.int64(5),
        np.bool_(False),
        np.array(6.0),
        torch.tensor(7.0),
        torch.tensor(8, dtype=torch.int32),
        torch.tensor(9.0, dtype=torch.float64),
    ]
    for v in values:
        m.record("x", v)
    raw = np.array([1.5, 2, 1, 3.5, 4.5, 5, 0, 6, 7, 8, 9], dtype=np.float64)
    got = m.compute()
    assert got["x/count"] == len(raw)
    assert got["x/sum"] == pytest.approx(raw.sum())
    assert got["x/mean"] == pytest.approx(raw.mean())
    assert got["x/min"] == 0.0 and got["x/max"] == 9.0 and got["x/last"] == 9.0
    assert got["x/var"] == pytest.approx(raw.var())
    assert got["x/std"] == pytest.approx(raw.std())
    assert all(type(v) is float for v in got.values())


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a.tolist(),
        lambda a: a,
        lambda a: a.astype(np.float32),
        lambda a: a.astype(np.int32),
        lambda a: torch.tensor(a),
        lambda a: torch.tensor(a, dtype=torch.float32),
        lambda a: torch.tensor(a, dtype=torch.int64),
        lambda a: torch.tensor(a, dtype=torch.float16),
        lambda a: torch.tensor(a, dtype=torch.bfloat16),
    ],
)
def test_every_element_is_a_sample(make: Any) -> None:
    raw = np.array([[3.0, 1.0, 4.0], [1.0, 5.0, 9.0]])
    m = ms.Metrics({"x": ms.Spec(ALL_PLAIN)})
    m.record("x", make(raw))
    got = m.compute()
    assert got["x/count"] == 6.0
    assert got["x/sum"] == pytest.approx(raw.sum())
    assert got["x/var"] == pytest.approx(raw.var())
    assert (got["x/min"], got["x/max"], got["x/last"]) == (1.0, 9.0, 9.0)


class ArrayLike:
    def __init__(self, data: list[float]) -> None:
        self.data = data

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return np.array(self.data, dtype=dtype)


class DLPackOnly:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self.tensor.__dlpack_device__()


def test_array_protocol_and_dlpack_objects() -> None:
    m = ms.Metrics({"x": ms.Spec(("mean", "count"))})
    m.record("x", ArrayLike([1.0, 2.0, 3.0]))
    m.record("x", DLPackOnly(torch.tensor([10.0, 20.0])))
    assert m.compute() == {"x/mean": 7.2, "x/count": 5.0}


def test_empty_arrays_record_nothing() -> None:
    m = ms.Metrics()
    m.record("a", np.array([]))
    m.record("b", torch.tensor([]))
    m.record("c", [])
    assert m.compute() == {}
    assert len(m) == 0 and m.names == []


def test_update_records_several() -> None:
    m = ms.Metrics({"lr": ms.Spec("last"), "tokens": ms.Spec("sum")})
    m.update({"lr": 1e-4, "tokens": 100})
    m.update({"lr": 2e-4, "tokens": torch.tensor(50)})
    assert m.compute() == {"lr": 2e-4, "tokens": 150.0}


def test_last_is_the_latest_record() -> None:
    m = ms.Metrics({"lr": ms.Spec("last")})
    for v in [1.0, 2.0, np.array([3.0, 4.0]), torch.tensor([5.0, 6.0]), 7.0, 8.0]:
        m.record("lr", v)
    assert m.compute() == {"lr": 8.0}
    m.record("lr", torch.tensor([9.0, 10.0]), mask=torch.tensor([True, False]))
    assert m.compute() == {"lr": 9.0}
    m.record("lr", np.array([11.0, 12.0]), weight=np.array([0.0, 0.0]))  # no kept sample
    assert m.compute() == {"lr": 9.0}


def test_huge_int_is_rejected() -> None:
    m = ms.Metrics()
    m.record("x", 1.0)
    before = m.to_bytes()
    for _ in range(2):  # the first and a later (buffered) record
        with pytest.raises((ValueError, OverflowError), match="'x'"):
            m.record("x", 10**400)
    assert m.to_bytes() == before


# -------------------------------------------------------- weights, masks


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize(
    ("weight", "mask"),
    [
        (2.5, None),
        ([1.0, 0.0, 3.0, 0.5], None),
        (None, [True, False, True, True]),
        (None, [1, 0, 0, 1]),
        ([1.0, 2.0, 3.0, 4.0], [True, True, False, True]),
        (0.5, [0, 1, 1, 0]),
    ],
)
def test_weighted_and_masked_mean(lib: str, weight: Any, mask: Any) -> None:
    x = np.array([1.0, 2.0, 4.0, 8.0])
    w = np.ones(4) if weight is None else np.broadcast_to(np.asarray(weight, float), (4,))
    keep = np.ones(4) if mask is None else np.asarray(mask, dtype=float)
    expected = weighted_mean(x, w * keep)
    if lib == "torch":
        value: Any = torch.tensor(x, dtype=torch.float32)
        wt: Any = None if weight is None else torch.tensor(weight)
        mk: Any = None
        if mask is not None:
            mk = torch.tensor(mask)
    else:
        value = x.astype(np.float32)
        wt = None if weight is None else np.asarray(weight)
        mk = None if mask is None else np.asarray(mask)
    m = ms.Metrics({"x": ms.Spec(("mean", "sum", "count"))})
    m.record("x", value, weight=wt, mask=mk)
    got = m.compute()
    assert got["x/mean"] == pytest.approx(expected)
    assert got["x/sum"] == pytest.approx(np.sum(w * keep * x))
    assert got["x/count"] == pytest.approx(np.sum(w * keep))


@pytest.mark.parametrize("lib", ["numpy", "torch", "mixed"])
@pytest.mark.parametrize("wshape", [(), (1,), (3,), (2, 1), (1, 3), (2, 3)])
def test_broadcast_weights(lib: str, wshape: tuple[int, ...]) -> None:
    x = np.arange(6, dtype=np.float64).reshape(2, 3) + 1.0
    rng = np.random.default_rng(sum(wshape) + len(wshape))
    w = rng.integers(0, 4, size=wshape).astype(np.float64) + 0.5
    mask = np.array([[True, False, True], [True, True, False]])
    full = np.broadcast_to(w, x.shape) * mask
    if lib == "torch":
        args: tuple[Any, Any, Any] = (torch.tensor(x), torch.tensor(w), torch.tensor(mask))
    elif lib == "mixed":  # a torch value with host weight and mask
        args = (torch.tensor(x), w if wshape else float(w), mask)
    else:
        args = (x, w if wshape else float(w), mask.astype(np.int8))
    m = ms.Metrics({"x": ms.Spec(("mean", "var", "min", "max"))})
    m.record("x", args[0], weight=args[1], mask=args[2])
    got = m.compute()
    mean = weighted_mean(x, full)
    kept = x[full > 0]
    assert got["x/mean"] == pytest.approx(mean)
    assert got["x/var"] == pytest.approx(np.sum(full * (x - mean) ** 2) / np.sum(full))
    assert (got["x/min"], got["x/max"]) == (kept.min(), kept.max())


def test_zero_weights_exclude_min_max_and_last() -> None:
    m = ms.Metrics({"x": ms.Spec(("min", "max", "last", "count"))})
    m.record("x", np.array([-100.0, 1.0, 2.0, 100.0]), weight=np.array([0.0, 1.0, 1.0, 0.0]))
    assert m.compute() == {"x/min": 1.0, "x/max": 2.0, "x/last": 2.0, "x/count": 2.0}


def test_all_masked_record_holds_no_samples() -> None:
    m = ms.Metrics()
    m.record("x", np.array([1.0, 2.0]), mask=np.array([False, False]))
    m.record("y", torch.tensor([1.0, 2.0]), mask=torch.tensor([False, False]))
    assert m.compute() == {}
    assert "x" not in m


def test_scalar_mask_and_weight() -> None:
    m = ms.Metrics({"x": ms.Spec(("mean", "count"))})
    m.record("x", 2.0, mask=True)
    m.record("x", 100.0, mask=False)
    m.record("x", 4.0, weight=3)
    m.record("x", torch.tensor(10.0), weight=torch.tensor(0.0))
    assert m.compute() == {"x/mean": 3.5, "x/count": 4.0}


# ------------------------------------------------------------- bad input

BAD_VALUES: list[Any] = [
    "1.0",
    None,
    b"1",
    1j,
    complex(1, 0),
    np.complex128(1),
    np.array([1 + 1j]),
    torch.tensor([1 + 1j]),
    ["a", "b"],
    {"a": 1},
    object(),
]


def _loaded() -> ms.Metrics:
    m = ms.Metrics({"e": ms.Spec(nan="error"), "t": ms.Spec(("mean", "last"))})
    m.record("x", 1.0)
    m.record("x", 2.0)
    m.record("t", torch.tensor([1.0, 2.0]))
    m.record("e", np.array([1.0, 5.0]))
    return m


@pytest.mark.parametrize("value", BAD_VALUES, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("name", ["x", "new/name"])
def test_bad_values_raise_naming_the_metric(value: Any, name: str) -> None:
    m = _loaded()
    before = m.to_bytes()
    with pytest.raises((TypeError, ValueError), match=repr(name)):
        m.record(name, value)
    assert m.to_bytes() == before
    assert name == "x" or name not in m


@pytest.mark.parametrize(
    ("value", "kwargs"),
    [
        (np.ones(3), {"mask": np.ones(2, dtype=bool)}),
        (np.ones((2, 3)), {"mask": np.ones(6, dtype=bool)}),
        (np.ones((2, 3)), {"mask": np.ones((3, 2), dtype=bool)}),
        (torch.ones(3), {"mask": torch.ones(2, dtype=torch.bool)}),
        (torch.ones(2, 3), {"mask": torch.ones(6, dtype=torch.bool)}),
        (torch.ones(3), {"mask": np.ones(4, dtype=bool)}),
        (1.0, {"mask": np.ones(2, dtype=bool)}),
        (np.ones(3), {"weight": np.ones(2)}),
        (torch.ones(3), {"weight": torch.ones(2)}),
        (1.0, {"weight": -1.0}),
        (1.0, {"weight": -1}),
        (np.ones(3), {"weight": np.array([1.0, -0.5, 1.0])}),
        (np.ones(3), {"weight": float("nan")}),
        (np.ones(3), {"weight": np.array([1.0, np.inf, 1.0])}),
        (torch.ones(3), {"weight": torch.tensor([1.0, -1.0, 1.0])}),
        (torch.ones(3), {"weight": -2.0}),
        (torch.ones(3), {"weight": np.array([1.0, -1.0, 1.0])}),
        (1.0, {"weight": "2"}),
        (1.0, {"weight": 1j}),
        (torch.ones(3), {"weight": torch.ones(3, dtype=torch.complex64)}),
        (np.ones(3), {"mask": np.array([1j, 0, 1])}),
        (np.ones(3), {"mask": "yes"}),
        (np.ones(3), {"weight": None, "mask": None, "unknown": 1}),
    ],
)
def test_bad_weights_and_masks_raise_naming_the_metric(value: Any, kwargs: dict[str, Any]) -> None:
    m = _loaded()
    before = m.to_bytes()
    with pytest.raises((TypeError, ValueError), match="'x'" if "unknown" not in kwargs else None):
        m.record("x", value, **kwargs)
    assert m.to_bytes() == before
    assert m.compute()["x"] == 1.5


@pytest.mark.parametrize("name", ["", None, 3, b"x"])
def test_bad_names(name: Any) -> None:
    m = ms.Metrics()
    with pytest.raises(TypeError):
        m.record(name, 1.0)
    assert m.to_bytes() == ms.Metrics().to_bytes()


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        np.float64("-inf"),
        np.array([1.0, np.nan]),
        [1.0, float("inf")],
        torch.tensor([1.0, float("nan")]),
        torch.tensor(float("-inf"), dtype=torch.float64),
    ],
    ids=repr,
)
def test_nan_error_raises_at_record_for_host_data(value: Any) -> None:
    m = _loaded()
    before = m.to_bytes()
    for _ in range(2):  # also once the name has taken its fast path
        with pytest.raises(ValueError, match="'e'"):
            m.record("e", value)
    assert m.to_bytes() == before
    assert m.compute()["e"] == 3.0


def test_nan_error_ignores_masked_out_nan() -> None:
    m = ms.Metrics({"e": ms.Spec("mean", nan="error")})
    m.record("e", np.array([1.0, np.nan]), mask=np.array([True, False]))
    m.record("e", torch.tensor([3.0, float("nan")]), weight=torch.tensor([1.0, 0.0]))
    assert m.compute() == {"e": 2.0}


def test_nan_ignore_drops_and_reports() -> None:
    m = ms.Metrics({"i": ms.Spec(("mean", "count", "max"), nan="ignore")})
    m.record("i", float("nan"))
    m.record("i", 1.0)
    m.record("i", float("inf"))
    m.record("i", 2.0)
    m.record("i", np.array([np.nan, 3.0, -np.inf]), weight=np.array([5.0, 1.0, 1.0]))
    m.record("i", torch.tensor([float("nan"), 6.0]))
    m.record("i", np.array([np.nan, 9.0]), mask=np.array([False, True]))  # masked NaN: not dropped
    assert m.compute() == {
        "i/mean": pytest.approx(np.mean([1.0, 2.0, 3.0, 6.0, 9.0])),
        "i/count": 5.0,
        "i/max": 9.0,
        "i/nan_dropped": 5.0,
    }


def test_nan_ignore_all_dropped_reports_only_the_count() -> None:
    m = ms.Metrics({"i": ms.Spec("mean", nan="ignore")})
    m.record("i", float("nan"))
    m.record("i", float("nan"))
    assert m.compute() == {"i/nan_dropped": 2.0}


def test_nan_ignore_without_drops_reports_zero() -> None:
    m = ms.Metrics({"i": ms.Spec("mean", nan="ignore")})
    m.record("i", 1.0)
    assert m.compute() == {"i": 1.0, "i/nan_dropped": 0.0}


def test_nan_propagate_enters_the_statistic() -> None:
    m = ms.Metrics({"p": ms.Spec(("mean", "max", "count"))})
    m.record("p", 1.0)
    m.record("p", float("nan"))
    got = m.compute()
    assert math.isnan(got["p/mean"]) and got["p/count"] == 2.0
    m2 = ms.Metrics({"p": ms.Spec(("mean", "max", "min"))})
    m2.record("p", np.array([1.0, np.inf]))
    assert m2.compute() == {"p/mean": np.inf, "p/max": np.inf, "p/min": 1.0}


# -------------------------------------------------------------- lifecycle


def test_names_len_contains() -> None:
    m = ms.Metrics({"declared": ms.Spec("max"), "g/*": ms.Spec("sum")})
    assert m.names == [] and len(m) == 0 and "declared" not in m
    m.record("b", 1.0)
    m.record("a", torch.tensor([1.0]))
    m.record("masked", np.array([1.0]), mask=np.array([False]))
    m.record("g/x", 2.0)
    assert m.names == ["b", "a", "g/x"]
    assert len(m) == 3
    assert "a" in m and "b" in m and "g/x" in m
    assert "declared" not in m and "masked" not in m and "g/*" not in m and 3 not in m
    m.reset()
    assert m.names == [] and len(m) == 0 and "a" not in m
    assert m.compute() == {}


def test_merged_names_count() -> None:
    a, b = ms.Metrics(), ms.Metrics()
    a.record("x", 1.0)
    b.record("y", 2.0)
    merged = ms.merge([a, b])
    assert set(merged.names) == {"x", "y"} and len(merged) == 2 and "y" in merged


def test_reset_keeps_specs_and_forgets_samples() -> None:
    m = ms.Metrics({"lr": ms.Spec("last", fmt=".2e"), "t/*": ms.Spec("max")})
    m.record("lr", 1e-3)
    m.record("lr", 2e-3)
    m.record("t/a", torch.tensor([5.0, 9.0]))
    m.record("s", 5.0)
    m.reset()
    assert m.compute() == {}
    m.record("lr", 3e-3)
    m.record("t/a", 1.0)
    m.record("t/a", 2.0)
    m.record("s", 1.0)
    assert m.compute() == {"lr": 3e-3, "t/a": 2.0, "s": 1.0}
    assert m.spec("lr") == ms.Spec("last", fmt=".2e")
    assert m.spec("t/new") == ms.Spec("max")


def test_reset_of_across_metrics_forgets_ranks() -> None:
    a, b = ms.Metrics({"x": ms.Spec("sum", across="mean")}), ms.Metrics()
    a.record("x", 2.0)
    b.define("x", ms.Spec("sum", across="mean"))
    b.record("x", 4.0)
    merged = ms.merge([a, b])
    assert merged.compute() == {"x": 3.0}
    merged.reset()
    assert merged.compute() == {} and len(merged) == 0
    merged.record("x", 10.0)
    assert merged.compute() == {"x": 10.0}


def test_compute_twice_and_record_in_between() -> None:
    m = ms.Metrics({"x": ms.Spec(("sum", "count"))})
    m.record("x", 1.0)
    assert m.compute() == m.compute() == {"x/sum": 1.0, "x/count": 1.0}
    m.record("x", torch.tensor([2.0, 3.0]))
    m.record("x", 4.0)
    assert m.compute() == {"x/sum": 10.0, "x/count": 4.0}


# ----------------------------------------------------------------- memory


@pytest.mark.parametrize(
    ("value", "n"),
    [
        (lambda i: float(i % 97), 30_000),
        (lambda i: np.float64(i % 7), 30_000),
        (lambda i: np.arange(3.0) + i % 5, 2_000),
    ],
    ids=["float", "np.float64", "array"],
)
def test_memory_does_not_grow_with_records(value: Any, n: int) -> None:
    import tracemalloc

    m = ms.Metrics({"q": ms.Spec(("mean", "std", "last", "max")), "r": ms.Spec("sum")})
    for i in range(10_000):  # warm up: every buffer and table at its working size
        m.record("q", value(i))
        m.record("r", 1.0)
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        peak_growth = 0
        for i in range(n):
            m.record("q", value(i))
            m.record("r", 1.0)
            if i % 1000 == 0:
                peak_growth = max(peak_growth, tracemalloc.get_traced_memory()[0] - start)
        growth = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    # O(metrics): pending buffers hold a few thousand numbers, not every record
    assert max(growth, peak_growth) < 128 * 1024, (growth, peak_growth)
    assert m.compute()["r"] == 10_000.0 + n


def test_serialized_size_does_not_grow_with_records() -> None:
    def blob(n: int) -> int:
        m = ms.Metrics({"a": ms.Spec(("mean", "p50", "p99")), "b": ms.Spec("sum")})
        rng = np.random.default_rng(n)
        for _ in range(n):
            m.record("a", rng.normal(size=10))
            m.record("b", 1.0)
        return len(m.to_bytes())

    # the sketch sends the cells between its extremes: at most its 8,067 cells
    sizes = [blob(n) for n in (10, 1000, 10_000)]
    assert max(sizes) <= 8067 * 8 + 2048, sizes
    assert sizes[1] < 2 * sizes[0], sizes


def test_sketch_state_under_64_kib() -> None:
    m = ms.Metrics({"a": ms.Spec(("p50", "p99.9"))})
    m.record("a", np.random.default_rng(0).lognormal(size=100_000))
    assert len(ms.Metrics({"b": ms.Spec("mean")}).to_bytes()) < 1024
    assert len(m.to_bytes()) < 64 * 1024 + 1024


# ------------------------------------------------------------- checkpoints


def _record_step(m: ms.Metrics, step: int) -> None:
    rng = np.random.default_rng(step)
    m.record("loss", float(rng.normal()))
    m.record("lr", 1e-4 * (step + 1))
    m.record("ent", torch.tensor(rng.normal(size=8)), mask=torch.tensor(rng.random(8) < 0.5))
    m.record("len", rng.integers(1, 100, size=4))
    m.record("pg", float(rng.normal()), weight=float(rng.integers(1, 5)))


SPECS = {
    "loss": ms.Spec(("mean", "std", "min", "max")),
    "lr": ms.Spec("last", fmt=".2e"),
    "ent": ms.Spec(("mean", "count")),
    "len": ms.Spec(("mean", "p50", "p99")),
    "pg": ms.Spec("sum", across="mean"),
}


def test_state_dict_mid_window_then_continue_equals_uninterrupted() -> None:
    straight = ms.Metrics(SPECS)
    for step in range(10):
        _record_step(straight, step)

    first = ms.Metrics(SPECS)
    for step in range(4):
        _record_step(first, step)
    state = pickle.loads(pickle.dumps(first.state_dict()))  # as a checkpoint would hold it
    resumed = ms.Metrics()
    resumed.load_state_dict(state)
    for step in range(4, 10):
        _record_step(resumed, step)
    assert same(resumed.compute(), straight.compute(), rel=1e-12, abs=1e-12)
    assert resumed.spec("lr") == ms.Spec("last", fmt=".2e")


def test_load_state_dict_rejects_garbage() -> None:
    m = ms.Metrics()
    m.record("x", 1.0)
    for bad in [{}, {"metricsync": 2, "data": b""}, {"metricsync": 1, "data": b"garbage"}, None]:
        with pytest.raises(ValueError):
            m.load_state_dict(bad)  # type: ignore[arg-type]
    assert m.compute() == {"x": 1.0}


# -------------------------------------------------------------- formatting


formatting = pytest.importorskip("metricsync._state._formatting")


def test_format_learning_rate_integers_large_and_nan() -> None:
    m = ms.Metrics(
        {
            "lr": ms.Spec("last", fmt=".2e"),
            "tokens": ms.Spec("sum", fmt=",.0f"),
            "big": ms.Spec("max"),
            "tiny": ms.Spec("mean"),
            "bad": ms.Spec("mean"),
            "len": ms.Spec(("mean", "max"), fmt=".1f"),
        }
    )
    m.record("lr", 3e-4)
    m.record("tokens", 1_234_567)
    m.record("tokens", 1_000)
    m.record("big", 123456789.0)
    m.record("tiny", 1e-6)
    m.record("bad", float("nan"))
    m.record("len", [1.0, 2.0])
    line = m.format()
    assert "lr=3.00e-04" in line
    assert "tokens=1,235,567" in line
    assert "len/mean=1.5" in line and "len/max=2.0" in line
    big = line.split("big=")[1].split()[0]
    assert big.replace(",", "").replace(".", "").isdigit() or "e+08" in big
    assert float(big.replace(",", "")) == pytest.approx(123456789.0, rel=1e-3)
    tiny = line.split("tiny=")[1].split()[0]
    assert float(tiny) == pytest.approx(1e-6, rel=1e-2)  # never 0.000
    assert "bad=nan" in line.lower()
    assert m.format(m.compute()) == line


def test_format_given_values() -> None:
    m = ms.Metrics({"lr": ms.Spec("last", fmt=".2e")})
    assert m.format({"lr": 1e-5}) == "lr=1.00e-05"
    assert m.format({}) == ""


# ----------------------------------------------------------------- merging


def test_merge_edge_cases() -> None:
    assert ms.merge([]).compute() == {}
    m = ms.Metrics({"x": ms.Spec(("sum", "count", "max"))})
    m.record("x", [1.0, 2.0])
    m.record("x", 3.0)
    assert m.merge(m) is m  # merging with itself doubles every sample
    assert m.compute() == {"x/sum": 12.0, "x/count": 6.0, "x/max": 3.0}
    assert ms.merge(iter([m, ms.Metrics()])).compute() == m.compute()
    with pytest.raises(TypeError):
        m.merge({"x": 1.0})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ms.merge([m, 3])  # type: ignore[list-item]


def test_a_merge_keeps_an_across_metrics_sketch_to_its_own_samples() -> None:
    # the other side counts as one rank: its samples must not reach this side's sketch,
    # or this side's own median (one of the two ranks averaged) would move
    spec = ms.Spec(("p50", "mean"), across="mean")
    a, b = ms.Metrics({"x": spec}), ms.Metrics({"x": spec})
    a.record("x", [1.0, 2.0, 3.0, 4.0, 5.0])
    b.record("x", [1.0] * 9)
    for merged in (a.copy().merge(b), ms.merge([a, b])):
        got = merged.compute()
        assert got["x/mean"] == np.mean([np.mean([1, 2, 3, 4, 5]), 1.0])
        assert got["x/p50"] == pytest.approx(np.mean([np.median([1, 2, 3, 4, 5]), 1.0]), rel=0.02)


def test_merging_an_empty_metrics_keeps_the_sign_of_a_zero_sum() -> None:
    # an empty merge merges nothing: the table's first fold still copies its state
    for record_first in (True, False):
        m = ms.Metrics({"x": ms.Spec(("sum", "mean"))})
        if record_first:
            m.record("x", -0.0)
        m.merge(ms.Metrics())
        if not record_first:
            m.record("x", -0.0)
        got = m.compute()
        assert [math.copysign(1.0, got[k]) for k in ("x/sum", "x/mean")] == [-1.0, -1.0]


def test_merge_result_is_independent_of_its_inputs() -> None:
    a, b = ms.Metrics(), ms.Metrics()
    a.record("x", 1.0)
    b.record("x", torch.tensor([3.0]))
    merged = ms.merge([a, b])
    a.record("x", 100.0)
    b.reset()
    assert merged.compute() == {"x": 2.0}
    merged.record("x", 5.0)
    assert a.compute() == {"x": 50.5} and b.compute() == {}


def test_empty_tensor_is_not_a_name_before_compute() -> None:
    m = ms.Metrics()
    m.record("a", torch.tensor([]))
    m.record("b", torch.ones(0, 3, device="meta"))
    assert m.names == [] and len(m) == 0 and "a" not in m


def test_merge_ignores_a_rule_clash_no_name_uses() -> None:
    a = ms.Metrics({"timing/*": ms.Spec("max")})
    a.record("loss", 0.0)
    b = ms.Metrics({"timing/*": ms.Spec("sum")})
    b.record("loss", 1.0)
    assert ms.merge([a, b]).compute() == {"loss": 0.5}
    b.record("timing/step", 2.0)  # now a name resolves differently on the two sides
    with pytest.raises(ms.SpecMismatchError, match="timing/step"):
        ms.merge([a, b])


def test_a_fully_masked_cpu_tensor_holds_no_sample() -> None:
    import torch

    m = ms.Metrics()
    m.record("f", torch.tensor([1.0, 2.0]), mask=torch.tensor([False, False]))
    m.record("g", np.array([1.0, 2.0]), mask=np.array([False, False]))
    assert (m.names, len(m), "f" in m, "g" in m) == ([], 0, False, False)
    m.record("f", torch.tensor([5.0]))
    assert m.names == ["f"] and m.compute() == {"f": 5.0}
    assert ["f"] not in m  # an unhashable name is simply not held
