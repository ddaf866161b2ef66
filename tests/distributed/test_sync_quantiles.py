"""Quantiles after a multi-rank gloo sync, against numpy over the union of raw samples."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _compare import same

pytest.importorskip("torch")

import metricsync as ms
from metricsync.testing import count_collectives, run_distributed

pytestmark = pytest.mark.distributed

QS = {"p0": 0.0, "p1": 0.01, "p50": 0.5, "p90": 0.9, "p99": 0.99, "p99.9": 0.999, "p100": 1.0}
SPEC = ms.Spec(tuple(QS))


def _samples(name: str, rank: int) -> np.ndarray:
    rng = np.random.default_rng([7, rank, len(name)])
    n = 3000 + 2000 * rank
    if name == "lognormal":
        return rng.lognormal(0.0, 2.0, n)
    if name == "uniform":
        return rng.uniform(-5.0, 10.0, n)
    if name == "exponential":
        return rng.exponential(3.0, n)
    mixed = rng.normal(0.0, 100.0, n)  # mixed signs with exact zeros
    mixed[rng.random(n) < 0.1] = 0.0
    return mixed


NAMES = ("lognormal", "uniform", "exponential", "mixed")


def _rank(rank: int, world: int) -> dict[str, float]:
    import torch

    m = ms.Metrics({name: SPEC for name in NAMES})
    for name in NAMES:
        values = _samples(name, rank)
        half = len(values) // 2
        m.record(name, values[:half])  # numpy on the host
        m.record(name, torch.as_tensor(values[half:]))  # a tensor on its device
    return m.sync(timeout=60).compute()


def _within(result: float, ordered: np.ndarray, q: float, accuracy: float = 0.01) -> bool:
    lo = ordered[int(np.floor(q * (len(ordered) - 1)))]
    hi = ordered[int(np.ceil(q * (len(ordered) - 1)))]
    slack = accuracy * max(abs(lo), abs(hi)) + 1e-12
    return min(lo, hi) - slack <= result <= max(lo, hi) + slack


@pytest.mark.usefixtures("sync_path")
@pytest.mark.parametrize("world", [3])
def test_quantiles_after_sync_are_within_accuracy(world: int) -> None:
    results = run_distributed(_rank, world)
    assert all(r == results[0] for r in results)  # identical on every rank
    got = results[0]
    for name in NAMES:
        ordered = np.sort(np.concatenate([_samples(name, r) for r in range(world)]))
        for stat, q in QS.items():
            value = got[f"{name}/{stat}"]
            if q in (0.0, 1.0):
                assert value == (ordered[0] if q == 0.0 else ordered[-1]), (name, stat)
            else:
                assert _within(value, ordered, q), (name, stat, value)


NAN_STEPS = (  # each sync's samples on ranks 0 and 1
    [[math.nan, 1.0, 2.0], [3.0]],  # rank 0 holds a NaN; the cells lie apart
    [[5.0, 700.0], [0.5, math.nan]],  # a NaN on rank 1, a range the window lacks
    [[2.0], [4.0]],  # no NaN: the window agreed without one still serves
)


def _nan_rank(rank: int, world: int) -> list[tuple[list[float], list[float], float]]:
    """Three syncs of a quantile metric some rank holds a NaN in (``nan="propagate"``):
    each synced histogram, as bucket counts, edges and total, on this rank."""
    out = []
    for step, held in enumerate(NAN_STEPS):
        m = ms.Metrics({"q": ms.Spec(("p50", "max"))})
        m.record("q", held[rank])
        with count_collectives() as seen:
            h = m.sync().histograms().get("q")
        if step == 2:  # a NaN's window was for its sync only: not the whole sketch again
            assert seen.bytes < 4_000, seen.bytes
        out.append(
            (
                [] if h is None else h.counts.tolist(),
                [] if h is None else h.edges.tolist(),
                0.0 if h is None else h.total,
            )
        )
    return out


@pytest.mark.usefixtures("sync_path")
def test_a_nan_on_one_rank_leaves_the_synced_histogram_whole() -> None:
    """A NaN under ``nan="propagate"`` makes a metric's min and max NaN, and the cells a
    sync sends are chosen from them: the finite samples must still all arrive, as in a
    merge of the same objects (the NaN itself has no bucket)."""
    got = run_distributed(_nan_rank, 2, timeout=120)
    assert got[0] == got[1]
    wants = []
    for held in NAN_STEPS:
        parts = []
        for values in held:
            part = ms.Metrics({"q": ms.Spec(("p50", "max"))})
            part.record("q", values)
            parts.append(part)
        h = ms.merge(parts).histograms()["q"]
        wants.append((h.counts.tolist(), h.edges.tolist(), h.total))
    for (counts, edges, total), (want_counts, want_edges, want_total) in zip(got[0], wants):
        assert total == want_total and counts == want_counts
        assert np.allclose(edges, want_edges, rtol=0, atol=0)


def _many_held(rank: int, j: int) -> list[float]:
    if j % 3:
        return [float(j + 1), 50.0 * (rank + 1)]
    return [[math.nan, 1.0 + j, 2.0], [3.0 * (j + 1), 900.0]][rank]


def _many_nan_rank(rank: int, world: int) -> dict[str, tuple[list[float], float]]:
    m = ms.Metrics({"q*": ms.Spec("p50")})
    for j in range(12):
        m.record(f"q{j:02d}", _many_held(rank, j))
    return {k: (h.counts.tolist(), h.total) for k, h in m.sync().histograms().items()}


@pytest.mark.usefixtures("sync_path")
def test_nans_among_many_quantile_metrics_leave_every_synced_histogram_whole() -> None:
    """The same with 12 quantile metrics (more than 8: the windows are checked as arrays),
    a NaN in every third on rank 0."""
    got = run_distributed(_many_nan_rank, 2, timeout=120)
    parts = []
    for rank in range(2):
        part = ms.Metrics({"q*": ms.Spec("p50")})
        for j in range(12):
            part.record(f"q{j:02d}", _many_held(rank, j))
        parts.append(part)
    want = {k: (h.counts.tolist(), h.total) for k, h in ms.merge(parts).histograms().items()}
    assert len(want) == 12 and got[0] == got[1] == want


INF_SPECS = {
    "lin": ms.Spec(("p0", "p10", "p50", "p90", "p100", "var"), ddof=1),
    "inv": ms.Spec(("p10", "p50", "p90"), quantile_method="inverted_cdf"),
}
#: each rank's samples and weights: +-inf on either rank, weights on different scales
INF_HELD = (
    ([-math.inf, 1.0, 2.0], [0.5, 0.5, 0.5]),
    ([3.0, math.inf, math.inf], [0.5, 0.5, 0.5]),
)


def _inf_parts(scale: float) -> list[ms.Metrics]:
    parts = []
    for x, w in INF_HELD:
        m = ms.Metrics(INF_SPECS)
        for name in INF_SPECS:
            m.record(name, np.array(x), weight=np.array(w) * scale)
        parts.append(m)
    return parts


def _inf_rank(rank: int, world: int) -> list[dict[str, float]]:
    return [_inf_parts(scale)[rank].sync(timeout=60).compute() for scale in INF_SCALES]


INF_SCALES = (1e-6, 1e6)


def test_infinities_and_weight_scales_sync_as_they_merge() -> None:
    """Samples [-inf, 1, 2 | 3, inf, inf] on two ranks, weights 0.5 times 1e-6 or 1e6:
    the synced quantiles are the limits of the definition (linear p10 -inf, p90 +inf),
    the same as a merge, and as with unit weights (issue 42: before, p90 was NaN and the
    linear quantiles and ``ddof=1`` depended on the scale)."""
    got = run_distributed(_inf_rank, 2, timeout=120)
    unit = ms.merge(_inf_parts(1.0 / 0.5)).compute()
    for i, scale in enumerate(INF_SCALES):
        merged = ms.merge(_inf_parts(scale)).compute()
        assert same(got[0][i], merged) and same(got[1][i], merged), scale
        assert merged == pytest.approx(unit, rel=1e-12, nan_ok=True), scale
    # six samples: h = 0.5, 2.5, 4.5 between -inf, 1, 2, 3, inf, inf
    assert unit["lin/p0"] == -math.inf and unit["lin/p100"] == math.inf
    assert unit["lin/p10"] == -math.inf and unit["lin/p90"] == math.inf
    assert unit["lin/p50"] == pytest.approx(2.5, rel=0.01)
    assert math.isnan(unit["lin/var"])  # inf - inf in the mean
    assert [unit[f"inv/{s}"] for s in ("p10", "p90")] == [-math.inf, math.inf]
    assert unit["inv/p50"] == pytest.approx(2.0, rel=0.01)
