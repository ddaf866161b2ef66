"""Packing a rank's state into an agreed layout, and merging every rank's packed state.

One rank's state travels as one float64 vector: a header (protocol, sync
number, layout fingerprint, flags), then for each state column the values of
the layout positions that carry it (:attr:`Layout.carried`), then each
``across`` metric's aggregate, its own result folded in as its first rank.
After an ``all_gather`` every rank unpacks every rank's vector and merges them
in rank order with the one merge algebra (:mod:`metricsync._algebra`), so a
sync computes exactly what ``merge`` computes, ``last``, ranks and ``first``
included. An ``argrank`` metric's extremes travel with the rank (in ``group``)
that holds them: :func:`pack` labels every sample of this rank with its rank,
replacing the ranks of an earlier sync, so a result's ranks count in one group. Sketches follow in a second gather, limited to the cells between
the global minimum and maximum every rank now knows.

>>> from metricsync._layout import Layout
>>> from metricsync._spec import Spec
>>> from metricsync._table import StateTable
>>> table = StateTable(); cols = identity(1); cols[:2, 0] = [2.0, 6.0]
>>> table.merge_state([table.slot("x", Spec())], cols)
>>> layout = Layout([("x", Spec())])
>>> data = pack(table, layout, positions(table, layout), rank=0)
>>> merge_ranks(layout, np.stack([data, data])).compute()
{'x': 3.0}
"""

from __future__ import annotations

import numpy as np

from . import _algebra as al
from ._across import ACOL, empty_aggregate, fold_rank, merge_aggregates
from ._algebra import identity
from ._layout import Layout
from ._quantile import window
from ._sketch import cells_numpy, sketch_layout
from ._table import StateTable

__all__ = [
    "HEADER",
    "merge_ranks",
    "pack",
    "pack_cells",
    "positions",
    "sketch_windows",
    "sum_cells",
    "within_windows",
]

HEADER = 8  #: int64 words ahead of a rank's data: see :mod:`metricsync._sync`


def positions(table: StateTable, layout: Layout) -> np.ndarray:
    """For each layout position, the table's slot (``len(table)`` where it has none)."""
    n = len(table)
    index = table.index
    return np.array([index.get(name, n) for name in layout.names], dtype=np.intp)


def pack(table: StateTable, layout: Layout, where: np.ndarray, rank: int) -> np.ndarray:
    """This rank's state in ``layout`` (``where`` from :func:`positions`) as one vector."""
    state = np.concatenate([table.state, identity(1)], axis=1)[:, where]
    # every sample this rank holds is this rank's here, whatever an earlier sync said, so the
    # ranks of a result always count in the group of the sync that made it
    state[[al.MAXRANK, al.MINRANK]] = np.where(state[al.W] > 0, float(rank), np.nan)
    parts = [state[c, layout.carried[c]] for c in range(al.NCOL_ALL)]
    if len(layout.across):
        own = table.own_values()
        for i in layout.across.tolist():
            slot = int(where[i])
            spec = layout.specs[i]
            if slot == len(table):
                agg = empty_aggregate(len(spec.reduce))
            else:
                agg = table.aggs[slot]
                if table.state[al.W, slot] > 0:
                    agg = fold_rank(agg, own[slot], spec.across == "first", before=True)
            parts.append(agg.reshape(-1))
    return np.concatenate(parts) if parts else np.zeros(0)


def _unpack(layout: Layout, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """State columns ``(NCOL_ALL, k)`` and stacked aggregates ``(rows, ACOL)`` of one rank."""
    state = identity(len(layout))
    offset = 0
    for c in range(al.NCOL_ALL):
        at = layout.carried[c]
        state[c, at] = data[offset : offset + len(at)]
        offset += len(at)
    return state, data[offset:].reshape(-1, ACOL)


def merge_ranks(layout: Layout, gathered: np.ndarray) -> StateTable:
    """Merge every rank's packed vector (rows of ``gathered``, rank order) into a table."""
    first = np.repeat(layout.first, layout.agg_rows)
    state, aggs = _unpack(layout, gathered[0])
    for row in gathered[1:]:
        other, other_aggs = _unpack(layout, row)
        state = al.merge(state, other, np)
        aggs = merge_aggregates(aggs, other_aggs, first)
    agg_of = {}
    at = 0
    for i, rows in zip(layout.across.tolist(), layout.agg_rows):
        agg_of[i] = aggs[at : at + rows].copy()
        at += rows
    sketches = {
        i: np.zeros(sketch_layout(layout.specs[i].accuracy).n_cells) for i in layout.sketched
    }
    return StateTable.from_parts(
        layout.names,
        layout.specs,
        state,
        sketches,
        agg_of,
        index=layout.index,
        plan=layout.plan,
        complete=True,
    )


def sketch_windows(layout: Layout, merged: StateTable) -> list[tuple[int, int]]:
    """The cell window of each exact sketch metric, from the merged (global) extremes."""
    out = []
    for i in layout.sketch:
        vmin, vmax = merged.extremes(i)
        out.append(window(sketch_layout(layout.specs[i].accuracy), vmin, vmax))
    return out


def within_windows(
    table: StateTable, layout: Layout, where: np.ndarray, windows: list[tuple[int, int]]
) -> bool:
    """Whether every sketch cell this rank holds lies inside the agreed windows.

    A metric's cells span those of its extremes (:func:`~metricsync._quantile.window`);
    the extremes of every metric of one accuracy are placed in one call.
    """
    n = len(table)
    groups: dict[float, list[tuple[tuple[int, int], float, float]]] = {}
    for i, agreed in zip(layout.sketch, windows):
        slot = int(where[i])
        if slot == n or not table.cols[al.W, slot] > 0:
            continue
        vmin, vmax = table.extremes(slot)
        if vmin <= vmax:  # else NaN: only the side cells, which always travel
            groups.setdefault(layout.specs[i].accuracy, []).append((agreed, vmin, vmax))
    for accuracy, items in groups.items():
        ends, _ = cells_numpy(
            sketch_layout(accuracy), np.array([v for _, lo, hi in items for v in (lo, hi)])
        )
        lo, hi = ends[0::2], ends[1::2] + 1
        bounds = np.array([a for a, _, _ in items], dtype=np.int64).reshape(-1, 2)
        if not ((lo >= hi) | ((bounds[:, 0] <= lo) & (hi <= bounds[:, 1]))).all():
            return False
    return True


def pack_cells(
    table: StateTable, layout: Layout, where: np.ndarray, windows: list[tuple[int, int]]
) -> np.ndarray:
    """This rank's sketch cells inside the windows, plus the NaN and clamped cells of each."""
    parts = []
    for i, (lo, hi) in zip(layout.sketch, windows):
        cells = table.sketches.get(int(where[i]))
        sk = sketch_layout(layout.specs[i].accuracy)
        if cells is None:
            parts.append(np.zeros(hi - lo + 2))
        else:
            parts += [cells[lo:hi], cells[[sk.nan_cell, sk.clamped_cell]]]
    return np.concatenate(parts) if parts else np.zeros(0)


def sum_cells(
    merged: StateTable, layout: Layout, windows: list[tuple[int, int]], gathered: np.ndarray
) -> None:
    """Put the rank-summed window cells into the merged table's sketches."""
    total = gathered.sum(axis=0)
    offset = 0
    for i, (lo, hi) in zip(layout.sketch, windows):
        sk = sketch_layout(layout.specs[i].accuracy)
        cells = merged.sketches[i]
        cells[lo:hi] = total[offset : offset + hi - lo]
        offset += hi - lo
        cells[[sk.nan_cell, sk.clamped_cell]] = total[offset : offset + 2]
        offset += 2
