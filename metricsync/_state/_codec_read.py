"""The decoder's side of the binary format (see :mod:`metricsync._state._codec`): a header's
checked :class:`Shape`, and the table a body of that shape holds; anything that recording and
merging cannot produce raises :class:`~metricsync.CodecError`.

>>> from metricsync._state._spec import Spec
>>> shape = new_shape({"rules": [], "slots": [["x", Spec("max").to_json()]], "sketch": [], "agg": []})
>>> shape.names, shape.specs, shape.fixed
(['x'], [Spec('max')], 80)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _algebra as al
from ._across import ACOL
from ._errors import CodecError
from ._keys import table_clash
from ._rules import SpecTable
from ._sketch import sketch_layout
from ._spec import Spec
from ._specinfo import spec_info
from ._table import StateTable
from ._tokens import token_of

__all__ = ["COUNT_MAX", "Shape", "body_bytes", "new_shape", "read_body"]

#: the largest dropped-sample or rank count a decoded state may hold: whole numbers up to
#: 2**53 (float64's exact integers; no job drops or merges that many), so that sums of
#: decoded counts never overflow
COUNT_MAX = float(2**53)


def body_bytes(
    n: int,
    sketches: list[list[int]],
    aggs: list[list[int]],
    ranked: list[int],
    ncol: int = al.NCOL,
) -> tuple[int, int]:
    """A body's bytes besides the sketches and their windows, and of the whole sketches
    (``ncol`` state rows per metric: 8 before version 3)."""
    fixed = n * ncol + sum(ACOL * rows for _, rows in aggs) + 2 * len(ranked)
    return 8 * fixed, 8 * sum(cells for _, cells in sketches)


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
class Shape:
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
    ncol: int  # state rows per metric (versions 1 and 2 lack N and W2)


def new_shape(header: Any, ncol: int = al.NCOL) -> Shape:
    """The checked shape of a parsed header (``CodecError`` where it cannot be one), whose
    body holds ``ncol`` state rows per metric."""
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
    if (found := table_clash(names, slot_specs)) is not None:
        name, other, key = found
        raise CodecError(
            f"metrics {name!r} and {other!r} would both report the key {key!r}; no record, "
            "merge or sync makes such a table"
        )
    fixed, dense = body_bytes(n, sketches, aggs, ranked, ncol)
    # the token of the tables of these names and specs: merging decoded results (a single
    # controller's workers, every step) finds what earlier merges of them worked out
    token = token_of(names, slot_specs)
    index = {name: slot for slot, name in enumerate(names)}
    return Shape(
        table_rules, names, slot_specs, index, token, sketches, aggs, ranked, fixed, dense, ncol
    )


def read_body(shape: Shape, body: memoryview, windowed: bool) -> StateTable:
    """The table a body of ``shape`` holds; checked before any state is allocated."""
    n, ncol = len(shape.names), shape.ncol
    offset = n * ncol * 8  # the state rows, then the windows (version 2), then cells
    if windowed:
        windows = _windows(shape, body, offset)
        offset += 16 * len(windows)
        need = shape.fixed + 16 * len(windows) + 8 * sum(count for _, count in windows)
    else:
        windows, need = None, shape.fixed + shape.dense
    if need != len(body):
        raise CodecError(f"body holds {len(body)} bytes, the header's {n} metrics need {need}")
    cols = np.empty((al.NCOL_ALL, n))  # the rank rows hold their identity unless sent
    cols[:ncol] = np.frombuffer(body[: n * ncol * 8], dtype="<f8").reshape(n, ncol).T
    cols[ncol:] = al.IDENTITY[ncol:, None]
    if ncol < al.NCOL:  # before N and W2 (version 3): the weights read as unit weights
        cols[[al.N, al.W2]] = cols[al.W]
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
    # a column no metric of the table carries holds its identity, as folds and syncs leave
    # it: a table's merge skips such a column's rule, which needs that of its inputs
    idle = [col for col in range(al.NCOL) if col not in spec_info(shape.specs, shape.token).need]
    cols[idle] = al.IDENTITY[idle, None]
    return table


def _windows(shape: Shape, body: memoryview, offset: int) -> list[tuple[int, int]]:
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
    w, drop, counts = state[al.W], state[al.DROP], state[al.N : al.W2 + 1]
    # the usual answer in a few reductions (NaN fails each test, as np.min and np.max
    # propagate it); the metric at fault is looked for only when one fails
    if (
        w.min(initial=0.0) >= 0
        and drop.min(initial=0.0) >= 0
        and drop.max(initial=0.0) <= COUNT_MAX
        and (drop == np.floor(drop)).all()
        and counts.min(initial=0.0) >= 0
        and not np.isnan(state[al.T].max(initial=-np.inf))
        and all(cells.min(initial=0.0) >= 0 for cells in cells_sent.values())
        and not table.aggs
    ):
        return
    bad = ~(w >= 0) | ~((drop >= 0) & (drop <= COUNT_MAX) & (drop == np.floor(drop)))
    bad |= ~(counts >= 0).all(axis=0)
    bad |= np.isnan(state[al.T])
    for slot, cells in cells_sent.items():
        bad[slot] |= not bool((cells >= 0).all())
    for slot, agg in table.aggs.items():
        ranks = agg[:, 1]
        bad[slot] |= not bool(
            ((ranks >= 0) & (ranks <= COUNT_MAX) & (ranks == np.floor(ranks))).all()
        )
    if bad.any():
        name = table.names[int(np.argmax(bad))]
        raise CodecError(
            f"metric {name!r} holds a negative, NaN or fractional count, or a dropped or "
            "rank count above 2**53; no record or merge makes that state"
        )


def _take(body: memoryview, offset: int, count: int) -> np.ndarray:
    end = offset + count * 8
    if count < 0 or end > len(body):
        raise CodecError("body too short for the declared arrays")
    return np.frombuffer(body[offset:end], dtype="<f8")
