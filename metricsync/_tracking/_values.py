"""What a log call's values become: plain floats under keys every backend can hold, an int step.

>>> unwrap({"n": 3, "ok": True})
({'n': 3.0, 'ok': 1.0}, {'n': None, 'ok': None})
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Mapping
from typing import Any

from .._log._logkeys import clean_key, describe_change, needs_cleaning

__all__ = [
    "as_step",
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


def as_step(step: Any) -> int:
    """``step`` as an int; ``TypeError`` for a bool or anything without ``__index__``."""
    if isinstance(step, bool) or not hasattr(step, "__index__"):
        raise TypeError(f"expected step to be an int, got {step!r}")
    return operator.index(step)
