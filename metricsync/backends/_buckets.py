"""Fitting a :class:`~metricsync.Histogram` into a backend's bucket limit, and naming it.

A quantile sketch at 1% relative accuracy has about 230 buckets per decade,
so a metric spanning several decades has more buckets than a dashboard draws
(W&B refuses more than 512). :func:`bounded_buckets` merges runs of adjacent
buckets: every sample stays counted, in a wider bucket whose edges are edges
of the original histogram.

>>> import numpy as np
>>> edges, counts = bounded_buckets(np.arange(6.0), np.array([1.0, 2.0, 3.0, 4.0, 5.0]), 2)
>>> edges.tolist(), counts.tolist()
([0.0, 3.0, 5.0], [6.0, 9.0])
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, TypeVar

import numpy as np

if TYPE_CHECKING:
    from .._state._histogram import Histogram

__all__ = ["MAX_BUCKETS", "bounded_buckets", "histogram_key", "histogram_rows"]

T = TypeVar("T")

MAX_BUCKETS = 512
"""Bucket limit used by the built-in backends (W&B's own maximum)."""


def histogram_key(name: str) -> str:
    """Where the built-in backends draw the histogram of metric ``name``.

    A suffix keeps it apart from the metric's scalars, which may be called
    ``name`` itself (a spec with one statistic).

    >>> histogram_key("response_length")
    'response_length/histogram'
    """
    return f"{name}/histogram"


def bounded_buckets(
    edges: np.ndarray, counts: np.ndarray, limit: int = MAX_BUCKETS
) -> tuple[np.ndarray, np.ndarray]:
    """``(edges, counts)`` with at most ``limit`` buckets, adjacent buckets merged evenly.

    >>> import numpy as np
    >>> e, c = bounded_buckets(np.linspace(0, 1, 1001), np.ones(1000), 300)
    >>> len(c), float(c.sum()), float(e[0]), float(e[-1])
    (250, 1000.0, 0.0, 1.0)
    """
    if limit < 1:
        raise ValueError(f"expected a bucket limit of at least 1, got {limit}")
    edges = np.asarray(edges, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    n = len(counts)
    if len(edges) != n + 1:
        raise ValueError(f"expected {n + 1} edges for {n} buckets, got {len(edges)}")
    group = -(-n // limit)
    if group <= 1:
        return edges, counts
    starts = np.arange(0, n, group)
    return np.append(edges[starts], edges[-1]), np.add.reduceat(counts, starts)


def histogram_rows(
    histograms: Mapping[str, Histogram],
    make: Callable[[Histogram, np.ndarray, np.ndarray], T],
    limit: int = MAX_BUCKETS,
) -> Iterator[tuple[str, T]]:
    """``(histogram_key(name), make(hist, edges, counts))`` per histogram, buckets bounded.

    >>> import metricsync as ms
    >>> m = ms.Metrics({"len": ms.Spec("p50")})
    >>> m.record("len", [16, 32, 64])
    >>> [(k, len(c)) for k, c in histogram_rows(m.histograms(), lambda h, e, c: c, 2)]
    [('len/histogram', 2)]
    """
    for name, hist in histograms.items():
        edges, counts = bounded_buckets(hist.edges, hist.counts, limit)
        yield histogram_key(name), make(hist, edges, counts)
