"""Packing a rank's state into an agreed layout, and merging every rank's packed state.

One float64 vector per rank: a header (protocol, sync number, layout fingerprint, flags), then
the carried columns in layout order, sketch cells, ``across`` rows; every rank merges every
rank's vector with the merge algebra.

>>> from metricsync._state._algebra import identity
>>> from metricsync._sync._layout import Layout
>>> from metricsync._state._spec import Spec
>>> from metricsync._state._table import StateTable
>>> table = StateTable(); cols = identity(1); cols[:2, 0] = [2.0, 6.0]
>>> table.merge_state([table.slot("x", Spec())], cols)
>>> layout = Layout([("x", Spec())])
>>> where = positions(table, layout)
>>> data = pack(table, layout, where, 0, pack_index(len(table), layout, where))
>>> merge_ranks(layout, np.stack([data, data])).compute()
{'x': 3.0}
"""

from __future__ import annotations

from enum import IntEnum
from itertools import repeat

import numpy as np

from .._state import _algebra as al
from .._state._across import ACOL, empty_aggregate, fold_rank, merge_aggregates
from .._state._quantile import window
from .._state._sketch import sketch_layout
from .._state._table import StateTable
from ._layout import Layout, Window

__all__ = [
    "HEADER",
    "Word",
    "header",
    "merge_ranks",
    "pack",
    "pack_cells",
    "pack_index",
    "positions",
    "sum_cells",
    "widened",
    "within_windows",
]


class Word(IntEnum):
    """The int64 words of the header ahead of a rank's data, by position (the gather path
    sends them as they are, the reduce path's round A as keys: :mod:`metricsync._sync._allreduce`)."""

    MAGIC = 0  # the protocol's
    SEQ = 1  # the group's sync number
    LAYOUT = 2  # the agreed layout's fingerprint
    SIZE = 3  # its number of names
    FLAGS = 4  # this rank's flags (see metricsync._sync._sync)
    CLASH = 5  # 1 + the layout position of a name this rank holds under another spec, or 0
    TAG = (
        6  # which Metrics it syncs (see metricsync._sync._sync._owner_tag, metricsync._sync._async)
    )
    BLOB = 7  # the bytes of this rank's layout entries the layout lacks


HEADER = len(Word)  #: int64 words ahead of a rank's data: see :mod:`metricsync._sync._sync`


def header(
    *, magic: int, seq: int, layout: int, size: int, flags: int, clash: int, tag: int, blob: int
) -> np.ndarray:
    """A rank's header: each word at its :class:`Word` position.

    >>> h = header(magic=1, seq=2, layout=3, size=4, flags=5, clash=6, tag=-7, blob=8)
    >>> int(h[Word.FLAGS]), int(h[Word.TAG]), len(h) == HEADER
    (5, -7, True)
    """
    return np.array([magic, seq, layout, size, flags, clash, tag, blob], dtype=np.int64)


def positions(table: StateTable, layout: Layout) -> np.ndarray:
    """For each layout position, the table's slot (``len(table)`` where it has none)."""
    n, names = len(table), layout.names
    found = map(table.index.get, names, repeat(n, len(names)))  # C loops, no Python per name
    return np.fromiter(found, dtype=np.intp, count=len(names))


def pack_index(n: int, layout: Layout, where: np.ndarray) -> tuple[np.ndarray, ...]:
    """Where :func:`pack` reads a table of ``n`` slots (placed by ``where``): for each
    carried value, its state column and slot (slot 0 where the table has none); the
    packed positions the table has no slot for, with their columns' identities; and
    the packed positions of the rank columns, with whether the table lacks each slot."""
    counts = [len(at) for at in layout.carried]
    rows = np.repeat(np.arange(al.NCOL_ALL), counts)
    slots = np.concatenate([where[at] for at in layout.carried]).astype(np.intp)
    absent = slots == n
    slots[absent] = 0  # a table always has room for a slot (its state is never 0 wide)
    missing = np.flatnonzero(absent)
    sizes = np.cumsum([0, *counts])
    rank_at = np.r_[
        sizes[al.MAXRANK] : sizes[al.MAXRANK + 1], sizes[al.MINRANK] : sizes[al.MINRANK + 1]
    ].astype(np.intp)
    return (
        rows.astype(np.intp),
        slots,
        missing,
        al.IDENTITY[rows[missing]],
        rank_at,
        absent[rank_at],
    )


def pack(
    table: StateTable, layout: Layout, where: np.ndarray, rank: int, index: tuple[np.ndarray, ...]
) -> np.ndarray:
    """This rank's state in ``layout`` (``where`` from :func:`positions`, ``index`` from
    :func:`pack_index`) as one vector."""
    rows, slots, missing, fill, rank_at, rank_absent = index
    cols = table.cols  # read in place: a copy of a state of 10,000 slots costs more
    if cols.flags.c_contiguous:  # one gather from the raveled columns is the cheapest read
        flat = rows * cols.shape[1]
        flat += slots
        data = cols.ravel().take(flat)
    else:
        data = cols[rows, slots]
    data[missing] = fill
    if len(rank_at):
        # every sample this rank holds is this rank's here, whatever an earlier sync said, so
        # the ranks of a result always count in the group of the sync that made it
        held = (cols[al.W, slots[rank_at]] > 0) & ~rank_absent
        data[rank_at] = np.where(held, float(rank), np.nan)
    if not len(layout.across):
        return data
    parts = [data]
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
    return np.concatenate(parts)


def merge_ranks(layout: Layout, gathered: np.ndarray) -> StateTable:
    """Merge every rank's packed vector (rows of ``gathered``, rank order) into a table."""
    world, k, carried = len(gathered), len(layout), len(layout.unpack_at)
    flat = layout.blank.copy()
    flat[layout.unpack_at] = al.merge_packed(gathered[:, :carried], layout.packed)
    state = flat.reshape(al.NCOL_ALL, k)
    aggs = gathered[0, carried:].reshape(-1, ACOL)
    if len(layout.across) and world > 1:
        first = np.repeat(layout.first, layout.agg_rows)
        for row in gathered[1:]:
            aggs = merge_aggregates(aggs, row[carried:].reshape(-1, ACOL), first)
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


def widened(layout: Layout, windows: list[Window], merged: StateTable) -> list[Window]:
    """Each exact sketch metric's window grown to hold the merged (global) extremes.

    A window covers the union of the ranges it was made for, so it only grows;
    missing extremes leave it as it is. NaN extremes (a NaN sample, which
    travels in its side cell, makes them NaN) say nothing of where the finite
    samples lie: every finite cell travels then, under a window whose ``vmin`` is
    NaN, which the caller keeps for this sync only.
    """
    out = []
    for i, old in zip(layout.sketch, windows):
        vmin, vmax = merged.extremes(i)
        if vmin != vmin or vmax != vmax:  # NaN
            out.append(Window(np.nan, np.nan, 0, sketch_layout(layout.specs[i].accuracy).nan_cell))
            continue
        if not vmin <= vmax or (old.vmin <= vmin and vmax <= old.vmax):
            out.append(old)
            continue
        vmin, vmax = min(vmin, old.vmin), max(vmax, old.vmax)
        lo, hi = window(sketch_layout(layout.specs[i].accuracy), vmin, vmax)
        out.append(Window(vmin, vmax, lo, hi))
    return out


def within_windows(
    table: StateTable, layout: Layout, where: np.ndarray, windows: list[Window]
) -> bool:
    """Whether every sketch cell this rank holds lies inside the agreed windows.

    It does when the rank's extremes lie within the range each window was made
    for: :func:`~metricsync._state._quantile.window` reaches a cell past those of the
    range's ends, so every sample in the range falls inside, however its
    logarithm rounds. NaN extremes (a NaN sample) say nothing of the finite
    samples: the rank's finite cells are looked at instead.
    """
    if not windows:
        return True
    if len(windows) <= 8:  # a few: scalar reads cost less than building arrays
        n, cols = len(table), table.cols
        for slot, win in zip(where[layout.sketch_at].tolist(), windows):
            if slot < n and cols[al.W, slot] > 0:
                lo, hi = -cols[al.NEGMIN, slot], cols[al.MAX, slot]
                if lo < win.vmin or hi > win.vmax:
                    return False
                if (lo != lo or hi != hi) and _cells_outside(table, slot, win):
                    return False
        return True
    slots = where[layout.sketch_at]
    held = slots < len(table)
    cols = table.cols[:, np.where(held, slots, 0)]
    lo, hi = -cols[al.NEGMIN], cols[al.MAX]
    ranges = np.array([(w.vmin, w.vmax) for w in windows])
    with np.errstate(invalid="ignore"):
        outside = (lo < ranges[:, 0]) | (hi > ranges[:, 1])
    if (outside & held & (cols[al.W] > 0)).any():
        return False
    unknown = (np.isnan(lo) | np.isnan(hi)) & held & (cols[al.W] > 0)
    return not any(
        _cells_outside(table, int(slots[j]), windows[j]) for j in np.flatnonzero(unknown).tolist()
    )


def _cells_outside(table: StateTable, slot: int, win: Window) -> bool:
    """Whether ``slot``'s sketch holds a finite cell outside ``win`` (its extremes are NaN)."""
    cells = table.sketches.get(slot)
    if cells is None:
        return False
    end = sketch_layout(table.specs[slot].accuracy).nan_cell  # the side cells always travel
    return bool(cells[: win.lo].any() or cells[win.hi : end].any())


def pack_cells(
    table: StateTable, layout: Layout, where: np.ndarray, windows: list[Window]
) -> np.ndarray:
    """This rank's sketch cells inside the windows, plus the NaN and clamped cells of each."""
    parts = []
    for i, (_, _, lo, hi) in zip(layout.sketch, windows):
        cells = table.sketches.get(int(where[i]))
        sk = sketch_layout(layout.specs[i].accuracy)
        if cells is None:
            parts.append(np.zeros(hi - lo + 2))
        else:
            parts += [cells[lo:hi], cells[sk.nan_cell :]]  # the last two: NaN, clamped
    return np.concatenate(parts) if parts else np.zeros(0)


def sum_cells(
    merged: StateTable, layout: Layout, windows: list[Window], gathered: np.ndarray
) -> None:
    """Put the rank-summed window cells into the merged table's sketches."""
    total = gathered.sum(axis=0)
    offset = 0
    for i, (_, _, lo, hi) in zip(layout.sketch, windows):
        sk = sketch_layout(layout.specs[i].accuracy)
        cells = merged.sketches[i]
        cells[lo:hi] = total[offset : offset + hi - lo]
        offset += hi - lo
        cells[sk.nan_cell :] = total[offset : offset + 2]  # the last two: NaN, clamped
        offset += 2
