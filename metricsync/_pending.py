"""Host samples waiting to be folded into the state table.

Python numbers append to a per-name ``array('d')`` without a lock (the hot path); small arrays
and masked samples are listed per name, so a name folds as one run; :mod:`metricsync._runs`
reads everything out as one batch. Buffers are swapped, never truncated, so a thread's late
append is not lost and a capture can read later.

>>> from metricsync._fold import fold
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
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import compress, islice, repeat
from typing import Any

import numpy as np

from . import _algebra as al
from ._fold import Batch, Cells
from ._runs import Chunk, Rows, Runs, to_batch
from ._spec import Spec

__all__ = ["CHUNK_LIMIT", "FAST_LIMIT", "Captured", "Held", "HostPending"]

FAST_LIMIT = 4096  #: numbers a name buffers before a fold
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


_EMPTY = array("d")  #: an empty buffer: a slice of it is a new one, made faster than array("d")
_WHOLE = slice(None)


def _new_stamped(like: StampedBuffer) -> StampedBuffer:
    fresh = StampedBuffer("d")
    fresh.ignore_nan = like.ignore_nan
    return fresh


@dataclass
class Held:
    """Every pending sample of a :class:`HostPending`, as plain arrays, laid out as it holds
    them (a checkpoint carries this, so that a restored ``Metrics`` folds them, and what
    follows, at the same points and in the same runs as the one that wrote it)."""

    #: name, its number buffer's numbers, the time of a ``last`` metric's latest number
    numbers: list[tuple[str, np.ndarray, float | None]] = field(default_factory=list)
    pairs: list[tuple[str, np.ndarray, np.ndarray]] = field(default_factory=list)  # weighted
    #: buffers a fold swapped out while another thread held them: name, values, weights, time
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
        self.weighted: dict[str, tuple[Any, Any]] = {}  # name -> (values, weights)
        self._retired: list[tuple[str, Any, int]] = []  # (name, buffer or pair, read)
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

    def open_weighted(self, name: str, spec: Spec) -> tuple[Any, Any] | None:
        """Give ``name`` a pair of buffers for weighted Python numbers (the fast path);
        return it (None where its spec takes none: ``last`` and ``nan="error"``)."""
        if spec.nan == "error" or "last" in spec.reduce:
            return None
        pair = self.weighted.get(name)
        if pair is None:
            pair = self.weighted[name] = (array("d"), array("d"))
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
        # the same keys: the dict is updated in place, and the record path holds it
        self._renew(list(compress(self.fast, self.fast.values())))  # those holding numbers
        self.weighted.update(
            {n: (_EMPTY[:], _EMPTY[:]) for n, (v, _) in self.weighted.items() if v}
        )
        self._retired, self._used, self._rows = [], 0, Rows()
        self._arrays, self._extended = {}, 0
        self._meta = [array("q"), array("q"), array("d"), array("b")]

    def empty(self) -> bool:
        """Whether no sample is pending."""
        if self._retired or self._used or self._rows.slot or self._arrays:
            return False
        if any(self.fast.values()):
            return False
        return not any(values for values, _ in self.weighted.values())

    def appended(self) -> int:
        """How many numbers the number buffers hold: only an append (the lock-free path
        of ``Metrics.record``) changes it between the changes the store's lock covers.

        >>> pending = HostPending(); pending.open("x", Spec())
        >>> pending.fast["x"].append(1.0); pending.appended()
        1
        """
        n = sum(map(len, self.fast.values()))
        if self.weighted:
            n += sum(len(v) + len(w) for v, w in self.weighted.values())
        for _, buf, _ in self._retired:
            n += len(buf[0]) + len(buf[1]) if isinstance(buf, tuple) else len(buf)
        return n

    def held(self) -> set[str]:
        """Names with pending numbers (they may still be NaN that a fold drops)."""
        names = {n for n, b in self.fast.items() if len(b)}
        names.update(n for n, (v, _) in self.weighted.items() if len(v))
        names.update(n for n, _, _ in self._retired)
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
            self.fast or self.weighted or self._retired or self._arrays or self._used
        ) and not (len(self._meta[0]) or len(self._rows.slot))

    def take(self, index: Mapping[str, int], consume: bool) -> Batch | None:
        """Every pending sample as a :class:`Batch` (None if none); ``consume`` empties the
        buffers, else they are read by copy and left as they are."""
        if self.untouched():
            return None
        now = al.now_us()
        runs = Runs()
        kept: list[tuple[str, Any, int]] = []
        for name, old, done in self._retired:
            # the list entry, the loop variable and getrefcount's argument: nobody else holds
            # it, so nobody can append to it any more once it is read
            held = sys.getrefcount(old) > 3
            n = runs.read(index[name], old, done, now)
            if held or not consume:
                kept.append((name, old, n if consume else done))
        bufs = list(self.fast.values())  # in the order of the names in ``fast``
        slots, stamped = self._order_of(index)
        if consume:  # swap out the buffers holding numbers first, then read them
            names = list(self.fast)
            busy: list[int] = []
            if any(bufs):  # a C loop: the buffers may all be empty
                sizes = np.fromiter(map(len, bufs), dtype=np.int64, count=len(bufs))
                busy = np.flatnonzero(sizes).tolist()
            self._renew(names if len(busy) == len(names) else [names[i] for i in busy])
            taken = [bufs[i] for i in busy]
            stamps = [buf.stamp if buf.__class__ is StampedBuffer else now for buf in taken]
            counts = runs.read_bulk(taken, slots[busy], np.array(stamps, dtype=np.float64))
            del taken
            for i, n in zip(busy, counts.tolist()):
                # the list entry, the variable and getrefcount's argument: a recording
                # thread that fetched the buffer before the swap holds one more
                buf = bufs[i]
                if sys.getrefcount(buf) > 3:
                    kept.append((names[i], buf, n))
        else:
            stamps_all = np.full(len(bufs), now)
            if len(stamped):
                stamps_all[stamped] = [bufs[i].stamp for i in stamped.tolist()]
            runs.read_bulk(bufs, slots, stamps_all)
        pairs = [item for item in self.weighted.items() if item[1][0]]
        if consume:
            self.weighted.update({name: (_EMPTY[:], _EMPTY[:]) for name, _ in pairs})
        for name, pair in pairs:
            n = runs.read(index[name], pair, 0, now)
            if consume and sys.getrefcount(pair) > 3:
                kept.append((name, pair, n))
        self._retired = kept
        runs.read_arrays(index, self._arrays, now)
        batch = self._batch(runs)
        if consume:
            self._arrays, self._extended = {}, 0
            self._used, self._rows = 0, Rows()
            self._meta = [array("q"), array("q"), array("d"), array("b")]
        return batch

    def export(self) -> Held:
        """Every pending sample, copied, as this object holds it (the caller holds the
        store's lock; the lock-free appends of ``record`` may still add numbers)."""
        held = Held()
        for name, buf in self.fast.items():
            if len(buf):
                stamp = buf.stamp if buf.__class__ is StampedBuffer else None
                held.numbers.append((name, np.frombuffer(buf.tobytes()), stamp))
        for name, pair in self.weighted.items():
            n = _length(pair)
            if n:
                values, weights = (np.frombuffer(b.tobytes())[:n] for b in pair)
                held.pairs.append((name, values, weights))
        for name, buf, done in self._retired:
            n = _length(buf)
            if n > done:
                if isinstance(buf, tuple):
                    v, w = (np.frombuffer(b.tobytes())[done:n] for b in buf)
                    held.retired.append((name, v, w, None))
                else:
                    stamp = buf.stamp if isinstance(buf, StampedBuffer) else None
                    held.retired.append((name, np.frombuffer(buf.tobytes())[done:n], None, stamp))
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
        """Hold ``held`` (checked: see :mod:`metricsync._resume`) as :meth:`export` found
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
            pair[0].frombytes(values.astype(np.float64).tobytes())
            pair[1].frombytes(paired.astype(np.float64).tobytes())
        for name, values, weights, stamp in held.retired:
            if weights is not None:
                self._retired.append((name, (_buffer(values), _buffer(weights)), 0))
            elif stamp is not None:
                buf = StampedBuffer("d")
                buf.frombytes(values.astype(np.float64).tobytes())
                buf.stamp = stamp
                self._retired.append((name, buf, 0))
            else:
                self._retired.append((name, _buffer(values), 0))
        for name, parts in held.arrays:
            self._arrays[name] = list(parts)
            self._extended += sum(map(len, parts))
        for slot, values, weights, stamp in held.chunk:
            self.add(slot, values, weights, stamp)
        for slot, row, stamp in held.rows:
            self._rows.add(slot, row, None, stamp)
        self._rows.cells = list(held.cells)

    def _renew(self, names: list[str]) -> None:
        """Swap the number buffers of ``names`` for new empty ones of their kinds. Each name
        is given its new buffer once (none holds one of another kind in between), and the
        plain ones are made and stored by C loops: a reset of 10,000 names swaps them all."""
        fast = self.fast
        odd = self._stamped.intersection(names) if self._stamped else ()
        stamped = {name: _new_stamped(fast[name]) for name in odd}
        plain = [name for name in names if name not in odd] if odd else names
        fast.update(zip(plain, map(_EMPTY.__getitem__, repeat(_WHOLE, len(plain)))))
        fast.update(stamped)

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

    def capture(self) -> Captured:
        """The pending samples of this moment, to read later (on another thread) without
        changing anything here: each number buffer with its length now (buffers only grow
        in place; a fold or ``clear`` swaps them out, never truncates them) and a copy of
        the array samples. The caller holds the store's lock."""
        now = al.now_us()
        numbers = [(name, old, done, _length(old), now) for name, old, done in self._retired]
        for i, (name, buf, done, n, _) in enumerate(numbers):
            if n > done and isinstance(buf, StampedBuffer):  # its time now, not at the read
                numbers[i] = (name, buf, done, n, buf.stamp)
        numbers += [  # the length first, then the time, as above
            (name, buf, 0, len(buf), buf.stamp if buf.__class__ is StampedBuffer else now)
            for name, buf in self.fast.items()
            if buf
        ]
        numbers += [(name, pair, 0, _length(pair), now) for name, pair in self.weighted.items()]
        used, wts = self._used, self._wts
        chunk = Chunk(
            used,
            self._vals[:used].copy(),
            None if wts is None else wts[:used].copy(),
            [a[:] for a in self._meta],
            self._rows.copy(),
        )
        arrays = {name: parts[:] for name, parts in self._arrays.items()}  # never changed
        return Captured(numbers, chunk, arrays, now)

    def _batch(self, runs: Runs) -> Batch | None:
        return to_batch(runs, Chunk(self._used, self._vals, self._wts, self._meta, self._rows))


def _buffer(values: np.ndarray) -> array:
    """A number buffer holding ``values``."""
    buf = array("d")
    buf.frombytes(values.astype(np.float64).tobytes())
    return buf


def _length(buf: Any) -> int:
    """Numbers in a buffer; a pair counts the samples both halves hold (another thread
    may be between its two appends)."""
    return min(len(buf[0]), len(buf[1])) if isinstance(buf, tuple) else len(buf)


class Captured:
    """Pending samples captured by :meth:`HostPending.capture`; ``batch`` reads them."""

    def __init__(
        self,
        numbers: list[tuple[str, Any, int, int, float]],
        chunk: Chunk,
        arrays: dict[str, list[np.ndarray]],
        now: float,
    ):
        self._numbers = numbers  # (name, buffer or pair, read before, length, time)
        self._chunk = chunk  # a HostPending holding copies of the array samples
        self._arrays = arrays  # name -> its listed arrays (see HostPending.extend)
        self._now = now

    def batch(self, index: Mapping[str, int]) -> Batch | None:
        """Every captured sample as a :class:`Batch` (None if none), as ``take`` would
        have given at the capture; ``index`` maps names to slots. Reads once."""
        runs = Runs()
        for name, buf, done, n, stamp in self._numbers:
            if n > done:
                runs.read_until(index[name], buf, done, n, stamp)
        self._numbers = []  # drop the buffers: a fold keeps a held buffer to read it again
        runs.read_arrays(index, self._arrays, self._now)
        return to_batch(runs, self._chunk)
