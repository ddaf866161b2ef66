"""Synchronizing metrics across ``torch.distributed`` ranks.

A steady sync is one gather of a header and the state packed in the group's agreed layout;
every rank merges every rank's state, so the result equals ``merge``. New names grow the
layout (two collectives), unheld ones retire, large groups take the reduce path, and a failed
or timed-out collective raises ``SyncError`` and breaks the group.

>>> import metricsync as ms
>>> m = ms.Metrics(); m.record("loss", [1.0, 3.0]); m.record("acc", 0.5)
>>> m.sync().compute()  # no process group: one rank's sync, its names in name order
{'acc': 0.5, 'loss': 2.0}
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np

from .._record._store import Store
from .._state._errors import SpecMismatchError, SyncError, with_device_error
from .._state._rules import SpecTable
from .._state._spec import Spec
from .._state._table import StateTable
from ._allreduce import Reduced, choose, widen
from ._comm import Comm, remaining
from ._group import GroupContext, sync_target
from ._layout import (
    NO_WINDOW,
    GroupState,
    Layout,
    Placement,
    Window,
    decode_entries,
    encode_entries,
)
from ._placement import place
from ._reduce import (
    HEADER,
    Word,
    header,
    merge_ranks,
    pack,
    pack_cells,
    sum_cells,
    widened,
    within_windows,
)
from ._retire import settle

__all__ = ["describe_tag", "sync", "sync_in", "sync_table"]

_MAGIC = 0x6D73796E6332  # "msync2": the header's flags include _FULL
_RELAYOUT, _DEVICE_ERROR, _CONFLICT, _WINDOW, _DECLARED, _FULL = 1, 2, 4, 8, 16, 32


def sync(
    store: Store,
    group: Any = None,
    timeout: Any = None,
    wrap: Callable[[Store], Any] = lambda store: store,
) -> Any:
    """``wrap`` of a store holding the merge over ``group``, identical on every rank (without
    a process group, one rank's sync: :func:`metricsync._sync._group.alone`)."""
    ctx, seconds = sync_target(group, timeout)
    return sync_in(ctx, seconds, store, wrap)


def sync_in(
    ctx: GroupContext, seconds: float | None, store: Store, wrap: Callable[[Store], Any]
) -> Any:
    """:func:`sync` with its group resolved."""
    with store.lock:  # a device error is reported after the header gather, on every rank
        table, error = with_device_error(store.folded, lambda: store.folded(devices=False))
        rules = store.rules.copy()
    return wrap(Store(rules, sync_table(ctx, table, rules, error, seconds, owner=store)))


def sync_table(
    ctx: GroupContext,
    table: StateTable,
    rules: SpecTable,
    error: ValueError | None,
    timeout: float | None,
    tag: int = 0,
    poll: bool = True,
    owner: object = None,
) -> StateTable:
    """The merge of ``table`` over every rank of the group of ``ctx`` (see the module
    docstring).

    ``tag`` identifies the sync's ``Metrics`` among a group's async syncs (see
    :mod:`metricsync._sync._async`); a blocking sync passes its store as ``owner``
    instead, and its tag says where that store last synced on the group
    (:func:`_owner_tag`). Ranks whose tags differ raise ``SyncError``, since they
    are merging different ``Metrics``. ``poll``: whether host collectives are
    polled before the wait blocks (see :mod:`metricsync._sync._comm`).
    """
    state = ctx.state
    if state.broken is not None:
        raise SyncError(
            f"metricsync sync: this process group is out of step: {state.broken}; "
            "create a new process group to sync again"
        )
    deadline = None if timeout is None else time.monotonic() + timeout
    left = remaining(deadline)
    if not state.lock.acquire(timeout=-1 if left is None else max(left, 0.0)):
        raise SyncError(
            "metricsync sync: another thread's sync on this group did not finish in time"
        )
    comm = Comm(ctx, deadline, poll)
    try:
        tag = tag if owner is None else _owner_tag(state, owner)
        # the path: one gather, or reductions whose size does not grow with the group
        reduce = choose(ctx.world, state.layout, state.windows)
        run = _agree_and_reduce if reduce else _agree_and_merge
        result = run(comm, table, rules, error, tag)
        _count(state, owner)
        return result
    except (SpecMismatchError, _Agreed) as exc:  # every rank raises the same, in step
        _count(state, owner)
        if isinstance(exc, _Agreed):
            raise exc.error from None
        raise
    except SyncError:
        raise
    except BaseException:
        if comm.count:
            state.broken = "an earlier sync raised between its collectives"
        raise
    finally:
        state.lock.release()


def _owner_tag(state: GroupState, owner: object) -> int:
    """The tag of a blocking sync of ``owner``: -1 for its first sync on the group, else
    -2 less the sync number of its last one (negative: async tags are positive). Ranks
    that sync the same ``Metrics`` objects in the same order agree on it; a rank that
    syncs another ``Metrics`` than its peers, one last synced at another sync number,
    does not (see :func:`_check_in_step`)."""
    last = state.synced.get(owner)
    return -1 if last is None else -2 - last


def _count(state: GroupState, owner: object) -> None:
    """One more sync ran on the group (every rank in step), the last one of ``owner``."""
    if owner is not None:
        state.synced[owner] = state.seq
    state.seq += 1


class _Agreed(Exception):
    """An error every rank raises after the same collectives (the group stays in step)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _Opening(NamedTuple):
    """One attempt's start, alike on both paths (:func:`_open`)."""

    placed: Placement  # this rank's table in the layout
    flags: int  # this rank's
    agreed: list[Window]  # the agreed sketch windows, per sketch entry of the layout
    blob: bytes  # this rank's entries the layout lacks, encoded
    declared: np.ndarray  # per layout position: this rank's rules declare it otherwise
    head: np.ndarray  # this rank's header (Word)


def _open(
    state: GroupState,
    table: StateTable,
    rules: SpecTable,
    error: Exception | None,
    tag: int,
    layout: Layout,
    placed: Placement | None,
    attempt: int,
) -> _Opening:
    """Where ``table`` sits in ``layout``, and what this rank says of it in its header."""
    placed = place(state, table, layout, placed)
    covered = placed.covered
    flags = (0 if covered else _RELAYOUT) | (_DEVICE_ERROR if error else 0)
    agreed = [state.windows.get(entry, NO_WINDOW) for entry in layout.sketch_entries]
    if covered and not within_windows(table, layout, placed.where, agreed):
        flags |= _WINDOW
    clash = 0
    if attempt and not covered:  # the new entries gave a name this rank holds another spec
        flags |= _CONFLICT
        clash = 1 + _uncovered(table, layout)
    # a rank with entries the layout lacks sends their encoded size ahead of them
    blob = b"" if covered else encode_entries(_new_entries(table, placed))
    # which layout entries this rank holds, and which its rules declare otherwise
    declared = _declared_otherwise(state, rules, layout, placed.mine)
    flags |= (_DECLARED if declared.any() else 0) | (_FULL if placed.full else 0)
    head = header(
        magic=_MAGIC,
        seq=state.seq,
        layout=layout.fingerprint,
        size=len(layout),
        flags=flags,
        clash=clash,
        tag=tag,
        blob=len(blob),
    )
    return _Opening(placed, flags, agreed, blob, declared, head)


def _raise_agreed(
    every: int,
    error: Exception | None,
    rules: SpecTable,
    table: StateTable,
    layout: Layout,
    clash: int,
) -> None:
    """The errors every rank raises in step, from the OR of every rank's flags (``clash``:
    the largest clash word, :class:`Word`)."""
    if every & _DEVICE_ERROR:
        raise _Agreed(
            error
            or SyncError(
                "metricsync sync: another rank recorded invalid data (see that rank's error)"
            )
        )
    if every & _CONFLICT:
        _raise_conflict(rules, table, layout, clash - 1)


def _close(
    state: GroupState,
    layout: Layout,
    agreed: list[Window],
    merged: StateTable,
    held: np.ndarray | None,
) -> StateTable:
    """The end of a sync on both paths: the agreed windows kept, names no rank held for long
    retired, and the result limited to the names some rank holds (``held``; None: all)."""
    state.windows.update(zip(layout.sketch_entries, agreed))
    settle(state, layout, held, state.seq)  # names no rank held for long leave the layout
    if held is not None and not held.all():  # names no rank holds (another Metrics') stay out
        return merged.subset(*layout.part(held))
    return merged


def _agree_and_merge(
    comm: Comm, table: StateTable, rules: SpecTable, error: Exception | None, tag: int
) -> StateTable:
    ctx = comm.ctx
    state, rank = ctx.state, ctx.rank
    layout = state.layout
    placed: Placement | None = None
    for attempt in range(2):
        placed, flags, agreed, blob, declared, head = _open(
            state, table, rules, error, tag, layout, placed, attempt
        )
        where = placed.where
        bits = np.packbits(np.concatenate([placed.held, declared]))
        bits = np.concatenate([bits, np.zeros(-len(bits) % 8, dtype=np.uint8)])
        size = layout.data_size + sum(w.hi - w.lo + 2 for w in agreed)
        if flags & (_RELAYOUT | _DEVICE_ERROR | _CONFLICT):  # no state to send: the new
            data = np.zeros(size)  # entries instead, where they fit (see _inline_entries)
            if len(blob) <= 8 * size:
                data.view(np.uint8)[: len(blob)] = np.frombuffer(blob, dtype=np.uint8)
        else:
            data = np.concatenate(
                [
                    pack(table, layout, where, rank, placed.index),
                    pack_cells(table, layout, where, agreed),
                ]
            )
        gathered = comm.all_gather(
            np.concatenate([head.view(np.float64), bits.view(np.float64), data]),
            "the state gather",
        )
        heads = np.ascontiguousarray(gathered[:, :HEADER]).view(np.int64)
        _check_in_step(comm, heads, head)
        every = int(np.bitwise_or.reduce(heads[:, Word.FLAGS]))
        if every & (_DEVICE_ERROR | _CONFLICT):
            _raise_agreed(every, error, rules, table, layout, int(heads[:, Word.CLASH].max()))
        nbits = len(bits) // 8
        if every & _DECLARED and not every & _RELAYOUT:  # held by one rank, declared otherwise?
            held_bits = np.ascontiguousarray(gathered[:, HEADER : HEADER + nbits]).view(np.uint8)
            masks = np.unpackbits(held_bits, axis=1)[:, : 2 * len(layout)].astype(bool)
            k = len(layout)
            clashes = np.flatnonzero(masks[:, k:].any(0) & masks[:, :k].any(0))
            if len(clashes):
                _raise_conflict(rules, table, layout, int(clashes[0]))
        body = gathered[:, HEADER + nbits :]
        if every & _RELAYOUT:
            sizes = heads[:, Word.BLOB].tolist()
            if max(sizes) <= 8 * size:  # every rank's new entries rode in this gather
                blobs = np.ascontiguousarray(body).view(np.uint8)
            else:
                blobs = _gather_entries(comm, blob, sizes)
            layout = _extend(blobs, sizes, layout)
            continue
        merged = merge_ranks(layout, body[:, : layout.data_size])
        if every & _WINDOW:  # some samples fell outside the agreed cells: widen, send again
            wider = widened(layout, agreed, merged)
            cells = comm.all_gather(pack_cells(table, layout, where, wider), "the sketch gather")
            sum_cells(merged, layout, wider, cells)
            # a NaN's window (every cell) serves this sync only; the next agrees anew
            agreed = [old if new.vmin != new.vmin else new for old, new in zip(agreed, wider)]
        elif layout.sketch:
            sum_cells(merged, layout, agreed, body[:, layout.data_size :])
        bits = gathered[:, HEADER : HEADER + nbits]
        held = None if every & _FULL else _held_by_any(bits, len(layout))
        return _close(state, layout, agreed, merged, held)
    raise AssertionError("unreachable: the second attempt returns or raises")


_IN_STEP = [int(w) for w in (Word.MAGIC, Word.SEQ, Word.LAYOUT)]  # the ranks' agreed words
_SAME = [*_IN_STEP, int(Word.TAG)]  # ... and the same Metrics


def _check_in_step(comm: Comm, heads: np.ndarray, mine: np.ndarray) -> None:
    own = mine.tolist()
    want = [own[w] for w in _SAME]
    if all([row[w] for w in _SAME] == want for row in heads.tolist()):
        return
    if not (heads[:, _IN_STEP] == mine[_IN_STEP]).all():
        comm.ctx.state.broken = "ranks disagreed on the sync sequence or the agreed layout"
        raise SyncError(
            "metricsync sync: the ranks are out of step (a different number of syncs, or syncs "
            "interleaved with other collectives on this group); create a new process group"
        )
    # the same sync number, different Metrics
    raise _out_of_order(comm, heads[:8, Word.TAG].tolist(), mine)


def _out_of_order(comm: Comm, tags: list[int], mine: np.ndarray) -> SyncError:
    """The error of a sync whose ranks' tags differ (ranks 0..7's ``tags``): they are
    merging different ``Metrics``. An async one leaves the group out of step."""
    seen = "; ".join(f"rank {r}: {describe_tag(int(t))}" for r, t in enumerate(tags))
    blocking = mine[Word.TAG] < 0  # see _owner_tag
    if not blocking:  # queued async syncs stay in another order: the group is out of step
        comm.ctx.state.broken = "ranks started their async syncs in a different order"
    kind = "blocking" if blocking else "async"
    return SyncError(
        f"metricsync sync: ranks started their {kind} syncs on this group in a different "
        f"order, so sync #{int(mine[Word.SEQ])} would merge different Metrics ({seen}); every rank "
        "must start them in the same order, with the same Metrics objects"
    )


def _held_by_any(bits: np.ndarray, k: int) -> np.ndarray:
    """Per layout position: some rank holds it (the first ``k`` of each rank's bits)."""
    rows = np.ascontiguousarray(bits).view(np.uint8)
    return np.unpackbits(np.bitwise_or.reduce(rows, axis=0))[:k].astype(bool)


def _declared_otherwise(
    state: GroupState, rules: SpecTable, layout: Layout, mine: np.ndarray
) -> np.ndarray:
    """Per layout position: this rank holds no slot for it and a rule gives it another spec.

    A few such positions are looked up one by one. Many (another ``Metrics``' names on
    this group) are answered for every position at once, kept in the group's ``state``
    per rules and layout, so syncing a small ``Metrics`` in turn with a large one
    resolves no name again.
    """
    out = np.zeros(len(layout), dtype=bool)
    if rules.empty():
        return out
    missing = np.flatnonzero(~mine)
    if len(missing) <= _FEW_MISSING:
        out[missing] = _ruled_otherwise(rules, layout, missing.tolist())
        return out
    key = (rules.token, layout.fingerprint)
    kept = state.otherwise  # the group's own (its syncs hold its lock)
    every = kept.pop(key, None)  # put back last: the latest used
    if every is None:
        every = _ruled_otherwise(rules, layout, range(len(layout)))
        if len(kept) >= _KEPT_OTHERWISE:
            kept.pop(next(iter(kept)))
    kept[key] = every
    return every & ~mine


def _ruled_otherwise(rules: SpecTable, layout: Layout, positions: Iterable[int]) -> np.ndarray:
    """Per position of ``positions``: a rule gives the layout's name there another spec."""
    names, specs = layout.names, layout.specs
    differs = []
    for i in positions:
        rule = rules.explicit(names[i])
        differs.append(rule is not None and rule != specs[i])
    return np.array(differs, dtype=bool)


_FEW_MISSING = 64  #: layout positions a rank lacks that _declared_otherwise looks up one by one
_KEPT_OTHERWISE = 4  #: (rules, layout) answers a group keeps: those of its latest syncs


def _uncovered(table: StateTable, layout: Layout) -> int:
    """The layout position of a name this rank holds under another spec."""
    for name, spec in zip(table.names, table.specs):
        i = layout.index.get(name)
        if i is not None and layout.specs[i] != spec:
            return i
    raise AssertionError("a rank that is not covered holds a name the layout specs differently")


def _raise_conflict(rules: SpecTable, table: StateTable, layout: Layout, position: int) -> None:
    name, theirs = layout.names[position], layout.specs[position]
    slot = table.index.get(name)
    mine = table.specs[slot] if slot is not None else rules.explicit(name)
    if mine is not None and mine != theirs:
        verb = "is" if slot is not None else "is declared"
        raise SpecMismatchError(
            f"metric {name!r} {verb} {mine!r} on this rank and {theirs!r} on another rank"
        )
    raise SpecMismatchError(
        f"metric {name!r} is {theirs!r} here and declared or held differently on another rank"
    )


def _new_entries(table: StateTable, placed: Placement) -> list[tuple[str, Spec]]:
    """The (name, spec) entries of ``table`` its layout (``placed``) lacks."""
    known = np.zeros(len(table), dtype=bool)  # the slots the layout holds with their spec
    known[placed.where[placed.held]] = True
    names, specs = table.names, table.specs
    return [(names[i], specs[i]) for i in np.flatnonzero(~known).tolist()]


def _gather_entries(comm: Comm, blob: bytes, sizes: list[int]) -> np.ndarray:
    """Every rank's encoded new entries (``blob``: this rank's; ``sizes``: every rank's,
    from the headers) when some did not fit in the state gather: one gather of bytes."""
    padded = np.zeros(max(sizes), dtype=np.uint8)
    padded[: len(blob)] = np.frombuffer(blob, dtype=np.uint8)
    return comm.all_gather(padded, "the layout gather")


def _extend(blobs: np.ndarray, sizes: list[int], layout: Layout) -> Layout:
    """The layout grown by every rank's entries it lacks (row ``r`` of ``blobs``: rank
    ``r``'s, encoded, ``sizes[r]`` bytes long)."""
    additions: dict[str, Any] = {}
    for rank, (row, size) in enumerate(zip(blobs, sizes)):
        if not size:  # a rank whose entries the layout holds sends none
            continue
        for name, spec in decode_entries(row[:size].tobytes()):
            seen = additions.setdefault(name, spec)
            if seen != spec:
                raise SpecMismatchError(
                    f"metric {name!r} is {seen!r} on one rank and {spec!r} on rank {rank}"
                )
    return layout.extended(additions.items())


def describe_tag(tag: int) -> str:
    """What a sync's tag says, for error messages (blocking syncs' tags are negative).

    >>> describe_tag(1), describe_tag(5)
    ('the first async sync of its Metrics', 'a Metrics last synced at #3')
    >>> describe_tag(-1), describe_tag(-5)
    ('the first blocking sync of its Metrics', 'a Metrics last synced at #3')
    """
    kind = "blocking" if tag < 0 else "async"
    if abs(tag) <= 1:
        return f"the first {kind} sync of its Metrics" if tag else "a blocking sync"
    return f"a Metrics last synced at #{abs(tag) - 2}"


# ---------------------------------------------------------------- the reduce path


def _agree_and_reduce(
    comm: Comm, table: StateTable, rules: SpecTable, error: Exception | None, tag: int
) -> StateTable:
    """:func:`_agree_and_merge`'s protocol through reductions (:mod:`metricsync._sync._allreduce`):
    the header, flags and MAX columns in one MAX reduce, the rest in one SUM reduce."""
    ctx = comm.ctx
    state, rank = ctx.state, ctx.rank
    layout = state.layout
    placed: Placement | None = None
    for attempt in range(2):
        placed, flags, agreed, blob, declared, head = _open(
            state, table, rules, error, tag, layout, placed, attempt
        )
        where = placed.where
        packable = not flags & (_RELAYOUT | _DEVICE_ERROR | _CONFLICT)
        data = pack(table, layout, where, rank, placed.index) if packable else None
        red = Reduced(comm, layout)
        got = red.round_a(head, data)
        _check_reduced(comm, got, head)
        every = got.flags
        if every & (_DEVICE_ERROR | _CONFLICT):
            _raise_agreed(every, error, rules, table, layout, got.clash)
        if every & _RELAYOUT:
            blobs, sizes = _gather_sized(comm, blob, got.blob)
            layout = _extend(blobs, sizes, layout)
            continue
        assert data is not None
        if every & _WINDOW:  # the global extremes are known: send the cells of the wider window
            wider = widen(red, layout, agreed)
            cells_in = wider
            agreed = [old if new.vmin != new.vmin else new for old, new in zip(agreed, wider)]
        else:
            cells_in = agreed
        asked_held = None if every & _FULL else placed.held
        asked_declared = declared if every & _DECLARED else None
        merged, held, declared_any = red.round_b(
            data, table, where, cells_in, asked_held, asked_declared
        )
        if declared_any is not None:  # held by some rank (all, when one holds all)?
            clashes = np.flatnonzero(declared_any if held is None else held & declared_any)
            if len(clashes):
                _raise_conflict(rules, table, layout, int(clashes[0]))
        # round B summed the held bits unless some rank holds every name (_FULL): exact
        return _close(state, layout, agreed, merged, held)
    raise AssertionError("unreachable: the second attempt returns or raises")


def _check_reduced(comm: Comm, got: Any, mine: np.ndarray) -> None:
    """:func:`_check_in_step` on round A's maxima and minima of the header words."""
    if (got.high == got.low).all():
        return
    if not got.agree(Word.MAGIC, Word.SEQ, Word.LAYOUT):
        comm.ctx.state.broken = "ranks disagreed on the sync sequence or the agreed layout"
        raise SyncError(
            "metricsync sync: the ranks are out of step (a different number of syncs, or syncs "
            "interleaved with other collectives on this group); create a new process group"
        )
    raise _out_of_order(comm, got.tags, mine)


def _gather_sized(comm: Comm, blob: bytes, longest: int) -> tuple[np.ndarray, list[int]]:
    """Every rank's encoded new entries, each behind its size (8 bytes), and the sizes."""
    padded = np.zeros(8 + longest, dtype=np.uint8)
    padded[:8] = np.frombuffer(np.int64(len(blob)).tobytes(), dtype=np.uint8)
    padded[8 : 8 + len(blob)] = np.frombuffer(blob, dtype=np.uint8)
    rows = comm.all_gather(padded, "the layout gather")
    sizes = np.ascontiguousarray(rows[:, :8]).view(np.int64)[:, 0].tolist()
    return rows[:, 8:], sizes
