"""The versioned binary format of a :class:`~metricsync.Metrics` (no pickle inside).

Layout, all little-endian::

    magic "MSYN" | u16 version | u16 flags (0) | u32 header length | u64 body length
    header: UTF-8 JSON {"rules": [[key, spec]], "slots": [[name, spec]],
                        "sketch": [[slot, cells]], "agg": [[slot, rows]]}
                        "ranks": [slot] (only when an argrank metric is present)}
    body:   float64 state rows (slots x 8), then the (start, count) window of each
            sketch, then the count cells of each sketch from its start, then each across
            aggregate (rows x 4), then the (max rank, min rank) pair of each argrank metric
    u32 CRC-32 of everything before it

A sketch sends its cells between its extremes (lengths 16-4,096 at 1%: ~300 of
8,067). Version 1, still read, sent every cell of every sketch.

Every length is checked against the bytes actually present before anything is
allocated, so a hostile header cannot make the decoder allocate more than 4 MiB
plus a bounded multiple of the input's size: the body must be exactly as long as
the declared metrics and windows need before any state is created, the whole
sketches a blob declares may take at most 4 MiB plus 32 bytes per byte of the
blob (the encoder sends as many sketches whole as that needs), a format spec may
not ask for a width or precision above 100 (``format`` would allocate that many
characters), and a spec may ask for at most 32 statistics, so ``compute()`` and
``format()`` of a decoded blob stay linear in its size. The decoder's work is
linear in the input's size. Anything malformed raises
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
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _algebra as al
from ._across import ACOL
from ._errors import CodecError, MetricsyncError
from ._rules import SpecTable
from ._sketch import held_span, sketch_layout
from ._spec import Spec
from ._table import StateTable
from ._tokens import remember, token_of

__all__ = ["FORMAT_VERSION", "decode", "encode"]

MAGIC = b"MSYN"
FORMAT_VERSION = 2
_READS = (1, 2)  #: version 1 has no sketch windows
_SKETCH_SLACK, _SKETCH_RATIO = 4 << 20, 32  #: whole-sketch bytes a blob may declare
_HEAD = struct.Struct("<4sHHIQ")
_CRC = struct.Struct("<I")
_MIN_SIZE = _HEAD.size + _CRC.size


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
    body = b"".join(parts)
    blob = _HEAD.pack(MAGIC, FORMAT_VERSION, 0, len(head.text), len(body)) + head.text + body
    return blob + _CRC.pack(zlib.crc32(blob))


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


#: (rules token, table token) -> the header of those rules, names and specs: a worker
#: that returns its results every step encodes the same header each time
_HEADS: dict[tuple[object, object], _Head] = {}


def _head_of(rules: SpecTable, table: StateTable) -> _Head:
    key = (rules.token, table.token)
    head = _HEADS.get(key)
    if head is None:
        head = _new_head(rules, table)
        _keep(_HEADS, key, head, len(head.text))
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
    fixed, dense = _body_bytes(len(specs), header["sketch"], header["agg"], ranked)
    return _Head(text_bytes, sketched, aggregated, ranked, fixed, dense)


def _body_bytes(
    n: int, sketches: list[list[int]], aggs: list[list[int]], ranked: list[int]
) -> tuple[int, int]:
    """A body's bytes besides the sketches and their windows, and of the whole sketches."""
    fixed = n * al.NCOL + sum(ACOL * rows for _, rows in aggs) + 2 * len(ranked)
    return 8 * fixed, 8 * sum(cells for _, cells in sketches)


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
    magic, version, flags, head_len, body_len = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise CodecError(f"not a metricsync blob (magic {magic!r})")
    if version not in _READS:
        raise CodecError(
            f"unsupported format version {version} (this build reads {_READS[0]} to {_READS[-1]})"
        )
    if flags != 0:
        raise CodecError(f"unknown flags {flags:#x}")
    if _HEAD.size + head_len + body_len + _CRC.size != len(data):
        raise CodecError(
            f"length mismatch: header says {head_len} + {body_len} bytes, "
            f"{len(data) - _MIN_SIZE} are present"
        )
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    view = memoryview(data)
    if zlib.crc32(view[: -_CRC.size]) != crc:
        raise CodecError("checksum mismatch: the blob is corrupted")
    try:
        text = data[_HEAD.size : _HEAD.size + head_len]
        shape = known = _SHAPES.get(text)
        if shape is None:
            shape = _new_shape(json.loads(text.decode("utf-8")))
        if shape.dense > _declarable(len(data)):
            raise CodecError(
                f"{len(data)} bytes declare sketches of {shape.dense} bytes, more than they may"
            )
        table = _read(shape, view[_HEAD.size + head_len : -_CRC.size], windowed=version > 1)
        if known is None:  # kept once a blob of it decoded, and only up to a size
            _keep(_SHAPES, text, shape, len(text))
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


@dataclass(frozen=True)
class _Shape:
    """What a header says, checked: rules, names, specs, and the parts the body holds."""

    rules: SpecTable  # handed out as copies
    names: list[str]  # shared by the tables decoded from this header (copied on change)
    specs: list[Spec]
    index: dict[str, int]
    token: object
    sketches: list[tuple[int, int]]  # (slot, cells)
    aggs: list[tuple[int, int]]  # (slot, rows)
    ranked: list[int]
    fixed: int  # bytes of the body besides the sketches and their windows
    dense: int  # bytes of the whole sketches


#: header bytes -> their checked shape: a single controller decodes its workers'
#: results every step, and each worker's header is the same each time
_SHAPES: dict[bytes, _Shape] = {}
_KEPT, _KEPT_BYTES = 16, 1 << 20  #: headers kept by each of the encoder and the decoder


def _keep(kept: dict[Any, Any], key: Any, value: Any, size: int) -> None:
    """Keep ``value`` under ``key`` (the latest few, headers of at most 1 MiB)."""
    if size <= _KEPT_BYTES:
        remember(kept, key, value, _KEPT)


def _new_shape(header: Any) -> _Shape:
    if not isinstance(header, dict):
        raise CodecError("header must be a JSON object")
    rules = _pairs(header, "rules", (str, str))
    slots = _pairs(header, "slots", (str, str))
    sketches = _pairs(header, "sketch", (int, int))
    aggs = _pairs(header, "agg", (int, int))
    ranked = header.get("ranks", [])
    if not isinstance(ranked, list) or not all(type(s) is int for s in ranked):
        raise CodecError("header field 'ranks' must be a list of slots")
    specs: dict[str, Spec] = {}
    table_rules = SpecTable()
    try:
        table_rules.add_all([(key, _spec_of(text, specs)) for key, text in rules])
    except (TypeError, ValueError) as exc:
        raise CodecError(f"malformed rules: {exc}") from None
    slot_specs = [_spec_of(text, specs) for _, text in slots]
    n = len(slots)
    names = [name for name, _ in slots]
    if len(set(names)) != n or not all(names):
        raise CodecError("empty or repeated metric name")
    if [slot for slot, _ in sketches] != [s for s, sp in enumerate(slot_specs) if sp.needs_sketch]:
        raise CodecError("sketch entries do not match the quantile metrics")
    for slot, size in sketches:
        if size != sketch_layout(slot_specs[slot].accuracy).n_cells:
            raise CodecError(f"sketch of metric {names[slot]!r} has {size} cells")
    if [slot for slot, _ in aggs] != [s for s, sp in enumerate(slot_specs) if sp.across != "exact"]:
        raise CodecError("aggregate entries do not match the across metrics")
    for slot, count in aggs:
        if count != len(slot_specs[slot].reduce):
            raise CodecError(f"aggregate of metric {names[slot]!r} has {count} rows")
    if ranked != [s for s, spec in enumerate(slot_specs) if spec.argrank]:
        raise CodecError("rank entries do not match the argrank metrics")
    fixed, dense = _body_bytes(n, sketches, aggs, ranked)
    # the token of the tables of these names and specs: merging decoded results (a single
    # controller's workers, every step) finds what earlier merges of them worked out
    token = token_of(names, slot_specs)
    index = {name: slot for slot, name in enumerate(names)}
    return _Shape(
        table_rules, names, slot_specs, index, token, sketches, aggs, ranked, fixed, dense
    )


def _read(shape: _Shape, body: memoryview, windowed: bool) -> StateTable:
    """The table a body of ``shape`` holds; checked before any state is allocated."""
    n = len(shape.names)
    offset = n * al.NCOL * 8  # the state rows, then the windows (version 2), then cells
    if windowed:
        windows = _windows(shape, body, offset)
        offset += 16 * len(windows)
        need = shape.fixed + 16 * len(windows) + 8 * sum(count for _, count in windows)
    else:
        windows, need = None, shape.fixed + shape.dense
    if need != len(body):
        raise CodecError(f"body holds {len(body)} bytes, the header's {n} metrics need {need}")
    cols = al.identity(n)
    cols[: al.NCOL] = np.frombuffer(body[: n * al.NCOL * 8], dtype="<f8").reshape(n, al.NCOL).T
    cells: dict[int, np.ndarray] = {}
    sent: dict[int, np.ndarray] = {}  # the cells the body holds (the rest are zero)
    for i, (slot, size) in enumerate(shape.sketches):
        start, count = (0, size) if windows is None else windows[i]
        whole = cells[slot] = np.zeros(size)
        whole[start : start + count] = sent[slot] = _take(body, offset, count)
        offset += count * 8
    agg_of: dict[int, np.ndarray] = {}
    for slot, count in shape.aggs:
        agg_of[slot] = _take(body, offset, count * ACOL).reshape(count, ACOL).copy()
        offset += count * ACOL * 8
    if ranked := shape.ranked:
        cols[al.MAXRANK :, ranked] = _take(body, offset, 2 * len(ranked)).reshape(-1, 2).T
    parts = (shape.names, shape.specs, cols, cells, agg_of)
    table = StateTable.from_parts(*parts, index=shape.index, complete=True, token=shape.token)
    _check_counts(table, sent)
    return table


def _windows(shape: _Shape, body: memoryview, offset: int) -> list[tuple[int, int]]:
    """The ``(start, count)`` window of each sketch, within its cells (as Python floats)."""
    raw = _take(body, offset, 2 * len(shape.sketches)).tolist()
    out = []
    for (slot, size), start, count in zip(shape.sketches, raw[::2], raw[1::2]):
        whole = start.is_integer() and count.is_integer()  # not NaN, inf or a fraction
        if not (whole and count >= 0 and 0 <= start <= size - count):
            name = shape.names[slot]
            raise CodecError(f"the sketch window of metric {name!r} is not within its cells")
        out.append((int(start), int(count)))
    return out


def _spec_of(text: str, cache: dict[str, Spec]) -> Spec:
    """The spec a header text describes (parsed once per distinct text)."""
    spec = cache.get(text)
    if spec is None:  # Spec bounds its statistics and format widths before using them
        spec = cache[text] = Spec.from_json(text)
    return spec


def _check_counts(table: StateTable, cells_sent: dict[int, np.ndarray]) -> None:
    """Reject states no record or merge can produce (see the module docstring);
    ``cells_sent``: the sketch cells the body held, per slot."""
    state = table.state
    bad = ~(state[al.W] >= 0) | ~(state[al.DROP] >= 0) | ~np.isfinite(state[al.DROP])
    bad |= np.isnan(state[al.T])
    for slot, cells in cells_sent.items():
        bad[slot] |= not bool((cells >= 0).all())
    for slot, agg in table.aggs.items():
        ranks = agg[:, 1]
        bad[slot] |= not bool(
            (np.isfinite(ranks) & (ranks >= 0) & (ranks == np.floor(ranks))).all()
        )
    if bad.any():
        name = table.names[int(np.argmax(bad))]
        raise CodecError(
            f"metric {name!r} holds a negative, NaN or fractional count; no record or merge "
            "makes that state"
        )


def _take(body: memoryview, offset: int, count: int) -> np.ndarray:
    end = offset + count * 8
    if count < 0 or end > len(body):
        raise CodecError("body too short for the declared arrays")
    return np.frombuffer(body[offset:end], dtype="<f8")
