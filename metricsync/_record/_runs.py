"""Buffered samples read out as one :class:`~metricsync._record._fold.Batch`.

The types through which a fold (or an async sync's worker) reads what
:mod:`metricsync._record._pending` holds: number buffers, listed arrays, the copy buffer.

>>> from array import array
>>> runs = Runs()
>>> runs.read(3, array("d", [1.0, 2.0]), now=5.0)
2
>>> empty = Chunk(0, np.empty(0), None, [array("q"), array("q"), array("d"), array("b")], Rows())
>>> batch = to_batch(runs, empty)
>>> batch.values.tolist(), batch.slot.tolist(), batch.length.tolist()
([1.0, 2.0], [3], [2])
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from .._state import _algebra as al
from ._fold import Batch, Cells

__all__ = ["Chunk", "Rows", "Runs", "copy_numbers", "to_batch"]


class Chunk(NamedTuple):
    """The array samples of a ``HostPending`` (its chunk buffer and reduced rows)."""

    used: int
    vals: np.ndarray
    wts: np.ndarray | None
    meta: list[Any]
    rows: Rows


class Rows:
    """Records reduced on arrival: their state columns side by side, slots, times, cells."""

    __slots__ = ("cells", "cols", "slot", "stamp")

    def __init__(self) -> None:
        self.cols = np.empty((al.NCOL_ALL, 0))  # allocated by the first record
        self.slot = array("q")
        self.stamp = array("d")
        self.cells: list[Cells] = []

    def add(self, slot: int, row: np.ndarray, cells: Cells | None, stamp: float) -> None:
        """Keep one record's state column (a bounded number of them between folds)."""
        n = len(self.slot)
        if n == self.cols.shape[1]:
            self.cols = np.concatenate([self.cols, np.empty((al.NCOL_ALL, max(n, 16)))], axis=1)
        self.cols[:, n] = row
        self.slot.append(slot)
        self.stamp.append(stamp)
        if cells is not None:
            self.cells.append(cells)

    def copy(self) -> Rows:
        """An independent copy."""
        out = Rows()
        out.cols = self.cols[:, : len(self.slot)].copy()
        out.slot, out.stamp, out.cells = self.slot[:], self.stamp[:], list(self.cells)
        return out


def to_batch(runs: Runs, chunk: Chunk) -> Batch | None:
    """``runs`` and ``chunk`` as one :class:`Batch` (None if both are empty)."""
    if len(runs.bulk) == 1 and not runs.slot and not chunk.meta[0] and not chunk.rows.slot:
        data, counts, slots, stamps = runs.bulk[0]  # the usual case: number buffers only,
        parts = [np.frombuffer(data)]  # and arrays listed by name
        if runs.arrays:
            counts = np.concatenate([counts, np.array(runs.array_count, dtype=np.int64)])
            slots = np.concatenate([slots, np.array(runs.array_slot, dtype=np.int64)])
            stamps = np.concatenate([stamps, np.array(runs.array_stamp, dtype=np.float64)])
            parts += runs.arrays
        start = np.zeros(len(counts), dtype=np.int64)
        np.cumsum(counts[:-1], out=start[1:])
        return Batch(_joined(parts), None, slots, start, counts, stamps)
    slots, lengths, stamps, weighted = (np.frombuffer(a, dtype=a.typecode) for a in chunk.meta)
    rows = chunk.rows
    if not runs.slot and not runs.bulk and not runs.arrays and not len(slots) and not rows.slot:
        return None
    used = chunk.used
    bulk_len = [counts for _, counts, _, _ in runs.bulk]
    run_len = np.array(runs.count, dtype=np.int64)
    array_len = np.array(runs.array_count, dtype=np.int64)
    joined = b"".join([data for data, _, _, _ in runs.bulk] + runs.values)
    values = _joined([np.frombuffer(joined), *runs.arrays, chunk.vals[:used]])
    length = np.concatenate([*bulk_len, run_len, array_len, lengths])
    start = np.zeros(len(length), dtype=np.int64)
    np.cumsum(length[:-1], out=start[1:])
    weights = None
    if runs.weighted or weighted.any():
        own = np.ones(used)
        if chunk.wts is not None and weighted.any():
            mine = np.repeat(weighted.astype(bool), lengths)
            own[mine] = chunk.wts[:used][mine]
        listed = b"".join(
            w if w is not None else _ONE * n for w, n in zip(runs.weights, runs.count)
        )
        ones = np.ones(int(sum(int(c.sum()) for c in bulk_len)))
        weights = np.concatenate([ones, np.frombuffer(listed), np.ones(int(array_len.sum())), own])
    batch = Batch(
        values,
        weights,
        np.concatenate(
            [
                *(s for _, _, s, _ in runs.bulk),
                np.array(runs.slot + runs.array_slot, dtype=np.int64),
                slots,
            ]
        ),
        start,
        length,
        np.concatenate(
            [
                *(t for _, _, _, t in runs.bulk),
                np.array(runs.stamp + runs.array_stamp, dtype=np.float64),
                stamps,
            ]
        ),
    )
    if rows.slot:
        batch.rows = rows.cols[:, : len(rows.slot)]
        batch.row_slot = np.array(rows.slot, dtype=np.int64)  # copies: the arrays grow
        batch.row_stamp = np.array(rows.stamp, dtype=np.float64)
        batch.cells = rows.cells
    return batch


_ONE = np.ones(1).tobytes()


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """``parts`` as one float64 array: the only part as it is (read-only: a fold only
    reads), else one copy of them all."""
    nonempty = [p for p in parts if len(p)] or parts[:1]
    if len(nonempty) == 1 and nonempty[0].dtype == np.float64:
        return nonempty[0]
    return np.concatenate(nonempty, dtype=np.float64)


def copy_numbers(bufs: list[Any]) -> tuple[bytes, np.ndarray]:
    """The numbers of number buffers ``bufs``, joined, and how many each held: exactly
    the numbers read, whatever other threads append meanwhile (a consuming fold deletes
    those). Under the GIL, one ``join`` of the arrays themselves (one copy: as they are
    mutable, it holds the GIL throughout, so no append lands midway); an append between
    the lengths and the join makes the total disagree. Then, and without a GIL (where an
    append to an exported array would fail), a copy of each buffer, taken in one call."""
    if _gil_enabled():
        counts = np.fromiter(map(len, bufs), dtype=np.int64, count=len(bufs))
        data = b"".join(bufs)
        if len(data) == 8 * int(counts.sum()):
            return data, counts
    copies = list(map(array.tobytes, bufs))  # a C loop (number buffers are arrays)
    counts = np.fromiter(map(len, copies), dtype=np.int64, count=len(copies)) >> 3
    return b"".join(copies), counts


_gil_enabled: Callable[[], bool] = getattr(sys, "_is_gil_enabled", lambda: True)


class Runs:
    """Buffered numbers read out as runs: bytes, count, slot and time of each."""

    __slots__ = (
        "array_count",
        "array_slot",
        "array_stamp",
        "arrays",
        "bulk",
        "count",
        "slot",
        "stamp",
        "values",
        "weighted",
        "weights",
    )

    def __init__(self) -> None:
        # unweighted runs read many at a time: (bytes, counts, slots, stamps)
        self.bulk: list[tuple[bytes, np.ndarray, np.ndarray, np.ndarray]] = []
        self.values: list[bytes] = []
        self.weights: list[bytes | None] = []
        self.count: list[int] = []
        self.slot: list[int] = []
        self.stamp: list[float] = []
        self.weighted = False
        # arrays listed by name (HostPending.extend): one run per name, after the numbers
        self.arrays: list[np.ndarray] = []
        self.array_count: list[int] = []  # samples in each run
        self.array_slot: list[int] = []
        self.array_stamp: list[float] = []

    def read(self, slot: int, buf: Any, now: float) -> int:
        """Add ``buf``'s numbers (a copy taken in one call, so an append elsewhere neither
        fails nor slips in between); return how many it holds."""
        data = buf.tobytes()
        n = len(data) // 8
        if n:
            self.add(slot, data, None, getattr(buf, "stamp", now), n)
        return n

    def add_pairs(self, slot: int, data: bytes, now: float) -> int:
        """Add a weighted buffer's samples from its copy ``data`` (value, weight, value,
        ...: ``array.tobytes``); return how many floats it held."""
        n = len(data) // 16
        if n:
            both = np.frombuffer(data, count=2 * n)
            self.add(slot, both[0::2].tobytes(), both[1::2].tobytes(), now, n)
        return 2 * n

    def read_arrays(
        self, index: Mapping[str, int], arrays: Mapping[str, list[np.ndarray]], now: float
    ) -> None:
        """Add the arrays listed under each name (read, not copied) as one run per name."""
        for name, parts in arrays.items():
            self.arrays += parts
            self.array_count.append(sum(map(len, parts)))
            self.array_slot.append(index[name])
            self.array_stamp.append(now)

    def read_bulk(self, bufs: list[Any], slots: np.ndarray, stamps: np.ndarray) -> np.ndarray:
        """Add the numbers of number buffers ``bufs`` (see :func:`copy_numbers`), of slots
        ``slots``, stamped ``stamps``; return how many each holds."""
        data, counts = copy_numbers(bufs)
        self.add_bulk(data, counts, slots, stamps)
        return counts

    def add_bulk(
        self, data: bytes, counts: np.ndarray, slots: np.ndarray, stamps: np.ndarray
    ) -> None:
        """Add number buffers' numbers ``data``: ``counts[i]`` of them of slot ``slots[i]``,
        stamped ``stamps[i]`` (as :func:`copy_numbers` read them)."""
        held = counts > 0
        if held.any():
            self.bulk.append((data, counts[held], slots[held], stamps[held]))

    def add(
        self, slot: int, values: bytes, weights: bytes | None, stamp: float, n: int = -1
    ) -> None:
        """Add one run: ``values`` (float64 bytes), their weights, slot and time."""
        n = len(values) // 8 if n < 0 else n
        self.values.append(values)
        self.weights.append(weights)
        self.weighted |= weights is not None
        self.count.append(n)
        self.slot.append(slot)
        self.stamp.append(stamp)
