"""Histograms of quantile metrics, read from their merged sketches.

A merged sketch counts every rank's samples in log-spaced buckets, so no sample is gathered to
draw one; :func:`sketch_histogram` trims it to the occupied range, clipped to the exact
extremes. Non-finite samples are left out.

>>> import numpy as np
>>> from metricsync._state._sketch import ingest_numpy, sketch_layout
>>> layout = sketch_layout(0.01)
>>> cells = ingest_numpy(layout, np.array([1.0, 2.0, 2.0, 4.0]))
>>> h = sketch_histogram(layout, cells, 1.0, 4.0)
>>> h.total, float(h.edges[0]), float(h.edges[-1]), len(h.edges) == len(h.counts) + 1
(4.0, 1.0, 4.0, True)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._sketch import SketchLayout, sketch_layout
from ._table import StateTable

__all__ = ["Histogram", "sketch_histogram", "table_histograms"]


@dataclass(frozen=True)
class Histogram:
    """A histogram of one metric's samples: ``len(edges) == len(counts) + 1``.

    Occupied sketch buckets keep their own edges; a run of empty buckets
    between them becomes one empty bucket, so a histogram has at most twice as
    many buckets as occupied cells. ``total``, ``sum`` and ``sum_squares``
    describe the finite samples, the sums estimated from the bucket midpoints
    (within the sketch's relative accuracy).
    """

    edges: np.ndarray
    counts: np.ndarray
    min: float
    max: float
    total: float
    sum: float
    sum_squares: float


def _cell_edges(layout: SketchLayout) -> np.ndarray:
    """Lower and upper value bound of every finite cell, in cell order (n_cells, 2)."""
    idx = np.arange(layout.min_index, layout.max_index + 1, dtype=np.float64)
    upper = np.exp(idx * layout.ln_gamma)  # bucket i holds (gamma**(i-1), gamma**i]
    lower = np.exp((idx - 1) * layout.ln_gamma)  # bit-equal to the previous bucket's upper
    edges = np.full((layout.n_cells, 2), np.nan)
    zero = layout.zero_cell
    n = layout.n_buckets
    edges[zero + 1 : zero + 1 + n, 0] = lower
    edges[zero + 1 : zero + 1 + n, 1] = upper
    edges[1 : 1 + n, 0] = -upper[::-1]
    edges[1 : 1 + n, 1] = -lower[::-1]
    edges[zero] = (-lower[0], lower[0])  # exact zeros: a bucket narrower than any other
    return edges


def sketch_histogram(
    layout: SketchLayout, cells: np.ndarray, vmin: float, vmax: float
) -> Histogram | None:
    """The histogram of a sketch's finite samples, or None when it holds none."""
    finite = np.zeros(layout.n_cells, dtype=bool)
    finite[1 : layout.pos_inf_cell] = True
    counts = np.where(finite, cells, 0.0)
    occupied = np.flatnonzero(counts > 0)
    if occupied.size == 0:
        return None
    bounds = _cell_edges(layout)[occupied]
    gap = bounds[1:, 0] > bounds[:-1, 1]  # empty buckets between two occupied ones
    n = len(occupied) + int(gap.sum())
    edges = np.empty(n + 1)
    kept = np.zeros(n)
    at = np.arange(len(occupied)) + np.concatenate([[0], np.cumsum(gap)])  # position of each
    edges[at] = bounds[:, 0]
    edges[at + 1] = bounds[:, 1]
    kept[at] = counts[occupied]
    if np.isfinite(vmin):
        edges[0] = min(max(edges[0], vmin), edges[1])
    if np.isfinite(vmax):
        edges[-1] = max(min(edges[-1], vmax), edges[-2])
    with np.errstate(over="ignore", invalid="ignore"):  # counts or values beyond float64
        mids = 0.5 * (edges[:-1] + edges[1:])
        return Histogram(
            edges=edges,
            counts=kept,
            min=float(vmin),
            max=float(vmax),
            total=float(kept.sum()),
            sum=float((kept * mids).sum()),
            sum_squares=float((kept * mids * mids).sum()),
        )


def table_histograms(table: StateTable) -> dict[str, Histogram]:
    """The histogram of every sketch of ``table`` holding finite samples, by metric name."""
    out = {}
    for slot, cells in table.sketches.items():
        layout = sketch_layout(table.specs[slot].accuracy)
        hist = sketch_histogram(layout, cells, *table.extremes(slot))
        if hist is not None:
            out[table.names[slot]] = hist
    return out
