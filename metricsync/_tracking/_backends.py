"""What ``Tracker`` takes apart: logged values, backend entries, histogram globs.

>>> unwrap({"n": 3, "ok": True})
({'n': 3.0, 'ok': 1.0}, {'n': None, 'ok': None})
"""

from __future__ import annotations

import fnmatch
import inspect
import operator
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from .._log._logkeys import clean_key, describe_change, needs_cleaning
from ..backends import BACKEND_OPTIONS, Backend, available_backends, backend_options, create_backend

__all__ = [
    "as_step",
    "backend_entries",
    "call_factory",
    "check_options",
    "fan_out",
    "histogram_patterns",
    "is_backend",
    "make_backend",
    "select_histograms",
    "unwrap",
]


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
    A key no log can hold (a lone surrogate, over 1024 characters) is logged
    under its :func:`~metricsync._log._logkeys.clean_key` name, with a warning; one
    that would then take another key's name raises ``ValueError`` naming both.

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
    if needs_cleaning(values):
        return _cleaned(values, formats)
    return values, {key: formats.get(key) for key in values}


def _cleaned(
    values: dict[str, float], formats: Mapping[str, str | None]
) -> tuple[dict[str, float], dict[str, str | None]]:
    """``values`` and their formats under keys every backend can hold; a warning per change."""
    names = {key: clean_key(key) for key in values}
    taken: dict[str, str] = {}
    for key, name in names.items():
        other = taken.setdefault(name, key)
        if other != key:
            raise ValueError(
                f"metric keys {other!r:.80} and {key!r:.80} would both be logged as {name!r:.80}; "
                "rename one"
            )
    for key, name in names.items():
        if name != key:
            warnings.warn(f"metricsync: {describe_change(key, name)}", UserWarning, stacklevel=5)
    return (
        {names[key]: value for key, value in values.items()},
        {names[key]: formats.get(key) for key in values},
    )


def is_backend(obj: object) -> bool:
    """A backend object: has ``log`` and ``close`` and is not a class (a class is a factory)."""
    return (
        not isinstance(obj, type)
        and callable(getattr(obj, "log", None))
        and callable(getattr(obj, "close", None))
    )


def call_factory(factory: Callable[..., Any], directory: Path) -> Backend:
    """``factory(directory)`` when it takes a required positional argument, else ``factory()``."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        wants_dir = True
    else:
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        wants_dir = any(p.kind in positional and p.default is p.empty for p in parameters)
    made = factory(directory) if wants_dir else factory()
    if not is_backend(made):
        name = getattr(factory, "__qualname__", type(factory).__name__)
        raise TypeError(
            f"backend factory {name} returned {type(made).__name__}, expected an object with "
            "log(values, step, formats) and close()"
        )
    return cast(Backend, made)


def histogram_patterns(histograms: bool | str | Sequence[str] | None) -> tuple[str, ...]:
    """The globs that ``Tracker(histograms=...)`` selects.

    >>> histogram_patterns(True), histogram_patterns("len*"), histogram_patterns(None)
    (('*',), ('len*',), ())
    """
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


def check_options(names: list[str], options: Mapping[str, Any]) -> None:
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


def backend_entries(backends: Any) -> list[Any]:
    """``Tracker(backends=...)`` as a list of names, backend objects and factories.

    >>> backend_entries("jsonl"), backend_entries(("console", "jsonl"))
    (['jsonl'], ['console', 'jsonl'])
    """
    if isinstance(backends, str) or is_backend(backends) or callable(backends):
        entries = [backends]
    else:
        entries = list(cast(Iterable[Any], backends))
    names = [e for e in entries if isinstance(e, str)]
    for entry in entries:
        if not isinstance(entry, str) and not is_backend(entry) and not callable(entry):
            raise TypeError(
                "expected backend names, objects with log(values, step, formats) and "
                f"close(), or factories returning one, got {type(entry).__name__}"
            )
    if len(set(names)) != len(names):
        raise ValueError(f"expected each backend once, got {names}")
    return entries


def select_histograms(
    metrics: Any, patterns: tuple[str, ...], backends: Sequence[tuple[str, Any]]
) -> dict[str, Any]:
    """The histograms of ``metrics`` that ``patterns`` select; none unless a backend takes them."""
    wanted = patterns and any(callable(getattr(b, "log_histograms", None)) for _, b in backends)
    read = getattr(metrics, "histograms", None)
    if not wanted or not callable(read):
        return {}
    return {
        clean_key(key): hist
        for key, hist in read().items()
        if any(fnmatch.fnmatchcase(key, p) for p in patterns)
    }


def fan_out(
    backends: Sequence[tuple[str, Any]],
    step: int,
    values: Mapping[str, float],
    formats: Mapping[str, str | None],
    histograms: Mapping[str, Any],
    report: Callable[[str, str, Exception], None],
) -> None:
    """Hand one step to every backend; ``report`` each failure and go on with the others."""
    for label, backend in backends:
        try:
            backend.log(dict(values), step, dict(formats))
        except Exception as exc:
            report(label, f"failed at step {step}", exc)
            continue
        log_histograms = getattr(backend, "log_histograms", None)
        if histograms and callable(log_histograms):
            try:
                log_histograms(dict(histograms), step)
            except Exception as exc:
                report(label, f"failed to log histograms at step {step}", exc)


def make_backend(
    entry: Any, directory: Path, options: dict[str, Any], console_keys: Any
) -> tuple[str, Backend]:
    """``(label, backend)`` for one entry: a name, a backend object or a factory."""
    if isinstance(entry, str):
        return entry, create_backend(entry, directory, options, console_keys=console_keys)
    backend = cast(Backend, entry) if is_backend(entry) else call_factory(entry, directory)
    return type(backend).__name__, backend


def as_step(step: Any) -> int:
    """``step`` as an int; ``TypeError`` for a bool or anything without ``__index__``."""
    if isinstance(step, bool) or not hasattr(step, "__index__"):
        raise TypeError(f"expected step to be an int, got {step!r}")
    return operator.index(step)
