"""The versioned binary format of a :class:`~metricsync.Metrics` (no pickle inside).

``magic "MSYN" | version | header length | body length | JSON header | float64 body | CRC-32``.
Every length is checked before anything is allocated and decoded states must be ones recording
and merging can produce, so a hostile blob gives :class:`~metricsync.CodecError` and bounded
work.

>>> import metricsync as ms
>>> m = ms.Metrics({"lr": ms.Spec("last")}); m.record("lr", 3e-4)
>>> ms.Metrics.from_bytes(m.to_bytes()).compute()
{'lr': 0.0003}
>>> ms.Metrics.from_bytes(b"MSYN")
Traceback (most recent call last):
...
metricsync.CodecError: truncated: 4 bytes, a metricsync blob has at least 24
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _algebra as al
from ._codec_read import Shape, body_bytes, new_shape, read_body
from ._errors import CodecError, MetricsyncError
from ._lru import LRU
from ._rules import SpecTable
from ._sketch import held_span
from ._spec import Spec
from ._table import StateTable

__all__ = ["FORMAT_VERSION", "HEAD", "decode", "encode", "frame", "unframe"]

MAGIC = b"MSYN"
FORMAT_VERSION = 3
_READS = (1, 2, 3)  #: version 1 has no sketch windows; 1 and 2 lack the N and W2 rows
_NCOL = {1: 8, 2: 8, 3: al.NCOL}  #: state rows per metric, per version
_SKETCH_SLACK, _SKETCH_RATIO = 4 << 20, 32  #: whole-sketch bytes a blob may declare
HEAD = struct.Struct("<4sHHIQ")  #: magic, version, flags, header length, body length
_CRC = struct.Struct("<I")
_MIN_SIZE = HEAD.size + _CRC.size


def encode(rules: SpecTable, table: StateTable) -> bytes:
    """Encode spec rules and a state table."""
    head = _head_of(rules, table)
    state = table.state
    parts = [np.ascontiguousarray(state[: al.NCOL].T).astype("<f8").tobytes()]
    parts += _sketch_parts(head, table.sketches)
    parts += [table.aggs[slot].astype("<f8").tobytes() for slot in head.aggregated]
    if head.ranked:
        rows = state[al.MAXRANK :, head.ranked]
        parts.append(np.ascontiguousarray(rows.T).astype("<f8").tobytes())
    return frame(head.text, b"".join(parts))


def frame(head: bytes, body: bytes, version: int = FORMAT_VERSION, flags: int = 0) -> bytes:
    """A blob of these header and body bytes: the fixed header with their lengths in
    front, a CRC-32 of it all behind (tests and the fuzzer frame hostile parts with it).

    >>> decode(frame(b'{"rules": [], "slots": [], "sketch": [], "agg": []}', b""))[1].names
    []
    """
    blob = HEAD.pack(MAGIC, version, flags, len(head), len(body)) + head + body
    return blob + _CRC.pack(zlib.crc32(blob))


def unframe(blob: bytes) -> tuple[bytes, bytes]:
    """The header and body bytes of a framed blob, as its fixed header places them
    (nothing is checked: :func:`decode` does that).

    >>> unframe(frame(b"{}", b"body"))
    (b'{}', b'body')
    """
    head_len = HEAD.unpack_from(blob)[3]
    return blob[HEAD.size : HEAD.size + head_len], blob[HEAD.size + head_len : -_CRC.size]


def _sketch_parts(head: _Head, sketches: dict[int, np.ndarray]) -> list[bytes]:
    """The windows of the sketches, then their cells from each start (some sketches
    whole where windows alone would let the decoder allocate more than it accepts)."""
    if not head.sketched:
        return []
    windows = np.zeros((len(head.sketched), 2))
    for i, slot in enumerate(head.sketched):
        windows[i] = held_span(sketches[slot])
    sent = 8 * (int(windows[:, 1].sum()) + windows.size) + len(head.text) + head.fixed
    for i, slot in enumerate(head.sketched):  # whole sketches, as few as the bound needs
        if head.dense <= _declarable(sent + _MIN_SIZE):
            break
        sent += 8 * (len(sketches[slot]) - int(windows[i, 1]))
        windows[i] = 0, len(sketches[slot])
    parts = [windows.astype("<f8").tobytes()]
    for slot, (start, count) in zip(head.sketched, windows.astype(np.intp).tolist()):
        parts.append(sketches[slot][start : start + count].astype("<f8").tobytes())
    return parts


@dataclass(frozen=True)
class _Head:
    """An encoded header and the slots whose parts the body carries, in order."""

    text: bytes
    sketched: list[int]
    aggregated: list[int]
    ranked: list[int]
    fixed: int  # body bytes besides the sketches and their windows
    dense: int  # bytes of the whole sketches


#: the latest headers, encoded and decoded, of at most 1 MiB each:
#: - (rules token, table token) -> the header the encoder made of those rules, names and
#:   specs (a worker that returns its results every step encodes the same header each time);
#: - header bytes (behind the count of state rows, for versions before 3) -> the shape the
#:   decoder checked (a single controller decodes its workers' same headers every step)
_HEADERS: LRU[tuple[object, object] | bytes, _Head | Shape] = LRU(32)
_KEPT_BYTES = 1 << 20


def _head_of(rules: SpecTable, table: StateTable) -> _Head:
    key = (rules.token, table.token)
    head = _HEADERS.get(key)
    if not isinstance(head, _Head):
        head = _new_head(rules, table)
        if len(head.text) <= _KEPT_BYTES:
            _HEADERS.put(key, head)
    return head


def _new_head(rules: SpecTable, table: StateTable) -> _Head:
    texts: dict[Spec, str] = {}  # each distinct spec's JSON, made once (a table repeats few)

    def text(spec: Spec) -> str:
        found = texts.get(spec)
        if found is None:
            found = texts[spec] = spec.to_json()
        return found

    specs = table.specs
    sketched = sorted(table.sketches)
    aggregated = sorted(table.aggs)
    header: dict[str, list[Any]] = {
        "rules": [[key, text(spec)] for key, spec in rules.rules()],
        "slots": [[name, text(spec)] for name, spec in zip(table.names, specs)],
        "sketch": [[slot, len(table.sketches[slot])] for slot in sketched],
        "agg": [[slot, len(table.aggs[slot])] for slot in aggregated],
    }
    ranked = [slot for slot, spec in enumerate(specs) if spec.argrank]
    if ranked:
        header["ranks"] = ranked
    text_bytes = json.dumps(header, separators=(",", ":")).encode()
    fixed, dense = body_bytes(len(specs), header["sketch"], header["agg"], ranked)
    return _Head(text_bytes, sketched, aggregated, ranked, fixed, dense)


def _declarable(size: int) -> int:
    """Bytes of whole sketches a blob of ``size`` bytes may declare (see the module doc)."""
    return _SKETCH_SLACK + _SKETCH_RATIO * size


def decode(data: Any) -> tuple[SpecTable, StateTable]:
    """Decode bytes made by :func:`encode` into ``(rules, table)``; ``CodecError`` for anything else."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < _MIN_SIZE:
        raise CodecError(
            f"truncated: {len(data)} bytes, a metricsync blob has at least {_MIN_SIZE}"
        )
    magic, version, flags, head_len, body_len = HEAD.unpack_from(data)
    if magic != MAGIC:
        raise CodecError(f"not a metricsync blob (magic {magic!r})")
    if version not in _READS:
        raise CodecError(
            f"unsupported format version {version} (this build reads {_READS[0]} to {_READS[-1]})"
        )
    if flags != 0:
        raise CodecError(f"unknown flags {flags:#x}")
    if HEAD.size + head_len + body_len + _CRC.size != len(data):
        raise CodecError(
            f"length mismatch: header says {head_len} + {body_len} bytes, "
            f"{len(data) - _MIN_SIZE} are present"
        )
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    view = memoryview(data)
    if zlib.crc32(view[: -_CRC.size]) != crc:
        raise CodecError("checksum mismatch: the blob is corrupted")
    try:
        text = data[HEAD.size : HEAD.size + head_len]
        ncol = _NCOL[version]
        key = text if ncol == al.NCOL else bytes([ncol]) + text  # no JSON starts with a byte < 32
        known = _HEADERS.get(key)
        shape = known if isinstance(known, Shape) else None
        if shape is None:
            shape = new_shape(json.loads(text.decode("utf-8")), ncol)
        if shape.dense > _declarable(len(data)):
            raise CodecError(
                f"{len(data)} bytes declare sketches of {shape.dense} bytes, more than they may"
            )
        table = read_body(shape, view[HEAD.size + head_len : -_CRC.size], windowed=version > 1)
        if known is None and len(text) <= _KEPT_BYTES:  # kept once a blob of it decoded
            _HEADERS.put(key, shape)
        return shape.rules.copy(), table
    except CodecError:
        raise
    except (
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        RecursionError,
        AttributeError,
        OverflowError,  # a JSON integer too large for a float (a spec's accuracy)
        MetricsyncError,  # a rule table conflict
    ) as exc:
        raise CodecError(f"malformed metricsync blob: {exc}") from None
