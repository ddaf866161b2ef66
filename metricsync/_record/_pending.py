"""Host samples waiting to be folded into the state table.

Python numbers append to a per-name ``array('d')`` without a lock (the hot path), weighted
ones as value-weight pairs in one call; small arrays and masked samples are listed per name,
so a name folds as one run; :mod:`metricsync._record._runs` reads everything out as one batch. A fold
copies the buffers and deletes exactly what it copied, so a late append stays for the next
fold (ARCHITECTURE.md, "Threads").

>>> from metricsync._record._fold import fold
>>> from metricsync._state._spec import Spec
>>> pending = HostPending()
>>> pending.open("x", Spec("max"))
>>> pending.fast["x"].append(2.0); pending.fast["x"].append(5.0)
>>> slots, cols, cells = fold(pending.take({"x": 0}, consume=True), [Spec("max")])
>>> slots.tolist(), float(cols[2, 0])
([0], 5.0)
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import compress, islice, repeat
from typing import Any

import numpy as np

from .._state import _algebra as al
from .._state._spec import Spec
from ._fold import Batch, Cells
from ._runs import Chunk, Rows, Runs, copy_numbers, to_batch

__all__ = ["CHUNK_LIMIT", "FAST_LIMIT", "PAIR_LIMIT", "Captured", "Held", "HostPending"]

FAST_LIMIT = 4096  #: numbers a name buffers before a fold
PAIR_LIMIT = 2 * FAST_LIMIT  #: floats a weighted buffer holds before a fold (value, weight)
CHUNK_LIMIT = 1 << 16  #: array samples buffered before a fold; larger arrays fold at once
_RECORD_LIMIT = 1 << 10  #: array records buffered before a fold
_JOINED_MAX = 64  #: arrays of at most this many samples join their name's number buffer
_FINITE = float("inf")


class StampedBuffer(array):  # type: ignore[type-arg,unused-ignore]
    """A number buffer that also keeps the time of its latest kept number (for ``last``)."""

    stamp = -np.inf
    ignore_nan = False

    def append(self, value: Any) -> None:
        if self.ignore_nan and not -_FINITE < value < _FINITE:
            array.append(self, value)
            return
        # the time first, then the number: a fold between them sees the old numbers with
        # the new time, and the number landing after it makes the next one fold again (see
        # Store.folded); in the other order a fold kept between them would keep the old time
        before, self.stamp = self.stamp, al.now_us()
        try:
            array.append(self, value)
        except BaseException:
            self.stamp = before
            raise


_WHOLE = slice(None)


@dataclass
class Held:
    """Every pending sample of a :class:`HostPending`, as plain arrays, laid out as it holds
    them (a checkpoint carries this, so that a restored ``Metrics`` folds them, and what
    follows, at the same points and in the same runs as the one that wrote it)."""

    #: name, its number buffer's numbers, the time of a ``last`` metric's latest number
    numbers: list[tuple[str, np.ndarray, float | None]] = field(default_factory=list)
    pairs: list[tuple[str, np.ndarray, np.ndarray]] = field(default_factory=list)  # weighted
    #: numbers read as their own run, apart from their name's buffer (checkpoints of
    #: versions that kept a buffer swapped out while a thread held it): name, values,
    #: weights, time
    retired: list[tuple[str, np.ndarray, np.ndarray | None, float | None]] = field(
        default_factory=list
    )
    arrays: list[tuple[str, list[np.ndarray]]] = field(default_factory=list)  # see ``extend``
    chunk: list[tuple[int, np.ndarray, np.ndarray | None, float]] = field(default_factory=list)
    rows: list[tuple[int, np.ndarray, float]] = field(default_factory=list)  # slot, column, time
    cells: list[Cells] = field(default_factory=list)  # the sketch cells of the rows


class HostPending:
    """Pending host samples of one ``Metrics``; see the module docstring."""

    def __init__(self) -> None:
        self.fast: dict[str, Any] = {}  # name -> array('d')
        self.weighted: dict[str, array] = {}  # name -> array('d'): value, weight, value, ...
        self._leftover: list[tuple[str, np.ndarray, np.ndarray | None, float | None]] = []
        self._vals = np.empty(0)
        self._wts: np.ndarray | None = None
        self._used = 0
        self._arrays: dict[str, list[np.ndarray]] = {}  # see ``extend``
        self._extended = 0  # samples in ``_arrays``
        self._meta: list[Any] = [array("q"), array("q"), array("d"), array("b")]  # slot, n, t, w?
        self._rows = Rows()  # records reduced on arrival
        self._removed = 0  # names ``fast`` lost so far (it gains names only at its end)
        self._order: tuple[int, int, np.ndarray, np.ndarray] | None = None  # see _order_of
        self._stamped: set[str] = set()  # names whose buffer is a StampedBuffer

    def open(self, name: str, spec: Spec) -> None:
        """Give ``name`` a number buffer, so its later Python numbers take the fast path."""
        if spec.nan == "error" or name in self.fast:
            return
        if "last" in spec.reduce:
            buf = StampedBuffer("d")
            buf.ignore_nan = spec.nan == "ignore"
            self.fast[name] = buf
            self._stamped.add(name)
        else:
            self.fast[name] = array("d")

    def open_weighted(self, name: str, spec: Spec) -> array | None:
        """Give ``name`` a buffer for weighted Python numbers (the fast path), which
        ``fromlist([value, weight])`` appends to: one call, so that two threads recording
        the name never interleave a value with another's weight; return it (None where
        its spec takes none: ``last`` and ``nan="error"``)."""
        if spec.nan == "error" or "last" in spec.reduce:
            return None
        pair = self.weighted.get(name)
        if pair is None:
            pair = self.weighted[name] = array("d")
        return pair

    def fits(self, n: int) -> bool:
        """Whether ``n`` more array samples (or one reduced record) fit before a fold."""
        records = len(self._meta[0]) + len(self._rows.slot)
        return self._used + self._extended + n <= CHUNK_LIMIT and records < _RECORD_LIMIT

    def add_row(self, slot: int, row: np.ndarray, cells: Cells | None, stamp: float) -> None:
        """Keep one record reduced on arrival (its cells give slot 0: replaced by ``slot``)."""
        self._rows.add(slot, row, None if cells is None else (slot, *cells[1:]), stamp)

    def extend(self, name: str, values: np.ndarray, owned: bool = False) -> bool:
        """Keep unweighted array samples (checked, 1-D) of a name with a plain number buffer:
        a few join that buffer (where a list of numbers goes, so a name's numbers, lists and
        small arrays fold as one run), more are kept as a copy (none if ``owned``: a fresh
        array nobody else holds), listed under the name so that its arrays fold as one run.
        False when its buffer is not plain (a ``last`` metric's keeps the time of its latest
        number). The caller made room with a fold."""
        buf = self.fast.get(name)
        if buf.__class__ is not array:
            return False
        if len(values) <= _JOINED_MAX and len(buf) + len(values) <= FAST_LIMIT:
            buf.frombytes(np.asarray(values, dtype=np.float64).tobytes())  # one C call
            return True
        kept = values if owned else np.array(values, dtype=np.float64)
        arrays = self._arrays.get(name)
        if arrays is None:
            self._arrays[name] = [kept]
        else:
            arrays.append(kept)
        self._extended += len(kept)
        return True

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
        if self.fast.pop(name, None) is not None:
            self._removed += 1
        self._stamped.discard(name)
        self.weighted.pop(name, None)
        self._arrays.pop(name, None)

    def clear(self) -> None:
        """Forget every pending sample."""
        # in place: the record path holds the buffers (C loops: a reset of 10,000 names)
        _delete(list(compress(self.fast.values(), self.fast.values())), None)
        for name in self._stamped:
            self.fast[name].stamp = -np.inf
        _delete(list(compress(self.weighted.values(), self.weighted.values())), None)
        self._leftover, self._used, self._rows = [], 0, Rows()
        self._arrays, self._extended = {}, 0
        self._meta = [array("q"), array("q"), array("d"), array("b")]

    def empty(self) -> bool:
        """Whether no sample is pending."""
        if self._leftover or self._used or self._rows.slot or self._arrays:
            return False
        if any(self.fast.values()):
            return False
        return not any(self.weighted.values())

    def appended(self) -> int:
        """How many numbers the number buffers hold: only an append (the lock-free path
        of ``Metrics.record``) changes it between the changes the store's lock covers.

        >>> pending = HostPending(); pending.open("x", Spec())
        >>> pending.fast["x"].append(1.0); pending.appended()
        1
        """
        n = sum(map(len, self.fast.values()))
        if self.weighted:
            n += sum(map(len, self.weighted.values()))
        return n

    def held(self) -> set[str]:
        """Names with pending numbers (they may still be NaN that a fold drops)."""
        names = {n for n, b in self.fast.items() if len(b)}
        names.update(n for n, b in self.weighted.items() if len(b))
        names.update(entry[0] for entry in self._leftover)
        names.update(self._arrays)
        return names

    def chunk_slots(self) -> set[int]:
        """Slots with pending array samples."""
        return set(self._meta[0]) | set(self._rows.slot)

    def untouched(self) -> bool:
        """Whether no buffer was opened and nothing is pending (a decoded result's store).

        >>> pending = HostPending(); pending.untouched()
        True
        >>> pending.open("x", Spec()); pending.untouched()
        False
        """
        return not (
            self.fast or self.weighted or self._leftover or self._arrays or self._used
        ) and not (len(self._meta[0]) or len(self._rows.slot))

    def take(self, index: Mapping[str, int], consume: bool) -> Batch | None:
        """Every pending sample as a :class:`Batch` (None if none); ``consume`` empties the
        buffers of what was read (a number appended meanwhile stays), else they are read
        by copy and left as they are."""
        if self.untouched():
            return None
        now = al.now_us()
        runs = Runs()
        self._read_numbers(runs, index, now, consume)
        runs.read_arrays(index, self._arrays, now)
        batch = self._batch(runs)
        if consume:
            self._arrays, self._extended = {}, 0
            self._used, self._rows = 0, Rows()
            self._meta = [array("q"), array("q"), array("d"), array("b")]
        return batch

    def _read_numbers(
        self, runs: Runs, index: Mapping[str, int], now: float, consume: bool
    ) -> None:
        """Add every number buffer's numbers to ``runs``; ``consume`` deletes from each
        buffer the numbers its copy held (see the module docstring)."""
        for name, values, weights, stamp in self._leftover:  # nobody else holds these
            wts = None if weights is None else weights.tobytes()
            runs.add(index[name], values.tobytes(), wts, now if stamp is None else stamp)
        if consume:
            self._leftover = []
        bufs = list(self.fast.values())  # in the order of the names in ``fast``
        slots, stamped = self._order_of(index)
        if consume:  # only the buffers holding numbers (a C loop: they may all be empty)
            busy = np.flatnonzero(np.fromiter(map(len, bufs), dtype=np.int64, count=len(bufs)))
            if len(busy) < len(bufs):
                bufs = [bufs[i] for i in busy.tolist()]
                slots = slots[busy]
                if len(stamped):
                    stamped = np.flatnonzero(np.isin(busy, stamped))
        data, counts = copy_numbers(bufs)  # exactly what it read of each
        stamps = np.full(len(bufs), now)  # read after the numbers: no number is later
        if len(stamped):
            stamps[stamped] = [bufs[i].stamp for i in stamped.tolist()]
        runs.add_bulk(data, counts, slots, stamps)
        if consume:
            _delete(bufs, counts.tolist())
        pairs = [item for item in self.weighted.items() if item[1]]
        for name, pair in pairs:
            n = runs.add_pairs(index[name], array.tobytes(pair), now)
            if consume:
                _delete([pair], [n])

    def export(self) -> Held:
        """Every pending sample, copied, as this object holds it (the caller holds the
        store's lock; the lock-free appends of ``record`` may still add numbers)."""
        held = Held()
        for name, buf in self.fast.items():
            if len(buf):
                stamp = buf.stamp if buf.__class__ is StampedBuffer else None
                held.numbers.append((name, np.frombuffer(buf.tobytes()), stamp))
        for name, pair in self.weighted.items():
            both = np.frombuffer(pair.tobytes())
            n = len(both) // 2
            if n:
                held.pairs.append((name, both[0 : 2 * n : 2].copy(), both[1 : 2 * n : 2].copy()))
        held.retired = list(self._leftover)  # never changed: see restore
        held.arrays = [(name, list(parts)) for name, parts in self._arrays.items()]
        start = 0
        slots, lengths, stamps, weighted = self._meta
        for slot, n, stamp, has in zip(slots, lengths, stamps, weighted):
            wts = self._wts[start : start + n].copy() if has and self._wts is not None else None
            held.chunk.append((slot, self._vals[start : start + n].copy(), wts, stamp))
            start += n
        rows = self._rows
        held.rows = [
            (slot, rows.cols[:, i].copy(), stamp)
            for i, (slot, stamp) in enumerate(zip(rows.slot, rows.stamp))
        ]
        held.cells = list(rows.cells)
        return held

    def restore(self, held: Held, specs: Mapping[str, Spec]) -> None:
        """Hold ``held`` (checked: see :mod:`metricsync._record._resume`) as :meth:`export` found
        it; ``specs`` maps its names to their specs. Nothing may be pending here yet."""
        for name, values, stamp in held.numbers:
            self.open(name, specs[name])
            buf = self.fast[name]
            buf.frombytes(values.astype(np.float64).tobytes())
            if stamp is not None:
                buf.stamp = stamp
        for name, values, paired in held.pairs:
            pair = self.open_weighted(name, specs[name])
            assert pair is not None  # checked by the decoder
            both = np.column_stack([values, paired]).astype(np.float64)
            pair.frombytes(both.tobytes())  # C order: value, weight, value, ...
        for name, values, weights, stamp in held.retired:
            if len(values):
                wts = None if weights is None else np.array(weights, dtype=np.float64)
                self._leftover.append((name, np.array(values, dtype=np.float64), wts, stamp))
        for name, parts in held.arrays:
            self._arrays[name] = list(parts)
            self._extended += sum(map(len, parts))
        for slot, values, weights, stamp in held.chunk:
            self.add(slot, values, weights, stamp)
        for slot, row, stamp in held.rows:
            self._rows.add(slot, row, None, stamp)
        self._rows.cells = list(held.cells)

    def _order_of(self, index: Mapping[str, int]) -> tuple[np.ndarray, np.ndarray]:
        """The slot of each name of ``fast``, in its order, and the positions of the
        buffers that keep their own time (cached; names added since extend the cache)."""
        known = 0
        if self._order is not None and self._order[0] == self._removed:
            known = self._order[1]
        if known == len(self.fast) and self._order is not None:
            return self._order[2], self._order[3]
        added = list(islice(self.fast.items(), known, None))
        slots = np.array([index[name] for name, _ in added], dtype=np.int64)
        stamped = [known + i for i, (_, buf) in enumerate(added) if buf.__class__ is StampedBuffer]
        if known:
            assert self._order is not None
            slots = np.concatenate([self._order[2], slots])
            stamped = self._order[3].tolist() + stamped
        self._order = (self._removed, len(self.fast), slots, np.array(stamped, dtype=np.intp))
        return self._order[2], self._order[3]

    def capture(self, index: Mapping[str, int]) -> Captured:
        """The pending samples of this moment, to fold later (on another thread) without
        changing anything here: the numbers copied (one call per buffer, as a fold reads
        them) and the array samples copied. The caller holds the store's lock; ``index``
        maps names to slots."""
        now = al.now_us()
        runs = Runs()
        self._read_numbers(runs, index, now, consume=False)
        used, wts = self._used, self._wts
        chunk = Chunk(
            used,
            self._vals[:used].copy(),
            None if wts is None else wts[:used].copy(),
            [a[:] for a in self._meta],
            self._rows.copy(),
        )
        arrays = {name: parts[:] for name, parts in self._arrays.items()}  # never changed
        return Captured(runs, chunk, arrays, now)

    def _batch(self, runs: Runs) -> Batch | None:
        return to_batch(runs, Chunk(self._used, self._vals, self._wts, self._meta, self._rows))


def _delete(bufs: list[Any], counts: list[int] | None) -> None:
    """Delete the first ``counts[i]`` numbers of each of ``bufs`` (all of them where
    ``counts`` is None), in place: one call each (numbers appended since stay), in a C
    loop."""
    cuts = repeat(_WHOLE, len(bufs)) if counts is None else map(slice, counts)
    deque(map(array.__delitem__, bufs, cuts), maxlen=0)


class Captured:
    """Pending samples captured by :meth:`HostPending.capture`; ``batch`` reads them."""

    def __init__(self, runs: Runs, chunk: Chunk, arrays: dict[str, list[np.ndarray]], now: float):
        self._runs = runs  # the numbers, copied
        self._chunk = chunk  # a HostPending holding copies of the array samples
        self._arrays = arrays  # name -> its listed arrays (see HostPending.extend)
        self._now = now

    def batch(self, index: Mapping[str, int]) -> Batch | None:
        """Every captured sample as a :class:`Batch` (None if none), as ``take`` would
        have given at the capture; ``index`` maps names to slots (the capture's). Reads
        once."""
        runs, self._runs = self._runs, Runs()
        runs.read_arrays(index, self._arrays, self._now)
        return to_batch(runs, self._chunk)
