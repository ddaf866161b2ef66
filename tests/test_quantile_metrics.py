"""Quantile statistics (``pNN``) through ``Metrics``: accuracy, edge values, size, devices."""

from __future__ import annotations

import math

import numpy as np
import pytest

import metricsync as ms

torch = pytest.importorskip("torch")  # the numpy-only test matrix has no torch

pytest.importorskip("metricsync._state._sketch")

QS = ("p0", "p1", "p10", "p50", "p90", "p99", "p99.9", "p100")


def within_one_percent_of_rank(
    got: float, q: float, samples: np.ndarray, accuracy: float = 0.01
) -> bool:
    """``got`` is numpy's (linear) quantile within the sketch's accuracy.

    Linear interpolation between the order statistics around ``q (n - 1)``,
    each estimated within ``accuracy``: the error is at most ``accuracy`` times
    the interpolation of their magnitudes.
    """
    s = np.sort(samples)
    if q in (0.0, 1.0):
        return got == (s[0] if q == 0.0 else s[-1])
    h = q * (len(s) - 1)
    lo, hi = math.floor(h), math.ceil(h)
    frac = h - lo
    expected = s[lo] + frac * (s[hi] - s[lo]) if frac else s[lo]
    bound = accuracy * ((1 - frac) * abs(s[lo]) + frac * abs(s[hi]))
    return bool(got == expected or abs(got - expected) <= bound * (1 + 1e-9))


@pytest.mark.parametrize(
    "dist",
    ["lognormal", "normal", "uniform_ints", "heavy_tail", "constant", "two_points", "signed_tiny"],
)
def test_quantiles_within_one_percent(dist: str) -> None:
    rng = np.random.default_rng(7)
    data = {
        "lognormal": rng.lognormal(5.0, 2.0, size=20_000),
        "normal": rng.normal(0.0, 100.0, size=20_000),
        "uniform_ints": rng.integers(1, 4096, size=20_000).astype(float),
        "heavy_tail": rng.pareto(1.1, size=20_000) * 1e3,
        "constant": np.full(1000, 3.14159),
        "two_points": np.repeat([-2.0, 5.0], [300, 700]),
        "signed_tiny": rng.normal(0.0, 1e-9, size=5_000),
    }[dist]
    m = ms.Metrics({"x": ms.Spec(QS)})
    for chunk in np.array_split(data, 13):
        m.record("x", chunk)
    got = m.compute()
    for stat in QS:
        q = float(stat[1:]) / 100
        assert within_one_percent_of_rank(got[f"x/{stat}"], q, data), (stat, got[f"x/{stat}"])


def test_python_floats_numpy_and_torch_agree() -> None:
    rng = np.random.default_rng(3)
    data = rng.gamma(2.0, 50.0, size=3000)
    by_float, by_numpy, by_torch = (ms.Metrics({"x": ms.Spec(QS)}) for _ in range(3))
    for v in data.tolist():
        by_float.record("x", v)
    by_numpy.record("x", data)
    by_torch.record("x", torch.tensor(data))
    a, b, c = by_float.compute(), by_numpy.compute(), by_torch.compute()
    assert a == pytest.approx(b, rel=1e-12) and b == pytest.approx(c, rel=1e-12)


def test_single_sample_and_exact_ends() -> None:
    m = ms.Metrics({"x": ms.Spec(QS)})
    m.record("x", 42.5)
    assert set(m.compute().values()) == {42.5}
    m.record("x", [-7.25, 1e6])
    got = m.compute()
    assert got["x/p0"] == -7.25 and got["x/p100"] == 1e6


def test_zeros_negatives_and_infinities() -> None:
    data = np.array([-np.inf, -5.0, -0.0, 0.0, 0.0, 2.0, 3.0, np.inf])
    m = ms.Metrics({"x": ms.Spec(("p0", "p25", "p50", "p100"))})
    m.record("x", data)
    got = m.compute()
    assert got["x/p0"] == -np.inf and got["x/p100"] == np.inf
    assert got["x/p50"] == 0.0
    assert within_one_percent_of_rank(got["x/p25"], 0.25, data)


def test_nan_policies_for_quantiles() -> None:
    m = ms.Metrics(
        {
            "prop": ms.Spec(("p50", "p100")),
            "ign": ms.Spec(("p50", "p100"), nan="ignore"),
            "err": ms.Spec("p50", nan="error"),
        }
    )
    for name in ("prop", "ign"):
        m.record(name, [1.0, float("nan"), 3.0, 2.0])
        m.record(name, torch.tensor([float("nan"), 2.0]))
    with pytest.raises(ValueError, match="'err'"):
        m.record("err", [1.0, float("nan")])
    got = m.compute()
    assert math.isnan(got["prop/p50"])
    assert got["ign/p50"] == pytest.approx(2.0, rel=0.01)
    assert got["ign/p100"] == 3.0 and got["ign/nan_dropped"] == 2.0
    assert "err" not in got


def test_weights_and_masks_in_quantiles() -> None:
    values = np.array([1.0, 10.0, 100.0, 1000.0])
    weights = np.array([1.0, 0.0, 3.0, 1.0])  # 10 is left out; 100 weighs three times more
    # weights relative to their mean 5/3: 0.6, 1.8, 0.6 at cumulative 0.6, 2.4, 3.0; linear
    # positions q * (3 - 1): p25 halfway from 1 (position 0) to 100 (position 1)
    want = {"p0": 1.0, "p25": 50.5, "p50": 100.0, "p75": 100.0, "p100": 1000.0}
    for value, weight in [
        (values, weights),
        (values, weights * 1e-3),  # the scale of the weights changes nothing
        (torch.tensor(values), torch.tensor(weights)),
        (torch.tensor(values, dtype=torch.float32), weights),
    ]:
        m = ms.Metrics({"x": ms.Spec(("p0", "p25", "p50", "p75", "p100"))})
        m.record("x", value, weight=weight)
        got = m.compute()
        for stat, expected in want.items():
            assert got[f"x/{stat}"] == pytest.approx(expected, rel=0.01), stat
    m = ms.Metrics({"x": ms.Spec(("p0", "p100", "p50"))})
    m.record("x", torch.tensor([5.0, -100.0, 6.0, 100.0]), mask=torch.tensor([1, 0, 1, 0]))
    got = m.compute()
    assert got["x/p0"] == 5.0 and got["x/p100"] == 6.0


def test_state_stays_under_64_kib() -> None:
    base = len(ms.Metrics({"x": ms.Spec(QS)}).to_bytes())  # the header, no state
    sizes = []
    m = ms.Metrics({"x": ms.Spec(QS)})
    rng = np.random.default_rng(0)
    for _ in range(5):
        m.record("x", rng.lognormal(0.0, 8.0, size=50_000))
        sizes.append(len(m.to_bytes()))
    # the cells between the extremes travel: they grow with the spread, never past the sketch
    assert sizes == sorted(sizes) and max(sizes) - base <= 64 * 1024, sizes


def test_accuracy_option() -> None:
    data = np.arange(1.0, 10_001.0)
    m = ms.Metrics({"x": ms.Spec(("p50", "p90"), accuracy=0.05)})
    m.record("x", data)
    got = m.compute()
    assert within_one_percent_of_rank(got["x/p50"], 0.5, data, accuracy=0.05)
    assert within_one_percent_of_rank(got["x/p90"], 0.9, data, accuracy=0.05)
    fine = ms.Metrics({"x": ms.Spec(("p50", "p90"))})
    fine.record("x", data)
    assert len(m.to_bytes()) < len(fine.to_bytes())
    with pytest.raises(ValueError):
        ms.Spec("p50", accuracy=1e-4)  # would not fit in 64 KiB


def test_different_accuracy_is_a_spec_conflict() -> None:
    a = ms.Metrics({"x": ms.Spec("p50")})
    b = ms.Metrics({"x": ms.Spec("p50", accuracy=0.02)})
    a.record("x", 1.0)
    b.record("x", 2.0)
    with pytest.raises(ms.SpecMismatchError):
        a.merge(b)


def test_quantiles_on_the_meta_device() -> None:
    from metricsync.testing import meta_records

    m = ms.Metrics({"x": ms.Spec(("p50", "p99"))})
    with meta_records():  # meta tensors stand in for an accelerator's
        x = torch.randn(100, device="meta")
        m.record("x", x, mask=torch.ones(100, dtype=torch.bool, device="meta"))
    assert m.names == ["x"]


def test_quantile_merge_equals_single_process() -> None:
    rng = np.random.default_rng(11)
    data = rng.exponential(10.0, size=10_000)
    whole = ms.Metrics({"x": ms.Spec(QS)})
    whole.record("x", data)
    parts = [ms.Metrics({"x": ms.Spec(QS)}) for _ in range(5)]
    for i, chunk in enumerate(np.array_split(data, 50)):
        parts[i % 5].record("x", torch.tensor(chunk) if i % 2 else chunk)
    assert ms.merge(parts).compute() == pytest.approx(whole.compute(), rel=1e-12)
    assert ms.merge(parts[::-1]).compute() == pytest.approx(whole.compute(), rel=1e-12)


def test_reset_clears_the_sketch() -> None:
    m = ms.Metrics({"x": ms.Spec(("p50", "count"))})
    m.record("x", np.full(100, 1000.0))
    m.reset()
    m.record("x", [1.0, 2.0, 3.0])
    got = m.compute()
    assert got["x/count"] == 3.0 and got["x/p50"] == pytest.approx(2.0, rel=0.01)
