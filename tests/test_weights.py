"""Weights count by their proportions: no statistic but ``sum`` and ``count`` depends on
their scale (issue 42).

Before, linear quantiles placed order statistics at ``q (W - 1)`` (1..10 with weights
0.1 gave p10 = p50 = p90 = 1.0) and ``var``/``std`` divided by ``W - ddof`` (weights
[0.5, 0.5] gave NaN with ``ddof=1``, [1, 1] gave 2.0). Now quantiles read weights
relative to their mean and ``ddof`` treats them as reliability weights
(``W - ddof * sum(w^2) / W``, numpy's ``cov(..., aweights=w)``); unweighted and masked
samples keep numpy's default answers.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import metricsync as ms
from metricsync._state import _algebra as al
from metricsync._state import _codec as codec

torch = pytest.importorskip("torch")  # the numpy-only test matrix has no torch

SCALES = (1e-6, 1e-3, 0.1, 1.0, 10.0, 1e3, 1e6)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("method", ["linear", "inverted_cdf"])
def test_equal_weights_on_any_scale_give_numpys_quantiles(scale: float, method: str) -> None:
    x = np.arange(1.0, 11.0)
    m = ms.Metrics({"x": ms.Spec(("p10", "p50", "p90"), quantile_method=method)})
    m.record("x", x, weight=np.full(10, scale))
    got = m.compute()
    for q in (10, 50, 90):  # linear: 1.9, 5.5, 9.1 (before, at weights 0.1: 1.0 each)
        want = np.quantile(x, q / 100, method=method)
        assert got[f"x/p{q}"] == pytest.approx(want, rel=0.01), (q, scale)
    unweighted = ms.Metrics({"x": ms.Spec(("p10", "p50", "p90"), quantile_method=method)})
    unweighted.record("x", x)
    assert got == pytest.approx(unweighted.compute(), rel=1e-12)


@pytest.mark.parametrize("scale", SCALES)
def test_unequal_weights_on_any_scale_give_the_same_quantiles(scale: float) -> None:
    rng = np.random.default_rng(5)
    x, w = rng.lognormal(0.0, 1.0, 500), rng.exponential(1.0, 500)
    spec = ms.Spec(("p1", "p25", "p50", "p75", "p99"))
    base, scaled = ms.Metrics({"x": spec}), ms.Metrics({"x": spec})
    for part in np.array_split(np.arange(500), 7):  # several records, merged
        base.record("x", x[part], weight=w[part])
        scaled.record("x", torch.tensor(x[part]), weight=torch.tensor(w[part] * scale))
    assert scaled.compute() == pytest.approx(base.compute(), rel=1e-9)


@pytest.mark.parametrize("ddof", [0, 1, 2])
@pytest.mark.parametrize("scale", SCALES)
def test_var_and_std_treat_weights_as_reliability_weights(ddof: int, scale: float) -> None:
    rng = np.random.default_rng(ddof)
    x, w = rng.normal(3.0, 2.0, 40), rng.uniform(0.1, 2.0, 40) * scale
    m = ms.Metrics({"x": ms.Spec(("var", "std"), ddof=ddof)})
    for part in np.array_split(np.arange(40), 3):
        m.record("x", x[part], weight=w[part])
    want = float(np.cov(x, aweights=w, ddof=ddof))  # W - ddof * sum(w^2) / W
    got = m.compute()
    assert got["x/var"] == pytest.approx(want, rel=1e-12)
    assert got["x/std"] == pytest.approx(math.sqrt(want), rel=1e-12)


def test_ddof_of_weights_below_one_is_not_nan() -> None:
    """The issue's case: weights [0.5, 0.5] and [1, 1] give one sample variance, 2.0."""
    for w in ([0.5, 0.5], [1.0, 1.0], [1e-9, 1e-9], [7.0, 7.0]):
        m = ms.Metrics({"x": ms.Spec(("var", "std"), ddof=1)})
        m.record("x", np.array([1.0, 3.0]), weight=np.array(w))
        got = m.compute()
        assert got["x/var"] == pytest.approx(2.0, rel=1e-12), w
        assert got["x/std"] == pytest.approx(math.sqrt(2.0), rel=1e-12), w
    one = ms.Metrics({"x": ms.Spec("var", ddof=1)})
    one.record("x", 5.0, weight=0.25)
    assert math.isnan(one.compute()["x"])  # one sample: no sample variance, as numpy


@pytest.mark.parametrize("device", ["numpy", "torch"])
def test_masks_keep_numpys_answers_over_the_kept_samples(device: str) -> None:
    rng = np.random.default_rng(11)
    x = rng.normal(0.0, 10.0, (6, 50))
    keep = rng.random((6, 50)) < 0.4
    spec = ms.Spec(("var", "std", "p10", "p50", "p90"), ddof=1)
    m = ms.Metrics({"x": spec})
    for row, mask in zip(x, keep):
        if device == "torch":
            m.record("x", torch.tensor(row), mask=torch.tensor(mask))
        else:
            m.record("x", row, mask=mask)
    kept = x[keep]
    got = m.compute()
    assert got["x/var"] == pytest.approx(np.var(kept, ddof=1), rel=1e-12)
    assert got["x/std"] == pytest.approx(np.std(kept, ddof=1), rel=1e-12)
    s = np.sort(kept)
    for q in (10, 50, 90):
        h = q / 100 * (len(s) - 1)
        lo, hi, f = s[math.floor(h)], s[math.ceil(h)], h - math.floor(h)
        bound = 0.01 * ((1 - f) * abs(lo) + f * abs(hi))
        assert abs(got[f"x/p{q}"] - np.quantile(kept, q / 100)) <= bound * (1 + 1e-9)


def _as_version_2(blob: bytes) -> bytes:
    """``blob`` (one metric, no sketch beyond its window) written as version 2 wrote it:
    8 state rows per metric, without N and W2."""
    head, body = codec.unframe(blob)
    rows = np.frombuffer(body[: al.NCOL * 8], dtype="<f8")
    old = rows[: al.N].tobytes()  # W .. DROP, the rows before N and W2
    return codec.frame(head, old + body[al.NCOL * 8 :], version=2)


@pytest.mark.parametrize("spec", [ms.Spec(("p10", "p50", "p90")), ms.Spec(("var", "std"), ddof=1)])
def test_blobs_of_version_2_read_as_unit_weights(spec: ms.Spec) -> None:
    """Versions 1 and 2 have no sample count or squared-weight sum: their weights read as
    unit weights, exact for unweighted and masked records."""
    m = ms.Metrics({"x": spec})
    m.record("x", np.arange(1.0, 21.0), mask=np.arange(20) % 3 != 0)
    old = _as_version_2(m.to_bytes())
    assert codec.HEAD.unpack_from(old)[1] == 2
    back = ms.Metrics.from_bytes(old)
    assert back.compute() == m.compute()
    assert back.to_bytes() == m.to_bytes()  # written again as the current version


@pytest.mark.parametrize("scale", [1e-6, 1e6])
def test_the_device_fold_gives_the_host_numbers(
    scale: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPU tensors through the accelerator fold (a hook sends them there): the same sample
    count and squared-weight sum, so the same scale-free quantiles and ``ddof`` variance."""
    rng = np.random.default_rng(3)
    x = np.r_[rng.normal(0.0, 5.0, 300), [math.inf, -math.inf]]
    w = np.r_[rng.uniform(0.0, 2.0, 300), [0.5, 0.25]] * scale
    specs = {
        "q": ms.Spec(("p10", "p50", "p90", "var"), ddof=1),
        "f": ms.Spec(("var", "std"), ddof=1, nan="ignore"),
    }
    host = ms.Metrics(specs)
    for name in specs:
        for part in np.array_split(np.arange(302), 5):
            host.record(name, x[part], weight=w[part])
    monkeypatch.setattr("metricsync._record._convert.HOST_DEVICE_TYPES", frozenset())
    device = ms.Metrics(specs)
    for name in specs:
        for part in np.array_split(np.arange(302), 5):
            device.record(name, torch.tensor(x[part]), weight=torch.tensor(w[part]))
    want = host.compute()
    assert device.compute() == pytest.approx(want, rel=1e-9, nan_ok=True)
    finite = np.isfinite(x)
    cov = float(np.cov(x[finite], aweights=w[finite], ddof=1))
    assert want["f/var"] == pytest.approx(cov, rel=1e-9)
    assert math.isnan(want["q/var"])  # +-inf among the samples (nan="propagate")
