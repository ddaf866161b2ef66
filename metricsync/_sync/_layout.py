"""Layout agreement across ranks: the sorted (name, spec) list every rank packs its state in.

A :class:`Layout` has a chained 62-bit fingerprint; each group remembers its last agreed one
(:class:`GroupState`, in the group's memory in :mod:`metricsync._sync._group`), so a steady sync
packs straight into it, and new names extend it by exchanging only the additions (compact
UTF-8 entries).

>>> from metricsync._state._spec import Spec
>>> layout = Layout([("b", Spec("max")), ("a", Spec())])
>>> layout.names, decode_entries(encode_entries(layout.entries)) == layout.entries
(['a', 'b'], True)
"""

from __future__ import annotations

import bisect
import hashlib
import json
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .._state import _algebra as al
from .._state._spec import Spec
from .._state._stats import Plan
from .._state._tokens import remember

__all__ = [
    "NO_WINDOW",
    "GroupState",
    "Layout",
    "Part",
    "Placement",
    "Window",
    "decode_entries",
    "encode_entries",
]

_MASK62 = (1 << 62) - 1


def encode_entries(entries: Iterable[tuple[str, Spec]]) -> bytes:
    """(name, spec) pairs as one block of bytes (see the module docstring)."""
    entries = list(entries)
    distinct: dict[Spec, int] = {}
    ids = [distinct.setdefault(spec, len(distinct)) for _, spec in entries]
    texts = [spec.to_json() for spec in distinct]
    names = "\0".join(name for name, _ in entries)
    if names.count("\0") > max(len(entries) - 1, 0):  # a name holds NUL: the names in JSON
        return json.dumps([texts, ids, [name for name, _ in entries]]).encode()
    head = json.dumps([texts, ids], separators=(",", ":"))
    # any str is a metric name: a lone surrogate too (passed through, and back in decode)
    return (head + "\n" + names).encode("utf-8", "surrogatepass")


def decode_entries(blob: bytes) -> list[tuple[str, Spec]]:
    """The pairs of :func:`encode_entries` (``ValueError`` for anything else)."""
    head, _, names = blob.decode("utf-8", "surrogatepass").partition("\n")
    texts, ids, *given = json.loads(head)
    specs = [Spec.from_json(text) for text in texts]
    listed = given[0] if given else names.split("\0") if ids else []
    if len(listed) != len(ids):
        raise ValueError("layout entries and names differ in number")
    return [(name, specs[i]) for name, i in zip(listed, ids)]


def _name_of(entry: tuple[str, Spec]) -> str:
    return entry[0]


class Layout:
    """An agreed, name-sorted list of (name, spec), its fingerprint and derived indexes."""

    def __init__(self, entries: Iterable[tuple[str, Spec]]) -> None:
        self.entries = sorted(list(entries), key=_name_of)  # a list first: far faster to sort
        self.names = [name for name, _ in self.entries]
        self.specs = [spec for _, spec in self.entries]
        digest = hashlib.blake2b(encode_entries(self.entries), digest_size=8).digest()
        self.fingerprint = int.from_bytes(digest, "little") & _MASK62
        self.grown: tuple[int, np.ndarray] | None = None  # see extended()
        self._derive(*al.spec_kinds(self.specs))

    def _derive(self, ids: np.ndarray, kinds: list[Spec]) -> None:
        """Everything else, per distinct spec once, then spread with ``ids``."""
        self.kinds = (ids, kinds)
        self.index = dict(zip(self.names, range(len(self.names))))
        self._plan: Plan | None = None
        exact = np.array([s.across == "exact" for s in kinds], dtype=bool)[ids]
        self.exact = exact
        self.across = np.flatnonzero(~exact)
        self.first = np.array([self.specs[i].across == "first" for i in self.across], dtype=bool)
        self.agg_rows = [len(self.specs[i].reduce) for i in self.across]
        sketched = np.array([s.needs_sketch for s in kinds], dtype=bool)
        self.sketch = np.flatnonzero(sketched[ids] & exact).tolist() if len(ids) else []
        self.sketched = np.flatnonzero(sketched[ids]).tolist() if len(ids) else []  # any across
        self.sketch_entries = [self.entries[i] for i in self.sketch]
        self.sketch_at = np.array(self.sketch, dtype=np.intp)
        # per state column, the positions that carry it through a sync
        masks = np.array([al.carries(s) for s in kinds]).reshape(len(kinds), al.NCOL_ALL)
        carried = masks[ids].T if len(ids) else np.zeros((al.NCOL_ALL, 0), dtype=bool)
        carried[:, ~exact] = False
        carried[al.DROP, ~exact] = True
        self.carried = [np.flatnonzero(row) for row in carried]
        k = len(self.entries)
        # where each packed value goes in a raveled (NCOL_ALL, k) state, in packing order
        self.unpack_at = np.concatenate([c * k + at for c, at in enumerate(self.carried)])
        self.data_size = int(carried.sum()) + 4 * sum(self.agg_rows)  # float64 words
        self.blank = al.identity(k).reshape(-1)  # a raveled state holding no samples
        self.blank.flags.writeable = False
        self.packed = al.Packed(self.carried)  # what al.merge_packed reads of the packing
        self._parts: dict[bytes, Part] = {}  # see part()

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def plan(self) -> Plan:
        """The output keys of this layout's metrics (built once)."""
        if self._plan is None:
            self._plan = Plan(self.names, self.specs, self.kinds)
        return self._plan

    def part(self, keep: np.ndarray) -> Part:
        """The entries at the positions ``keep`` marks, with their index and output plan
        (kept for the last few ``keep``: a sync meets the same one again and again).

        >>> from metricsync._state._spec import Spec
        >>> part = Layout([("a", Spec()), ("b", Spec("max"))]).part(np.array([False, True]))
        >>> part.positions.tolist(), part.names, part.slot_of
        ([1], ['b'], {'b': 0})
        """
        key = np.packbits(keep).tobytes()
        part = self._parts.get(key)
        if part is None:
            positions = np.flatnonzero(keep)
            names = [self.names[i] for i in positions.tolist()]
            specs = [self.specs[i] for i in positions.tolist()]
            plan = Plan(names, specs)
            part = Part(positions, names, specs, dict(zip(names, range(len(names)))), plan)
            part = remember(self._parts, key, part, 4)  # a bound: the latest syncs' patterns
        return part

    def covers(self, names: list[str], specs: list[Spec]) -> bool:
        """Whether every (name, spec) is in this layout."""
        index, mine = self.index, self.specs
        for name, spec in zip(names, specs):
            i = index.get(name)
            if i is None or mine[i] != spec:
                return False
        return True

    def extended(self, additions: Iterable[tuple[str, Spec]]) -> Layout:
        """This layout with ``additions`` (new names, or names whose spec they replace).

        New names are inserted into the sorted lists, and the fingerprint chains this
        one's with the additions' (every rank extends the same layout by the same
        additions, so they agree); a replaced spec rebuilds the layout. An extended
        layout's ``grown`` is this one's fingerprint and, per addition, the position in
        this one it went in before (what ``np.insert`` takes), so that a table placed in
        this layout is placed in the new one without looking up every name again.

        >>> from metricsync._state._spec import Spec
        >>> old = Layout([("a", Spec()), ("c", Spec())])
        >>> new = old.extended([("d", Spec()), ("b", Spec())])
        >>> new.names, new.grown[0] == old.fingerprint, new.grown[1].tolist()
        (['a', 'b', 'c', 'd'], True, [1, 2])
        """
        index, specs = self.index, self.specs
        additions = [
            (name, spec)
            for name, spec in sorted(additions, key=_name_of)
            if name not in index or specs[index[name]] != spec
        ]
        if not additions:
            return self
        if any(name in index for name, _ in additions):  # a spec replaced
            merged = dict(self.entries)
            merged.update(additions)
            return Layout(list(merged.items()))
        digest = hashlib.blake2b(
            self.fingerprint.to_bytes(8, "little") + encode_entries(additions), digest_size=8
        ).digest()
        out = Layout.__new__(Layout)
        out.fingerprint = int.from_bytes(digest, "little") & _MASK62
        at = [bisect.bisect_left(self.names, name) for name, _ in additions]
        out.grown = (self.fingerprint, np.array(at, dtype=np.intp))
        out.entries = _inserted(self.entries, at, additions)
        out.names = _inserted(self.names, at, [name for name, _ in additions])
        out.specs = _inserted(self.specs, at, [spec for _, spec in additions])
        ids, kinds = self.kinds
        kinds = list(kinds)
        new_ids = []
        for _, spec in additions:
            if spec not in kinds:
                kinds.append(spec)
            new_ids.append(kinds.index(spec))
        out._derive(np.insert(ids, at, new_ids).astype(np.intp), kinds)
        return out

    def without(self, drop: np.ndarray) -> Layout:
        """This layout less the positions ``drop`` marks (names no rank holds any more).

        The fingerprint chains this one's with the dropped positions, so every rank
        dropping the same positions of the same layout agrees without re-encoding it.

        >>> from metricsync._state._spec import Spec
        >>> old = Layout([("a", Spec()), ("b", Spec("max")), ("c", Spec())])
        >>> new = old.without(np.array([False, True, False]))
        >>> new.names, new.specs, new.fingerprint != old.fingerprint
        (['a', 'c'], [Spec('mean'), Spec('mean')], True)
        """
        keep = np.flatnonzero(~drop)
        if len(keep) == len(self):
            return self
        digest = hashlib.blake2b(
            self.fingerprint.to_bytes(8, "little")
            + b"without"
            + np.flatnonzero(drop).astype("<i8").tobytes(),
            digest_size=8,
        ).digest()
        out = Layout.__new__(Layout)
        out.fingerprint = int.from_bytes(digest, "little") & _MASK62
        out.grown = None
        kept = keep.tolist()
        out.entries = [self.entries[i] for i in kept]
        out.names = [self.names[i] for i in kept]
        out.specs = [self.specs[i] for i in kept]
        ids, kinds = self.kinds
        out._derive(ids[keep], kinds)
        return out


class Part(NamedTuple):
    """Some of a layout's entries (:meth:`Layout.part`)."""

    positions: np.ndarray  # in the layout, ascending
    names: list[str]
    specs: list[Spec]
    slot_of: dict[str, int]  # name -> its position among these
    plan: Plan


def _inserted(items: list[Any], at: list[int], new: list[Any]) -> list[Any]:
    """``items`` with ``new[j]`` inserted before ``items[at[j]]`` (``at`` ascending)."""
    out: list[Any] = []
    start = 0
    for i, item in zip(at, new):
        out += items[start:i]
        out.append(item)
        start = i
    out += items[start:]
    return out


EMPTY = Layout([])


@dataclass
class GroupState:
    """What one process group remembers between syncs."""

    layout: Layout = EMPTY
    seq: int = 0  # completed syncs
    broken: str | None = None  # why the group's collectives are out of step
    lock: threading.Lock = field(default_factory=threading.Lock)  # one sync at a time
    # the sketch cells each quantile metric sends: those of the union of every global
    # range of its samples seen so far
    windows: dict[tuple[str, Spec], Window] = field(default_factory=dict)
    # (table token, layout fingerprint) -> where a table's slots sit in the layout
    placed: dict[tuple[object, int], Placement] = field(default_factory=dict)
    # (rules token, layout fingerprint) -> per layout position, whether a rule gives it
    # another spec (see metricsync._sync); the latest few: the Metrics synced in turn here
    otherwise: dict[tuple[object, int], np.ndarray] = field(default_factory=dict)
    # per position of ``layout`` (that of fingerprint ``held_for``): the last sync number
    # at which some rank held its name (see metricsync._sync._retire)
    held_at: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    held_for: int = EMPTY.fingerprint
    # the sync number at which each Metrics (its store) last synced here, blocking
    synced: weakref.WeakKeyDictionary[Any, int] = field(default_factory=weakref.WeakKeyDictionary)


class Window(NamedTuple):
    """The sketch cells ``[lo, hi)`` a quantile metric sends, from a range of values."""

    vmin: float
    vmax: float
    lo: int
    hi: int


NO_WINDOW = Window(np.inf, -np.inf, 0, 0)  #: no samples seen: only the side cells travel


@dataclass(frozen=True)
class Placement:
    """Where a table's slots sit in a layout (cached per table names and layout)."""

    where: np.ndarray  # per layout position: the table's slot, or len(table)
    mine: np.ndarray  # per layout position: the table has a slot for the name
    held: np.ndarray  # ... with the layout's spec
    covered: bool  # every name of the table is in the layout with the same spec
    full: bool  # the table holds every name of the layout with its spec
    index: tuple[np.ndarray, ...]  # where packing reads a covered table (_reduce.pack_index)
    fingerprint: int  # the layout's
    names: list[str]  # the table's names and specs (copies): a table only appends slots,
    specs: list[Spec]  # so a table they begin has this placement, and more (_placement)
