"""The vectorized fold (``_fold``) and statistics (``_stats``), each against numpy over the
raw samples: behaviours a mutation sweep of the two modules found no test checking."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _compare import assert_same

import metricsync as ms
from metricsync._record._fold import Batch, fold
from metricsync._state import _algebra as al
from metricsync._state._stats import Plan, compute

STATS = ms.Spec(("mean", "sum", "count", "min", "max", "last", "var", "std"), ddof=0)


def _table(slots: np.ndarray, cols: np.ndarray, n: int) -> np.ndarray:
    """A table of ``n`` slots holding the fold's states (one per distinct slot)."""
    assert len(set(slots.tolist())) == len(slots)
    table = al.identity(n)
    table[:, slots] = cols
    return table


def _computed(batch: Batch | None, names: list[str], specs: list[ms.Spec]) -> dict[str, float]:
    slots, cols, _ = fold(batch, specs)
    return compute(Plan(names, specs), specs, _table(slots, cols, len(specs)), {}, {})


def _oracle(samples: dict[str, tuple[list[float], list[float]]]) -> dict[str, float]:
    """Every statistic of STATS over each name's (values, weights), in time order."""
    out: dict[str, float] = {}
    for name, (values, weights) in samples.items():
        x, w = np.asarray(values, dtype=np.float64), np.asarray(weights, dtype=np.float64)
        x, w = x[w > 0], w[w > 0]
        if not len(x):
            continue
        mean = float(np.average(x, weights=w))
        var = float(np.average((x - mean) ** 2, weights=w))
        out |= {
            f"{name}/mean": mean,
            f"{name}/sum": float(np.dot(w, x)),
            f"{name}/count": float(w.sum()),
            f"{name}/min": float(x.min()),
            f"{name}/max": float(x.max()),
            f"{name}/last": float(x[-1]),
            f"{name}/var": var,
            f"{name}/std": math.sqrt(var),
        }
    return out


# ------------------------------------------------------------------ fold: empty runs


@pytest.mark.parametrize("weighted", [False, True])
def test_empty_runs_in_a_batch_fold_as_if_they_were_not_there(weighted: bool) -> None:
    """A run of no samples (first, in the middle, last) neither adds to its metric nor
    shifts the samples of the runs after it; its metric's other runs fold as usual."""
    rng = np.random.default_rng(7)
    # (slot, length, stamp) per run; slot 2 has an empty run only
    runs = [
        (0, 0, 1.0),
        (0, 3, 2.0),
        (1, 2, 3.0),
        (0, 0, 9.0),
        (2, 0, 4.0),
        (1, 4, 5.0),
        (0, 2, 6.0),
        (1, 0, 10.0),
    ]
    slot = np.array([r[0] for r in runs], dtype=np.int64)
    length = np.array([r[1] for r in runs], dtype=np.int64)
    stamp = np.array([r[2] for r in runs])
    start = np.r_[0, np.cumsum(length)[:-1]].astype(np.int64)
    values = rng.normal(size=int(length.sum()))
    weights = rng.uniform(0.5, 2.0, size=len(values)) if weighted else None
    names, specs = ["a", "b", "c"], [STATS] * 3
    samples: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in names}
    for s, lo, n in zip(slot.tolist(), start.tolist(), length.tolist()):  # stamps rise per slot
        samples[names[s]][0].extend(values[lo : lo + n])
        samples[names[s]][1].extend(np.ones(n) if weights is None else weights[lo : lo + n])
    batch = Batch(values, weights, slot, start, length, stamp)
    assert_same(_computed(batch, names, specs), _oracle(samples), rel=1e-12, abs=1e-12)


def test_a_batch_of_empty_runs_only_folds_to_no_samples() -> None:
    batch = Batch(
        np.zeros(0),
        None,
        np.array([0, 1]),
        np.array([0, 0]),
        np.array([0, 0]),
        np.array([1.0, 2.0]),
    )
    assert _computed(batch, ["a", "b"], [STATS, STATS]) == {}


def test_a_fold_of_no_batch_gives_no_states() -> None:
    slots, cols, cells = fold(None, [STATS])
    assert len(slots) == 0 and cols.shape == (al.NCOL_ALL, 0) and cells == []


# ------------------------------------------------------------ no kept samples: identity


@pytest.mark.parametrize("records", [1, 2])  # one state, or two merged
@pytest.mark.parametrize("n", [3, 5000])  # a buffered run, and a record reduced on arrival
def test_samples_that_all_weigh_zero_leave_the_state_of_no_samples(
    n: int, records: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Zero-weight samples are not samples: the metric's state, byte for byte, is the one
    of a metric that recorded only an empty array, whichever path the record takes; it
    takes no value nor time from a metric folded beside it."""
    monkeypatch.setattr(al, "now_us", lambda: 5.0)  # the same stamps in both
    spec = ms.Spec(("last", "mean", "max", "min", "std"))
    specs = {"other": ms.Spec(("last", "sum")), "lr": spec}
    empty, zero = ms.Metrics(specs), ms.Metrics(specs)
    for m in (empty, zero):
        m.record("other", 7.0)  # the first slot, folded beside "lr"
    empty.record("lr", np.zeros(0))
    for _ in range(records):
        zero.record("lr", np.arange(1.0, n + 1.0), weight=np.zeros(n))
    assert zero.compute() == empty.compute() == {"other/last": 7.0, "other/sum": 7.0}
    assert zero.to_bytes() == empty.to_bytes()


# ------------------------------------------------ a state depends on its own records


def test_a_merged_state_carries_nothing_its_spec_does_not_ask_for() -> None:
    """A mean metric buffered beside max/min/std metrics (whose columns a fold computes for
    every run) holds the same state, byte for byte, whether its samples came as one run or
    as several runs merged: the columns it does not carry are the identity either way."""
    specs = {"x": ms.Spec("mean"), "y": ms.Spec(("max", "min", "std"))}
    parts = [np.array([1.0, 5.0, 2.0]), np.array([7.0, 3.0]), np.array([4.0])]
    merged, single = ms.Metrics(specs), ms.Metrics(specs)
    for part in parts:  # weighted arrays are buffered as a run each, merged by slot
        merged.record("x", part, weight=np.ones(len(part)))
    single.record("x", np.concatenate(parts), weight=np.ones(6))  # one run
    for m in (merged, single):
        m.record("y", np.array([2.0, 8.0]))
    assert (
        merged.compute()
        == single.compute()
        == {"x": 22.0 / 6, "y/max": 8.0, "y/min": 2.0, "y/std": 3.0}
    )
    assert merged.to_bytes() == single.to_bytes()


# ------------------------------------------------------------------ var and std


@pytest.mark.parametrize(
    ("values", "weights", "ddof"),
    [
        ([0.1, 0.2, 0.4], [1.0, 1.0, 1.0], 0),  # a second moment below 1
        ([0.1, 0.2, 0.4], [1.0, 1.0, 1.0], 1),
        ([1.0, 3.0], [0.25, 0.25], 0),  # weights summing to less than 1
        ([1.0, 3.0, 6.0], [0.5, 0.5, 0.5], 1),  # weight minus ddof below 1
        ([1.0, 3.0, 6.0, 2.0], [0.125, 0.25, 0.5, 0.125], 0),
        ([1e-3, 2e-3], [1.0, 1.0], 1),
    ],
)
@pytest.mark.parametrize("how", ["one record", "a record per sample", "reduced on arrival"])
def test_var_and_std_of_small_moments_and_weights_match_numpy(
    values: list[float], weights: list[float], ddof: int, how: str
) -> None:
    """Small second moments and total weights at or below 1 (where a rule comparing with
    1 rather than 0 would go wrong), one record, several merged, or one large record."""
    x, w = np.array(values), np.array(weights)
    if how == "reduced on arrival":  # repeated past the buffering limit, weights scaled down
        x, w = np.tile(x, 400), np.tile(w, 400) / 400
    # reliability weights: numpy's covariance with aweights (W - ddof * sum(w^2) / W)
    var = float(np.cov(x, aweights=w, ddof=ddof))
    m = ms.Metrics({"x": ms.Spec(("var", "std"), ddof=ddof)})
    if how == "a record per sample":
        for xi, wi in zip(x, w):
            m.record("x", np.array([xi]), weight=np.array([wi]))  # a run each, merged
    else:
        m.record("x", x, weight=w)
    got = m.compute()
    assert got["x/var"] == pytest.approx(var, rel=1e-12)
    assert got["x/std"] == pytest.approx(math.sqrt(var), rel=1e-12)


# ------------------------------------------------------------ nan="ignore" drop counts


@pytest.mark.parametrize("n", [5, 1000])  # buffered, and reduced on arrival
def test_weighted_samples_drop_their_nan_and_keep_their_weights(n: int) -> None:
    rng = np.random.default_rng(3)
    x, w = rng.normal(size=n), rng.uniform(0.5, 2.0, size=n)
    x[::4], x[1::7] = np.nan, np.inf
    finite = np.isfinite(x)
    m = ms.Metrics({"x": ms.Spec(("mean", "sum", "count", "max", "std"), nan="ignore")})
    m.record("x", x, weight=w)
    xs, ws = x[finite], w[finite]
    mean = np.average(xs, weights=ws)
    want = {
        "x/mean": mean,
        "x/sum": float(np.dot(ws, xs)),
        "x/count": float(ws.sum()),
        "x/max": float(xs.max()),
        "x/std": math.sqrt(np.average((xs - mean) ** 2, weights=ws)),
        "x/nan_dropped": float(n - finite.sum()),
    }
    assert_same(m.compute(), want, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("dropped", [1, 2])
def test_a_metric_that_dropped_only_nan_reports_just_its_drop_count(dropped: int) -> None:
    """No sample kept: no statistic, but the count of what was dropped, even a single one."""
    m = ms.Metrics({"x": ms.Spec(("mean", "max"), nan="ignore"), "y": ms.Spec("sum")})
    m.record("x", [math.nan] * dropped)
    m.record("y", 1.0)
    assert m.compute() == {"x/nan_dropped": float(dropped), "y": 1.0}
