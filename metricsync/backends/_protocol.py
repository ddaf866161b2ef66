"""What a backend is: the :class:`Backend` protocol and its optional histogram method.

>>> class Print:
...     def log(self, values, step, formats): print(step, dict(values))
...     def close(self): pass
>>> isinstance(Print(), Backend), isinstance(Print(), HistogramBackend)
(True, False)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .._state._histogram import Histogram

__all__ = ["Backend", "HistogramBackend", "missing_package"]


@runtime_checkable
class Backend(Protocol):
    """What a :class:`~metricsync.Tracker` needs from a backend.

    ``values`` maps metric keys to Python floats (NaN and infinities
    included); ``formats`` maps the same keys to their format spec or None.

    >>> class Print:
    ...     def log(self, values, step, formats): print(step, dict(values))
    ...     def close(self): pass
    >>> isinstance(Print(), Backend)
    True
    """

    def log(
        self, values: Mapping[str, float], step: int, formats: Mapping[str, str | None]
    ) -> None:
        """Record ``values`` for ``step``."""

    def close(self) -> None:
        """Flush and release everything; the backend is not used afterwards."""


@runtime_checkable
class HistogramBackend(Backend, Protocol):
    """A backend that also draws distributions (an optional extra method).

    A :class:`~metricsync.Tracker` made with ``histograms=`` calls
    ``log_histograms`` after ``log`` at the same step, with the histograms of
    the quantile metrics it selected (from :meth:`metricsync.Metrics.histograms`,
    so after a sync they cover every rank's samples). Backends without the
    method are skipped.

    >>> class Buckets:
    ...     def log(self, values, step, formats): pass
    ...     def log_histograms(self, histograms, step):
    ...         print(step, {k: int(h.total) for k, h in histograms.items()})
    ...     def close(self): pass
    >>> isinstance(Buckets(), HistogramBackend)
    True
    """

    def log_histograms(self, histograms: Mapping[str, Histogram], step: int) -> None:
        """Record one histogram per key for ``step``."""


def missing_package(backend: str, package: str, extra: str) -> str:
    """The message of the ``ImportError`` raised when an optional package is missing.

    >>> missing_package("wandb", "wandb", "wandb")
    'the "wandb" backend needs the wandb package: pip install "metricsync[wandb]"'
    """
    return f'the "{backend}" backend needs the {package} package: pip install "metricsync[{extra}]"'
