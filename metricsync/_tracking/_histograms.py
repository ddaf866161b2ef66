"""Which metrics get histograms: the globs of ``Tracker(histograms=...)`` and what they select."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import Any

from .._log._logkeys import clean_key

__all__ = [
    "histogram_patterns",
    "select_histograms",
]


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
