"""Folding host samples into state columns, vectorized.

*Runs* (a name's buffered samples) become columns with one ``reduceat`` per needed column;
*rows* (large records reduced on arrival, :func:`reduce_record`) merge in recording order
(:func:`merge_by_slot`). :func:`fold` takes a :class:`Batch` of what was buffered.

>>> import numpy as np
>>> from metricsync._spec import Spec
>>> row, cells = reduce_record(np.array([1.0, 5.0, 9.0]), np.array([True, True, False]), Spec("max"), 1.0)
>>> float(row[2]), cells
(5.0, None)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from . import _algebra as al
from ._cells import Cells, run_cells, sketch_cells
from ._spec import Spec
from ._tokens import kept, kept_if_any, latest_kept

__all__ = [
    "Batch",
    "Cells",
    "SpecInfo",
    "fold",
    "merge_by_slot",
    "reduce_record",
    "run_columns",
    "spec_info",
]

_SUM = [al.W, al.S, al.DROP]
_COUNTS = (al.N, al.W2)  #: SUM columns only some specs carry: summed where one does
_MAX = [al.MAX, al.NEGMIN]


class SpecInfo:
    """Per slot of a spec list, what a fold asks of its spec, as arrays: the columns it
    carries ``(NCOL_ALL, n)``, whether it drops NaN, whether it keeps a sketch."""

    __slots__ = ("carried", "ignore", "keep", "need", "sketch", "uncarried")

    def __init__(self, specs: Sequence[Spec], before: SpecInfo | None = None) -> None:
        """``before``: the info of a prefix of ``specs``, extended here by the rest."""
        self.keep = tuple(specs)  # alive while cached, so no other object takes their ids
        done = 0 if before is None else len(before.keep)
        ids, kinds = al.spec_kinds(self.keep[done:])  # specs are few, slots many
        carries = np.array([al.carries(s) for s in kinds], dtype=bool).reshape(-1, al.NCOL_ALL)
        self.carried = carries[ids].T
        self.ignore = np.array([s.nan == "ignore" for s in kinds], dtype=bool)[ids]
        self.sketch = np.array([s.needs_sketch for s in kinds], dtype=bool)[ids]
        if before is not None:
            self.carried = np.concatenate([before.carried, self.carried], axis=1)
            self.ignore = np.concatenate([before.ignore, self.ignore])
            self.sketch = np.concatenate([before.sketch, self.sketch])
        self.uncarried = ~self.carried[: al.NCOL]  # persisted columns a fold sets back
        # the columns any of them carries: a fold computes these for every run (a column a
        # metric does not carry is set back to its identity afterwards)
        self.need = set(np.flatnonzero(self.carried.any(axis=1)).tolist())


def spec_info(specs: Sequence[Spec], key: object = None) -> SpecInfo:
    """The :class:`SpecInfo` of ``specs``, kept by ``key`` (an object that stands for
    exactly these specs, as a table's token does: see :func:`metricsync._tokens.kept`)
    or else by the identity of each spec: a table's spec list changes rarely, and is
    read at every fold.

    >>> spec_info([Spec("max"), Spec(("mean", "p50"), nan="ignore")]).ignore.tolist()
    [False, True]
    """
    by_id = key is None
    if by_id:
        key = tuple(map(id, specs))
    entry = kept_if_any(key)
    info = None if entry is None else entry.info
    if info is None:
        # a table gains names at its end: what was kept last most often holds a prefix
        latest = latest_kept()
        entry = kept(key)
        before = None if latest is None or latest is entry else latest.info
        if before is not None and not (
            len(before.keep) <= len(specs) and before.keep == tuple(specs[: len(before.keep)])
        ):
            before = None
        if before is not None and len(before.keep) == len(specs) and not by_id:
            info = before  # the same specs, nothing to add (by id, it must keep these ones)
        else:
            info = SpecInfo(specs, before)
        entry.info = info  # folds run on several threads (async syncs): either is right
    return info


def run_columns(
    need: set[int],
    x: np.ndarray,
    w: np.ndarray | None,
    starts: np.ndarray,
    lengths: np.ndarray,
    stamps: np.ndarray,
) -> np.ndarray:
    """``(NCOL_ALL, runs)``: the needed columns of contiguous runs (``stamps``: one per run)."""
    cols = al.identity(len(starts))
    if w is None:
        cols[al.W] = lengths
        cols[al.S] = ssum = np.add.reduceat(x, starts)
        if al.MAX in need:
            cols[al.MAX] = np.maximum.reduceat(x, starts)
        if al.NEGMIN in need:
            cols[al.NEGMIN] = -np.minimum.reduceat(x, starts)
        if al.LAST in need:
            cols[al.LAST], cols[al.T] = x[starts + lengths - 1], stamps
        if al.M2 in need:
            dev = x - np.repeat(ssum / lengths, lengths)
            cols[al.M2] = np.add.reduceat(dev * dev, starts)
        if al.N in need:
            cols[al.N] = lengths
        if al.W2 in need:
            cols[al.W2] = lengths
        return cols
    keep = w > 0
    x0 = np.where(keep, x, 0.0)
    cols[al.W] = wsum = np.add.reduceat(w, starts)
    cols[al.S] = ssum = np.add.reduceat(w * x0, starts)
    if al.MAX in need:
        cols[al.MAX] = np.maximum.reduceat(np.where(keep, x, -np.inf), starts)
    if al.NEGMIN in need:
        cols[al.NEGMIN] = np.maximum.reduceat(np.where(keep, -x, -np.inf), starts)
    if al.LAST in need:
        idx = np.maximum.reduceat(np.where(keep, np.arange(len(x)), -1), starts)
        has = idx >= 0
        cols[al.LAST] = np.where(has, x[np.maximum(idx, 0)], 0.0)
        cols[al.T] = np.where(has, stamps, -np.inf)
    if al.M2 in need:
        mean = np.where(wsum > 0, ssum / np.where(wsum > 0, wsum, 1.0), 0.0)
        dev = x0 - np.repeat(mean, lengths)
        cols[al.M2] = np.add.reduceat(np.where(keep, w * dev * dev, 0.0), starts)
    if al.N in need:
        cols[al.N] = np.add.reduceat(keep.astype(np.float64), starts)
    if al.W2 in need:
        cols[al.W2] = np.add.reduceat(w * w, starts)
    return cols


def reduce_record(
    x: np.ndarray, w: np.ndarray | None, spec: Spec, stamp: float
) -> tuple[np.ndarray, Cells | None]:
    """One record's state column, and its sketch cells (slot 0), reduced on arrival.

    ``w`` is None, a boolean mask or float64 weights (finite, >= 0).
    NaN and infinities of a ``nan="ignore"`` metric are dropped and counted.
    """
    need = al.needed_columns(spec)
    row = al.IDENTITY.copy()
    if w is not None and w.dtype == np.bool_:
        x, w = x[w], None
    elif w is not None:
        kept = w > 0
        if not kept.all():
            x, w = x[kept], w[kept]
    with np.errstate(all="ignore"):
        if spec.nan == "ignore":
            finite = np.isfinite(x)
            if not finite.all():
                row[al.DROP] = len(x) - int(np.count_nonzero(finite))
                x = x[finite]
                w = None if w is None else w[finite]
        if not len(x):
            return row, None
        if w is None:
            row[al.W], row[al.S] = len(x), x.sum(dtype=np.float64)
            row[al.N] = row[al.W2] = len(x)
        else:
            row[al.W], row[al.S] = w.sum(), np.dot(w, x.astype(np.float64, copy=False))
            row[al.N], row[al.W2] = len(x), np.dot(w, w)
        if al.MAX in need or al.NEGMIN in need:
            row[al.MAX], row[al.NEGMIN] = x.max(), -float(x.min())  # -uint8(3) is 253
        if al.LAST in need:
            row[al.LAST], row[al.T] = float(x[-1]), stamp
        if al.M2 in need:
            x = x.astype(np.float64, copy=False)
            dev = x - row[al.S] / row[al.W] if row[al.W] > 0 else x * 0.0
            row[al.M2] = np.dot(dev, dev) if w is None else np.dot(w * dev, dev)
    if not spec.needs_sketch:
        return row, None
    return row, sketch_cells(spec, 0, x.astype(np.float64, copy=False), w)


def merge_by_slot(
    cols: np.ndarray, slot: np.ndarray, stamp: np.ndarray, info: SpecInfo
) -> tuple[np.ndarray, np.ndarray]:
    """``(slots, cols)``: rows of the same slot merged in time order (see the module docstring)."""
    if len(slot) < 2 or np.bincount(slot).max() < 2:  # one row per slot: nothing to merge
        _forget_uncarried(cols, slot, info)
        return slot, cols
    order = _time_order(slot, stamp)
    if order is not None:
        cols, slot = np.take(cols, order, axis=1), slot[order]
    starts = np.empty(len(slot), dtype=bool)
    starts[:1] = True
    np.not_equal(slot[1:], slot[:-1], out=starts[1:])
    first = np.flatnonzero(starts)
    slots = slot[first]
    if len(first) == len(slot):  # one row per slot: nothing to merge
        _forget_uncarried(cols, slots, info)
        return slots, cols
    out = al.identity(len(first))
    with np.errstate(all="ignore"):
        sums = _SUM + [c for c in _COUNTS if c in info.need]
        out[sums] = np.add.reduceat(cols[sums], first, axis=1)
        out[_MAX] = np.maximum.reduceat(cols[_MAX], first, axis=1)
        idx = np.maximum.reduceat(
            np.where(cols[al.T] > -np.inf, np.arange(cols.shape[1]), -1), first
        )
        has = idx >= 0
        out[al.LAST] = np.where(has, cols[al.LAST, np.maximum(idx, 0)], 0.0)
        out[al.T] = np.where(has, cols[al.T, np.maximum(idx, 0)], -np.inf)
        if info.carried[al.M2, slots].any():
            out[al.M2] = _chan(cols[al.W], cols[al.S], cols[al.M2], first)
    _forget_uncarried(out, slots, info)
    return slots, out


def _time_order(slot: np.ndarray, stamp: np.ndarray) -> np.ndarray | None:
    """The order that sorts rows by slot, then time; None when they are in it already."""
    if len(slot) < 2 or ((slot[1:] >= slot[:-1]).all() and _in_time(slot, stamp)):
        return None
    order = np.argsort(slot, kind="stable")  # far faster than a lexsort with the times
    if not _in_time(slot[order], stamp[order]):
        order = np.lexsort((stamp, slot))
    return order


def _in_time(slot: np.ndarray, stamp: np.ndarray) -> bool:
    """Whether the rows of each slot (slots sorted) are in time order."""
    return not ((slot[1:] == slot[:-1]) & (stamp[1:] < stamp[:-1])).any()


def _forget_uncarried(cols: np.ndarray, slots: np.ndarray, info: SpecInfo) -> None:
    """Put the identity back in the columns ``slots``' specs do not carry, where a fold
    may have written (a state depends on the records alone, not on other metrics): the
    persisted columns, as the rank columns only a sync writes."""
    n, k = al.NCOL, len(slots)
    if k >= 512 and slots[-1] - slots[0] == k - 1 and (np.diff(slots) == 1).all():
        where = info.uncarried[:, slots[0] : slots[-1] + 1]  # a range of slots: no gather
    else:
        where = info.uncarried[:, slots]
    np.copyto(cols[:n], al.IDENTITY[:n, None], where=where)


def _chan(w: np.ndarray, s: np.ndarray, m2: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Each slot's second moment: its rows (runs starting at ``first``) merged pairwise by
    Chan's formula, neighbours first, in log2(rows) vectorized rounds."""
    w, s, m2 = w.copy(), s.copy(), m2.copy()
    run = np.repeat(np.arange(len(first)), np.diff(np.r_[first, len(w)]))
    while len(run) > len(first):
        rank = np.arange(len(run)) - np.r_[first][run]  # position within the slot's rows
        left = (rank % 2 == 0) & np.r_[run[1:] == run[:-1], False]  # has a right neighbour
        a, b = np.flatnonzero(left), np.flatnonzero(left) + 1
        wa, wb = w[a], w[b]
        total = wa + wb
        delta = s[b] / np.where(wb > 0, wb, 1.0) - s[a] / np.where(wa > 0, wa, 1.0)
        both = (wa > 0) & (wb > 0)
        fix = np.where(both, wa * wb / np.where(total > 0, total, 1.0) * delta * delta, 0.0)
        m2[a], w[a], s[a] = m2[a] + m2[b] + fix, total, s[a] + s[b]
        keep = np.ones(len(run), dtype=bool)
        keep[b] = False
        w, s, m2, run = w[keep], s[keep], m2[keep], run[keep]
        first = np.flatnonzero(np.r_[True, run[1:] != run[:-1]])
    return m2


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


_NO_ROWS: np.ndarray = _frozen(al.identity(0))
_NO_SLOTS: np.ndarray = _frozen(np.zeros(0, dtype=np.int64))
_NO_STAMPS: np.ndarray = _frozen(np.zeros(0))


@dataclass
class Batch:
    """Pending samples: runs (run ``i`` is ``values[start[i]:start[i]+length[i]]``) and
    records reduced on arrival (state columns ``rows``, with their sketch cells)."""

    values: np.ndarray
    weights: np.ndarray | None  # None: every weight is 1
    slot: np.ndarray
    start: np.ndarray
    length: np.ndarray
    stamp: np.ndarray
    rows: np.ndarray = field(default_factory=lambda: _NO_ROWS)  # read-only empties
    row_slot: np.ndarray = field(default_factory=lambda: _NO_SLOTS)
    row_stamp: np.ndarray = field(default_factory=lambda: _NO_STAMPS)
    cells: list[Cells] = field(default_factory=list)


def fold(
    batch: Batch | None, specs: Sequence[Spec], key: object = None
) -> tuple[np.ndarray, np.ndarray, list[Cells]]:
    """Fold a batch into ``(slots, cols, cells)``: distinct slots, their state columns
    ``(NCOL_ALL, len(slots))``, and sketch additions (see :mod:`metricsync._fold`).

    NaN and infinities of ``nan="ignore"`` metrics are dropped here and counted. ``key``
    stands for exactly these specs, if given (see :func:`spec_info`).
    """
    if batch is None:
        return np.zeros(0, dtype=np.intp), al.identity(0), []
    cols, slot, stamp, cells = [batch.rows], [batch.row_slot], [batch.row_stamp], list(batch.cells)
    info = spec_info(specs, key)
    runs = batch.length > 0
    every = bool(runs.all())  # no empty run (the usual case): no selection to make
    if every or runs.any():
        if every:
            run_slot, start, length, run_stamp = batch.slot, batch.start, batch.length, batch.stamp
        else:
            run_slot, start, length = batch.slot[runs], batch.start[runs], batch.length[runs]
            run_stamp = batch.stamp[runs]
        x, w = batch.values, batch.weights
        if len(start) != len(batch.length):  # empty runs leave gaps: keep the samples of the rest
            take = np.repeat(start - np.r_[0, np.cumsum(length)[:-1]], length)
            take += np.arange(int(length.sum()))
            x, w = x[take], None if w is None else w[take]
            start = np.r_[0, np.cumsum(length)[:-1]]
        with np.errstate(all="ignore"):
            ignore = info.ignore[run_slot]
            drops = None
            if ignore.any():
                dropped = np.repeat(ignore, length) & ~np.isfinite(x)
                if w is not None:
                    dropped &= w > 0
                if dropped.any():
                    w = np.where(dropped, 0.0, 1.0 if w is None else w)
                    drops = np.add.reduceat(dropped.astype(np.float64), start)
            run_cols = run_columns(info.need, x, w, start, length, run_stamp)
            if drops is not None:
                run_cols[al.DROP] = drops
        cells += run_cells(specs, info.sketch[run_slot], run_slot, x, w, start, length)
        if not len(batch.row_slot):  # runs only: nothing to join them with
            return (*merge_by_slot(run_cols, run_slot, run_stamp, info), cells)
        cols.append(run_cols)
        slot.append(run_slot)
        stamp.append(run_stamp)
    slots, merged = merge_by_slot(
        np.concatenate(cols, axis=1), np.concatenate(slot), np.concatenate(stamp), info
    )
    return slots, merged, cells
