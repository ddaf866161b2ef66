"""Per-rank aggregates for ``across`` modes other than ``"exact"``.

An ``across="mean"|"sum"|"min"|"max"`` metric combines each rank's own result.
Its finished ranks are kept as one aggregate row per statistic:
``[sum of rank values, number of ranks, max of rank values, -min of rank values]``,
which merges by sum (first two columns) and max (last two), so it rides in the
same SUM and MAX all-reduces as every other state. A rank without samples adds
nothing.

>>> import numpy as np
>>> ranks = merge_aggregates(rank_aggregate(np.array([3.0])), rank_aggregate(np.array([5.0])))
>>> combine("mean", ranks, np.array([10.0]), has_local=True).tolist()
[6.0]
>>> combine("min", ranks, np.array([np.nan]), has_local=False).tolist()
[3.0]
"""

from __future__ import annotations

import numpy as np

__all__ = ["AGG_IDENTITY", "combine", "empty_aggregate", "merge_aggregates", "rank_aggregate"]

AGG_IDENTITY = np.array([0.0, 0.0, -np.inf, -np.inf])


def empty_aggregate(n_stats: int) -> np.ndarray:
    """An aggregate with no ranks, one row per statistic."""
    return np.tile(AGG_IDENTITY, (n_stats, 1))


def rank_aggregate(values: np.ndarray) -> np.ndarray:
    """One rank's statistics as an aggregate of one rank."""
    agg = np.empty((len(values), 4))
    agg[:, 0] = values
    agg[:, 1] = 1.0
    agg[:, 2] = values
    agg[:, 3] = -values
    return agg


def merge_aggregates(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The aggregate of the ranks of ``a`` and of ``b``."""
    out = a + b
    out[:, 2:] = np.maximum(a[:, 2:], b[:, 2:])
    return out


def combine(across: str, agg: np.ndarray, local: np.ndarray, has_local: bool) -> np.ndarray | None:
    """The per-rank combination of finished ranks (``agg``) and this rank's own values.

    None when no rank holds samples.
    """
    if has_local:
        agg = merge_aggregates(agg, rank_aggregate(local))
    ranks = agg[:, 1]
    if not ranks.any():
        return None
    if across == "mean":
        return agg[:, 0] / np.where(ranks > 0, ranks, 1.0)
    if across == "sum":
        return agg[:, 0].copy()
    if across == "max":
        return agg[:, 2].copy()
    return -agg[:, 3]
