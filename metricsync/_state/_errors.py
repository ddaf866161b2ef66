"""The exceptions metricsync raises.

All of them derive from :class:`MetricsyncError`, so one ``except`` clause
catches everything the library raises on purpose.

>>> import metricsync as ms
>>> issubclass(ms.CodecError, ValueError) and issubclass(ms.CodecError, ms.MetricsyncError)
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["CodecError", "MetricsyncError", "SpecMismatchError", "SyncError", "with_device_error"]

T = TypeVar("T")


class MetricsyncError(Exception):
    """Base class of every error metricsync raises on purpose."""


class SpecMismatchError(MetricsyncError):
    """The same metric name resolves to two different specs.

    Raised by ``define`` when a name is redefined differently, and by
    ``merge``/``sync`` when two sides disagree on a name's spec.
    """


class CodecError(MetricsyncError, ValueError):
    """Bytes handed to ``Metrics.from_bytes`` are malformed, truncated or hostile."""


class SyncError(MetricsyncError):
    """A collective did not complete: a rank is missing, timed out or failed."""


def with_device_error(
    take: Callable[[], T], without_devices: Callable[[], T]
) -> tuple[T, ValueError | None]:
    """``take()`` and None, or, when a device record failed its checks (``ValueError``),
    ``without_devices()`` (what to send in its place: a sync reports the error on every
    rank, and the error stays on the store until ``reset()``) and that error."""
    try:
        return take(), None
    except ValueError as exc:
        return without_devices(), exc
