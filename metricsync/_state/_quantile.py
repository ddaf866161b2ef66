"""Quantiles and cell windows from sketch cells (see :mod:`metricsync._state._sketch`).

:func:`query` answers quantiles of many sketches at once (numpy's linear definition or nearest
rank); :func:`window` gives the cells a value range touches.

>>> import numpy as np
>>> from metricsync._state._sketch import ingest_numpy, sketch_layout
>>> layout = sketch_layout(0.01)
>>> cells = ingest_numpy(layout, np.array([1.0, 2.0, 3.0, 4.0, 5.0]))
>>> query(layout, cells[None], [0.5], np.array([1.0]), np.array([5.0]), "linear").round(2)
array([[2.97]])
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ._sketch import SketchLayout

__all__ = ["query", "query_sketches", "window"]


def query(
    layout: SketchLayout,
    cells: np.ndarray,
    qs: Sequence[float],
    vmin: npt.ArrayLike,
    vmax: npt.ArrayLike,
    method: str = "inverted_cdf",
    counts: npt.ArrayLike | None = None,
) -> np.ndarray:
    """Quantiles ``qs`` of ``m`` sketches at once: ``cells`` (m, n_cells) -> (m, len(qs)).

    With total weight ``W``, ``n`` samples of positive weight (``counts``, per row;
    None: ``W``, as for unit weights) and ``x_(j)`` the sample at position ``j``
    when every weight is divided by the mean weight ``W / n`` (the first sample
    whose cumulative weight exceeds ``j * W / n``):

    - ``"inverted_cdf"`` (nearest rank): the first sample whose cumulative
      weight reaches ``q * W``; unweighted, ``x_(ceil(q*n) - 1)``;
    - ``"linear"`` (numpy's default): with ``h = q * (n - 1)``,
      ``x_(floor h) + (h - floor h) * (x_(floor h + 1) - x_(floor h))``, and
      the limit where that meets an infinity: ``-inf`` from ``-inf``, ``+inf``
      towards ``+inf``, NaN only between ``-inf`` and ``+inf``.

    Both depend on the proportions of the weights only, and give numpy's
    answer for equal weights. A cumulative weight within a relative ``2**-36``
    of a position counts as on it (rounding of the weight sums moves no
    answer to the next sample). Each ``x_(j)`` is the representative of its
    bucket, within relative error ``accuracy`` (exact for zeros and
    infinities; unbounded for clamped samples), so a ``linear`` answer between
    two samples of one sign is within ``accuracy`` of numpy's too. Answers are
    clipped into the exact ``[vmin, vmax]`` the caller tracks; ``q = 0`` and
    ``q = 1`` return them exactly. Rows with zero total weight, or any weight on
    NaN, give NaN. A 1-D ``cells`` gives a 1-D result.

    >>> from metricsync._state._sketch import ingest_numpy, sketch_layout
    >>> layout = sketch_layout()
    >>> cells = np.stack([ingest_numpy(layout, np.arange(1.0, 101.0)), np.zeros(layout.n_cells)])
    >>> query(layout, cells, [0.0, 0.5, 0.99, 1.0], np.array([1.0, 0.0]), np.array([100.0, 0.0])).round(2)
    array([[  1. ,  49.9,  98.5, 100. ],
           [  nan,   nan,   nan,   nan]])
    >>> query(layout, cells[0], [0.5], 1.0, 100.0, method="linear").round(2)
    array([50.41])
    """
    if method not in ("inverted_cdf", "linear"):
        raise ValueError(f"method must be 'inverted_cdf' or 'linear', got {method!r}")
    c = np.asarray(cells, dtype=np.float64)
    if c.shape[-1:] != (layout.n_cells,) or c.ndim > 2:
        raise ValueError(f"sketch cells must have shape (m, {layout.n_cells}), got {c.shape}")
    one_row = c.ndim == 1
    c = c.reshape(-1, layout.n_cells)
    q = np.asarray(qs, dtype=np.float64).reshape(-1)
    if q.size and not (q.min() >= 0.0 and q.max() <= 1.0):  # NaN fails both
        raise ValueError(f"quantiles must lie in [0, 1], got {list(qs)}")
    lo, hi = _per_row(vmin, c.shape[0]), _per_row(vmax, c.shape[0])
    n = None if counts is None else _per_row(counts, c.shape[0])
    first_cell, end = 0, layout.nan_cell
    if len(lo) and np.isfinite(lo).all() and np.isfinite(hi).all() and lo.min() <= hi.max():
        # every sample lies in [vmin, vmax]: the cells outside hold nothing
        first_cell, end = window(layout, float(lo.min()), float(hi.max()))
    cum = np.cumsum(c[:, first_cell:end], axis=1)
    if not np.isfinite(cum[:, -1]).all():  # weight sums beyond float64: every cell, rescaled
        first_cell, end = 0, layout.nan_cell
        cum = np.cumsum(_rescaled(c[:, :end]), axis=1)
    reps = layout.representatives
    out = _answer(reps[first_cell:end], cum, q, method, lo, hi, n, layout.edge)
    out[c[:, layout.nan_cell] != 0] = np.nan
    return out[0] if one_row else out


def query_sketches(
    layout: SketchLayout,
    sketches: Sequence[np.ndarray],
    qs: Sequence[float],
    vmin: np.ndarray,
    vmax: np.ndarray,
    method: str,
    counts: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`query` of sketches given one by one, with finite ``vmin <= vmax`` of each
    (they hold samples): only the cells of their common window are copied and summed.

    >>> from metricsync._state._sketch import ingest_numpy, sketch_layout
    >>> layout = sketch_layout()
    >>> a = ingest_numpy(layout, np.arange(1.0, 101.0))
    >>> query_sketches(layout, [a], [0.5], np.array([1.0]), np.array([100.0]), "linear").round(2)
    array([[50.41]])
    """
    first_cell, end = window(layout, float(vmin.min()), float(vmax.max()))
    if len(sketches) <= _FEW:  # one by one: fewer numpy calls than all at once
        cums = [np.cumsum(cells[first_cell:end]) for cells in sketches]
        if all(math.isfinite(cum[-1]) for cum in cums):
            reps = layout.representatives[first_cell:end]
            lo, hi, qs = vmin.tolist(), vmax.tolist(), list(qs)
            ns = [None] * len(sketches) if counts is None else counts.tolist()
            nan = [_NAN] * len(qs)
            edge = layout.edge
            return np.array(
                [
                    nan
                    if cells[layout.nan_cell]
                    else _answer_one(reps, cum, qs, method, a, b, k, edge)
                    for cells, cum, a, b, k in zip(sketches, cums, lo, hi, ns)
                ]
            ).reshape(len(sketches), len(qs))
    cum = np.cumsum(np.stack([cells[first_cell:end] for cells in sketches]), axis=1)
    if not np.isfinite(cum[:, -1]).all():  # weights beyond float64
        return query(layout, np.stack(sketches), qs, vmin, vmax, method, counts)
    reps = layout.representatives[first_cell:end]
    out = _answer(reps, cum, np.asarray(qs), method, vmin, vmax, counts, layout.edge)
    out[[cells[layout.nan_cell] != 0 for cells in sketches]] = np.nan
    return out


_FEW = 8  #: sketches a query answers one by one (fewer numpy calls than all at once)
_NAN = float("nan")
#: a cumulative weight this close (relatively) to a quantile's position counts as on it:
#: the same samples answer whatever the scale of the weights, their sums rounded apart
_TIE = 2.0**-36


def _beyond(x: float, lo: float, hi: float, edge: float) -> float:
    """A sample of the largest bucket of its sign answers with the exact extreme of its
    sign where that lies beyond the bucket: its samples may be clamped from anywhere up
    to it (``p50`` of ``1e308`` of weight beyond float64 is ``1e308``, not ``1e19``)."""
    if edge <= x < math.inf:
        return max(x, hi)
    if -math.inf < x <= -edge:
        return min(x, lo)
    return x


def _beyond_rows(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, edge: float) -> np.ndarray:
    """:func:`_beyond` of ``(rows, k)`` answers with each row's extremes."""
    if len(lo) and -edge < lo.min() and hi.max() < edge:  # nothing clamped beyond (usual)
        return x
    big = np.abs(x) >= edge
    if not big.any():
        return x
    top = big & (x > 0) & (x < np.inf)
    bottom = big & (x < 0) & (x > -np.inf)
    x = np.where(top, np.maximum(x, hi[:, None]), x)
    return np.where(bottom, np.minimum(x, lo[:, None]), x)


def _snapped(h: float) -> float:
    """A position within the tie tolerance of a whole one is on it: ``p29`` of 101
    samples is the 29th, where ``0.29 * 100`` rounds to ``28.999999999999996``."""
    whole = float(round(h)) if math.isfinite(h) else h
    return whole if abs(h - whole) <= _TIE * h else h


def _lerp_one(x0: float, x1: float, frac: float) -> float:
    """``x0 + frac * (x1 - x0)`` for ``x0 <= x1``, and its limit where that meets an
    infinity: the value of equal ends, an infinite end, or NaN from -inf to +inf."""
    if frac == 0.0 or x0 == x1:
        return x0
    if math.isinf(x0) or math.isinf(x1):
        return _NAN if math.isinf(x0) and math.isinf(x1) else (x0 if math.isinf(x0) else x1)
    return x0 + frac * (x1 - x0)


def _lerp(x0: np.ndarray, x1: np.ndarray, frac: np.ndarray) -> np.ndarray:
    """:func:`_lerp_one` of arrays (``x0 <= x1`` elementwise); inside ``errstate``."""
    out = x0 + frac * (x1 - x0)
    ends = np.isinf(x0) | np.isinf(x1)
    if ends.any():
        out = np.where(ends, np.where(np.isinf(x0) & np.isinf(x1), np.nan, x0 + x1), out)
    return np.where((frac == 0) | (x0 == x1), x0, out)


def _answer_one(
    reps: np.ndarray,
    cum: np.ndarray,
    qs: list[float],
    method: str,
    lo: float,
    hi: float,
    n: float | None,
    edge: float = math.inf,
) -> list[float]:
    """:func:`_answer` of one row of finite cumulative weights, a binary search per
    quantile instead of comparisons with every cell (the same positions: ``cum`` never
    decreases)."""
    total = float(cum[-1])
    if not total > 0:
        return [_NAN] * len(qs)
    last = len(cum) - 1
    if method == "inverted_cdf":
        # how many cells lie below q * W (within the tie tolerance)
        at = cum.searchsorted([(q - _TIE) * total for q in qs])
        out = reps.take(np.minimum(at, last)).tolist()
        if not -edge < lo <= hi < edge:  # a sample clamped beyond the largest buckets
            out = [_beyond(v, lo, hi, edge) for v in out]
    else:
        count = n if n is not None and 0 < n < math.inf else total  # unit weights if unknown
        unit = total / count  # the mean weight: positions j sit at cumulative weight j * unit
        h = [_snapped(max(q * (count - 1.0), 0.0)) for q in qs]
        below = [float(math.floor(x)) for x in h]
        bounds = [b * (1.0 + _TIE) * unit for b in below]
        bounds += [(b + 1.0) * (1.0 + _TIE) * unit for b in below]
        ends = reps.take(np.minimum(cum.searchsorted(bounds, side="right"), last)).tolist()
        if not -edge < lo <= hi < edge:  # a sample clamped beyond the largest buckets
            ends = [_beyond(v, lo, hi, edge) for v in ends]
        k = len(qs)
        out = [_lerp_one(ends[j], ends[j + k], x - b) for j, (x, b) in enumerate(zip(h, below))]
    # into [lo, hi] (NaN stays NaN, as with numpy's minimum and maximum), ends exact
    return [lo if q == 0.0 else hi if q == 1.0 else min(max(v, lo), hi) for v, q in zip(out, qs)]


def _answer(
    reps: np.ndarray,
    cum: np.ndarray,
    q: np.ndarray,
    method: str,
    lo: np.ndarray,
    hi: np.ndarray,
    n: np.ndarray | None = None,
    edge: float = math.inf,
) -> np.ndarray:
    """Quantiles ``q`` of each row of cumulative cell weights ``cum`` (cells answering
    ``reps``), clipped into ``[lo, hi]``; NaN for rows without weight. ``n``: each row's
    number of samples (None: its total weight). Every quantile at once, unless the
    comparisons would take too much memory."""
    total = cum[:, -1]
    rows, width = cum.shape
    last = width - 1
    if rows * width * q.size > 1 << 21 and q.size > 1:
        out = np.concatenate(
            [_answer(reps, cum, q[j : j + 1], method, lo, hi, n, edge) for j in range(q.size)],
            axis=1,
        )
        out[total <= 0] = np.nan
        return out
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if method == "inverted_cdf":
            target = (q - _TIE) * total[:, None]
            first = np.count_nonzero(cum[:, :, None] < target[:, None, :], axis=1)
            out = _beyond_rows(reps[np.minimum(first, last)], lo, hi, edge)
        else:
            count = (total if n is None else np.where((n > 0) & (n < np.inf), n, total))[:, None]
            unit = total[:, None] / count  # the mean weight (inf weights: positions past all)
            h = np.maximum(q * (count - 1.0), 0.0)
            whole = np.round(h)
            h = np.where(np.abs(h - whole) <= _TIE * h, whole, h)  # as _snapped
            below = np.floor(h)
            frac = np.where(np.isfinite(h), h - below, 0.0)
            # the positions of x_(floor h) and x_(floor h + 1), counted in one pass
            bounds = np.concatenate([below, below + 1.0], axis=1) * ((1.0 + _TIE) * unit)
            at = np.minimum(np.count_nonzero(cum[:, :, None] <= bounds[:, None, :], axis=1), last)
            x0 = _beyond_rows(reps[at[:, : q.size]], lo, hi, edge)
            x1 = _beyond_rows(reps[at[:, q.size :]], lo, hi, edge)
            out = _lerp(x0, x1, frac)
        out = np.minimum(np.maximum(out, lo[:, None]), hi[:, None])
    out[:, q == 0.0] = lo[:, None]
    out[:, q == 1.0] = hi[:, None]
    out[total <= 0] = np.nan
    return out


def _rescaled(cells: np.ndarray) -> np.ndarray:
    """Each row of cell weights divided by its largest (the quantiles depend on their
    proportions only), so that it sums within float64; a row with infinite cells keeps
    their limit: weight 1 on each infinite cell, none elsewhere."""
    top = cells.max(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        scaled = cells / np.where(top > 0, top, 1.0)
    return np.where(np.isinf(top), np.isinf(cells).astype(np.float64), scaled)


def _per_row(v: npt.ArrayLike, rows: int) -> np.ndarray:
    """``v`` as a float64 vector of ``rows`` entries (a scalar is repeated)."""
    a = np.asarray(v, dtype=np.float64).reshape(-1)
    return a if a.size == rows else np.broadcast_to(a, (rows,))


def window(layout: SketchLayout, vmin: float, vmax: float) -> tuple[int, int]:
    """The cells ``[lo, hi)`` that samples within ``[vmin, vmax]`` can occupy.

    Every rank computes the same window from the global extremes, so a sync
    sends only these cells (plus the four side cells past ``pos_inf_cell - 1``:
    ``-inf`` at 0 is inside when ``vmin`` is ``-inf``). The window reaches one
    cell beyond each extreme's, so a logarithm rounded differently from numpy's
    (two scalars are placed with :mod:`math` here) still covers every sample.

    >>> from metricsync._state._sketch import sketch_layout
    >>> layout = sketch_layout()
    >>> lo, hi = window(layout, 16.0, 4096.0)
    >>> hi - lo  # two decades at 1%: 280 cells, 2.2 KB
    280
    """
    if not (vmin <= vmax):  # NaN or no samples: only the side cells
        return layout.pos_inf_cell, layout.pos_inf_cell
    lo = max(_cell_of(layout, vmin) - 1, 0)
    return lo, min(_cell_of(layout, vmax) + 2, layout.nan_cell)


def _cell_of(layout: SketchLayout, v: float) -> int:
    """The value-ordered cell of one non-NaN sample, as :func:`cells_numpy` places it
    (give or take one cell where the logarithms round differently)."""
    if v == 0.0:
        return layout.zero_cell
    if math.isinf(v):
        return layout.pos_inf_cell if v > 0 else layout.neg_inf_cell
    k = math.ceil(math.log(abs(v)) * (1.0 / layout.ln_gamma))
    k = min(max(k, layout.min_index), layout.max_index) - layout.min_index + 1
    return layout.zero_cell + (k if v > 0 else -k)
