"""The definitions users trip over, each against an independent oracle.

- ``last``: each kept number has its own time under ``nan="ignore"`` (a
  dropped NaN or a zero-weight sample moves no time stamp); NaN at equal
  stamps merges commutatively; ``across="first"`` keeps the left-most operand
  holding samples in ``merge`` and ``collect``.
- Quantiles against numpy, by hypothesis: the default is numpy's linear
  interpolation, within the sketch's accuracy of each of the two order
  statistics it interpolates; ``quantile_method="inverted_cdf"`` is numpy's
  nearest rank within the accuracy.
- Masks hold 0/1 or booleans; anything else raises ``ValueError`` naming the
  metric and ``weight=`` (host records at ``record``, device ones at
  ``compute``), and records nothing.
- ``ddof`` against numpy (and torch) over reliability weights (``np.cov`` aweights).
- Observing (``compute``, ``state_dict``, ``copy``, ``names``, ``to_bytes``,
  ...) mid-way leaves the final ``compute()`` and ``to_bytes()`` bit for bit
  those of an uninterrupted run, for host and device records.
- NumPy ``RuntimeWarning``s never escape: under ``warnings.simplefilter("error")``
  records, merges, ``compute``, ``format``, ``histograms`` and the binary
  format of 1e308, infinities and NaN in every ``across`` mode succeed.

Device records are checked through the accelerator code path on CPU tensors
(``metricsync._record._convert.HOST_DEVICE_TYPES`` emptied), skipped without torch.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metricsync as ms
import metricsync._record._convert
import metricsync._state._algebra
from metricsync._record._pending import FAST_LIMIT

HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs torch")

SETTINGS = settings(
    max_examples=int(os.environ.get("METRICSYNC_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@contextlib.contextmanager
def clock() -> Iterator[list[float]]:
    """A recording clock the test sets: ``now[0]`` microseconds until changed."""
    now = [1.0]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(metricsync._state._algebra, "now_us", lambda: now[0])
        yield now


@contextlib.contextmanager
def device_path(on: bool = True) -> Iterator[None]:
    """CPU tensors through the accelerator code path (with ``on``)."""
    with pytest.MonkeyPatch.context() as mp:
        if on:
            mp.setattr(metricsync._record._convert, "HOST_DEVICE_TYPES", frozenset())
        yield


def bits(values: dict[str, float]) -> dict[str, bytes]:
    """Results compared bit for bit (-0.0 differs from 0.0; every NaN is one NaN)."""
    return {k: b"nan" if math.isnan(v) else np.float64(v).tobytes() for k, v in values.items()}


def as_kind(values: list[float], kind: str) -> Any:
    if kind == "float":
        return values[0]
    if kind == "list":
        return values
    import torch

    return torch.tensor(values, dtype=torch.float64)


KINDS = ["float", "list"] + (["tensor"] if HAS_TORCH else [])
PATHS = [False, True] if HAS_TORCH else [False]


# -------------------------------------------------------------------- last


@pytest.mark.parametrize("device", PATHS, ids=["host", "device"][: len(PATHS)])
@pytest.mark.parametrize("kind", KINDS)
def test_last_ignores_the_time_of_a_dropped_nan(kind: str, device: bool) -> None:
    spec = ms.Spec("last", nan="ignore")
    with clock() as now, device_path(device):
        a, b = ms.Metrics({"lr": spec}), ms.Metrics({"lr": spec})
        now[0] = 0.5
        a.record("lr", 0.5)  # a first record opens the name's number buffer
        now[0] = 1.0
        a.record("lr", as_kind([1.0], kind))
        now[0] = 2.0
        b.record("lr", as_kind([2.0], kind))
        now[0] = 3.0
        a.record("lr", as_kind([math.nan], kind))  # dropped: a's latest kept number is at 1
        for parts in ([a, b], [b, a]):
            assert ms.merge(parts).compute() == {"lr": 2.0, "lr/nan_dropped": 1.0}
        restored = ms.Metrics.from_bytes(a.to_bytes()).merge(b)
        assert restored.compute() == {"lr": 2.0, "lr/nan_dropped": 1.0}


@pytest.mark.parametrize("swap", ["reset", "fold"])
def test_last_of_a_renewed_number_buffer_still_ignores_the_time_of_a_dropped_nan(swap: str) -> None:
    # a reset, or a fold of a full buffer, swaps the name's number buffer for a new one
    spec = ms.Spec("last", nan="ignore")
    with clock() as now:
        a, b = ms.Metrics({"lr": spec}), ms.Metrics({"lr": spec})
        now[0] = 0.5
        a.record("lr", 0.5)  # opens the name's number buffer
        if swap == "reset":
            a.reset()
        else:
            for _ in range(FAST_LIMIT):  # the buffer fills: folded and swapped
                a.record("lr", 0.25)
        now[0] = 1.0
        a.record("lr", 1.0)
        now[0] = 2.0
        b.record("lr", 2.0)
        now[0] = 3.0
        a.record("lr", math.nan)  # dropped: a's latest kept number is at 1
        for parts in ([a, b], [b, a]):
            assert ms.merge(parts).compute() == {"lr": 2.0, "lr/nan_dropped": 1.0}
        restored = ms.Metrics.from_bytes(a.to_bytes()).merge(b)
        assert restored.compute() == {"lr": 2.0, "lr/nan_dropped": 1.0}


@pytest.mark.parametrize("device", PATHS, ids=["host", "device"][: len(PATHS)])
def test_last_ignores_the_time_of_a_zero_weight_sample(device: bool) -> None:
    with clock() as now, device_path(device):
        a, b = ms.Metrics({"lr": ms.Spec("last")}), ms.Metrics({"lr": ms.Spec("last")})
        now[0] = 1.0
        a.record("lr", 0.5)
        a.record("lr", 1.0)  # the number buffer, after a first record
        now[0] = 2.0
        b.record("lr", 2.0)
        now[0] = 3.0
        a.record("lr", as_kind([5.0], KINDS[-1]), weight=0.0)  # not a sample
        a.record("lr", as_kind([6.0, 7.0], KINDS[-1]), mask=[False, False])
        for parts in ([a, b], [b, a]):
            assert ms.merge(parts).compute() == {"lr": 2.0}


LAST_VALUES = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0, 1e308, 5e-324]
TIED = ms.Spec(("last", "max", "min", "p50", "count"))  # order statistics: exact in any order


def _total_order(v: float) -> tuple[float, float]:
    return (v, math.copysign(1.0, v))  # 0.0 above -0.0 (NaN handled by the caller)


@given(st.lists(st.sampled_from(LAST_VALUES), min_size=2, max_size=5), st.randoms())
@SETTINGS
def test_merges_at_equal_times_commute_bit_for_bit(values: list[float], rnd: Any) -> None:
    with clock():  # every record at the same time: ties everywhere
        parts = []
        for v in values:
            m = ms.Metrics({"x": TIED})
            m.record("x", v)
            parts.append(m)
        want = ms.merge(parts)
        shuffled = list(parts)
        rnd.shuffle(shuffled)
        got = ms.merge(shuffled)
        # a left fold, a right fold and a shuffled order all hold the same state
        right = parts[-1].copy()
        for m in parts[-2::-1]:
            right = m.copy().merge(right)
    assert got.to_bytes() == want.to_bytes() == right.to_bytes()
    last = got.compute()["x/last"]
    if any(math.isnan(v) for v in values):  # NaN wins ties
        assert math.isnan(last)
    else:  # else the larger value, and 0.0 above -0.0
        assert bits({"x": last}) == bits({"x": max(values, key=_total_order)})


def _first_parts() -> list[ms.Metrics | None]:
    spec = ms.Spec(("last", "mean", "count"), across="first")
    parts: list[ms.Metrics | None] = []
    for values in (None, [], [5.0, 7.0], [1.0], None, [9.0]):
        m = ms.Metrics({"lr": spec, "other": ms.Spec("sum")})
        m.record("other", 1.0)
        if values is not None:
            m.record("lr", values)  # [] records no sample
        parts.append(m)
    return parts


def test_first_keeps_the_left_most_operand_holding_samples() -> None:
    parts = _first_parts()
    want = {"lr/last": 7.0, "lr/mean": 6.0, "lr/count": 2.0, "other": 6.0}
    held = [m for m in parts if m is not None]
    assert ms.merge(held).compute() == want
    assert ms.collect([None, *held, None]).compute() == want
    assert ms.merge(held[::-1]).compute() == {
        **want,
        "lr/last": 9.0,
        "lr/mean": 9.0,
        "lr/count": 1.0,
    }
    # associativity: a merged operand keeps its own left-most holder
    left = ms.merge(held[:3])
    assert ms.merge([left, ms.merge(held[3:])]).compute() == want
    assert (
        ms.merge([held[0], held[1], ms.merge(held[3:][::-1]), held[2]]).compute()["lr/last"] == 9.0
    )
    # and the result survives the binary format
    assert ms.Metrics.from_bytes(ms.merge(held).to_bytes()).compute() == want


# --------------------------------------------------------------- quantiles

MAGNITUDES = st.floats(1e-9, 1e9, allow_nan=False, allow_infinity=False)
SAMPLE = st.one_of(st.just(0.0), MAGNITUDES, MAGNITUDES.map(lambda x: -x))
PERCENT = st.one_of(
    st.sampled_from([1.0, 10.0, 25.0, 50.0, 75.0, 90.0, 99.0, 99.9]),
    st.integers(1, 999).map(lambda i: i / 10),
)


@st.composite
def quantile_case(
    draw: st.DrawFn,
) -> tuple[list[np.ndarray], list[np.ndarray | None], list[float], float]:
    n_parts = draw(st.integers(1, 3))
    values, weights = [], []
    for _ in range(n_parts):
        x = np.array(draw(st.lists(SAMPLE, min_size=0, max_size=60)))
        values.append(x)
        weighted = draw(st.booleans())
        weights.append(
            np.array(
                draw(st.lists(st.integers(0, 3), min_size=len(x), max_size=len(x))), dtype=float
            )
            if weighted
            else None
        )
    percents = draw(st.lists(PERCENT, min_size=1, max_size=4, unique=True))
    return values, weights, percents, draw(st.sampled_from([0.01, 0.05]))


def _stat(percent: float) -> str:
    return f"p{percent:g}"


def _check_quantile(
    got: float, q: float, samples: np.ndarray, method: str, accuracy: float
) -> None:
    s = np.sort(samples)
    want = float(np.quantile(samples, q, method=method))
    slack = 1 + 1e-12
    if method == "inverted_cdf":
        bound = accuracy * abs(want)
    else:
        # numpy interpolates x_lo and x_hi at h = q (n - 1); the sketch knows each within
        # accuracy, so its interpolation is within accuracy of each one's share
        h = q * (len(s) - 1)
        lo, hi = math.floor(h), math.ceil(h)
        f = h - lo
        bound = accuracy * ((1 - f) * abs(s[lo]) + f * abs(s[hi]))
    assert abs(got - want) <= bound * slack + 1e-300, (method, q, got, want, bound)


@given(quantile_case(), st.sampled_from(["linear", "inverted_cdf"]))
@SETTINGS
def test_quantiles_against_numpy(case: Any, method: str) -> None:
    values, weights, percents, accuracy = case
    stats = tuple(_stat(p) for p in percents)
    kwargs = {} if method == "linear" else {"quantile_method": method}
    spec = ms.Spec((*stats, "count"), accuracy=accuracy, **kwargs)
    parts = []
    for x, w in zip(values, weights):
        m = ms.Metrics({"q": spec})
        m.record("q", x, weight=w)
        parts.append(m)
    got = ms.merge(parts).compute()
    samples = np.concatenate(
        [x if w is None else np.repeat(x, w.astype(int)) for x, w in zip(values, weights)]
    )
    if not len(samples):
        assert got == {}
        return
    assert got["q/count"] == len(samples)
    x = np.concatenate(values)
    w = np.concatenate([np.ones(len(v)) if u is None else u for v, u in zip(values, weights)])
    for p, stat in zip(percents, stats):
        if method == "linear" and not np.isin(w, (0.0, 1.0)).all():
            _check_weighted_linear(got[f"q/{stat}"], p / 100, x, w, accuracy)
        else:  # repeats for the nearest rank; numpy over the kept samples for 0/1 weights
            _check_quantile(got[f"q/{stat}"], p / 100, samples, method, accuracy)


def _check_weighted_linear(
    got: float, q: float, x: np.ndarray, w: np.ndarray, accuracy: float
) -> None:
    """docs/definitions.md, by brute force: weights relative to their mean ``W / n``,
    ``x_(j)`` the first sample whose cumulative weight exceeds ``j W / n``, linear between
    ``x_(floor h)`` and ``x_(floor h + 1)`` at ``h = q (n - 1)`` (integer weights here:
    the comparisons are exact)."""
    order = np.argsort(x[w > 0], kind="stable")
    xs, ws = x[w > 0][order], w[w > 0][order]
    n, total, cum = len(xs), ws.sum(), np.cumsum(ws)
    h = q * (n - 1)
    j = math.floor(h)
    x0, x1 = (xs[min(int(np.count_nonzero(cum * n <= k * total)), n - 1)] for k in (j, j + 1))
    f = h - j
    want = x0 + f * (x1 - x0)
    bound = accuracy * ((1 - f) * abs(x0) + f * abs(x1))
    assert abs(got - want) <= bound * (1 + 1e-12) + 1e-300, (q, got, want, bound)


def test_quantile_defaults_are_numpys() -> None:
    m = ms.Metrics({"q": ms.Spec(("p50", "p25"))})
    m.record("q", [1.0, 2.0, 3.0, 4.0])
    got = m.compute()  # numpy: 2.5 and 1.75 (the nearest rank said 2 and 1)
    assert abs(got["q/p50"] - 2.5) <= 0.01 * 2.5 and abs(got["q/p25"] - 1.75) <= 0.01 * 1.75
    assert ms.Spec("p50").quantile_method == "linear"
    near = ms.Metrics({"q": ms.Spec(("p50", "p25"), quantile_method="inverted_cdf")})
    near.record("q", [1.0, 2.0, 3.0, 4.0])
    assert near.compute()["q/p25"] == 1.0 and abs(near.compute()["q/p50"] - 2.0) <= 0.02
    doc = ms.Spec.__doc__ or ""
    assert "linear" in doc and "inverted_cdf" in doc and "numpy" in doc


# -------------------------------------------------------------------- masks

BAD_MASKS = [[0.5, 1.0], [2, 1], [-1, 0], [1.0, math.nan], [1.0, math.inf]]


@pytest.mark.parametrize("mask", BAD_MASKS, ids=str)
def test_a_mask_that_is_not_zero_or_one_raises_at_record(mask: list[float]) -> None:
    m = ms.Metrics()
    m.record("kept", 1.0)
    before = m.to_bytes()
    with pytest.raises(ValueError, match=r"'entropy'.*weight="):
        m.record("entropy", np.array([1.0, 2.0]), mask=np.array(mask))
    with pytest.raises(ValueError, match=r"'entropy'.*weight="):
        m.record("entropy", [1.0, 2.0], mask=mask)
    assert m.to_bytes() == before


@needs_torch
@pytest.mark.parametrize("mask", BAD_MASKS, ids=str)
def test_a_device_mask_that_is_not_zero_or_one_raises_at_compute(mask: list[float]) -> None:
    import torch

    with device_path():
        m = ms.Metrics()
        m.record("kept", torch.tensor([1.0]))
        m.record("entropy", torch.tensor([1.0, 2.0]), mask=torch.tensor(mask))
        with pytest.raises(ValueError, match=r"'entropy'.*weight="):
            m.compute()
        with pytest.raises(ValueError, match=r"'entropy'.*weight="):
            m.compute()  # the bad record was discarded; the error stays until reset()


@pytest.mark.parametrize("device", PATHS, ids=["host", "device"][: len(PATHS)])
def test_zero_one_masks_of_any_dtype_are_masks(device: bool) -> None:
    x = [1.0, 2.0, 4.0]
    masks: list[Any] = [
        [True, False, True],
        [1, 0, 1],
        [1.0, 0.0, 1.0],
        np.array([1, 0, 1], dtype=np.uint8),
    ]
    if HAS_TORCH:
        import torch

        masks += [torch.tensor([1, 0, 1]), torch.tensor([1.0, 0.0, 1.0], dtype=torch.bfloat16)]
    with device_path(device):
        for mask in masks:
            m = ms.Metrics({"x": ms.Spec(("mean", "count"))})
            m.record("x", as_kind(x, KINDS[-1]), mask=mask)
            assert m.compute() == {"x/mean": 2.5, "x/count": 2.0}, mask


# --------------------------------------------------------------------- ddof


@given(
    st.lists(
        st.lists(st.integers(-1000, 1000).map(lambda i: i / 8), max_size=20), min_size=1, max_size=3
    ),
    st.data(),
    st.sampled_from([0, 1, 2]),
)
@SETTINGS
def test_ddof_against_numpy_with_reliability_weights(
    parts: list[list[float]], data: Any, ddof: int
) -> None:
    """``ddof`` divides by ``W - ddof * sum(w^2) / W``: numpy's ``cov`` with ``aweights``
    (before: ``W - ddof``, frequency weights, which depend on the weights' scale)."""
    spec = ms.Spec(("var", "std", "count"), ddof=ddof)
    metrics, samples, weights = [], [], []
    for x in parts:
        w = data.draw(st.lists(st.integers(0, 3), min_size=len(x), max_size=len(x)))
        m = ms.Metrics({"x": spec})
        m.record("x", x, weight=[float(v) for v in w])
        metrics.append(m)
        samples += [v for v, k in zip(x, w) if k]
        weights += [float(k) for k in w if k]
    got = ms.merge(metrics).compute()
    if not samples:
        assert got == {}
        return
    a = np.array(weights)
    if a.sum() - ddof * (a * a).sum() / a.sum() <= 0:  # numpy warns, inf or NaN; here NaN
        assert math.isnan(got["x/var"]) and math.isnan(got["x/std"])
        return
    want = np.cov(np.array(samples), aweights=a, ddof=ddof)
    assert got["x/var"] == pytest.approx(want, rel=1e-9, abs=1e-9)
    assert got["x/std"] == pytest.approx(math.sqrt(want), rel=1e-9, abs=1e-9)


_PLAIN_STATS = ("mean", "sum", "count", "min", "max", "last", "var", "std")


def _numpy_statistic(stat: str, x: np.ndarray, ddof: int) -> float:
    if stat in ("var", "std"):
        if len(x) - ddof <= 0:
            return math.nan
        var = float(np.var(x, ddof=ddof))
        return var if stat == "var" else math.sqrt(var)
    if stat in ("count", "last"):
        return float(len(x) if stat == "count" else x[-1])
    return float(getattr(np, stat)(x))


@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(_PLAIN_STATS), min_size=1, max_size=4, unique=True),
            st.sampled_from([0, 1, 2]),
            st.lists(st.integers(-1000, 1000).map(lambda i: i / 8), max_size=6),
        ),
        min_size=1,
        max_size=8,
    ),
    st.randoms(use_true_random=False),
)
@SETTINGS
def test_every_metric_gets_its_own_statistics_and_ddof(
    metrics: list[tuple[list[str], int, list[float]]], rng: Any
) -> None:
    """Metrics of different statistics and ddof side by side, their slots in a drawn
    order: each key is numpy's statistic of that metric's samples, with its ddof."""
    specs = {
        f"m{i}": ms.Spec(tuple(stats), ddof=ddof) for i, (stats, ddof, _) in enumerate(metrics)
    }
    samples = {name: xs for name, (_, _, xs) in zip(specs, metrics) if xs}
    m = ms.Metrics(specs)
    for name in sorted(samples, key=lambda _: rng.random()):  # slots in a drawn order
        m.record(name, samples[name][0])
    for name, xs in samples.items():
        for x in xs[1:]:
            m.record(name, x)
    want = {}
    for name, (stats, ddof, xs) in zip(specs, metrics):
        for key, stat in zip(specs[name].output_keys(name), stats):
            if xs:
                want[key] = _numpy_statistic(stat, np.array(xs), ddof)
    got = m.compute()
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-9, nan_ok=True), key


@needs_torch
def test_ddof_one_is_torchs_default() -> None:
    import torch

    x = torch.tensor([1.0, 2.0, 4.0, 8.0], dtype=torch.float64)
    for device in PATHS:
        with device_path(device):
            m = ms.Metrics({"x": ms.Spec(("std", "var"), ddof=1)})
            m.record("x", x[:1])
            m.record("x", x[1:])
            got = m.compute()
        assert got["x/std"] == pytest.approx(float(x.std()), rel=1e-12)
        assert got["x/var"] == pytest.approx(float(x.var()), rel=1e-12)
    assert ms.Spec("std").ddof == 0


# ---------------------------------------------- observing changes nothing

OBSERVERS = [
    "compute",
    "state_dict",
    "copy",
    "names",
    "to_bytes",
    "format",
    "histograms",
    "merge_out",
]
SPECS = {
    "s": ms.Spec(("mean", "std", "p50", "last", "min", "max", "sum"), nan="ignore"),
    "t": ms.Spec(("mean", "std"), across="mean"),
    "u": ms.Spec(("mean", "var"), ddof=1),
}
FLOATS = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@st.composite
def an_op(draw: st.DrawFn, torch_ok: bool) -> tuple[str, str, np.ndarray, np.ndarray | None]:
    kinds = ["float", "wfloat", "list", "numpy", "burst", "update"]
    if torch_ok:
        kinds += ["tensor", "tensor_w", "tensor_mask", "tensor_scalar"]
    kind = draw(st.sampled_from(kinds))
    n = draw(st.integers(1, 30))
    x = np.array(draw(st.lists(st.one_of(FLOATS, st.just(math.nan)), min_size=n, max_size=n)))
    w = np.array(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=n, max_size=n)))
    return draw(st.sampled_from(sorted(SPECS))), kind, x, w


def _apply(m: ms.Metrics, op: tuple[str, str, np.ndarray, np.ndarray | None], seed: int) -> None:
    name, kind, x, w = op
    if kind == "float":
        m.record(name, float(x[0]))
    elif kind == "wfloat":
        m.record(name, float(x[0]), weight=float(w[0]))
    elif kind == "list":
        m.record(name, x.tolist())
    elif kind == "numpy":
        m.record(name, x, weight=w)
    elif kind == "burst":  # past a fast-path buffer's fold point
        for v in np.random.default_rng(seed).normal(size=4500).tolist():
            m.record(name, v)
    elif kind == "update":
        m.update({name: float(x[0]), "v": x})
    else:
        import torch

        t = torch.tensor(x)
        if kind == "tensor":
            m.record(name, t)
        elif kind == "tensor_w":
            m.record(name, t, weight=torch.tensor(w))
        elif kind == "tensor_mask":
            m.record(name, t, mask=torch.tensor(w > 0.7))
        else:
            m.record(name, t[0])


def _observe(m: ms.Metrics, how: str) -> None:
    if how == "names":
        _ = m.names
    elif how == "merge_out":
        ms.Metrics().merge(m)
    else:
        getattr(m, how)()


def _run(
    ops: list[Any], observe: dict[int, list[str]], device: bool
) -> tuple[dict[str, bytes], bytes]:
    with clock() as now, device_path(device):
        m = ms.Metrics(SPECS)
        for i, op in enumerate(ops):
            now[0] = 10.0 * (i + 1)
            for how in observe.get(i, []):
                _observe(m, how)
            _apply(m, op, i)
        now[0] = 10.0 * (len(ops) + 1)
        return bits(m.compute()), m.to_bytes()


@st.composite
def observed_case(draw: st.DrawFn) -> tuple[list[Any], dict[int, list[str]], bool]:
    device = draw(st.booleans()) if HAS_TORCH else False
    ops = draw(st.lists(an_op(HAS_TORCH), min_size=1, max_size=12))
    observe = draw(
        st.dictionaries(
            st.integers(0, len(ops)),
            st.lists(st.sampled_from(OBSERVERS), min_size=1, max_size=3),
            min_size=1,
        )
    )
    return ops, observe, device


@given(observed_case())
@SETTINGS
def test_observing_mid_way_changes_nothing(case: Any) -> None:
    ops, observe, device = case
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's warnings about NaN weights are not the point
        plain = _run(ops, {}, device)
        observed = _run(ops, observe, device)
    assert observed[0] == plain[0]
    assert observed[1] == plain[1]


@given(
    st.lists(st.lists(an_op(HAS_TORCH), max_size=6), min_size=1, max_size=4),
    st.permutations(range(4)),
)
@SETTINGS
def test_merging_settled_parts_equals_merging_them_as_recorded(
    parts: list[list[Any]], order: list[int]
) -> None:
    """A merge reads a settled part (nothing to fold: a decoded result) from its table and
    folds any other part into a copy first: merging the parts as recorded, pending samples
    and all, and decoded from their bytes gives the same bytes, in any order."""
    with clock() as now, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's warnings about NaN weights are not the point
        recorded = []
        for j, ops in enumerate(parts):
            m = ms.Metrics(SPECS)
            for i, op in enumerate(ops):
                now[0] = 1000.0 * j + 10.0 * (i + 1)
                _apply(m, op, i)
            recorded.append(m)
        settled = [ms.Metrics.from_bytes(m.to_bytes()) for m in recorded]
        at = [i for i in order if i < len(parts)]
        merged, decoded = ms.merge([recorded[i] for i in at]), ms.merge([settled[i] for i in at])
        assert decoded.to_bytes() == merged.to_bytes()
        assert bits(decoded.compute()) == bits(merged.compute())


# ----------------------------------------------------------------- warnings

EXTREMES = [
    [1e308, 1e308],
    [math.inf, 1.0],
    [-math.inf, -1e308],
    [1e308, -math.inf],
    [math.nan, 2.0],
    [-1e308, 1e308],
]
STATS = ("mean", "sum", "std", "var", "min", "max", "last", "count", "p50", "p0", "p100")


@pytest.mark.parametrize("device", PATHS, ids=["host", "device"][: len(PATHS)])
@pytest.mark.parametrize("across", ["exact", "mean", "sum", "min", "max", "first"])
def test_no_numpy_warning_escapes_from_extreme_values(across: str, device: bool) -> None:
    specs = {
        "p": ms.Spec(STATS, across=across),
        "i": ms.Spec(STATS, across=across, nan="ignore", ddof=1),
    }
    with warnings.catch_warnings(), device_path(device):
        warnings.simplefilter("error")
        parts = []
        for i, values in enumerate(EXTREMES):
            m = ms.Metrics(specs)
            for name in specs:
                m.record(name, as_kind(values, KINDS[-1]))
                m.record(name, values[0], weight=1e308)  # a weight sum beyond float64
                m.record(name, as_kind(values, KINDS[-1]), weight=[1e308, 1e308])
                m.record(name, 1e308 if i % 2 else -1e308)
            m.compute()
            m.format()
            m.histograms()
            parts.append(m)
        for order in (parts, parts[::-1]):
            merged = ms.merge(order)
            got = merged.compute()
            merged.format()
            merged.histograms()
            again = ms.Metrics.from_bytes(merged.to_bytes())
            assert bits(again.compute()) == bits(got)
            chained = order[0].copy()
            for m in order[1:]:
                chained.merge(m)
            assert bits(chained.compute()) == bits(got)


def test_no_numpy_warning_escapes_from_sketch_counts_beyond_float64() -> None:
    x = np.ones(70_000)  # larger arrays fold at once: each adds to the sketch at record
    w = np.zeros(70_000)
    w[0] = 1e308
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = ms.Metrics({"x": ms.Spec(("p50", "count"))})
        m.record("x", x, weight=w)
        m.record("x", x, weight=w)  # the cell's count goes past float64: inf
        assert m.compute() == {"x/p50": 1.0, "x/count": math.inf}
        assert m.histograms()["x"].total == math.inf


def test_weighted_quantiles_follow_the_documented_weight_semantics() -> None:
    """docs/definitions.md: weights count by their proportions. The nearest rank is
    numpy's weighted inverted CDF; linear interpolation reads each weight relative to the
    mean weight (before: on their scale, a total weight of 1 or less put every quantile
    at the minimum, issue 42)."""
    x = np.arange(1.0, 11.0)
    w = np.array([3.0, 1.0, 2.0, 5.0, 1.0, 1.0, 4.0, 2.0, 1.0, 3.0])
    qs = ("p10", "p50", "p90")
    want = np.quantile(x, [0.1, 0.5, 0.9], weights=w, method="inverted_cdf")
    for scale in (1e-3, 1.0, 1e3):
        m = ms.Metrics({"x": ms.Spec(qs, quantile_method="inverted_cdf")})
        m.record("x", x, weight=w * scale)
        got = [m.compute()[f"x/{q}"] for q in qs]
        assert got == pytest.approx(want, rel=0.01), scale
    # weights / their mean 2.3: cumulative 1.30, 1.74, 2.61, 4.78, 5.22, ..., 8.26, 8.70, 10;
    # positions h = q * 9: p10 at 0.9 (x_(0) = x_(1) = 1), p50 at 4.5 (from 4 to 5),
    # p90 at 8.1 (from 8 to 10)
    for scale in (1e-3, 1.0 / w.sum(), 1.0, 1e3):  # a total weight of 1 among them
        m = ms.Metrics({"x": ms.Spec(qs)})
        m.record("x", x, weight=w * scale)
        assert list(m.compute().values()) == pytest.approx([1.0, 4.5, 8.2], rel=0.01), scale
