"""Asynchronous syncs: off the training thread, on a gloo "bookkeeping" process group.

``sync(async_op=True)`` snapshots the state under the lock (pending samples captured, not
folded) and returns a :class:`SyncHandle`; one daemon worker runs the syncs in call order on
a separate gloo group over the same ranks, so its collectives never interleave with the
training thread's.

>>> import metricsync as ms
>>> handle = ms.Metrics().sync(async_op=True)  # no process group: done at once
>>> handle.done(), handle.wait().compute()
(True, {})
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Hashable
from datetime import timedelta
from typing import Any

from ._errors import SyncError, with_device_error
from ._group import check_timeout, resolve_group, sync_target
from ._rules import SpecTable
from ._store import Store
from ._sync import sync_table
from ._table import StateTable

__all__ = [
    "EXIT_WAIT",
    "SyncHandle",
    "bookkeeping_group",
    "done_handle",
    "exit_time_left",
    "submit",
    "sync_async",
]

EXIT_WAIT = 5.0
"""Seconds that pending async syncs get, in all, when the interpreter exits."""

_Job = tuple["SyncHandle", Callable[[], Any]]


class SyncHandle:
    """An async sync: ``wait()`` gives the synced ``Metrics``, ``done()`` tells if it finished.

    Returned by ``metrics.sync(group, async_op=True)``; the state was taken at
    that call. ``wait()`` re-raises what the sync raised (``SyncError``,
    ``SpecMismatchError``, ...), on every call. ``Tracker.log`` takes a handle
    and writes the step when it completes.

    >>> import metricsync as ms
    >>> m = ms.Metrics()
    >>> m.record("loss", 2.0)
    >>> handle = m.sync(async_op=True)
    >>> m.record("loss", 100.0)   # after the call: goes to the next sync
    >>> handle.wait().compute()
    {'loss': 2.0}
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        """Set the outcome (the sync's worker does; ``wait()`` then returns or raises it)."""
        self._result, self._error = result, error
        self._event.set()

    def done(self) -> bool:
        """Whether the sync finished, with a result or an error."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        """The synced ``Metrics``; raises the sync's error if it failed.

        ``timeout`` (seconds) bounds this wait only: ``TimeoutError`` when the
        sync is still running then (it goes on; wait again). The sync's own
        timeout, given to ``sync``, is what turns a missing rank into
        ``SyncError``.
        """
        if not self._event.wait(timeout):
            raise TimeoutError(f"metricsync: the async sync is still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def __repr__(self) -> str:
        state = "pending" if not self.done() else "failed" if self._error else "done"
        return f"SyncHandle({state})"


def done_handle(result: Any = None, error: BaseException | None = None) -> SyncHandle:
    """A handle that already finished with ``result`` (or ``error``)."""
    handle = SyncHandle()
    handle.finish(result, error)
    return handle


# ---------------------------------------------------------------- bookkeeping groups

_BOOKKEEPING: dict[Hashable, Any] = {}  # group key -> gloo group, or the SyncError creating it
_LOCK = threading.Lock()


def _key(dist: Any, group: Any) -> Hashable:
    return (getattr(group, "group_name", None), tuple(dist.get_process_group_ranks(group)))


def bookkeeping_group(group: Any = None, *, timeout: Any = None) -> Any:
    """The gloo group that async syncs over ``group`` run on, created on the first call.

    ``group``: a process group or a 1-D ``DeviceMesh`` (None: the default
    group). Creating it is collective: for a group over every rank, every
    rank calls it (the first async sync over such a group does it for you);
    for a sub-group, every member calls it once, at set-up. It blocks until
    every member has arrived, at most ``timeout`` (seconds; torch's default
    process-group timeout without one), which also stays the group's bound on
    each collective; a failure raises :class:`~metricsync.SyncError`, here and
    for every later call. See :mod:`metricsync._async` for what it costs.

    >>> import metricsync as ms
    >>> from metricsync.testing import run_distributed
    >>> def fn(rank, world):
    ...     ms.bookkeeping_group()                  # every rank, once, at set-up
    ...     m = ms.Metrics()
    ...     m.record("x", float(rank))
    ...     return m.sync(timeout=30, async_op=True).wait().compute()
    >>> run_distributed(fn, world_size=2)  # doctest: +SKIP
    [{'x': 0.5}, {'x': 0.5}]
    """
    import torch.distributed as dist

    seconds = check_timeout(timeout)
    group = resolve_group(dist, group)
    key = _key(dist, group)
    with _LOCK:
        made = _BOOKKEEPING.get(key)
        if made is not None and not isinstance(made, SyncError) and not _alive(dist, made):
            made = None  # destroyed with the process groups: make a new one (after a new init)
            del _BOOKKEEPING[key]
            _NEXT.pop(key, None)
    if made is None:
        made = _create(dist, group, seconds)
        with _LOCK:
            made = _BOOKKEEPING.setdefault(key, made)
    if isinstance(made, SyncError):
        raise SyncError(f"metricsync: no bookkeeping group for async syncs: {made}")
    return made


def _alive(dist: Any, group: Any) -> bool:
    """Whether ``group`` is still registered (``destroy_process_group`` forgets every group)."""
    try:
        dist.get_process_group_ranks(group)
    except Exception:
        return False
    return True


def _create(dist: Any, group: Any, seconds: float | None) -> Any:
    """A gloo group over ``group``'s ranks, or the ``SyncError`` that creating it gave."""
    ranks = sorted(dist.get_process_group_ranks(group))
    whole = ranks == list(range(dist.get_world_size()))
    try:
        return dist.new_group(
            None if whole else ranks,
            timeout=None if seconds is None else timedelta(seconds=seconds),
            backend="gloo",
            use_local_synchronization=not whole,
        )
    except Exception as exc:  # a member that never arrived, or a broken store
        return SyncError(f"creating it failed ({type(exc).__name__}: {exc})")


# -------------------------------------------------------------------------- worker


class _Worker:
    """The one thread that runs queued syncs, in the order they were started."""

    def __init__(self) -> None:
        self.queue: queue.Queue[_Job | None] = queue.Queue()
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="metricsync-sync", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            handle, job = item
            try:
                handle.finish(job())
            except BaseException as exc:  # handed to wait(), in the caller's thread
                handle.finish(error=exc)

    def close(self, timeout: float) -> None:
        """Let the queued syncs run for at most ``timeout`` seconds, then stop taking new ones."""
        self.closed = True
        self.queue.put(None)
        self.thread.join(timeout)


_worker: _Worker | None = None


def _running_worker() -> _Worker:
    global _worker
    with _LOCK:
        if _worker is None or _worker.closed:
            _worker = _Worker()
        return _worker


_exit_deadline: float | None = None


def exit_time_left() -> float:
    """Seconds left of the :data:`EXIT_WAIT` that every wait at interpreter exit shares.

    The first call starts the count, so the Tracker's wait for its pending
    steps and the worker's for its syncs end together.
    """
    global _exit_deadline
    if _exit_deadline is None:
        _exit_deadline = time.monotonic() + EXIT_WAIT
    return max(0.0, _exit_deadline - time.monotonic())


@atexit.register
def _close_at_exit() -> None:  # registered before the Tracker's, so it runs after it
    if _worker is not None:
        _worker.close(exit_time_left())


def _forget_after_fork() -> None:  # threads do not survive a fork; process groups neither
    global _worker
    _worker = None
    _BOOKKEEPING.clear()
    _NEXT.clear()
    _LAST.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


# ------------------------------------------------------------------------ ordering

_NEXT: dict[Hashable, int] = {}  # group -> number of async syncs started on its bookkeeping group
_LAST: weakref.WeakKeyDictionary[Store, dict[Hashable, int]] = weakref.WeakKeyDictionary()


def _tag(store: Store, key: Hashable) -> int:
    """The header tag of the next async sync of ``store`` on the group ``key`` (see the module)."""
    with _LOCK:
        position = _NEXT.get(key, 0)
        _NEXT[key] = position + 1
        last = _LAST.setdefault(store, {})
        previous = last.get(key, -1)
        last[key] = position
    return previous + 2  # 1: this Metrics' first async sync here; 0 is for blocking syncs


def sync_async(store: Store, group: Any, timeout: Any, wrap: Callable[[Store], Any]) -> SyncHandle:
    """A handle for the merge over ``group`` of ``store`` as it is now (see the module)."""
    started = time.monotonic()
    dist, group, seconds = sync_target(group, timeout)
    if dist is None:
        return done_handle(wrap(Store(store.rules.copy(), store.snapshot())))
    with store.lock:  # a device error is reported after the header gather, on every rank
        later, error = with_device_error(store.snapshot_later, lambda: _host_only(store))
        rules = store.rules.copy()
    return submit(store, group, later, rules, error, seconds, wrap, started)


def _host_only(store: Store) -> Callable[[], StateTable]:
    """What an async sync sends when a device record failed: the host samples alone."""
    table = store.folded(devices=False)
    return lambda: table


def submit(
    store: Store,
    group: Any,
    later: Callable[[], StateTable],
    rules: SpecTable,
    error: ValueError | None,
    timeout: float | None,
    wrap: Callable[[Store], Any],
    started: float,
) -> SyncHandle:
    """Queue the sync of the snapshot ``later()`` folds on the worker; a handle at once."""
    import torch.distributed as dist

    ranks = sorted(dist.get_process_group_ranks(group))
    if ranks != list(range(dist.get_world_size())):
        with _LOCK:
            known = _key(dist, group) in _BOOKKEEPING
        if not known:
            raise RuntimeError(
                "an async sync over a sub-group runs on a bookkeeping group that every member "
                "creates once at set-up: call metricsync.bookkeeping_group(group) on each rank "
                f"of the group {ranks} first"
            )
    try:
        side = bookkeeping_group(group, timeout=timeout)
    except SyncError as exc:
        return done_handle(error=exc)
    tag = _tag(store, _key(dist, group))

    lock = store.lock

    def job() -> Any:
        with lock:  # the caller's Metrics call under way (a reset, say) goes first: see the module
            pass
        table, problem = _finish(later, error)
        left = None if timeout is None else max(timeout - (time.monotonic() - started), 1e-3)
        return wrap(
            Store(rules, sync_table(dist, side, table, rules, problem, left, tag, poll=False))
        )

    handle = SyncHandle()
    _running_worker().queue.put((handle, job))
    return handle


def _finish(later: Callable[[], StateTable], error: Any) -> tuple[StateTable, Any]:
    """The folded table; a failed fold still syncs, so every rank raises and none waits."""
    try:
        return later(), error
    except Exception as exc:
        failed = ValueError(f"metricsync: folding the pending samples failed ({exc!r})")
        failed.__cause__ = exc
        return StateTable(), error or failed
