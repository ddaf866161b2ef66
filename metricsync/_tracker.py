"""The :class:`Tracker`: log computed metrics to several backends, from rank 0 only.

>>> import tempfile
>>> from metricsync._logfile import read_jsonl
>>> run_dir = tempfile.mkdtemp()
>>> with Tracker(backends=("console", "jsonl"), run_dir=run_dir) as tracker:
...     tracker.log({"loss": 0.6931, "lr": 3e-4}, step=1)
step 1 | loss   0.6931  lr 3.00e-04
>>> read_jsonl(run_dir)[1]
[(1, {'loss': 0.6931, 'lr': 0.0003})]
"""

from __future__ import annotations

import operator
import os
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from .backends import BACKEND_OPTIONS, Backend, create_backend

__all__ = ["Tracker", "detect_rank"]

_KNOWN_OPTIONS = frozenset().union(*BACKEND_OPTIONS.values())


def detect_rank(rank: int | None = None) -> int:
    """This process's rank: ``rank`` if given, else torch.distributed's, else ``$RANK``, else 0.

    torch.distributed is asked only when it is already imported and its
    default process group is initialized (an uninitialized or unimported one
    cannot hold a rank), so this never pays for importing torch.

    >>> detect_rank(3)
    3
    >>> import os
    >>> detect_rank() == int(os.environ.get("RANK", "0"))
    True
    """
    if rank is not None:
        if isinstance(rank, bool) or operator.index(rank) < 0:
            raise ValueError(f"expected rank to be a non-negative int, got {rank!r}")
        return operator.index(rank)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    env = os.environ.get("RANK", "").strip()
    if not env:
        return 0
    try:
        return int(env)
    except ValueError:
        raise ValueError(f"expected $RANK to be an integer, got {env!r}") from None


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


class Tracker:
    """Fan computed metrics out to logging backends; only rank 0 writes by default.

    ``backends`` holds names (``"console"``, ``"jsonl"``, ``"tensorboard"``,
    ``"wandb"``, ``"mlflow"``; see :mod:`metricsync.backends`) and/or backend
    objects (anything with ``log(values, step, formats)`` and ``close()``).
    ``console_keys`` is a glob (or list of globs) limiting what the console
    prints; ``backend_options`` go to the backends that accept them
    (``project=``, ``name=``, ``mode=`` for wandb, ``experiment=``,
    ``tracking_uri=`` for mlflow, ``fsync=`` for jsonl, ...).

    The rank comes from :func:`detect_rank`. With ``rank_zero_only=True`` (the
    default) other ranks create no backend, write nothing and return from
    ``log`` at once, without computing. With ``rank_zero_only=False`` every
    rank logs; ranks other than 0 write under ``run_dir/rank<N>``.

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
    >>> Tracker(run_dir=tempfile.mkdtemp(), rank=1).backends
    ()
    """

    def __init__(
        self,
        backends: str | Backend | Iterable[str | Backend] = ("jsonl",),
        run_dir: str | os.PathLike[str] = "runs/metricsync",
        *,
        rank: int | None = None,
        rank_zero_only: bool = True,
        console_keys: str | Sequence[str] | None = None,
        **backend_options: Any,
    ) -> None:
        unknown = sorted(set(backend_options) - _KNOWN_OPTIONS)
        if unknown:
            raise TypeError(
                f"unexpected backend option(s) {', '.join(unknown)}; "
                f"expected some of {', '.join(sorted(_KNOWN_OPTIONS))}"
            )
        entries: list[str | Backend]
        if isinstance(backends, str) or _is_backend(backends):
            entries = [cast("str | Backend", backends)]
        else:
            entries = list(cast("Iterable[str | Backend]", backends))
        names = [e for e in entries if isinstance(e, str)]
        for entry in entries:
            if isinstance(entry, str):
                if entry not in BACKEND_OPTIONS:
                    raise ValueError(
                        f"expected backend names among {', '.join(sorted(BACKEND_OPTIONS))} "
                        f"or backend objects, got {entry!r}"
                    )
            elif not _is_backend(entry):
                raise TypeError(
                    "expected backend names or objects with log(values, step, formats) and "
                    f"close(), got {type(entry).__name__}"
                )
        if len(set(names)) != len(names):
            raise ValueError(f"expected each backend once, got {names}")
        self.rank = detect_rank(rank)
        self.run_dir = Path(run_dir)
        self.active = self.rank == 0 or not rank_zero_only
        directory = self.run_dir if self.rank == 0 else self.run_dir / f"rank{self.rank}"
        self._backends: list[tuple[str, Backend]] = []
        self._reported: set[str] = set()
        self._closed = False
        self._last_step: int | None = None
        if not self.active:
            return
        try:
            for entry in entries:
                if isinstance(entry, str):
                    made = create_backend(
                        entry, directory, backend_options, console_keys=console_keys
                    )
                    self._backends.append((entry, made))
                else:
                    label, taken = type(entry).__name__, {lab for lab, _ in self._backends}
                    if label in taken:  # two objects of one class: tell them apart in warnings
                        label = next(
                            f"{label}#{i}"
                            for i in range(2, len(taken) + 3)
                            if f"{label}#{i}" not in taken
                        )
                    self._backends.append((label, entry))
        except BaseException:
            self.close()
            raise
        steps = [getattr(b, "last_step", None) for _, b in self._backends]
        known = [s for s in steps if isinstance(s, int)]
        self._last_step = max(known) if known else None

    @property
    def backends(self) -> tuple[str, ...]:
        """Labels of the active backends (names, or class names of objects).

        >>> import tempfile
        >>> Tracker(("console", "jsonl"), run_dir=tempfile.mkdtemp()).backends
        ('console', 'jsonl')
        """
        return tuple(label for label, _ in self._backends)

    def log(self, metrics: Any, step: int) -> None:
        """Log a Metrics or a dict of numbers at ``step`` to every backend.

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
        for label, backend in self._backends:
            try:
                backend.log(dict(values), step, dict(formats))
            except Exception as exc:
                self._report(label, f"failed at step {step}", exc)

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

        Calling it again does nothing.

        >>> import tempfile
        >>> tracker = Tracker(run_dir=tempfile.mkdtemp())
        >>> tracker.close(); tracker.close()
        """
        if self._closed:
            return
        self._closed = True
        for label, backend in self._backends:
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


def _is_backend(obj: object) -> bool:
    return callable(getattr(obj, "log", None)) and callable(getattr(obj, "close", None))
