"""Where a table's slots sit in an agreed layout, worked out from the last placement.

Per layout position: the table's slot and whether it holds the layout's spec. Placements are
cached per (table token, layout); a miss starts from the placement the layout grew from, or of
a table this one extends, and looks up only the added names.

>>> from metricsync._state._spec import Spec
>>> from metricsync._state._table import StateTable
>>> table = StateTable(); table.slot("b", Spec()); table.slot("z", Spec())
0
1
>>> placed = place(GroupState(), table, Layout([("a", Spec()), ("b", Spec())]))
>>> placed.where.tolist(), placed.held.tolist(), placed.covered
([2, 0], [False, True], False)
"""

from __future__ import annotations

import operator

import numpy as np

from .._state._table import StateTable
from ._layout import GroupState, Layout, Placement
from ._reduce import pack_index, positions

__all__ = ["place"]

_Parts = tuple[np.ndarray, np.ndarray, np.ndarray]  # where, mine, held


def place(
    state: GroupState, table: StateTable, layout: Layout, before: Placement | None = None
) -> Placement:
    """Where ``table``'s slots sit in ``layout``, cached in ``state`` (see the module
    docstring); ``before``: the same table's placement in the layout ``layout`` may
    have grown from."""
    key = (table.token, layout.fingerprint)
    hit = state.placed.get(key)
    if hit is not None:
        return hit
    n = len(table)
    grown = layout.grown
    if (
        before is not None
        and grown is not None
        and grown[0] == before.fingerprint
        and shortcut(len(grown[1]), len(layout))
    ):
        where, mine, held = _grown(table, layout, before, grown[1])
    else:
        start = _prefix(state, table, layout)
        where, mine, held = (
            _fresh(table, layout) if start is None else _appended(table, layout, start)
        )
    held_count = int(held.sum())
    covered = int(mine.sum()) == n and held_count == n
    if len(state.placed) >= 8:
        state.placed.pop(next(iter(state.placed)))
    index = pack_index(n, layout, where) if covered else ()  # only a covered table packs
    placed = Placement(
        where,
        mine,
        held,
        covered,
        held_count == len(layout),
        index,
        layout.fingerprint,
        list(table.names),
        list(table.specs),
    )
    state.placed[key] = placed
    return placed


def shortcut(added: int, size: int) -> bool:
    """Whether a placement in a layout of ``size`` names starts from a cached one that
    lacks ``added`` of them (see the module docstring).

    >>> shortcut(1, 100), shortcut(60, 100)
    (True, False)
    """
    return 2 * added < size


def _fresh(table: StateTable, layout: Layout) -> _Parts:
    where = positions(table, layout)
    mine = where < len(table)
    # specs are canonical: the same object (C loops), or rarely an equal one (checked)
    at = list(map([*table.specs, None].__getitem__, where.tolist()))
    held = np.fromiter(map(operator.is_, at, layout.specs), dtype=bool, count=len(at))
    for i in np.flatnonzero(mine & ~held).tolist():
        held[i] = at[i] == layout.specs[i]
    return where, mine, held


def _grown(table: StateTable, layout: Layout, before: Placement, at: np.ndarray) -> _Parts:
    """The placement ``before`` of ``table``, in the layout that grew into ``layout`` by
    names inserted before its positions ``at``."""
    n = len(table)
    added = (at + np.arange(len(at))).tolist()  # the added names' positions in ``layout``
    slots = [table.index.get(layout.names[i], n) for i in added]
    held = [s < n and table.specs[s] == layout.specs[i] for s, i in zip(slots, added)]
    return (
        np.insert(before.where, at, slots),
        np.insert(before.mine, at, [s < n for s in slots]),
        np.insert(before.held, at, held),
    )


def _prefix(state: GroupState, table: StateTable, layout: Layout) -> Placement | None:
    """A cached placement in ``layout`` of a table that ``table`` extends by new slots."""
    for placed in state.placed.values():
        k = len(placed.names)
        if (
            placed.fingerprint == layout.fingerprint
            and 0 < k < len(table)
            and shortcut(len(table) - k, len(layout))
            and table.names[:k] == placed.names
            and table.specs[:k] == placed.specs
        ):
            return placed
    return None


def _appended(table: StateTable, layout: Layout, start: Placement) -> _Parts:
    """The placement ``start`` of a table that ``table`` extends, with its new slots."""
    k, n = len(start.names), len(table)
    where, mine, held = start.where.copy(), start.mine.copy(), start.held.copy()
    where[where == k] = n  # "no slot" is the table's length
    for slot in range(k, n):
        i = layout.index.get(table.names[slot])
        if i is not None:  # a name new to this table: the position held none before
            where[i], mine[i] = slot, True
            held[i] = table.specs[slot] == layout.specs[i]
    return where, mine, held
