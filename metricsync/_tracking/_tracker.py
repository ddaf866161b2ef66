"""The :class:`Tracker`: log computed metrics to several backends, from rank 0 only.

>>> import tempfile
>>> from metricsync._log._logread import read_jsonl
>>> run_dir = tempfile.mkdtemp()
>>> with Tracker(backends=("console", "jsonl"), run_dir=run_dir) as tracker:
...     tracker.log({"loss": 0.6931, "lr": 3e-4}, step=1)
step 1 | loss   0.6931  lr 3.00e-04
>>> read_jsonl(run_dir)[1]
[(1, {'loss': 0.6931, 'lr': 0.0003})]
"""

from __future__ import annotations

import atexit
import contextlib
import os
import warnings
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from .._sync._async import EXIT_WAIT, SyncHandle, exit_time_left
from ..backends import Backend, BackendFactory
from ..backends._config import as_config
from ._backends import backend_entries, check_options, fan_out, is_backend, make_backend
from ._histograms import histogram_patterns, select_histograms
from ._rank import detect_rank
from ._values import as_step, unwrap
from ._writer import StepWriter, surface_failures

__all__ = ["BackendEntry", "Tracker", "detect_rank", "unwrap"]

BackendEntry = str | Backend | BackendFactory
"""What ``Tracker(backends=...)`` takes: a name, a backend object or a factory."""


class Tracker:
    """Fan computed metrics out to logging backends; only rank 0 writes by default.

    ``backends`` holds any mix of

    - names: ``"console"``, ``"jsonl"``, ``"tensorboard"``, ``"wandb"``,
      ``"mlflow"``, ``"swanlab"``, ``"trackio"`` (see :mod:`metricsync.backends`),
      names added with :func:`metricsync.backends.register_backend`, and names
      that installed packages declare in the entry-point group
      ``metricsync.backends``;
    - factories: a class or callable returning a backend, called with the
      run directory (when it takes a required argument) or with nothing,
      and only on the ranks that write, so other ranks create nothing;
    - backend objects (anything with ``log(values, step, formats)`` and
      ``close()``), already made by the caller; the Tracker closes them at
      ``close()``, on every rank.

    ``config`` (a mapping, a dataclass instance or an ``argparse.Namespace``)
    holds the run's hyperparameters and reaches every backend that records
    them: TensorBoard hparams, MLflow params, W&B, SwanLab and Trackio config.
    ``histograms`` (``True``, a glob or a list of globs) selects quantile
    metrics whose distribution is logged as a histogram, drawn from the merged
    sketch (:meth:`metricsync.Metrics.histograms`), to the backends that have
    ``log_histograms`` (TensorBoard, W&B, Trackio, and any custom backend with
    that method). ``console_keys`` is a glob (or list of globs) limiting what the
    console prints; ``backend_options`` go to the backends that accept them
    (``project=``, ``name=``, ``mode=`` for wandb and swanlab, ``experiment=``,
    ``tracking_uri=`` for mlflow, ``fsync=`` for jsonl, ...).

    The rank comes from :func:`~metricsync._tracking._rank.detect_rank`. With
    ``rank_zero_only=True`` (the default) other ranks create no backend, write
    nothing and return from ``log`` at once, without computing. With
    ``rank_zero_only=False`` every rank logs; ranks other than 0 write under
    ``run_dir/rank<N>``. Names and options are checked on every rank, so a
    mistake raises everywhere instead of on rank 0 alone.

    ``log`` takes a Metrics (values from ``compute()``, formats from
    ``key_formats()``), a dict of numbers (Python, numpy or 0-d torch
    scalars) or an async sync's handle, written in the background when it
    completes (``flush()`` waits; ``log_every`` syncs, logs and resets every
    n steps). A step lower than the last one logged (also across a resumed
    JSONL file) is warned about and still written. A backend that raises is
    reported once with a ``RuntimeWarning`` and skipped for that step; the
    others go on.

    >>> import tempfile
    >>> class Failing:
    ...     def log(self, values, step, formats): raise OSError("disk full")
    ...     def close(self): pass
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     with Tracker(("jsonl", Failing()), run_dir=tempfile.mkdtemp()) as tracker:
    ...         for step in range(3):
    ...             tracker.log({"loss": 1.0}, step)
    >>> [str(w.message).split(" and ")[0] for w in caught]
    ["metricsync: backend 'Failing' failed at step 0"]
    >>> made = []
    >>> def factory():
    ...     made.append(Failing())
    ...     return made[-1]
    >>> Tracker(("jsonl", factory), run_dir=tempfile.mkdtemp(), rank=1).backends, made
    ((), [])
    """

    def __init__(
        self,
        backends: BackendEntry | Iterable[BackendEntry] = ("jsonl",),
        run_dir: str | os.PathLike[str] = "runs/metricsync",
        *,
        rank: int | None = None,
        rank_zero_only: bool = True,
        console_keys: str | Sequence[str] | None = None,
        config: Any = None,
        histograms: bool | str | Sequence[str] = False,
        **backend_options: Any,
    ) -> None:
        entries = backend_entries(backends)
        names = [e for e in entries if isinstance(e, str)]
        check_options(names, backend_options)
        self._histogram_patterns = histogram_patterns(histograms)
        if config is not None:
            backend_options["config"] = as_config(config)
        self.rank = detect_rank(rank)
        self.run_dir = Path(run_dir)
        self.active = self.rank == 0 or not rank_zero_only
        directory = self.run_dir if self.rank == 0 else self.run_dir / f"rank{self.rank}"
        self._backends: list[tuple[str, Backend]] = []
        self._idle: list[Backend] = []  # objects handed to a rank that does not write
        self._reported: set[str] = set()
        self._closed = False
        self._last_step: int | None = None
        self._writer: StepWriter | None = None  # started by the first handle logged
        self._in_flight: SyncHandle | None = None  # log_every's last async sync
        if not self.active:
            self._idle = [cast(Backend, e) for e in entries if is_backend(e)]
            return
        try:
            for entry in entries:
                label, made = make_backend(entry, directory, backend_options, console_keys)
                self._backends.append((self._label(label), made))
        except BaseException:
            self.close()
            raise
        steps = [getattr(b, "last_step", None) for _, b in self._backends]
        known = [s for s in steps if isinstance(s, int)]
        self._last_step = max(known) if known else None

    def _label(self, label: str) -> str:
        taken = {lab for lab, _ in self._backends}
        if label not in taken:
            return label
        # two backends of one class: tell them apart in warnings
        return next(f"{label}#{i}" for i in range(2, len(taken) + 3) if f"{label}#{i}" not in taken)

    @property
    def backends(self) -> tuple[str, ...]:
        """Labels of the backends this rank writes to (names, or class names of objects).

        >>> import tempfile
        >>> Tracker(("console", "jsonl"), run_dir=tempfile.mkdtemp()).backends
        ('console', 'jsonl')
        """
        return tuple(label for label, _ in self._backends)

    def log(self, metrics: Any, step: int) -> None:
        """Log a Metrics, a dict of numbers or an async sync's handle at ``step``.

        A Metrics or a dict is computed now; with nothing in the background
        it is written now, else queued behind what is. A
        :class:`~metricsync.SyncHandle` (``metrics.sync(group,
        async_op=True)``) is written by a background thread when its sync
        completes; steps reach the backends in the order of the ``log`` calls
        either way. ``flush()`` waits for them. An async sync that failed
        raises its error (``SyncError``, ``SpecMismatchError``, ...) from the
        next ``log``, ``flush`` or ``close``, on every rank, and its step is not
        written. With ``histograms=`` set, the selected quantile metrics also
        go, as histograms, to the backends that have ``log_histograms``. A key
        no log can hold (a lone surrogate, over 1024 characters) is logged
        under a cleaned name with a warning, the other keys as given (see
        :mod:`metricsync._log._logkeys`).

        >>> import tempfile
        >>> import metricsync as ms
        >>> with Tracker("console", run_dir=tempfile.mkdtemp()) as tracker:
        ...     tracker.log({"tokens": 123456789, "lr": 1e-6}, step=7)
        ...     m = ms.Metrics()
        ...     m.record("loss", 0.25)
        ...     tracker.log(m.sync(async_op=True), step=8)
        ...     tracker.flush()
        step 7 | tokens 123,456,789  lr 1.00e-06
        step 8 | loss 0.2500
        """
        if self._closed:
            raise RuntimeError("Tracker.log() called after close()")
        step = as_step(step)
        if isinstance(metrics, SyncHandle):
            if self.active:
                self._note_step(step)
            self._background().put(step, metrics)
        elif self.active:
            entry = self._entry(metrics)
            self._note_step(step)
            if self._writer is not None and self._writer.busy():
                self._writer.put(step, entry)  # behind the steps still waiting
            else:
                self._write(step, entry)
        self._surface()

    def log_every(
        self,
        n: int,
        metrics: Any,
        step: int,
        *,
        group: Any = None,
        timeout: Any = None,
        async_op: bool = True,
        force: bool = False,
    ) -> Any:
        """At every ``n``-th step: sync ``metrics`` over ``group``, log the result, reset it.

        Call it at every step, on every rank (the sync is collective). When
        ``step % n == 0`` (or ``force``), it starts ``metrics.sync(group,
        timeout=timeout, async_op=async_op)``, logs it at ``step`` and
        resets ``metrics``, so each logged step holds the samples recorded
        since the previous one; it returns the handle (or, with
        ``async_op=False``, the synced Metrics), else None. At most one of its
        async syncs is in flight: before starting one it waits for the
        previous, which is normally long done.

        >>> import tempfile
        >>> import metricsync as ms
        >>> metrics = ms.Metrics()
        >>> with Tracker("console", run_dir=tempfile.mkdtemp()) as tracker:
        ...     for step in range(1, 7):
        ...         metrics.record("loss", 1.0 / step)
        ...         _ = tracker.log_every(3, metrics, step, timeout=60)
        step 3 | loss 0.6111
        step 6 | loss 0.2056
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"expected n to be a positive int, got {n!r}")
        if self._closed:
            raise RuntimeError("Tracker.log_every() called after close()")
        if as_step(step) % n and not force:
            return None
        if self._in_flight is not None:
            with contextlib.suppress(Exception):  # its error comes from log() below
                self._in_flight.wait()
        synced = metrics.sync(group, timeout=timeout, async_op=async_op)
        metrics.reset()
        self._in_flight = synced if isinstance(synced, SyncHandle) else None
        self.log(synced, step)
        return synced

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every step logged so far has gone to the backends.

        Once it returns, those steps are on disk as far as each backend
        writes at ``log`` (the JSONL log: complete lines, unbuffered). Raises
        ``TimeoutError`` when steps are still waiting for their sync after
        ``timeout`` seconds, and the error of a failed async sync.

        >>> import tempfile
        >>> with Tracker(run_dir=tempfile.mkdtemp()) as tracker:
        ...     tracker.log({"loss": 1.0}, step=1)
        ...     tracker.flush()
        """
        if self._writer is not None and not self._writer.wait_idle(timeout):
            waiting = self._writer.pending_steps()
            raise TimeoutError(
                f"metricsync: steps {waiting} were still waiting for their sync after {timeout} s"
            )
        self._surface()

    # ------------------------------------------------------------- internals

    def _note_step(self, step: int) -> None:
        if self._last_step is not None and step < self._last_step:
            warnings.warn(
                f"metricsync: step {step} goes backwards (the last logged step is "
                f"{self._last_step}); writing it anyway",
                UserWarning,
                stacklevel=3,
            )
        self._last_step = step

    def _background(self) -> StepWriter:
        if self._writer is None:
            self._writer = StepWriter(self._write, self._prepare)
            _OPEN.add(self)
        return self._writer

    def _prepare(self, item: Any) -> Any:
        """In the writer thread: what to write for a queued item (waits for a handle)."""
        if not isinstance(item, SyncHandle):
            return item
        synced = item.wait()
        return self._entry(synced) if self.active else None

    def _write(self, step: int, entry: Any) -> None:
        if entry is not None:
            values, formats, histograms = entry
            fan_out(self._backends, step, values, formats, histograms, self._report)

    def _entry(self, metrics: Any) -> tuple[Any, ...]:
        values, formats = unwrap(metrics)
        return values, formats, select_histograms(metrics, self._histogram_patterns, self._backends)

    def _report(self, label: str, what: str, exc: Exception, stacklevel: int = 3) -> None:
        deferred = self._writer is not None and self._writer.defer(label, what, exc)
        if deferred or label in self._reported:  # deferred: warned later, in the caller's thread
            return
        self._reported.add(label)
        warnings.warn(
            f"metricsync: backend {label!r} {what} and was skipped "
            f"({type(exc).__name__}: {exc}); further failures of it are not reported",
            RuntimeWarning,
            stacklevel=stacklevel,
        )

    def _surface(self, raise_errors: bool = True) -> None:
        """Warn about backend failures, and raise a failed async sync, kept by the writer."""
        if self._writer is not None:
            for label, what, exc in self._writer.take_deferred():
                self._report(label, what, exc, stacklevel=4)
            surface_failures(self._writer.failed, raise_errors)

    def close(self, timeout: float | None = None) -> None:
        """Write what is pending, then close every backend (a failing one is reported).

        Steps whose async sync has not finished within ``timeout`` seconds
        (None: as long as their syncs take) are not written, with a warning.
        Backend objects handed to a Tracker on a rank that does not write are
        closed here too. Calling it again does nothing. At interpreter exit,
        a Tracker left open with steps pending is closed with a bound of
        :data:`metricsync._sync._async.EXIT_WAIT` seconds.

        >>> import tempfile
        >>> tracker = Tracker(run_dir=tempfile.mkdtemp())
        >>> tracker.close(); tracker.close()
        """
        self._close(timeout, raise_errors=True)

    def _close(self, timeout: float | None, raise_errors: bool) -> None:
        if self._closed:
            return
        self._closed = True
        unwritten = self._writer.stop(timeout) if self._writer is not None else []
        _OPEN.discard(self)
        idle = [(self._label(type(b).__name__), b) for b in self._idle]
        for label, backend in self._backends + idle:
            try:
                backend.close()
            except Exception as exc:
                self._reported.discard(label)
                self._report(label, "failed to close", exc, stacklevel=4)
        if unwritten and self.active:
            warnings.warn(
                f"metricsync: steps {unwritten} were not written: their sync had not finished "
                f"within {timeout} s of close()",
                RuntimeWarning,
                stacklevel=3,
            )
        self._surface(raise_errors)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
        else:  # leaving on an error: a bounded close that does not hide it
            self._close(EXIT_WAIT, raise_errors=False)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"Tracker(backends={self.backends!r}, run_dir={str(self.run_dir)!r}, "
            f"rank={self.rank}, {state})"
        )


_OPEN: weakref.WeakSet[Tracker] = weakref.WeakSet()  # trackers with a background writer


@atexit.register
def _close_at_exit() -> None:  # runs before the sync worker stops (registered earlier)
    for tracker in list(_OPEN):
        tracker._close(exit_time_left(), raise_errors=False)
