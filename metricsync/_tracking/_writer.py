"""The Tracker's background writer: logged steps written in the order they were logged.

A daemon thread waits for each queued step in turn (an async sync's handle, or computed values),
so steps reach the backends in ``log`` order; a failed sync or backend is reported on the
training thread, never raised from the writer's.

>>> written = []
>>> writer = StepWriter(lambda step, item: written.append((step, item)))
>>> writer.put(1, "a"); writer.put(2, "b")
>>> writer.wait_idle(10.0), written
(True, [(1, 'a'), (2, 'b')])
>>> writer.stop(10.0)  # the steps it did not write
[]
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["StepWriter", "surface_failures"]


class StepWriter:
    """Calls ``write(step, item)`` for every queued item, in order, from a daemon thread.

    ``write`` may raise: the exception is kept, with the step, in
    :attr:`failed`. ``prepare(item)``, when given, runs first (it may wait);
    its exception is kept the same way and the step is not written.
    """

    def __init__(
        self,
        write: Callable[[int, Any], None],
        prepare: Callable[[Any], Any] | None = None,
        name: str = "metricsync-writer",
    ) -> None:
        self._write = write
        self._prepare = prepare
        self._items: deque[tuple[int, Any]] = deque()
        self._busy = 0  # queued plus the one being written
        self._cond = threading.Condition()
        self.failed: list[tuple[int, BaseException]] = []  # (step, what prepare/write raised)
        self._deferred: list[tuple[Any, ...]] = []
        self._stopped = False
        self.write_lock = threading.Lock()  # held while writing: close() takes it to stop writes
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def busy(self) -> bool:
        """Whether an item is queued or being written."""
        with self._cond:
            return self._busy > 0

    def put(self, step: int, item: Any) -> None:
        """Queue ``item`` for ``step``, behind everything queued before."""
        with self._cond:
            if self._stopped:
                raise RuntimeError("metricsync: the writer was stopped")
            self._items.append((step, item))
            self._busy += 1
            self._cond.notify_all()

    def pending_steps(self) -> list[int]:
        """The steps queued or being written."""
        with self._cond:
            return [step for step, _ in self._items]

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._stopped:
                    self._cond.wait()
                if not self._items:
                    return
                step, item = self._items[0]
            try:
                ready = self._prepare(item) if self._prepare is not None else item
                with self.write_lock:
                    if not self._stopped:
                        self._write(step, ready)
            except BaseException as exc:  # kept for the training thread
                with self._cond:
                    self.failed.append((step, exc))
            finally:
                with self._cond:
                    self._items.popleft()
                    self._busy -= 1
                    self._cond.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is queued; False if ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def defer(self, *report: Any) -> bool:
        """In the writer thread: keep ``report`` for :meth:`take_deferred` (True); else False."""
        if threading.get_ident() != self._thread.ident:
            return False
        with self._cond:
            self._deferred.append(report)
        return True

    def take_deferred(self) -> list[tuple[Any, ...]]:
        """What :meth:`defer` kept since the last call, oldest first."""
        with self._cond:
            kept, self._deferred = self._deferred, []
            return kept

    def stop(self, timeout: float | None = None) -> list[int]:
        """Write what is queued for at most ``timeout`` s, then no more; the steps left unwritten."""
        self.wait_idle(timeout)
        with self.write_lock, self._cond:
            self._stopped = True
            left = [step for step, _ in self._items]
            self._cond.notify_all()
        return left


def surface_failures(failed: list[tuple[int, BaseException]], raise_errors: bool) -> None:
    """Raise the oldest ``(step, exception)`` of ``failed`` (removed from it, with a note
    naming its step), or, without ``raise_errors``, warn about each and empty it."""
    if not failed:
        return
    if not raise_errors:
        for step, exc in failed:
            warnings.warn(
                f"metricsync: step {step} was not logged: {type(exc).__name__}: {exc}",
                RuntimeWarning,
                stacklevel=4,
            )
        failed.clear()
        return
    step, exc = failed.pop(0)
    note = getattr(exc, "add_note", None)
    if callable(note):
        note(f"(raised by the async sync logged at step {step}; that step was not written)")
    raise exc
