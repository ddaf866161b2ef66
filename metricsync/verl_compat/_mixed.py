"""Telling verl's own ``Metric`` from this package's, and refusing to mix them."""

from __future__ import annotations

import metricsync as ms

__all__ = [
    "MixedMetricError",
    "is_switched",
    "is_verl_metric",
    "refuse_verl_metric",
    "set_switched",
]

_switched = [False]  # whether install() switched this process's verl modules


def is_switched() -> bool:
    """Whether this process's verl modules are switched to metricsync (see ``install``)."""
    return _switched[0]


def set_switched(on: bool) -> None:
    """Record that ``install`` switched (True) or ``uninstall`` restored (False) verl's modules."""
    _switched[0] = on


class MixedMetricError(ms.MetricsyncError, ValueError):
    """verl's own ``Metric`` met this package's ``Metric`` in one call.

    verl's modules were not switched: call :func:`~metricsync.verl_compat.install`.
    """


def is_verl_metric(obj: object) -> bool:
    """True for an instance of verl's own ``Metric`` (checked by name: verl is not imported)."""
    cls = type(obj)
    return cls.__name__ == "Metric" and cls.__module__.split(".")[0] == "verl"


def refuse_verl_metric(obj: object, where: str) -> None:
    """Raise :class:`MixedMetricError` if ``obj`` is verl's own ``Metric``."""
    if is_verl_metric(obj):
        raise MixedMetricError(
            f"{where}: got verl's own Metric ({type(obj).__module__}.Metric) where "
            "metricsync.verl_compat.Metric is used; verl's modules still create their own "
            "metrics. Call metricsync.verl_compat.install() in every process (driver and "
            "workers) before verl records its first metric."
        )
