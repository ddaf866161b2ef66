"""Bounded layouts: a name no rank has held for :data:`RETIRE_AFTER` syncs leaves the layout.

Every rank learns from each sync which positions some rank holds (header bits, or the reduce
path's counts), so all ranks retire the same names after the same sync, with no extra
collective.

>>> from metricsync._state._spec import Spec
>>> state = GroupState()
>>> layout = Layout([("a", Spec()), ("b", Spec())])
>>> for seq in range(RETIRE_AFTER):  # "b" held at sync 0 only
...     settle(state, state.layout if seq else layout, np.array([True, seq == 0]), seq)
>>> len(state.layout), state.held_at.tolist()
(2, [15, 0])
>>> settle(state, state.layout, np.array([True, False]), RETIRE_AFTER)
>>> state.layout.names, state.held_at.tolist()
(['a'], [16])
"""

from __future__ import annotations

import numpy as np

from ._layout import GroupState, Layout

__all__ = ["RETIRE_AFTER", "settle"]

RETIRE_AFTER = 16  #: syncs of a group after which a name no rank held leaves its layout


def settle(state: GroupState, layout: Layout, held: np.ndarray | None, seq: int) -> None:
    """Make ``layout``, merged in by sync ``seq``, the group's, less the names no rank
    has held for :data:`RETIRE_AFTER` syncs; ``held``: per position, whether some rank
    holds it (None: every position is held)."""
    at = _aligned(state, layout, seq)
    if held is None:
        at.fill(seq)
    else:
        at[held] = seq
        stale = at <= seq - RETIRE_AFTER
        if stale.any():
            for i in np.flatnonzero(stale).tolist():
                state.windows.pop(layout.entries[i], None)
            layout = layout.without(stale)
            at = at[~stale]
    state.layout, state.held_at, state.held_for = layout, at, layout.fingerprint


def _aligned(state: GroupState, layout: Layout, seq: int) -> np.ndarray:
    """``state.held_at`` for the positions of ``layout`` (a name new to it: held at ``seq``)."""
    if state.held_for == layout.fingerprint:
        return state.held_at
    old, at = state.layout, state.held_at
    if state.held_for != old.fingerprint:  # not a record of the group's layout: start anew
        return np.full(len(layout), seq, dtype=np.int64)
    grown = layout.grown
    if grown is not None and grown[0] == old.fingerprint:  # names inserted: see extended()
        return np.insert(at, grown[1], seq)
    index = old.index
    slots = np.fromiter((index.get(name, -1) for name in layout.names), np.intp, len(layout))
    out = np.full(len(layout), seq, dtype=np.int64)
    found = slots >= 0
    out[found] = at[slots[found]]
    return out
