"""Quantiles of samples holding +-inf: the limit of the interpolation, on every path.

Between -inf and a larger sample the linear quantile is -inf, between a sample and
+inf it is +inf, between equal samples that sample; NaN only between -inf and +inf
(docs/definitions.md). Before: ``lo + f (hi - lo)`` met ``inf - inf``, so p90 of
``[1, inf, inf]`` was NaN while p50 was inf (issue 42). numpy gives NaN in some of
these cases (``np.quantile([1, 2, inf], 0.5)``): where we differ is written there.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _compare import same

import metricsync as ms
from metricsync._record._fold import reduce_record
from metricsync._state import _algebra as al
from metricsync._state._sketch import ingest_numpy, sketch_layout

torch = pytest.importorskip("torch")  # the numpy-only test matrix has no torch

INF = math.inf
STATS = ("p0", "p10", "p50", "p90", "p100")

#: samples -> the linear quantiles STATS, worked out by hand from the definition
LINEAR = {
    (1.0, INF, INF): (1.0, INF, INF, INF, INF),  # before: p90 NaN
    (-INF, -INF, 1.0): (-INF, -INF, -INF, -INF, 1.0),  # before: p10 and p90 NaN
    (-INF, 1.0, 2.0, INF): (-INF, -INF, 1.5, INF, INF),  # h = 0.3, 1.5, 2.7
    (1.0, 2.0, INF): (1.0, 1.2, 2.0, INF, INF),  # numpy: p50 NaN (2 + 0 * inf)
    (-INF, INF): (-INF, math.nan, math.nan, math.nan, INF),  # -inf to +inf: no limit
    (-INF, -INF, INF, INF): (-INF, -INF, math.nan, INF, INF),
    (INF, INF): (INF, INF, INF, INF, INF),
    (-INF,): (-INF, -INF, -INF, -INF, -INF),
}

#: samples -> the nearest-rank (inverted_cdf) quantiles STATS: a sample, never NaN
INVERTED = {
    (1.0, INF, INF): (1.0, 1.0, INF, INF, INF),
    (-INF, -INF, 1.0): (-INF, -INF, -INF, 1.0, 1.0),
    (-INF, INF): (-INF, -INF, -INF, INF, INF),
    (-INF, 1.0, 2.0, INF): (-INF, -INF, 1.0, INF, INF),
}


def _record(how: str, values: tuple[float, ...], method: str) -> ms.Metrics:
    m = ms.Metrics({"x": ms.Spec(STATS, quantile_method=method)})
    x = np.array(values)
    if how == "numpy":
        m.record("x", x)
    elif how == "floats":
        for v in values:
            m.record("x", v)
    elif how == "torch":
        m.record("x", torch.tensor(x, dtype=torch.float32))
    elif how == "weighted":  # equal weights on any scale: the same quantiles
        m.record("x", x, weight=np.full(len(x), 0.3))
    elif how == "masked":  # masked-out samples are no samples, whatever they hold
        m.record("x", np.r_[x, -INF, INF], mask=np.r_[np.ones(len(x)), 0, 0].astype(bool))
    elif how == "large":  # reduced on arrival: one record past the buffering limit
        pad = np.zeros(300)
        m.record("x", np.r_[x, pad], weight=np.r_[np.full(len(x), 1e-4), pad])
    return m


@pytest.mark.parametrize("how", ["numpy", "floats", "torch", "weighted", "masked", "large"])
@pytest.mark.parametrize(
    ("method", "values", "want"),
    [("linear", v, w) for v, w in LINEAR.items()]
    + [("inverted_cdf", v, w) for v, w in INVERTED.items()],
)
def test_quantiles_next_to_an_infinity_are_its_limit(
    how: str, method: str, values: tuple[float, ...], want: tuple[float, ...]
) -> None:
    got = _record(how, values, method).compute()
    for stat, expected in zip(STATS, want):
        assert same(got[f"x/{stat}"], expected, rel=0.01 * (1 + 1e-9)), (
            stat,
            got[f"x/{stat}"],
            expected,
        )


@pytest.mark.parametrize("method", ["linear", "inverted_cdf"])
@pytest.mark.parametrize("values", sorted(LINEAR, key=repr))
def test_infinities_merge_decode_and_copy_to_the_same_quantiles(
    method: str, values: tuple[float, ...]
) -> None:
    """Split over parts (one sample each, and all in one), merged in either order,
    through the binary format: the sketch holds its infinities consistently."""
    whole = _record("numpy", values, method)
    parts = []
    for v in values:
        part = ms.Metrics({"x": ms.Spec(STATS, quantile_method=method)})
        part.record("x", torch.tensor([v], dtype=torch.float64))
        parts.append(part)
    want = whole.compute()
    results = [
        ms.merge(parts).compute(),
        ms.merge(parts[::-1]).compute(),
        ms.Metrics.from_bytes(ms.merge(parts).to_bytes()).compute(),
        whole.copy().merge(ms.Metrics()).compute(),
    ]
    for got in results:
        assert got.keys() == want.keys()
        for key in want:
            assert got[key] == want[key] or (math.isnan(got[key]) and math.isnan(want[key]))


def test_the_device_fold_places_infinities_and_counts_as_the_host_fold() -> None:
    """The device fold (here on the CPU) puts +-inf in the same sketch cells as the host,
    and writes the same sample count and squared-weight sum."""
    from metricsync._record._device import DeviceState

    spec = ms.Spec(("var", "p50"), ddof=1)
    x = np.array([-INF, 1.0, 2.0, INF, 3.0, 0.0])
    w = np.array([0.5, 0.0, 2.0, 0.25, 1.0, 3.0])
    state = DeviceState(torch.device("cpu"))
    state.add(0, spec, torch.tensor(x), torch.tensor(w), None, now=1.0)
    _, cols, cells, bad = state.snapshot()
    assert not bad.any()
    row, _ = reduce_record(x, w, spec, 1.0)
    assert cols[[al.W, al.N, al.W2], 0].tolist() == row[[al.W, al.N, al.W2]].tolist()
    assert cols[al.N, 0] == 5.0 and cols[al.W2, 0] == (w * w).sum()
    np.testing.assert_array_equal(cells[0], ingest_numpy(sketch_layout(), x, w))


def test_numpy_meets_inf_minus_inf_where_the_limit_is_defined() -> None:
    """The cases docs/definitions.md lists where numpy (2.x) answers NaN and we the limit."""
    with np.errstate(invalid="ignore"):
        assert math.isnan(np.quantile([1.0, INF, INF], 0.9))
        assert math.isnan(np.quantile([1.0, 2.0, INF], 0.5))
        assert math.isnan(np.quantile([-INF, -INF, 1.0], 0.1))
    got = _record("numpy", (1.0, 2.0, INF), "linear").compute()
    assert got["x/p50"] == pytest.approx(2.0, rel=0.01)
