"""verl's ``AggregationType``, and the metricsync spec behind each of its members."""

from __future__ import annotations

from enum import Enum

import metricsync as ms

__all__ = ["SPECS", "AggregationType", "aggregation_type"]


class AggregationType(Enum):
    """How a :class:`~metricsync.verl_compat.Metric` combines its values: ``MEAN``,
    ``SUM``, ``MIN`` or ``MAX``.

    >>> AggregationType("sum") is AggregationType.SUM
    True

    A member equals verl's member of the same value: once
    :func:`~metricsync.verl_compat.install` has put this enum in verl's module,
    verl's own code still tells apart the members its objects made before (a
    verl ``Metric`` recorded before the switch aggregates as it did).
    """

    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Enum) and not isinstance(other, AggregationType):
            return type(other).__name__ == "AggregationType" and other.value == self.value
        return self is other

    def __hash__(self) -> int:
        return hash(self._name_)


#: The metricsync spec behind each aggregation. ``MEAN`` also keeps its total
#: weight (``count``), so a mean can be pooled again exactly after it was synced.
SPECS = {
    AggregationType.MEAN: ms.Spec(("mean", "count")),
    AggregationType.SUM: ms.Spec("sum", across="mean"),
    AggregationType.MIN: ms.Spec("min"),
    AggregationType.MAX: ms.Spec("max"),
}


def aggregation_type(aggregation: object) -> AggregationType:
    """``aggregation`` as an :class:`AggregationType` (verl's own enum members are accepted)."""
    if isinstance(aggregation, AggregationType):
        return aggregation
    value = aggregation.value if isinstance(aggregation, Enum) else aggregation
    try:
        return AggregationType(value)
    except ValueError:
        raise ValueError(
            f"Unsupported aggregation type: {aggregation!r} (expected 'mean', 'sum', 'min' "
            "or 'max', or an AggregationType)"
        ) from None
