"""A checkpoint that resumes exactly: the table as folded so far, and the samples still
pending, laid out as they are held.

``state_dict()`` carries it so a restored ``Metrics`` folds at the same points as an
uninterrupted one, bit for bit. Versioned, checked binary (``MSYR``, CRC-32); anything that
recording cannot hold raises :class:`~metricsync.CodecError`.

>>> import metricsync as ms
>>> m = ms.Metrics(); m.record("x", 0.1); m.record("x", [0.2, 0.3], weight=[1, 2])
>>> rules, table, held = decode(encode(m._store.rules, m._store.table, m._store.pending.export()))
>>> [name for name, _, _ in held.numbers], len(held.chunk)
(['x'], 1)
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import numpy as np

from .._state import _algebra as al
from .._state import _codec
from .._state._codec_read import COUNT_MAX
from .._state._errors import CodecError
from .._state._rules import SpecTable
from .._state._sketch import sketch_layout
from .._state._spec import Spec
from .._state._table import StateTable
from ._pending import CHUNK_LIMIT, Held

__all__ = ["decode", "encode"]

MAGIC = b"MSYR"
VERSION = 1
_HEAD = struct.Struct("<4sHHQIQ")  # magic, version, flags, table, header and body lengths
_CRC = struct.Struct("<I")


def encode(rules: SpecTable, table: StateTable, held: Held) -> bytes:
    """The table and the pending samples ``held`` (of that table's slots) as bytes."""
    index = table.index
    header: dict[str, list[Any]] = {k: [] for k in _KEYS}
    parts: list[np.ndarray] = []
    for name, values, stamp in held.numbers:
        header["numbers"].append([index[name], len(values), int(stamp is not None)])
        parts += [values] + ([] if stamp is None else [np.array([stamp])])
    for name, values, paired in held.pairs:
        header["pairs"].append([index[name], len(values)])
        parts += [values, paired]
    for name, values, weights, stamp in held.retired:
        entry = [index[name], len(values), int(weights is not None), int(stamp is not None)]
        header["retired"].append(entry)
        parts += [values] + ([] if weights is None else [weights])
        parts += [] if stamp is None else [np.array([stamp])]
    for name, arrays in held.arrays:
        header["arrays"].append([index[name], [len(a) for a in arrays]])
        parts += arrays
    for slot, values, weights, stamp in held.chunk:
        header["chunk"].append([int(slot), len(values), int(weights is not None)])
        parts += [values] + ([] if weights is None else [weights]) + [np.array([stamp])]
    for slot, row, stamp in held.rows:
        header["rows"].append(int(slot))
        parts += [row, np.array([stamp])]
    for slot, cells, counts in held.cells:
        header["cells"].append([int(slot), len(cells)])
        parts += [cells.astype(np.float64), counts]
    blob = _codec.encode(rules, table)
    head = json.dumps(header, separators=(",", ":")).encode()
    body = b"".join(np.asarray(p, dtype="<f8").tobytes() for p in parts)
    out = _HEAD.pack(MAGIC, VERSION, 0, len(blob), len(head), len(body)) + blob + head + body
    return out + _CRC.pack(zlib.crc32(out))


_KEYS = ("numbers", "pairs", "retired", "arrays", "chunk", "rows", "cells")


def decode(data: Any) -> tuple[SpecTable, StateTable, Held]:
    """``(rules, table, held)`` from :func:`encode`'s bytes; ``CodecError`` for anything else."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"a state_dict's 'resume' must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < _HEAD.size + _CRC.size:
        raise CodecError(f"truncated: {len(data)} bytes of a state_dict's 'resume'")
    magic, version, flags, table_len, head_len, body_len = _HEAD.unpack_from(data)
    if magic != MAGIC or version != VERSION or flags != 0:
        raise CodecError(f"not a metricsync resume state (magic {magic!r}, version {version})")
    if _HEAD.size + table_len + head_len + body_len + _CRC.size != len(data):
        raise CodecError("length mismatch in a state_dict's 'resume'")
    if zlib.crc32(memoryview(data)[: -_CRC.size]) != _CRC.unpack_from(data, len(data) - 4)[0]:
        raise CodecError("checksum mismatch: the state_dict's 'resume' is corrupted")
    start = _HEAD.size
    rules, table = _codec.decode(data[start : start + table_len])
    start += table_len
    try:
        header = json.loads(data[start : start + head_len].decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise CodecError(f"malformed resume header: {exc}") from None
    body = np.frombuffer(data, dtype="<f8", offset=start + head_len, count=body_len // 8)
    if body_len % 8:
        raise CodecError("the resume body is not a whole number of float64 values")
    return rules, table, _Reader(header, body, table).held()


class _Reader:
    """Reads a checked :class:`Held` out of a header and body (see the module docstring)."""

    def __init__(self, header: Any, body: np.ndarray, table: StateTable) -> None:
        if not isinstance(header, dict) or not all(isinstance(header.get(k), list) for k in _KEYS):
            raise CodecError(f"a resume header holds the lists {', '.join(_KEYS)}")
        self.header, self.body, self.table = header, body, table
        self.at = 0

    def take(self, n: int) -> np.ndarray:
        if self.at + n > len(self.body):
            raise CodecError("the resume body is shorter than its header says")
        out = self.body[self.at : self.at + n].astype(np.float64)
        self.at += n
        return out

    def spec(self, slot: Any) -> tuple[str, Spec]:
        if type(slot) is not int or not 0 <= slot < len(self.table.names):
            raise CodecError(f"a resume entry names slot {slot!r}, not a metric of the table")
        return self.table.names[slot], self.table.specs[slot]

    def entries(self, key: str, size: int) -> list[list[Any]]:
        out = []
        for entry in self.header[key]:
            if not (isinstance(entry, list) and len(entry) == size):
                raise CodecError(f"a malformed {key!r} entry in a resume header")
            for value in entry[1:]:
                if key != "arrays" and (type(value) is not int or value < 0):
                    raise CodecError(f"a malformed {key!r} entry in a resume header")
            out.append(entry)
        return out

    def held(self) -> Held:
        held = Held()
        seen: dict[str, set[str]] = {k: set() for k in ("numbers", "pairs", "arrays")}
        for slot, n, stamped in self.entries("numbers", 3):
            name, spec = self.buffered(seen, "numbers", slot, spec_takes=spec_opens)
            values = self.take(n)
            if bool(stamped) != ("last" in spec.reduce) or stamped > 1:
                raise CodecError(f"metric {name!r}: a number buffer's time does not fit its spec")
            held.numbers.append((name, values, self.stamp() if stamped else None))
        for slot, n in self.entries("pairs", 2):
            name, _ = self.buffered(seen, "pairs", slot, spec_takes=pair_opens)
            held.pairs.append((name, self.take(n), self.weights(name, n)))
        for slot, n, weighted, stamped in self.entries("retired", 4):
            name, spec = self.spec(slot)
            ok = spec_opens(spec) and weighted <= 1 and stamped <= 1 and not weighted & stamped
            if not ok or bool(stamped) != ("last" in spec.reduce and not weighted):
                raise CodecError(f"metric {name!r}: a retired buffer does not fit its spec")
            values = self.take(n)
            weights = self.weights(name, n) if weighted else None
            held.retired.append((name, values, weights, self.stamp() if stamped else None))
        for slot, lengths in self.entries("arrays", 2):
            name, _ = self.buffered(seen, "arrays", slot, spec_takes=plain_opens)
            if not isinstance(lengths, list) or not all(type(n) is int and n > 0 for n in lengths):
                raise CodecError(f"metric {name!r}: malformed array lengths in a resume header")
            held.arrays.append((name, [self.take(n) for n in lengths]))
        used = 0
        for slot, n, weighted in self.entries("chunk", 3):
            name, _ = self.spec(slot)
            used += n
            if used > CHUNK_LIMIT or n == 0 or weighted > 1:
                raise CodecError(f"metric {name!r}: a resume chunk entry out of bounds")
            values = self.take(n)
            weights = self.weights(name, n) if weighted else None
            held.chunk.append((slot, values, weights, self.stamp()))
        for slot in self.header["rows"]:
            name, _ = self.spec(slot)
            row = self.take(al.NCOL_ALL)
            if not _possible(row):
                raise CodecError(f"metric {name!r}: a pending row no record makes")
            held.rows.append((slot, row, self.stamp()))
        for slot, k in self.entries("cells", 2):
            name, spec = self.spec(slot)
            cells, counts = self.take(k), self.take(k)
            if not spec.needs_sketch or not k:
                raise CodecError(f"metric {name!r}: sketch cells its spec does not keep")
            size = sketch_layout(spec.accuracy).n_cells
            whole = (cells == np.floor(cells)) & (cells >= 0) & (cells < size)
            if not whole.all() or len(np.unique(cells)) != k or not (counts >= 0).all():
                raise CodecError(f"metric {name!r}: pending sketch cells out of bounds")
            held.cells.append((slot, cells.astype(np.intp), counts))
        if self.at != len(self.body):
            raise CodecError("the resume body is longer than its header says")
        return held

    def buffered(self, seen: dict[str, set[str]], key: str, slot: Any, spec_takes: Any) -> Any:
        name, spec = self.spec(slot)
        if name in seen[key] or not spec_takes(spec):
            raise CodecError(f"metric {name!r}: a pending buffer its spec does not take")
        seen[key].add(name)
        return name, spec

    def weights(self, name: str, n: int) -> np.ndarray:
        weights = self.take(n)
        if not (np.isfinite(weights) & (weights >= 0)).all():
            raise CodecError(f"metric {name!r}: a pending weight is negative or not finite")
        return weights

    def stamp(self) -> float:
        stamp = float(self.take(1)[0])
        if stamp != stamp or stamp == np.inf:
            raise CodecError("a pending record's time is NaN or infinite")
        return stamp


def spec_opens(spec: Spec) -> bool:
    """Whether a metric of ``spec`` has a number buffer (``HostPending.open``)."""
    return spec.nan != "error"


def pair_opens(spec: Spec) -> bool:
    """Whether it has a buffer for weighted numbers (``open_weighted``)."""
    return spec.nan != "error" and "last" not in spec.reduce


plain_opens = pair_opens  # a plain number buffer (not a ``last`` one's), which lists arrays


def _possible(row: np.ndarray) -> bool:
    """Whether a record reduced on arrival can have this state column."""
    w, drop, t = row[al.W], row[al.DROP], row[al.T]
    ranks = np.isnan(row[al.NCOL :])  # the rank columns hold their identity: only a sync sets them
    whole = drop == np.floor(drop)
    return bool(w >= 0 and 0 <= drop <= COUNT_MAX and whole and t == t and ranks.all())
