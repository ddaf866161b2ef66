"""Per-rank aggregates for ``across`` modes other than ``"exact"`` (mean, sum, min, max, first).

Each statistic keeps one row ``[value, ranks, max, -min]`` that merges by sum and max, so the
aggregates ride in the same packed collectives as every other state column. :func:`fold_rank`
is the one way a rank's own result joins an aggregate.

>>> import numpy as np
>>> ranks = fold_rank(fold_rank(empty_aggregate(1), np.array([3.0])), np.array([5.0]))
>>> combine("mean", ranks).tolist(), combine("first", fold_rank(empty_aggregate(1), np.array([3.0]))).tolist()
([4.0], [3.0])
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "ACOL",
    "AGG_IDENTITY",
    "combine",
    "empty_aggregate",
    "fold_rank",
    "merge_aggregates",
    "rank_aggregate",
]

ACOL = 4
AGG_IDENTITY = np.array([0.0, 0.0, -np.inf, -np.inf])


def empty_aggregate(n_stats: int) -> np.ndarray:
    """An aggregate with no ranks, one row per statistic."""
    return np.tile(AGG_IDENTITY, (n_stats, 1))


def rank_aggregate(values: np.ndarray) -> np.ndarray:
    """One rank's statistics as an aggregate of one rank."""
    agg = np.empty((len(values), ACOL))
    agg[:, 0] = values
    agg[:, 1] = 1.0
    agg[:, 2] = values
    agg[:, 3] = -values
    return agg


def merge_aggregates(a: np.ndarray, b: np.ndarray, first: np.ndarray | bool = False) -> np.ndarray:
    """The aggregate of the ranks of ``a`` followed by those of ``b``.

    ``first`` marks the rows of ``across="first"`` metrics (a bool for all rows,
    or one per row): there ``a``'s value wins when ``a`` holds a rank.
    """
    with np.errstate(all="ignore"):  # NaN and 1e308 rank values are data here
        out = a + b
        out[:, 2:] = np.maximum(a[:, 2:], b[:, 2:])
        if np.any(first):
            keep_a = a[:, 1] > 0
            out[:, 0] = np.where(first, np.where(keep_a, a[:, 0], b[:, 0]), out[:, 0])
    return out


def fold_rank(
    agg: np.ndarray, values: np.ndarray, first: bool = False, before: bool = False
) -> np.ndarray:
    """``agg`` with one more rank holding ``values``, after its ranks (``before``: ahead of them)."""
    rank = rank_aggregate(values)
    return merge_aggregates(rank, agg, first) if before else merge_aggregates(agg, rank, first)


def combine(across: str, agg: np.ndarray) -> np.ndarray | None:
    """The per-rank combination of an aggregate's ranks; None when no rank holds samples."""
    ranks = agg[:, 1]
    if not ranks.any():
        return None
    with np.errstate(all="ignore"):
        if across == "mean":
            return agg[:, 0] / np.where(ranks > 0, ranks, 1.0)
        if across in ("sum", "first"):
            return agg[:, 0].copy()
        if across == "max":
            return agg[:, 2].copy()
        return -agg[:, 3]
