"""Asynchronous syncs: off the training thread, on a gloo "bookkeeping" process group.

``metrics.sync(group, async_op=True)`` snapshots the state at the call (so
later records go to the next sync) and returns a :class:`SyncHandle` at once.
One daemon worker thread per process runs the queued syncs in the order they
were started, each on the bookkeeping group of its group: a gloo group over
the same ranks, created collectively once by :func:`bookkeeping_group`
(every rank of the default group must call it, as for any ``new_group``), or
for you on the first async sync over the whole world. Its cost: one more
process group (a few sockets per rank) and the thread.

Ranks must start their async syncs in the same order; the layout check of
each sync turns a different order into :class:`~metricsync.SyncError`
rather than a wrong merge when the Metrics differ in names. A missing rank
gives ``SyncError`` from ``wait()`` within the timeout. At exit, pending syncs
get a few seconds to finish; the worker never keeps the interpreter alive.

>>> import metricsync as ms
>>> handle = ms.Metrics().sync(async_op=True)  # no process group: done at once
>>> handle.done(), handle.wait().compute()
(True, {})
"""

from __future__ import annotations

import atexit
import queue
import threading
from collections.abc import Callable, Hashable
from typing import Any

from ._errors import SyncError
from ._rules import SpecTable
from ._store import Store
from ._table import StateTable

__all__ = ["SyncHandle", "bookkeeping_group", "done_handle", "submit"]

_EXIT_WAIT = 5.0  # seconds pending syncs get at interpreter exit


class SyncHandle:
    """A sync running in the background: ``wait()`` gives the synced Metrics, ``done()`` tells."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def _finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self._event.set()

    def done(self) -> bool:
        """Whether the sync finished (with a result or an error)."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        """The synced ``Metrics``; re-raises the sync's error; ``SyncError`` after ``timeout`` s."""
        if not self._event.wait(timeout):
            raise SyncError(f"metricsync sync: not finished within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def __repr__(self) -> str:
        return f"SyncHandle({'done' if self.done() else 'pending'})"


def done_handle(result: Any) -> SyncHandle:
    """A handle that is already finished with ``result``."""
    handle = SyncHandle()
    handle._finish(result)
    return handle


_BOOKKEEPING: dict[Hashable, Any] = {}
_LOCK = threading.Lock()


def bookkeeping_group(group: Any = None) -> Any:
    """The gloo group async syncs of ``group`` run on; created on first call.

    Collective: every rank of the default group must call it (with its own
    group, for sub-groups), in the same order, as ``torch.distributed.new_group``
    requires.
    """
    import torch.distributed as dist

    from ._sync import resolve_group

    group = resolve_group(dist, group)
    ranks = tuple(dist.get_process_group_ranks(group))
    key = (getattr(group, "group_name", None), ranks)
    with _LOCK:
        made = _BOOKKEEPING.get(key)
        if made is None:
            made = _BOOKKEEPING[key] = dist.new_group(list(ranks), backend="gloo")
        return made


class _Worker:
    """The one thread that runs queued syncs in order."""

    def __init__(self) -> None:
        self.queue: queue.Queue[tuple[SyncHandle, Callable[[], Any]] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="metricsync-sync", daemon=True)
        self.thread.start()
        atexit.register(self.close)

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            handle, job = item
            try:
                handle._finish(job())
            except BaseException as exc:  # handed to wait(), in the caller's thread
                handle._finish(error=exc)

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(_EXIT_WAIT)


_worker: _Worker | None = None


def submit(
    group: Any,
    table: StateTable,
    rules: SpecTable,
    error: ValueError | None,
    timeout: float | None,
    wrap: Callable[[Store], Any],
) -> SyncHandle:
    """Queue the sync of a snapshot on ``group``'s bookkeeping group; a handle at once."""
    import torch.distributed as dist

    from ._sync import sync_table

    global _worker
    ranks = tuple(dist.get_process_group_ranks(group))
    if ranks != tuple(range(dist.get_world_size())) and (
        (getattr(group, "group_name", None), ranks) not in _BOOKKEEPING
    ):
        raise RuntimeError(
            "an async sync over a sub-group needs its bookkeeping group first: call "
            "metricsync.bookkeeping_group(group) on every rank"
        )
    side = bookkeeping_group(group)
    handle = SyncHandle()
    with _LOCK:
        if _worker is None:
            _worker = _Worker()
        worker = _worker

    def job() -> Any:
        return wrap(Store(rules, sync_table(dist, side, table, rules, error, timeout)))

    worker.queue.put((handle, job))
    return handle
