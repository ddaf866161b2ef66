"""The versioned binary format of a :class:`~metricsync.Metrics` (no pickle inside).

Layout, all little-endian::

    magic "MSYN" | u16 version | u16 flags (0) | u32 header length | u64 body length
    header: UTF-8 JSON {"rules": [[key, spec]], "slots": [[name, spec]],
                        "sketch": [[slot, cells]], "agg": [[slot, rows]]}
    body:   float64 state rows (slots x 8), then each sketch, then each across aggregate (rows x 4)
    u32 CRC-32 of everything before it

Every length is checked against the bytes actually present before anything is
allocated, so a hostile header cannot make the decoder allocate more than the
input's size: the body must be exactly as long as the declared metrics need
before any state is created, and a format spec may not ask for a width or
precision above 1000 (``format`` would allocate that many characters). The
decoder's work is linear in the input's size. Anything malformed raises
:class:`~metricsync.CodecError`, and nothing else.

Decoded states must be ones that recording and merging can produce: weight
sums, sketch cells and dropped-sample counts are ``>= 0`` (not NaN), the
per-rank counts of ``across`` aggregates are non-negative integers and no
time stamp is NaN; anything else is a ``CodecError``. Values (sums, extremes,
``last``, second moments, aggregate values) may be NaN or infinite, as
``nan="propagate"`` samples and float64 overflow make them; ``compute()``
then reports NaN or infinities for them. Unknown extra header fields are
ignored.

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
import re
import struct
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np

from . import _state as st
from ._errors import CodecError, MetricsyncError
from ._spec import Spec, SpecTable

if TYPE_CHECKING:
    from ._metrics import Metrics

__all__ = ["FORMAT_VERSION", "decode", "encode"]

MAGIC = b"MSYN"
FORMAT_VERSION = 1
_HEAD = struct.Struct("<4sHHIQ")
_CRC = struct.Struct("<I")
_MIN_SIZE = _HEAD.size + _CRC.size
_MAX_FMT_NUMBER = 1000  # largest width or precision a decoded format spec may ask for
_FMT_NUMBER = re.compile(r"\d+")


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
    from ._metrics import Metrics
    from ._sketch import sketch_layout

    if not isinstance(header, dict):
        raise CodecError("header must be a JSON object")
    rules = _pairs(header, "rules", (str, str))
    slots = _pairs(header, "slots", (str, str))
    sketches = _pairs(header, "sketch", (int, int))
    aggs = _pairs(header, "agg", (int, int))
    specs: dict[str, Spec] = {}
    m = Metrics()
    _add_rules(m._table, [(key, _spec_of(text, specs)) for key, text in rules])
    slot_specs = [_spec_of(text, specs) for _, text in slots]
    n = len(slots)
    offset = n * st.NCOL * 8
    need = offset + sum(
        8 * sketch_layout(spec.accuracy).n_cells for spec in slot_specs if spec.needs_sketch
    )
    need += sum(32 * len(spec.reduce) for spec in slot_specs if spec.across != "exact")
    if need != len(body):  # checked before any state is allocated
        raise CodecError(f"body holds {len(body)} bytes, the header's {n} metrics need {need}")
    rows = np.frombuffer(body[:offset], dtype="<f8").reshape(n, st.NCOL)
    for (name, _), spec in zip(slots, slot_specs):
        if not name or name in m._index:
            raise CodecError(f"empty or repeated metric name {name!r}")
        m._slot(name, spec)
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
    _check_counts(m)
    return m


def _spec_of(text: str, cache: dict[str, Spec]) -> Spec:
    """The spec a header text describes (parsed once per distinct text)."""
    spec = cache.get(text)
    if spec is None:
        data = json.loads(text)
        fmt = data[2] if isinstance(data, list) and len(data) == 5 else None
        if isinstance(fmt, str) and any(
            len(digits) > 6 or int(digits) > _MAX_FMT_NUMBER for digits in _FMT_NUMBER.findall(fmt)
        ):
            raise CodecError(
                f"format spec {fmt[:40]!r} asks for a width or precision above {_MAX_FMT_NUMBER}"
            )
        spec = cache[text] = Spec.from_json(text)
    return spec


def _add_rules(table: SpecTable, rules: list[tuple[str, Spec]]) -> None:
    """Add decoded rules; a repeated key is malformed.

    ``SpecTable.add`` sorts the globs on every call, which is quadratic in
    their number: the globs but the last go in directly and one ``add`` sorts
    them all at once.
    """
    globs = []
    for key, spec in rules:
        if not key or table.rule_for(key) is not None:
            raise CodecError(f"empty or repeated rule {key!r}")
        if SpecTable.is_glob(key):
            globs.append((key, spec))
            table._globs[key] = spec  # placeholder so rule_for sees it; sorted below
        else:
            table.add(key, spec)
    if globs:
        last_key, last_spec = globs[-1]
        del table._globs[last_key]
        table.add(last_key, last_spec)


def _check_counts(m: Metrics) -> None:
    """Reject states no record or merge can produce (see the module docstring)."""
    n = len(m._names)
    rows = m._rows[:n]
    bad = ~(rows[:, st.W] >= 0) | ~(rows[:, st.DROP] >= 0) | ~np.isfinite(rows[:, st.DROP])
    bad |= np.isnan(rows[:, st.T])
    for slot, cells in m._sketch.items():
        bad[slot] |= not bool((cells >= 0).all())
    for slot, agg in m._agg.items():
        ranks = agg[:, 1]
        bad[slot] |= not bool(
            (np.isfinite(ranks) & (ranks >= 0) & (ranks == np.floor(ranks))).all()
        )
    if bad.any():
        name = m._names[int(np.argmax(bad))]
        raise CodecError(
            f"metric {name!r} holds a negative, NaN or fractional count; no record or merge "
            "makes that state"
        )


def _take(body: memoryview, offset: int, count: int) -> np.ndarray:
    end = offset + count * 8
    if count < 0 or end > len(body):
        raise CodecError("body too short for the declared arrays")
    return np.frombuffer(body[offset:end], dtype="<f8")
