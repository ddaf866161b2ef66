"""Histograms read from merged sketches, against numpy's binning of the raw samples."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import metricsync as ms


def _bucket_of(edges: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Index j with edges[j] < x <= edges[j+1]; the first bucket also holds edges[0]."""
    return np.maximum(np.searchsorted(edges, x, side="left") - 1, 0)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 400),
    parts=st.integers(1, 4),
    signed=st.booleans(),
)
def test_merged_histogram_bins_every_sample_where_numpy_does(
    seed: int, n: int, parts: int, signed: bool
) -> None:
    rng = np.random.default_rng(seed)
    samples = rng.lognormal(3.0, 1.5, size=n)
    if signed:
        samples *= rng.choice([-1.0, 1.0], size=n)
    pieces = np.array_split(samples, parts)
    ranks = []
    for piece in pieces:
        m = ms.Metrics({"len": ms.Spec(("mean", "p50"))})
        m.record("len", piece)
        ranks.append(m)
    h = ms.merge(ranks).histograms()["len"]
    assert len(h.edges) == len(h.counts) + 1
    assert np.all(np.diff(h.edges) >= 0)
    assert h.edges[0] == samples.min() and h.edges[-1] == samples.max()
    expected = np.bincount(_bucket_of(h.edges, samples), minlength=len(h.counts))
    np.testing.assert_array_equal(h.counts, expected)
    assert h.total == n
    assert abs(h.sum - samples.sum()) <= 0.02 * np.abs(samples).sum()


def test_only_quantile_metrics_with_finite_samples_have_histograms() -> None:
    m = ms.Metrics({"q": ms.Spec("p90"), "inf": ms.Spec("p50"), "plain": ms.Spec("max")})
    m.record("q", [0.0, 1.0, 1.0])
    m.record("inf", float("inf"))
    m.record("plain", 3.0)
    hists = m.histograms()
    assert set(hists) == {"q"}
    assert hists["q"].total == 3.0
    assert hists["q"].counts.max() == 2.0  # both ones share a bucket; zero has its own
