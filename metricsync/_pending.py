"""Host samples waiting to be folded into the state table, and the vectorized fold.

Python numbers go to a per-name ``array('d')`` (weighted ones to a pair of
them): the hot path of ``record`` is a dict lookup and an append, without a
lock. Arrays, lists and CPU tensors are copied into one preallocated float64
buffer, their slot, length and time into flat arrays: no Python object per
record. A fold turns every pending sample into state columns at once: runs
ordered by (slot, time), one ``reduceat`` per needed column, runs of a slot
merged with the merge algebra, and sketch cells through ``np.unique`` over
the touched cells only, never a full sketch per record.

Threads: a consuming fold swaps each number buffer for a new one and reads
the old one by copy (never exporting its memory, which an ``append``
elsewhere would then fail to resize). A thread that fetched a buffer just
before the swap may still append to it, so old buffers stay "retired" and are
read again at every fold until no other reference to them remains: no
sample of a ``record`` that returned is lost.

>>> from metricsync._spec import Spec
>>> pending = HostPending()
>>> pending.open("x", Spec("max"))
>>> pending.fast["x"].append(2.0); pending.fast["x"].append(5.0)
>>> slots, cols, cells = fold(pending.take({"x": 0}, consume=True), [Spec("max")])
>>> slots.tolist(), float(cols[2, 0])
([0], 5.0)
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _algebra as al
from ._sketch import cells_numpy, sketch_layout
from ._spec import Spec

__all__ = ["CHUNK_LIMIT", "FAST_LIMIT", "Batch", "HostPending", "fold"]

FAST_LIMIT = 4096  #: numbers a name buffers before a fold
CHUNK_LIMIT = 1 << 16  #: array samples buffered before a fold; larger arrays fold at once
_RECORD_LIMIT = 1 << 10  #: array records buffered before a fold
_FINITE = float("inf")


class StampedBuffer(array):  # type: ignore[type-arg,unused-ignore]
    """A number buffer that also keeps the time of its latest kept number (for ``last``)."""

    stamp = -np.inf
    ignore_nan = False

    def append(self, value: Any) -> None:
        array.append(self, value)
        if not self.ignore_nan or -_FINITE < value < _FINITE:
            self.stamp = al.now_us()


def _new_buffer(like: Any) -> Any:
    if isinstance(like, tuple):
        return (array("d"), array("d"))
    if isinstance(like, StampedBuffer):
        fresh = StampedBuffer("d")
        fresh.ignore_nan = like.ignore_nan
        return fresh
    return array("d")


@dataclass
class Batch:
    """Pending samples as runs: run ``i`` is ``values[start[i]:start[i]+length[i]]``."""

    values: np.ndarray
    weights: np.ndarray | None  # None: every weight is 1
    slot: np.ndarray
    start: np.ndarray
    length: np.ndarray
    stamp: np.ndarray

    def __len__(self) -> int:
        return len(self.slot)


class HostPending:
    """Pending host samples of one ``Metrics``; see the module docstring."""

    def __init__(self) -> None:
        self.fast: dict[str, Any] = {}  # name -> array('d')
        self.weighted: dict[str, tuple[Any, Any]] = {}  # name -> (values, weights)
        self._retired: list[tuple[str, Any, int]] = []  # (name, buffer or pair, read)
        self._vals = np.empty(0)
        self._wts: np.ndarray | None = None
        self._used = 0
        self._meta: list[Any] = [array("q"), array("q"), array("d"), array("b")]  # slot, n, t, w?

    def open(self, name: str, spec: Spec) -> None:
        """Give ``name`` a number buffer, so its later Python numbers take the fast path."""
        if spec.nan == "error" or name in self.fast:
            return
        if "last" in spec.reduce:
            buf = StampedBuffer("d")
            buf.ignore_nan = spec.nan == "ignore"
            self.fast[name] = buf
        else:
            self.fast[name] = array("d")
            self.weighted[name] = (array("d"), array("d"))

    def fits(self, n: int) -> bool:
        """Whether ``n`` more array samples fit before a fold."""
        return self._used + n <= CHUNK_LIMIT and len(self._meta[0]) < _RECORD_LIMIT

    def add(self, slot: int, values: np.ndarray, weights: np.ndarray | None, stamp: float) -> None:
        """Buffer (by copy) an array of checked samples; the caller made room with a fold."""
        n = len(values)
        if not len(self._vals):
            self._vals = np.empty(CHUNK_LIMIT)
        start, self._used = self._used, self._used + n
        self._vals[start : self._used] = values
        if weights is not None:
            if self._wts is None:
                self._wts = np.empty(CHUNK_LIMIT)
            self._wts[start : self._used] = weights
        slots, lengths, stamps, weighted = self._meta
        slots.append(slot)
        lengths.append(n)
        stamps.append(stamp)
        weighted.append(weights is not None)

    def forget(self, name: str) -> None:
        """Drop ``name``'s buffers (its spec changed)."""
        self.fast.pop(name, None)
        self.weighted.pop(name, None)

    def clear(self) -> None:
        """Forget every pending sample."""
        for name, buf in list(self.fast.items()):
            self.fast[name] = _new_buffer(buf)
        for name in list(self.weighted):
            self.weighted[name] = (array("d"), array("d"))
        self._retired, self._used = [], 0
        self._meta = [array("q"), array("q"), array("d"), array("b")]

    def held(self) -> set[str]:
        """Names with pending numbers (they may still be NaN that a fold drops)."""
        names = {n for n, b in self.fast.items() if len(b)}
        names.update(n for n, (v, _) in self.weighted.items() if len(v))
        names.update(n for n, _, _ in self._retired)
        return names

    def chunk_slots(self) -> set[int]:
        """Slots with pending array samples."""
        return set(self._meta[0])

    def take(self, index: Mapping[str, int], consume: bool) -> Batch | None:
        """Every pending sample as a :class:`Batch` (None if none); ``consume`` empties the
        buffers, else they are read by copy and left as they are."""
        runs: list[tuple[int, np.ndarray, np.ndarray | None, float]] = []
        now = al.now_us()
        kept: list[tuple[str, Any, int]] = []
        for name, old, done in self._retired:
            # the list entry, the loop variable and getrefcount's argument: nobody else holds
            # it, so nobody can append to it any more once it is read
            held = sys.getrefcount(old) > 3
            n = _read(runs, index[name], old, done, now)
            if held or not consume:
                kept.append((name, old, n if consume else done))
        for table in (self.fast, self.weighted):
            for name, buf in list(table.items()):
                if not len(buf[0] if isinstance(buf, tuple) else buf):
                    continue
                if consume:
                    table[name] = _new_buffer(buf)
                held = sys.getrefcount(buf) > 3  # the items list, the variable, the argument
                n = _read(runs, index[name], buf, 0, now)
                if consume and held:  # a recording thread fetched it before the swap
                    kept.append((name, buf, n))
        self._retired = kept
        batch = self._batch(runs)
        if consume:
            self._used = 0
            self._meta = [array("q"), array("q"), array("d"), array("b")]
        return batch

    def _batch(self, runs: list[tuple[int, np.ndarray, np.ndarray | None, float]]) -> Batch | None:
        slots, lengths, stamps, weighted = (np.frombuffer(a, dtype=a.typecode) for a in self._meta)
        if not runs and not len(slots):
            return None
        used = self._used
        values = np.concatenate([r[1] for r in runs] + [self._vals[:used]])
        run_len = np.array([len(r[1]) for r in runs], dtype=np.int64)
        length = np.concatenate([run_len, lengths])
        start = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64)
        weights = None
        if any(r[2] is not None for r in runs) or weighted.any():
            own = np.ones(used)
            if self._wts is not None and weighted.any():
                mine = np.repeat(weighted.astype(bool), lengths)
                own[mine] = self._wts[:used][mine]
            weights = np.concatenate(
                [r[2] if r[2] is not None else np.ones(len(r[1])) for r in runs] + [own]
            )
        return Batch(
            values,
            weights,
            np.concatenate([np.array([r[0] for r in runs], dtype=np.int64), slots]),
            start,
            length,
            np.concatenate([np.array([r[3] for r in runs]), stamps]),
        )


def _read(
    out: list[tuple[int, np.ndarray, np.ndarray | None, float]],
    slot: int,
    buf: Any,
    done: int,
    now: float,
) -> int:
    """Append ``buf``'s numbers past ``done`` to ``out`` (by copy); return how many it holds."""
    if isinstance(buf, tuple):  # another thread may be between its two appends: min length
        n = min(len(buf[0]), len(buf[1]))
        if n > done:
            w: np.ndarray | None = np.frombuffer(buf[1][done:n].tobytes())
            out.append((slot, np.frombuffer(buf[0][done:n].tobytes()), w, now))
        return n
    n = len(buf)
    if n > done:
        out.append((slot, np.frombuffer(buf[done:n].tobytes()), None, getattr(buf, "stamp", now)))
    return n


def fold(
    batch: Batch | None, specs: Sequence[Spec]
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, np.ndarray, np.ndarray]]]:
    """Fold a batch into ``(slots, cols, cells)``: distinct slots, their state columns
    ``(NCOL_ALL, len(slots))``, and ``(slot, cells, counts)`` sketch additions.

    NaN and infinities of ``nan="ignore"`` metrics are dropped here and counted.
    """
    if batch is None or not len(batch):
        return np.zeros(0, dtype=np.intp), al.identity(0), []
    # runs by slot, then by time: a metric's latest sample is in its last run (``last``)
    order = np.lexsort((batch.stamp, batch.slot))
    length = batch.length[order]
    keep_runs = length > 0
    order, length = order[keep_runs], length[keep_runs]
    if not len(order):
        return np.zeros(0, dtype=np.intp), al.identity(0), []
    run_slot, stamp = batch.slot[order], batch.stamp[order]
    run_start = np.concatenate([[0], np.cumsum(length)[:-1]])
    take = np.repeat(batch.start[order] - run_start, length) + np.arange(int(length.sum()))
    values = batch.values[take]
    weights = None if batch.weights is None else batch.weights[take]
    first = np.flatnonzero(np.r_[True, run_slot[1:] != run_slot[:-1]])
    slots = run_slot[first]
    starts = run_start[first]
    per_slot = np.diff(np.r_[starts, len(values)])
    used = [specs[s] for s in slots.tolist()]
    need = set().union(*(al.needed_columns(spec) for spec in used))
    per_run = al.identity(len(order))
    with np.errstate(all="ignore"):
        ignore = np.array([spec.nan == "ignore" for spec in used])
        if ignore.any():
            dropped = np.repeat(ignore, per_slot) & ~np.isfinite(values)
            if weights is not None:
                dropped &= weights > 0
            if dropped.any():
                weights = np.where(dropped, 0.0, 1.0 if weights is None else weights)
                per_run[al.DROP] = np.add.reduceat(dropped.astype(np.float64), run_start)
        _columns(per_run, need, values, weights, run_start, length, stamp)
        cols = _merge_runs(per_run, first)
    # a column a metric does not carry holds its identity: state depends on records only
    carried = np.array([al.carries(spec) for spec in used]).T
    cols[~carried] = np.broadcast_to(al.IDENTITY[:, None], cols.shape)[~carried]
    with np.errstate(over="ignore"):  # weight sums beyond float64 are inf, as in W
        cells = _cells(slots, used, values, weights, starts, per_slot)
    return slots, cols, cells


def _merge_runs(per_run: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Merge each slot's runs (``first``: where each slot's runs start), in order.

    Runs merge one after the other with the merge algebra (Chan's formula for
    the second moment), as separate records always have.
    """
    cols = per_run[:, first]
    counts = np.diff(np.r_[first, per_run.shape[1]])
    for j in range(1, int(counts.max())):
        more = counts > j
        cols[:, more] = al.merge(cols[:, more], per_run[:, first[more] + j], np)
    return cols


def _columns(
    cols: np.ndarray,
    need: set[int],
    x: np.ndarray,
    w: np.ndarray | None,
    starts: np.ndarray,
    lengths: np.ndarray,
    stamps: np.ndarray,
) -> None:
    """Fill the needed state columns of contiguous runs of samples (``stamps``: one per run)."""
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
        return
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


def _cells(
    slots: np.ndarray,
    specs: list[Spec],
    x: np.ndarray,
    w: np.ndarray | None,
    starts: np.ndarray,
    lengths: np.ndarray,
) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Sketch additions of the slots with sketches: only the cells their samples touch."""
    out = []
    for i, spec in enumerate(specs):
        if not spec.needs_sketch:
            continue
        layout = sketch_layout(spec.accuracy)
        part = slice(starts[i], starts[i] + lengths[i])
        weights = None if w is None else w[part]
        cell, clamped = cells_numpy(layout, x[part])
        touched, where = np.unique(cell, return_inverse=True)
        counts = np.bincount(where, weights, minlength=len(touched))
        if clamped is not None:
            extra = np.count_nonzero(clamped) if weights is None else weights[clamped].sum()
            touched = np.r_[touched, layout.clamped_cell]
            counts = np.r_[counts, extra]
        out.append((int(slots[i]), touched, counts))
    return out
