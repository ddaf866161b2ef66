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
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .._record._store import Store
from .._state._errors import SyncError, with_device_error
from .._state._rules import SpecTable
from .._state._table import StateTable
from ._group import GroupContext, GroupMemory, check_timeout, resolve, sync_target
from ._sync import sync_in, sync_table

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

_LOCK = threading.Lock()  # the worker, and the bookkeeping groups and counts of GroupMemory


def bookkeeping_group(group: Any = None, *, timeout: Any = None) -> Any:
    """The gloo group that async syncs over ``group`` run on, created on the first call.

    ``group``: a process group or a 1-D ``DeviceMesh`` (None: the default
    group). Creating it is collective: for a group over every rank, every
    rank calls it (the first async sync over such a group does it for you);
    for a sub-group, every member calls it once, at set-up. It blocks until
    every member has arrived, at most ``timeout`` (seconds; torch's default
    process-group timeout without one), which also stays the group's bound on
    each collective; a failure raises :class:`~metricsync.SyncError`, here and
    for every later call. See :mod:`metricsync._sync._async` for what it costs.

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
    return _bookkeeping(resolve(dist, group), seconds)


def _bookkeeping(ctx: GroupContext, seconds: float | None) -> Any:
    """The bookkeeping group of ``ctx``'s group, kept in its memory (created on first use:
    a group re-created after ``destroy_process_group`` is another group, with none yet)."""
    memory = ctx.memory
    with _LOCK:
        made = memory.bookkeeping
    if made is None:
        made = _create(ctx, seconds)
        with _LOCK:
            if memory.bookkeeping is None:
                memory.bookkeeping = made
            made = memory.bookkeeping
    if isinstance(made, SyncError):
        raise SyncError(f"metricsync: no bookkeeping group for async syncs: {made}")
    return made


def _whole(ctx: GroupContext) -> bool:
    """Whether ``ctx``'s group spans every rank of the default group."""
    return ctx.memory.ranks == tuple(range(ctx.dist.get_world_size()))


def _create(ctx: GroupContext, seconds: float | None) -> Any:
    """A gloo group over the ranks of ``ctx``'s group, or the ``SyncError`` creating it gave."""
    whole = _whole(ctx)
    try:
        return ctx.dist.new_group(
            None if whole else list(ctx.memory.ranks),
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


def _forget_after_fork() -> None:  # threads do not survive a fork (process groups: _group)
    global _worker, _LOCK
    _worker = None
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


# ------------------------------------------------------------------------ ordering


def _tag(store: Store, memory: GroupMemory) -> int:
    """The header tag of the next async sync of ``store`` on the group of ``memory`` (see
    the module)."""
    with _LOCK:
        position = memory.async_started
        memory.async_started = position + 1
        previous = memory.async_last.get(store, -1)
        memory.async_last[store] = position
    return previous + 2  # 1: this Metrics' first async sync here; 0 is for blocking syncs


def sync_async(store: Store, group: Any, timeout: Any, wrap: Callable[[Store], Any]) -> SyncHandle:
    """A handle for the merge over ``group`` of ``store`` as it is now (see the module)."""
    started = time.monotonic()
    ctx, seconds = sync_target(group, timeout)
    if ctx.dist is None:  # no process group: one rank's sync, with no collective to wait for
        return done_handle(sync_in(ctx, seconds, store, wrap))
    with store.lock:  # a device error is reported after the header gather, on every rank
        later, error = with_device_error(store.snapshot_later, lambda: _host_only(store))
        rules = store.rules.copy()
    return submit(store, ctx, later, rules, error, seconds, wrap, started)


def _host_only(store: Store) -> Callable[[], StateTable]:
    """What an async sync sends when a device record failed: the host samples alone."""
    table = store.folded(devices=False)
    return lambda: table


def submit(
    store: Store,
    ctx: GroupContext,
    later: Callable[[], StateTable],
    rules: SpecTable,
    error: ValueError | None,
    timeout: float | None,
    wrap: Callable[[Store], Any],
    started: float,
) -> SyncHandle:
    """Queue the sync of the snapshot ``later()`` folds on the worker; a handle at once."""
    if ctx.memory.bookkeeping is None and not _whole(ctx):
        raise RuntimeError(
            "an async sync over a sub-group runs on a bookkeeping group that every member "
            "creates once at set-up: call metricsync.bookkeeping_group(group) on each rank "
            f"of the group {list(ctx.memory.ranks)} first"
        )
    try:
        side = resolve(ctx.dist, _bookkeeping(ctx, timeout))  # the group the worker syncs on
    except SyncError as exc:
        return done_handle(error=exc)
    tag = _tag(store, ctx.memory)

    lock = store.lock

    def job() -> Any:
        with lock:  # the caller's Metrics call under way (a reset, say) goes first: see the module
            pass
        table, problem = _finish(later, error)
        left = None if timeout is None else max(timeout - (time.monotonic() - started), 1e-3)
        return wrap(Store(rules, sync_table(side, table, rules, problem, left, tag, poll=False)))

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
