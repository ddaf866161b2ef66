"""The versioned binary format of a :class:`~metricsync.Metrics` (no pickle inside).

Layout, all little-endian::

    magic "MSYN" | u16 version | u16 flags (0) | u32 header length | u64 body length
    header: UTF-8 JSON {"rules": [[key, spec]], "slots": [[name, spec]],
                        "sketch": [[slot, cells]], "agg": [[slot, rows]]}
    body:   float64 state rows (slots x 8), then each sketch, then each across aggregate (rows x 4)
    u32 CRC-32 of everything before it

Every length is checked against the bytes actually present before anything is
allocated, so a hostile header cannot make the decoder allocate more than the
input's size. Anything malformed raises :class:`~metricsync.CodecError`.

>>> import metricsync as ms
>>> m = ms.Metrics({"lr": ms.Spec("last")}); m.record("lr", 3e-4)
>>> ms.Metrics.from_bytes(m.to_bytes()).compute()
{'lr': 0.0003}
>>> ms.Metrics.from_bytes(b"MSYN")
Traceback (most recent call last):
...
metricsync.errors.CodecError: truncated: 4 bytes, a metricsync blob has at least 24
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np

from . import state as st
from .errors import CodecError
from .spec import Spec

if TYPE_CHECKING:
    from .metrics import Metrics

__all__ = ["FORMAT_VERSION", "decode", "encode"]

MAGIC = b"MSYN"
FORMAT_VERSION = 1
_HEAD = struct.Struct("<4sHHIQ")
_CRC = struct.Struct("<I")
_MIN_SIZE = _HEAD.size + _CRC.size


def encode(metrics: Metrics) -> bytes:
    """Encode folded ``metrics`` (the caller folds pending and device state first)."""
    m = metrics
    n = len(m._names)
    header: dict[str, list[Any]] = {
        "rules": [[key, spec.to_json()] for key, spec in m._table.rules()],
        "slots": [[name, spec.to_json()] for name, spec in zip(m._names, m._specs)],
        "sketch": [[slot, len(cells)] for slot, cells in sorted(m._sketch.items())],
        "agg": [[slot, len(agg)] for slot, agg in sorted(m._agg.items())],
    }
    head_bytes = json.dumps(header, separators=(",", ":")).encode()
    parts = [m._rows[:n].astype("<f8").tobytes()]
    parts += [m._sketch[slot].astype("<f8").tobytes() for slot, _ in header["sketch"]]
    parts += [m._agg[slot].astype("<f8").tobytes() for slot, _ in header["agg"]]
    body = b"".join(parts)
    blob = _HEAD.pack(MAGIC, FORMAT_VERSION, 0, len(head_bytes), len(body)) + head_bytes + body
    return blob + _CRC.pack(zlib.crc32(blob))


def decode(data: Any) -> Metrics:
    """Decode bytes made by :func:`encode`; ``CodecError`` for anything else."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < _MIN_SIZE:
        raise CodecError(
            f"truncated: {len(data)} bytes, a metricsync blob has at least {_MIN_SIZE}"
        )
    magic, version, flags, head_len, body_len = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise CodecError(f"not a metricsync blob (magic {magic!r})")
    if version != FORMAT_VERSION:
        raise CodecError(
            f"unsupported format version {version} (this build reads {FORMAT_VERSION})"
        )
    if flags != 0:
        raise CodecError(f"unknown flags {flags:#x}")
    if _HEAD.size + head_len + body_len + _CRC.size != len(data):
        raise CodecError(
            f"length mismatch: header says {head_len} + {body_len} bytes, "
            f"{len(data) - _MIN_SIZE} are present"
        )
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    if zlib.crc32(data[: -_CRC.size]) != crc:
        raise CodecError("checksum mismatch: the blob is corrupted")
    try:
        header = json.loads(data[_HEAD.size : _HEAD.size + head_len].decode("utf-8"))
        body = memoryview(data)[_HEAD.size + head_len : len(data) - _CRC.size]
        return _build(header, body)
    except CodecError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, RecursionError, AttributeError) as exc:
        raise CodecError(f"malformed metricsync blob: {exc}") from None


def _pairs(header: dict[str, Any], key: str, kinds: tuple[type, type]) -> list[Any]:
    items = header.get(key)
    if not isinstance(items, list):
        raise CodecError(f"header field {key!r} must be a list")
    for item in items:
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], kinds[0])
            and isinstance(item[1], kinds[1])
            and not isinstance(item[0], bool)
            and not isinstance(item[1], bool)
        ):
            raise CodecError(f"header field {key!r} holds a malformed entry")
    return items


def _build(header: Any, body: memoryview) -> Metrics:
    from .metrics import Metrics
    from .sketch import sketch_layout

    if not isinstance(header, dict):
        raise CodecError("header must be a JSON object")
    rules = _pairs(header, "rules", (str, str))
    slots = _pairs(header, "slots", (str, str))
    sketches = _pairs(header, "sketch", (int, int))
    aggs = _pairs(header, "agg", (int, int))
    specs: dict[str, Spec] = {}
    m = Metrics()
    for key, text in rules:
        m._table.add(key, specs.setdefault(text, Spec.from_json(text)))
    n = len(slots)
    offset = n * st.NCOL * 8
    if offset > len(body):
        raise CodecError(f"body too short for {n} state rows")
    rows = np.frombuffer(body[:offset], dtype="<f8").reshape(n, st.NCOL)
    for name, text in slots:
        if not name or name in m._index:
            raise CodecError(f"empty or repeated metric name {name!r}")
        m._slot(name, specs.setdefault(text, Spec.from_json(text)))
    if n:
        m._rows[:n] = rows
    want_sketch = sorted(s for s, spec in enumerate(m._specs) if spec.needs_sketch)
    if [slot for slot, _ in sketches] != want_sketch:
        raise CodecError("sketch entries do not match the quantile metrics")
    for slot, cells in sketches:
        if cells != sketch_layout(m._specs[slot].accuracy).n_cells:
            raise CodecError(f"sketch of metric {m._names[slot]!r} has {cells} cells")
        m._sketch[slot][:] = _take(body, offset, cells)
        offset += cells * 8
    want_agg = sorted(s for s, spec in enumerate(m._specs) if spec.across != "exact")
    if [slot for slot, _ in aggs] != want_agg:
        raise CodecError("aggregate entries do not match the across metrics")
    for slot, count in aggs:
        if count != len(m._specs[slot].reduce):
            raise CodecError(f"aggregate of metric {m._names[slot]!r} has {count} rows")
        m._agg[slot][:] = _take(body, offset, count * 4).reshape(count, 4)
        offset += count * 32
    if offset != len(body):
        raise CodecError(f"{len(body) - offset} unexplained trailing body bytes")
    return m


def _take(body: memoryview, offset: int, count: int) -> np.ndarray:
    end = offset + count * 8
    if count < 0 or end > len(body):
        raise CodecError("body too short for the declared arrays")
    return np.frombuffer(body[offset:end], dtype="<f8")
