"""Mergeable accumulator states, stored as rows of float64 columns.

Every metric owns one row of ``NCOL`` float64 numbers; a table of rows (one per
metric) is what merges, travels in collectives and gets computed in one
vectorized pass. Quantile metrics also own a fixed-size sketch vector.

Columns:

====== =================================================== ============
column meaning                                             merge
====== =================================================== ============
W      sum of weights (``count``)                          sum
S      sum of weight * value (``sum``; ``mean = S / W``)   sum
MAX    largest value with weight > 0                       max
NEGMIN minus the smallest value with weight > 0            max
T      wall-clock microseconds of the latest sample        max
LAST   the latest sample (ties: the larger value)          by (T, LAST)
M2     sum of w * (x - mean)^2                             Chan's formula
DROP   non-finite samples dropped under ``nan="ignore"``   sum
====== =================================================== ============

>>> import numpy as np
>>> a = rows_from_samples(np.array([1.0, 2.0]), None, np.array([0, 2]), now=1.0)
>>> b = rows_from_samples(np.array([3.0, 4.0]), None, np.array([0, 2]), now=2.0)
>>> both = merge_rows(a, b, np)
>>> compute_plain(both, np)["var"].tolist()
[1.25]
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

__all__ = [
    "COLUMNS",
    "IDENTITY",
    "NCOL",
    "compute_plain",
    "empty_rows",
    "merge_rows",
    "now_us",
    "rows_from_samples",
]

W, S, MAX, NEGMIN, T, LAST, M2, DROP = range(8)
COLUMNS = ("W", "S", "MAX", "NEGMIN", "T", "LAST", "M2", "DROP")
NCOL = len(COLUMNS)
IDENTITY = np.array([0.0, 0.0, -np.inf, -np.inf, -np.inf, 0.0, 0.0, 0.0])
SUM_COLUMNS = (W, S, DROP)
MAX_COLUMNS = (MAX, NEGMIN, T)

_last_stamp = 0


def now_us() -> float:
    """Wall-clock microseconds, strictly increasing within this process.

    >>> now_us() < now_us()
    True
    """
    global _last_stamp
    stamp = time.time_ns() // 1000
    if stamp <= _last_stamp:
        stamp = _last_stamp + 1
    _last_stamp = stamp
    return float(stamp)


def empty_rows(n: int) -> np.ndarray:
    """``n`` identity rows (no samples)."""
    return np.tile(IDENTITY, (n, 1))


def merge_rows(a: Any, b: Any, xp: Any) -> Any:
    """Merge two tables of rows elementwise; ``xp`` is ``numpy`` or ``torch``.

    Associative and commutative: ``last`` keeps the later time, and at equal
    times the larger value.
    """
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # NaN/inf samples
        return _merge_rows(a, b, xp)


def _merge_rows(a: Any, b: Any, xp: Any) -> Any:
    out = a + b  # W, S and DROP are sums; the other columns are overwritten below
    out[..., MAX] = xp.maximum(a[..., MAX], b[..., MAX])
    out[..., NEGMIN] = xp.maximum(a[..., NEGMIN], b[..., NEGMIN])
    ta, tb = a[..., T], b[..., T]
    take_b = (tb > ta) | ((tb == ta) & (b[..., LAST] > a[..., LAST]))
    out[..., T] = xp.maximum(ta, tb)
    out[..., LAST] = xp.where(take_b, b[..., LAST], a[..., LAST])
    wa, wb = a[..., W], b[..., W]
    total = wa + wb
    both = (wa > 0) & (wb > 0)
    safe_a = xp.where(wa > 0, wa, 1.0)
    safe_b = xp.where(wb > 0, wb, 1.0)
    safe_t = xp.where(total > 0, total, 1.0)
    delta = b[..., S] / safe_b - a[..., S] / safe_a
    correction = xp.where(both, wa * wb / safe_t * delta * delta, 0.0)
    out[..., M2] = a[..., M2] + b[..., M2] + correction
    return out


def rows_from_samples(
    values: np.ndarray,
    weights: np.ndarray | None,
    starts: np.ndarray,
    now: float | np.ndarray,
) -> np.ndarray:
    """Rows for consecutive segments of host samples (vectorized over segments).

    ``now`` is the time stamp of every segment, or one per segment.
    ``starts`` holds each segment's first index plus a final end index. Samples
    with weight 0 are ignored; the caller has already dropped what the nan
    policy drops. Every segment must be non-empty.
    """
    n_seg = len(starts) - 1
    rows = empty_rows(n_seg)
    if len(values) == 0:
        return rows
    heads = starts[:-1]
    lengths = np.diff(starts)
    if weights is None:  # the common case, in about half the passes over the samples
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            rows[:, W] = lengths
            rows[:, S] = ssum = np.add.reduceat(values, heads)
            rows[:, MAX] = np.maximum.reduceat(values, heads)
            rows[:, NEGMIN] = -np.minimum.reduceat(values, heads)
            rows[:, LAST] = values[starts[1:] - 1]
            rows[:, T] = now
            dev = values - np.repeat(ssum / lengths, lengths)
            rows[:, M2] = np.add.reduceat(dev * dev, heads)
        return rows
    keep = weights > 0
    w = weights
    x = np.where(keep, values, 0.0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        wsum = np.add.reduceat(w, heads)
        ssum = np.add.reduceat(w * x, heads)
        rows[:, W] = wsum
        rows[:, S] = ssum
        rows[:, MAX] = np.maximum.reduceat(np.where(keep, values, -np.inf), heads)
        rows[:, NEGMIN] = np.maximum.reduceat(np.where(keep, -values, -np.inf), heads)
        idx = np.maximum.reduceat(np.where(keep, np.arange(len(values)), -1), heads)
        has = idx >= 0
        rows[:, LAST] = np.where(has, values[np.maximum(idx, 0)], 0.0)
        rows[:, T] = np.where(has, now, -np.inf)
        mean = np.where(wsum > 0, ssum / np.where(wsum > 0, wsum, 1.0), 0.0)
        dev = x - np.repeat(mean, lengths)
        rows[:, M2] = np.add.reduceat(np.where(keep, w * dev * dev, 0.0), heads)
    return rows


def compute_plain(rows: Any, xp: Any) -> dict[str, Any]:
    """Every plain statistic for a table of rows, vectorized; no samples give NaN."""
    w = rows[..., W]
    has = w > 0
    safe = xp.where(has, w, 1.0)
    nan = float("nan")
    mean = xp.where(has, rows[..., S] / safe, nan)
    m2 = rows[..., M2]
    var = xp.where(has, xp.where(m2 < 0, 0.0, m2) / safe, nan)
    return {
        "mean": mean,
        "sum": rows[..., S],
        "count": w,
        "min": xp.where(has, -rows[..., NEGMIN], nan),
        "max": xp.where(has, rows[..., MAX], nan),
        "last": xp.where(rows[..., T] > -np.inf, rows[..., LAST], nan),
        "var": var,
        "std": xp.sqrt(var),
    }
