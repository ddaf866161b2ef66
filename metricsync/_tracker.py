"""The :class:`Tracker`: log computed metrics to several backends, from rank 0 only.

>>> import tempfile
>>> from metricsync._logread import read_jsonl
>>> run_dir = tempfile.mkdtemp()
>>> with Tracker(backends=("console", "jsonl"), run_dir=run_dir) as tracker:
...     tracker.log({"loss": 0.6931, "lr": 3e-4}, step=1)
step 1 | loss   0.6931  lr 3.00e-04
>>> read_jsonl(run_dir)[1]
[(1, {'loss': 0.6931, 'lr': 0.0003})]
"""

from __future__ import annotations

import fnmatch
import inspect
import operator
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from ._rank import detect_rank
from .backends import (
    BACKEND_OPTIONS,
    Backend,
    BackendFactory,
    available_backends,
    backend_options,
    create_backend,
)
from .backends._config import as_config

__all__ = ["BackendEntry", "Tracker", "detect_rank", "unwrap"]

BackendEntry = str | Backend | BackendFactory
"""What ``Tracker(backends=...)`` takes: a name, a backend object or a factory."""


def _to_float(key: str, value: object) -> float:
    """``value`` as a Python float, or ``TypeError`` naming the metric."""
    dtype = getattr(value, "dtype", None)
    complex_dtype = getattr(dtype, "kind", "") == "c" or getattr(dtype, "is_complex", False)
    if value is None or isinstance(value, (str, bytes, complex)) or complex_dtype:
        raise TypeError(f"metric {key!r}: expected a real number, got {type(value).__name__}")
    if type(value) is float:
        return value
    shape = getattr(value, "shape", ())
    if len(tuple(shape)) != 0:
        raise TypeError(
            f"metric {key!r}: expected a scalar (0-d), got {type(value).__name__} of shape "
            f"{tuple(shape)}; compute() a Metrics first"
        )
    try:
        return float(value)  # type: ignore[arg-type]
    except OverflowError:
        raise ValueError(f"metric {key!r}: {value!r:.40} does not fit in a float64") from None
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(
            f"metric {key!r}: expected a real number, got {type(value).__name__} ({exc})"
        ) from None


def unwrap(metrics: Any) -> tuple[dict[str, float], dict[str, str | None]]:
    """``(values, formats)`` from a Metrics-like object or a mapping of numbers.

    A Metrics is anything with ``compute()`` (and, for formats,
    ``key_formats()``); a mapping gets the adaptive format (None) everywhere.

    >>> import numpy as np
    >>> unwrap({"n": np.int64(3), "ok": True})
    ({'n': 3.0, 'ok': 1.0}, {'n': None, 'ok': None})
    """
    formats: Mapping[str, str | None] = {}
    if callable(getattr(metrics, "compute", None)):
        raw = metrics.compute()
        key_formats = getattr(metrics, "key_formats", None)
        if callable(key_formats):
            formats = key_formats()
    elif isinstance(metrics, Mapping):
        raw = metrics
    else:
        raise TypeError(
            "expected a Metrics (with compute()) or a mapping of metric names to numbers, "
            f"got {type(metrics).__name__}"
        )
    values: dict[str, float] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise TypeError(f"expected metric names to be str, got {key!r}")
        values[key] = _to_float(key, value)
    return values, {key: formats.get(key) for key in values}


def _is_backend(obj: object) -> bool:
    """A backend object: has ``log`` and ``close`` and is not a class (a class is a factory)."""
    return (
        not isinstance(obj, type)
        and callable(getattr(obj, "log", None))
        and callable(getattr(obj, "close", None))
    )


def _call_factory(factory: Callable[..., Any], directory: Path) -> Backend:
    """``factory(directory)`` when it takes a required positional argument, else ``factory()``."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        wants_dir = True
    else:
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        wants_dir = any(p.kind in positional and p.default is p.empty for p in parameters)
    made = factory(directory) if wants_dir else factory()
    if not _is_backend(made):
        name = getattr(factory, "__qualname__", type(factory).__name__)
        raise TypeError(
            f"backend factory {name} returned {type(made).__name__}, expected an object with "
            "log(values, step, formats) and close()"
        )
    return cast(Backend, made)


def _histogram_patterns(histograms: bool | str | Sequence[str] | None) -> tuple[str, ...]:
    if histograms is None or histograms is False:
        return ()
    if histograms is True:
        return ("*",)
    if isinstance(histograms, str):
        return (histograms,)
    patterns = tuple(histograms)
    if not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"expected histograms to be a bool, a glob or globs, got {histograms!r}")
    return patterns


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

    The rank comes from :func:`~metricsync._rank.detect_rank`. With
    ``rank_zero_only=True`` (the default) other ranks create no backend, write
    nothing and return from ``log`` at once, without computing. With
    ``rank_zero_only=False`` every rank logs; ranks other than 0 write under
    ``run_dir/rank<N>``. Names and options are checked on every rank, so a
    mistake raises everywhere instead of on rank 0 alone.

    ``log`` takes a Metrics (values from ``compute()``, formats from
    ``key_formats()``) or a dict of numbers (Python, numpy or 0-d torch
    scalars). A step lower than the last one logged (also across a resumed
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
        entries: list[BackendEntry]
        if isinstance(backends, str) or _is_backend(backends) or callable(backends):
            entries = [cast(BackendEntry, backends)]
        else:
            entries = list(cast("Iterable[BackendEntry]", backends))
        names = [e for e in entries if isinstance(e, str)]
        for entry in entries:
            if not isinstance(entry, str) and not _is_backend(entry) and not callable(entry):
                raise TypeError(
                    "expected backend names, objects with log(values, step, formats) and "
                    f"close(), or factories returning one, got {type(entry).__name__}"
                )
        if len(set(names)) != len(names):
            raise ValueError(f"expected each backend once, got {names}")
        self._check_options(names, backend_options)
        self._histogram_patterns = _histogram_patterns(histograms)
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
        if not self.active:
            self._idle = [cast(Backend, e) for e in entries if _is_backend(e)]
            return
        try:
            for entry in entries:
                if isinstance(entry, str):
                    made = create_backend(
                        entry, directory, backend_options, console_keys=console_keys
                    )
                    self._backends.append((entry, made))
                    continue
                backend = (
                    cast(Backend, entry)
                    if _is_backend(entry)
                    else _call_factory(cast("Callable[..., Any]", entry), directory)
                )
                self._backends.append((self._label(type(backend).__name__), backend))
        except BaseException:
            self.close()
            raise
        steps = [getattr(b, "last_step", None) for _, b in self._backends]
        known = [s for s in steps if isinstance(s, int)]
        self._last_step = max(known) if known else None

    @staticmethod
    def _check_options(names: list[str], options: Mapping[str, Any]) -> None:
        """Unknown names raise ValueError; options no chosen or built-in backend takes, TypeError."""
        known = set().union(*BACKEND_OPTIONS.values())
        takes_any = False
        for name in names:
            if name in BACKEND_OPTIONS:
                continue
            if name not in available_backends():
                raise ValueError(
                    f"expected backend names among {', '.join(available_backends())} or backend "
                    f"objects or factories, got {name!r}"
                )
            accepted = backend_options(name)
            if accepted is None:
                takes_any = True
            else:
                known |= accepted
        unknown = sorted(set(options) - known)
        if unknown and not takes_any:
            raise TypeError(
                f"unexpected backend option(s) {', '.join(unknown)}; "
                f"expected some of {', '.join(sorted(known))}"
            )

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
        """Log a Metrics or a dict of numbers at ``step`` to every backend.

        With ``histograms=`` set, the selected quantile metrics of a Metrics
        also go, as histograms, to the backends that have ``log_histograms``.

        >>> import tempfile
        >>> with Tracker("console", run_dir=tempfile.mkdtemp()) as tracker:
        ...     tracker.log({"tokens": 123456789, "lr": 1e-6}, step=7)
        step 7 | tokens 123,456,789  lr 1.00e-06
        """
        if self._closed:
            raise RuntimeError("Tracker.log() called after close()")
        if isinstance(step, bool) or not hasattr(step, "__index__"):
            raise TypeError(f"expected step to be an int, got {step!r}")
        step = operator.index(step)
        if not self.active:
            return
        values, formats = unwrap(metrics)
        if self._last_step is not None and step < self._last_step:
            warnings.warn(
                f"metricsync: step {step} goes backwards (the last logged step is "
                f"{self._last_step}); writing it anyway",
                UserWarning,
                stacklevel=2,
            )
        self._last_step = step
        histograms = self._histograms(metrics)
        for label, backend in self._backends:
            try:
                backend.log(dict(values), step, dict(formats))
            except Exception as exc:
                self._report(label, f"failed at step {step}", exc)
                continue
            log_histograms = getattr(backend, "log_histograms", None)
            if histograms and callable(log_histograms):
                try:
                    log_histograms(dict(histograms), step)
                except Exception as exc:
                    self._report(label, f"failed to log histograms at step {step}", exc)

    def _histograms(self, metrics: Any) -> dict[str, Any]:
        """The selected histograms of ``metrics``; none unless a backend can take them."""
        patterns = self._histogram_patterns
        wanted = patterns and any(
            callable(getattr(b, "log_histograms", None)) for _, b in self._backends
        )
        read = getattr(metrics, "histograms", None)
        if not wanted or not callable(read):
            return {}
        return {
            key: hist
            for key, hist in read().items()
            if any(fnmatch.fnmatchcase(key, p) for p in patterns)
        }

    def _report(self, label: str, what: str, exc: Exception) -> None:
        if label in self._reported:
            return
        self._reported.add(label)
        warnings.warn(
            f"metricsync: backend {label!r} {what} and was skipped "
            f"({type(exc).__name__}: {exc}); further failures of it are not reported",
            RuntimeWarning,
            stacklevel=3,
        )

    def close(self) -> None:
        """Close every backend (a failing one is reported, the others still close).

        Backend objects handed to a Tracker on a rank that does not write are
        closed here too. Calling it again does nothing.

        >>> import tempfile
        >>> tracker = Tracker(run_dir=tempfile.mkdtemp())
        >>> tracker.close(); tracker.close()
        """
        if self._closed:
            return
        self._closed = True
        idle = [(self._label(type(b).__name__), b) for b in self._idle]
        for label, backend in self._backends + idle:
            try:
                backend.close()
            except Exception as exc:
                self._reported.discard(label)
                self._report(label, "failed to close", exc)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"Tracker(backends={self.backends!r}, run_dir={str(self.run_dir)!r}, "
            f"rank={self.rank}, {state})"
        )
