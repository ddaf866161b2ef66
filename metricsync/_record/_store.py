"""What a ``Metrics`` holds: spec rules, the state table, pending host samples, device states.

Checks and applies records, folds pending samples when their buffers fill (so fold points
depend on the records alone) and gives read-only snapshots, kept until something changes:
every state-changing method is marked :func:`changing` (the lock, and the one place the
version moves); only the Python-number append of ``Metrics.record`` runs without the lock.

>>> store = Store()
>>> store.prepare("loss", [1.0, 3.0], None, None)()
>>> store.snapshot().compute()
{'loss': 2.0}
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable
from functools import partial, wraps
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np

from .._state import _algebra as al
from .._state._errors import SpecMismatchError
from .._state._keys import Lookup, clash, clash_error, first_clash
from .._state._lru import LRU
from .._state._rules import SpecTable, merged_rules
from .._state._spec import Spec
from .._state._table import StateTable
from . import _convert
from ._convert import as_torch, device_inputs, host_record, host_scalar
from ._devices import Devices, merge_devices
from ._fold import Batch, fold, reduce_record
from ._pending import FAST_LIMIT, PAIR_LIMIT, Held, HostPending

__all__ = ["Store", "changing"]

#: both sides' table and rules tokens of merges that agreed -> their rules, and the slots
#: of the merged table's names in this one (Store.absorb; a bound: the latest merges' pairs)
_AGREED: LRU[tuple[object, object, object, object], tuple[SpecTable, np.ndarray]] = LRU(64)

_BOOL = np.dtype(bool)
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
ARRIVAL_MIN = 256  #: arrays with more samples are reduced when recorded, smaller ones buffered
MASKED_MAX = 4096  #: a record under a mask alone buffers at most this many kept samples


_P = ParamSpec("_P")
_R = TypeVar("_R")


def changing(method: Callable[Concatenate[Store, _P], _R]) -> Callable[Concatenate[Store, _P], _R]:
    """Mark a :class:`Store` method that may change what a fold gives: it runs under the
    store's lock, and the change count moves as it starts and as it ends, so no fold kept
    before it, or made while it runs (a merge of a store into itself folds it midway), is
    current after it (:meth:`Store.folded`). The one place the count moves. A method that
    changes state without it would leave a stale fold; one that only reads takes the lock
    itself."""

    @wraps(method)
    def changed(self: Store, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self.lock:
            self._version += 1
            try:
                return method(self, *args, **kwargs)
            finally:
                self._version += 1

    return changed


def _numbers(value: list[Any]) -> array | None:
    """A list of Python floats and ints as an ``array('d')`` (None for any other list)."""
    if not all(v.__class__ is float or v.__class__ is int for v in value):
        return None
    try:
        return array("d", value)
    except OverflowError:  # an int beyond float64: the general path says so
        return None


class Store:
    """Rules, table, pending samples and device states of one ``Metrics``."""

    def __init__(self, rules: SpecTable | None = None, table: StateTable | None = None) -> None:
        self.rules = rules if rules is not None else SpecTable()
        self.table = table if table is not None else StateTable()
        self.pending = HostPending()
        self.devices = Devices()
        self.deferred: list[tuple[str, Callable[[], float]]] = []  # CUDA timers, read later
        self.lock = threading.RLock()
        self._version = 0  # calls of @changing methods so far: see ``folded``
        self._folded: tuple[tuple[int, bool, int], StateTable] | None = None

    # ------------------------------------------------------------------ specs

    def spec(self, name: str) -> Spec:
        """The spec ``name`` has, or would get on its first record."""
        slot = self.table.index.get(name)
        return self.table.specs[slot] if slot is not None else self.rules.resolve(name)

    @changing
    def adopt_rules(self, rules: SpecTable) -> None:
        """Use ``rules``; names whose spec they change must hold no samples."""
        self._apply_rules(rules, self._rule_changes(rules))

    def _rule_changes(self, rules: SpecTable) -> dict[int, Spec]:
        """Slots whose spec ``rules`` change; ``SpecMismatchError`` if one holds samples."""
        changes = {}
        for slot, name in enumerate(self.table.names):
            new = rules.explicit(name)
            if new is None or new == self.table.specs[slot]:
                continue
            if self._holds_data(slot):
                old = self.table.specs[slot]
                raise SpecMismatchError(
                    f"metric {name!r} holds samples under {old!r}; cannot change it to {new!r}"
                )
            changes[slot] = new
        if changes:
            self._refuse_clashes({self.table.names[slot]: spec for slot, spec in changes.items()})
        return changes

    def _apply_rules(self, rules: SpecTable, changes: dict[int, Spec]) -> None:
        self.rules = rules
        for slot, new in changes.items():
            name = self.table.names[slot]
            self.table.respec(slot, new)
            self.pending.forget(name)
            self.pending.open(name, new)

    def _held_spec(self, name: str) -> Spec | None:
        """The spec of ``name`` if it has a slot (a key of ``compute()``), else None."""
        slot = self.table.index.get(name)
        return None if slot is None else self.table.specs[slot]

    def check_name(self, name: str, spec: Spec, lookup: Lookup | None = None) -> None:
        """``SpecMismatchError`` naming both where ``name`` (without a slot yet), with
        ``spec``, would report a key another metric reports (see :mod:`metricsync._state._keys`)."""
        if name in self.table.index:
            return
        found = clash(name, spec, self._held_spec if lookup is None else lookup)
        if found is not None:
            raise clash_error(name, spec, *found)

    def check_new(self, names: list[str]) -> None:
        """:meth:`check_name` of each of ``names`` without a slot, against the table and
        each other (an ``update`` opening several names at once)."""
        with self.lock:
            new = {n: self.spec(n) for n in names if n not in self.table.index}
            if new:
                self._refuse_clashes(new)

    def _refuse_clashes(self, specs: dict[str, Spec]) -> None:
        """``SpecMismatchError`` naming both where a name of ``specs``, with its spec there,
        would share a key with another of them or with a name holding a slot."""

        def lookup(name: str) -> Spec | None:
            return specs.get(name) or self._held_spec(name)

        found = first_clash(list(specs), lookup)
        if found is not None:
            name, other, key = found
            raise clash_error(name, specs[name], other, key)

    def _slot(self, name: str, spec: Spec) -> int:
        """``name``'s slot, made with ``spec`` if it has none (where no key meets another's)."""
        slot = self.table.index.get(name)
        if slot is None:
            self.check_name(name, spec)
            slot = self.table.slot(name, spec)
        return slot

    def _holds_data(self, slot: int) -> bool:
        name = self.table.names[slot]
        if name in self.pending.held() or slot in self.pending.chunk_slots():
            return True
        deferred = any(name == pending for pending, _ in self.deferred)
        return deferred or self.table.holds_data(slot) or slot in self.devices.recorded_slots()

    # -------------------------------------------------------------- recording

    def prepare(self, name: Any, value: Any, weight: Any, mask: Any) -> Callable[[], object]:
        """Check and convert one record; the function returned applies it. Everything that
        can be wrong with the input raises here, naming the metric: applying cannot fail."""
        if not isinstance(name, str) or not name:
            raise TypeError(f"a metric name must be a non-empty string, got {name!r}")
        with self.lock:
            spec = self.spec(name)
            self.check_name(name, spec)
        cls = value.__class__
        plain = weight is None and mask is None
        if plain and (cls is float or cls is int or cls is np.float64) and spec.nan != "error":
            try:  # opens the name's number buffer
                return partial(self.add_number, name, float(value), spec)
            except OverflowError:
                raise ValueError(
                    f"metric {name!r}: {value!r:.40} does not fit in a float64"
                ) from None
        tensor = as_torch(value)
        if tensor is not None:
            host = _convert.HOST_DEVICE_TYPES
            if not (tensor.is_cpu and "cpu" in host) and tensor.device.type not in host:
                inputs = device_inputs(name, tensor, weight, mask)
                return partial(self._apply_device, name, spec, tensor, *inputs)
            if plain and tensor.dim() == 0:
                return self.prepare(name, host_scalar(name, tensor), None, None)
            value = tensor
        if plain and cls is list and spec.nan != "error" and "last" not in spec.reduce:
            numbers = _numbers(value)
            if numbers is not None:  # as Metrics.record extends an open buffer with it
                return partial(self.add_numbers, name, numbers, spec)
        values, w = host_record(name, value, weight, mask, spec.nan == "error")
        return partial(self._apply_host, name, spec, values, w)

    @changing
    def _apply_host(self, name: str, spec: Spec, values: np.ndarray, w: np.ndarray | None) -> None:
        slot = self._slot(name, spec)
        self.pending.open(name, spec)
        masked = w is not None and w.dtype == _BOOL  # a mask alone, no weight
        if masked:  # its kept samples, under add_masked's bound
            values, w = values[w], None
        most = MASKED_MAX if masked else ARRIVAL_MIN
        n = len(values)
        if not n:
            return
        if n == 1 and w is not None:  # a weighted number: it and its next ones take the
            # buffer the fast path appends to, whether or not it was open
            pair = self.pending.open_weighted(name, spec)
            if pair is not None:
                pair.fromlist([float(values[0]), float(w[0])])
                if len(pair) >= PAIR_LIMIT:
                    self.flush()
                return
        stamp = al.now_us()
        if not self.pending.fits(n if n <= most else 0):
            self.flush()
        if n > most:  # a few reductions now cost less than keeping every sample
            row, cells = reduce_record(values, w, spec, stamp)
            self.pending.add_row(slot, row, cells, stamp)
        elif w is not None or not self.pending.extend(name, values):
            self.pending.add(slot, values, w, stamp)

    @changing  # on the method itself: one call less on a hot path
    def add_small(self, name: str, values: np.ndarray) -> bool:
        """Buffer a small real array for a name whose number buffer is open (so its spec
        allows NaN); False when it is not such an array (the general path takes it)."""
        if values.dtype.kind not in "fiub" or not 0 < values.size <= ARRIVAL_MIN:
            return False
        flat = values.reshape(-1)
        if not self.pending.fits(len(flat)):
            self.flush()
        if not self.pending.extend(name, flat):
            self.pending.add(self.table.index[name], flat, None, al.now_us())
        return True

    def add_masked(self, name: str, x: Any, mask: Any) -> bool:
        """Record a large float CPU tensor under a boolean CPU mask of its shape, for a name
        whose number buffer is open; False for other tensors (the general path takes and
        checks them). Kept samples are buffered when few enough, else reduced now. ``numpy()``
        raises ``TypeError`` or ``RuntimeError`` for a tensor it cannot view (autograd, a
        negative or conjugate bit, sparse, nested, not on the CPU, bfloat16): the caller then
        takes the general path, nothing recorded."""
        xn, mn = x.numpy(), mask.numpy()
        if mn.dtype is not _BOOL or xn.dtype not in _FLOATS or xn.shape != mn.shape:
            return False
        if xn.size <= ARRIVAL_MIN:  # small: the general path buffers them
            return False
        self._add_kept(name, xn[mn])  # the kept samples, in C order
        return True

    @changing
    def _add_kept(self, name: str, kept: np.ndarray) -> None:
        n = len(kept)
        if not self.pending.fits(n if n <= MASKED_MAX else 0):
            self.flush()
        if n > MASKED_MAX:
            slot = self.table.index[name]
            stamp = al.now_us()
            row, cells = reduce_record(kept, None, self.table.specs[slot], stamp)
            self.pending.add_row(slot, row, cells, stamp)
        elif n and not self.pending.extend(name, kept, owned=True):  # indexing copied
            self.pending.add(self.table.index[name], kept, None, al.now_us())

    @changing
    def add_number(self, name: str, number: float, spec: Spec | None = None) -> bool:
        """Record ``number`` under ``name`` with ``spec`` (``prepare``'s), or without one
        with the spec ``name`` has: then False, recording nothing, where that spec refuses
        NaN (``prepare`` checks the number). The name's number buffer opens."""
        if spec is None:
            spec = self.spec(name)
            if spec.nan == "error":
                return False
        slot = self._slot(name, spec)
        self.pending.open(name, spec)  # the name's later numbers take the fast path
        buf = self.pending.fast.get(name)
        if buf is not None:  # this one too: one run with them
            buf.append(number)
            if len(buf) >= FAST_LIMIT:
                self.flush()
            return True
        if not self.pending.fits(1):
            self.flush()
        self.pending.add(slot, np.array([number]), None, al.now_us())
        return True

    @changing
    def add_numbers(self, name: str, numbers: array, spec: Spec) -> None:
        """Extend ``name``'s number buffer (opened here) by a list's numbers, as the fast
        path of ``Metrics.record`` extends an open one: where a list goes does not depend
        on whether the name was recorded before."""
        self._slot(name, spec)
        self.pending.open(name, spec)
        buf = self.pending.fast[name]
        buf.extend(numbers)
        if len(buf) >= FAST_LIMIT:
            self.flush()

    @changing
    def _apply_device(self, name: str, spec: Spec, x: Any, w: Any, m: Any) -> None:
        slot = self._slot(name, spec)
        self.pending.open(name, spec)
        if x.numel() == 0:  # no samples, and no device state that names would count
            return
        self.devices.add(name, slot, spec, x, w, m, al.now_us())

    @changing
    def add_on_device(self, name: str, x: Any, weight: Any, mask: Any) -> bool:
        """Pend an accelerator tensor (weight and mask as for record) for a name already
        recorded on its device: the slot, spec and row that its first record resolved
        are reused. False when the name has no such record (the general path takes the
        tensor). Bad input raises as on the general path, before anything is pended."""
        lane = self.devices.lane(name, x.device)
        if lane is None:
            return False
        w, m = device_inputs(name, x, weight, mask)
        if x.numel():  # a 0-d tensor its lane refused: copied if a reference may not be kept
            lane.state.pend(lane.row, x, w, m, al.now_us())
        return True

    def _check_union(self, other: StateTable, changes: dict[int, Spec]) -> None:
        """``SpecMismatchError`` where a name ``other`` adds (or one ``changes`` respecs)
        would share a key with another metric of the merged table."""
        index, mine = self.table.index, self.table.specs
        respecced = {self.table.names[slot]: spec for slot, spec in changes.items()}

        def lookup(name: str) -> Spec | None:
            spec = respecced.get(name)
            if spec is not None:
                return spec
            slot = index.get(name)
            if slot is not None:
                return mine[slot]
            slot = other.index.get(name)
            return None if slot is None else other.specs[slot]

        added = [name for name in other.names if name not in index]
        found = first_clash(added + list(respecced), lookup)
        if found is not None:
            name, key_of, key = found
            spec = lookup(name)
            assert spec is not None
            raise clash_error(name, spec, key_of, key)

    # ---------------------------------------------------------------- folding

    @changing
    def fold_devices(self) -> None:
        """Fold the device states whose lanes filled their inbox (``Metrics.record``)."""
        self.devices.fold_full()

    @changing
    def flush(self) -> None:
        """Fold the pending host samples into the table."""
        batch = self.pending.take(self.table.index, consume=True)
        if batch is not None:
            self._fold_into_table(batch, self.table)

    def _fold_into_table(self, batch: Batch, table: StateTable | None = None) -> None:
        table = self.table if table is None else table
        slots, cols, cells = fold(batch, table.specs, table.token)
        if len(slots):
            table.merge_state(slots, cols)
        for slot, touched, counts in cells:
            table.add_cells(slot, touched, counts)

    @changing
    def defer(self, name: str, value: Callable[[], float]) -> None:
        """Record ``value()`` under ``name`` at the next snapshot that reads devices."""
        spec = self.spec(name)
        self._slot(name, spec)  # the name takes its place (and format) now
        self.pending.open(name, spec)
        self.deferred.append((name, value))

    def _resolve_deferred(self) -> None:
        deferred, self.deferred = self.deferred, []
        for name, value in deferred:
            self.prepare(name, value(), None, None)()

    def compute(self) -> dict[str, float]:
        """``folded().compute()``; on the table itself, under the lock, when nothing waits
        to be folded (a synced ``Metrics``): no copy."""
        with self.lock:
            if self.settled():
                return self.table.compute()
        return self.folded().compute()

    def settled(self) -> bool:
        """Whether nothing waits to be folded: the table holds every sample (take the lock)."""
        return not self.deferred and not self.devices and self.pending.empty()

    def snapshot(self, devices: bool = True) -> StateTable:
        """A copy of the table plus every pending sample, the caller's to change. With
        ``devices``, device states come to the host (one copy per device); a device record
        that failed its checks raises ``ValueError`` naming the metric (the record is
        dropped, so the next snapshot succeeds)."""
        return self.folded(devices).copy()

    def folded(self, devices: bool = True) -> StateTable:
        """The table plus every pending sample, folded (see :meth:`snapshot`): shared, so
        the caller only reads it. Kept until the store changes, so observing again with
        no record between (``compute()`` then ``sync()``, a sync then a checkpoint) folds
        nothing again. A change is a call of a :func:`changing` method, which counts it,
        or an append to a number buffer by the lock-free path of ``Metrics.record``, which
        grows the buffers' total length (only a ``changing`` method shrinks it): that pair
        tells whether anything was recorded since."""
        with self.lock:
            if devices and self.deferred:
                self._resolve_deferred()
            live = devices and bool(self.devices)
            key = self._fold_key(live)
            if (kept := self._kept(key)) is not None:
                return kept
            batch = self.pending.take(self.table.index, consume=False)
            # always a new table: another thread may add slots to the live table while
            # the caller reads this one outside the lock
            table = self.table.copy()
            if batch is not None:
                self._fold_into_table(batch, table)
            if live:
                merge_devices(table, self.devices.read(table.names))
            self._folded = (key, table)
            return table

    def _fold_key(self, live: bool) -> tuple[int, bool, int]:
        """What the kept fold must have seen to be current (see :meth:`folded`). Read
        before the buffers are: a number appended in between makes the next one miss."""
        return (self._version, live, self.pending.appended() + self.devices.appended())

    def _kept(self, key: tuple[int, bool, int]) -> StateTable | None:
        """The kept fold, if it was made with ``key`` (still current)."""
        return self._folded[1] if self._folded is not None and self._folded[0] == key else None

    def snapshot_later(self) -> Callable[[], StateTable]:
        """:meth:`snapshot` in two halves: what must happen now (CUDA timers read, device
        states copied to the host, a copy of the table, the pending host samples captured
        without a fold) and a function, for another thread, that folds them and returns
        the same table ``snapshot()`` would have (the kept fold itself, read only, when
        nothing was recorded since it). A device error raises here, as there."""
        with self.lock:
            if self.deferred:
                self._resolve_deferred()
            if (kept := self._kept(self._fold_key(bool(self.devices)))) is not None:
                return lambda: kept  # nothing recorded since: no capture, no fold
            devices = self.devices.read(self.table.names)
            captured = self.pending.capture(self.table.index)
            table = self.table.copy()  # the live one may gain slots; this one stays

        def finish() -> StateTable:
            batch = captured.batch(table.index)
            if batch is not None:
                self._fold_into_table(batch, table)
            merge_devices(table, devices)
            return table

        return finish

    def held_names(self) -> list[str]:
        """Names holding samples, without reading any device (device records and CUDA
        timers not yet read count, so a kept fold with device states serves as well)."""
        with self.lock:
            kept = self._kept(self._fold_key(True)) if self.devices else None
            held = (self.folded(devices=False) if kept is None else kept).holds()
            held[sorted(self.devices.recorded_slots())] = True
            held[[self.table.index[name] for name, _ in self.deferred]] = True
            names = self.table.names
            return [names[i] for i in np.flatnonzero(held).tolist()]

    # ------------------------------------------------------------ checkpoints

    def resumable(self) -> tuple[SpecTable, StateTable, Held] | None:
        """Rules, a copy of the table as folded so far and the pending host samples, taken
        at once: what a store needs to go on exactly as this one (:meth:`resume`). None
        while accelerator states are pending (they fold into the table only when read)."""
        with self.lock:
            if self.deferred:
                self._resolve_deferred()
            if self.devices:
                return None
            return self.rules.copy(), self.table.copy(), self.pending.export()

    @classmethod
    def resume(cls, rules: SpecTable, table: StateTable, held: Held) -> Store:
        """A store holding ``table`` and the pending samples ``held`` (checked)."""
        store = cls(rules, table)
        store.pending.restore(held, {name: table.specs[i] for i, name in enumerate(table.names)})
        return store

    # -------------------------------------------------------------- lifecycle

    @changing
    def reset(self) -> None:
        """Forget every sample; keep rules, names and specs."""
        self._folded = None  # its memory too
        self.pending.clear()
        self.devices.clear()  # the same object: Metrics.record holds its lanes
        self.deferred = []
        self.table.reset()

    def absorb(self, other: Store) -> None:
        """Merge another store's rules and samples in, as one rank (itself: from a snapshot).
        Both locks are held, taken in one order (no deadlock between two threads merging
        each way), so a settled store's table (a decoded result's) is read as it is."""
        first, last = sorted((self.lock, other.lock), key=id)  # merging itself: one RLock twice
        with first, last:
            self._absorb(other)

    @changing
    def _absorb(self, other: Store) -> None:
        """:meth:`absorb`, under both locks."""
        table = other.table if other is not self and other.settled() else other.folded()
        # by token: a pair that agreed, changing no spec, agrees again (workers' results)
        key = (self.table.token, self.rules.token, table.token, other.rules.token)
        if (agreed := _AGREED.get(key)) is not None:
            self._apply_rules(agreed[0].copy(), {})
            self.table.absorb(table, agreed[1])  # a gained name opens its number buffer
        else:  # at its record
            merged = merged_rules(self.rules, self.table, other.rules, table)
            changes = self._rule_changes(merged)
            self._check_union(table, changes)
            self._apply_rules(merged, changes)
            at = self.table.absorb(table)
            if not changes:
                _AGREED.put(key, (merged.copy(), at))
