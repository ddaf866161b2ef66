"""The row a trainer hook hands a Tracker: its keys in one order on any number of ranks.

A synced :class:`metricsync.Metrics` computes its keys in name order on several
ranks and, without a process group, in the order they were recorded; a hook
that logged it as it came would print its columns in another order when the
same script runs on one rank. :class:`Row` puts them in the synced order
(metrics sorted by name, each one's keys in its spec's order) after the keys
the trainer logged itself, in the trainer's order, and keeps each key's format
and the Metrics' histograms: a Tracker reads it as it reads a Metrics.

>>> import metricsync as ms
>>> m = ms.Metrics({"r": ms.Spec(("mean", "max"), fmt=".1f")})
>>> m.update({"z": 1.0, "r": 3.0})
>>> row = Row()
>>> row.add(m)
>>> row.add({"loss": 0.5})
>>> row.compute()
{'r/mean': 3.0, 'r/max': 3.0, 'z': 1.0, 'loss': 0.5}
>>> row.key_formats()
{'r/mean': '.1f', 'r/max': '.1f', 'z': None, 'loss': None}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import metricsync as ms

__all__ = ["Row", "in_order"]


def in_order(metrics: ms.Metrics, first: Iterable[str] = ()) -> dict[str, float]:
    """``metrics.compute()``: the keys of ``first`` it holds, in that order, then each
    metric's keys in its spec's order, metrics sorted by name.

    >>> m = ms.Metrics({"r": ms.Spec(("mean", "max"))})
    >>> m.update({"z": 1.0, "loss": 2.0, "r": 3.0, "epoch": 4.0})
    >>> list(in_order(m, ["loss", "epoch"]))
    ['loss', 'epoch', 'r/mean', 'r/max', 'z']
    """
    values = metrics.compute()
    ordered = {key: values[key] for key in first if key in values}
    for name in sorted(metrics.names):
        spec = metrics.spec(name)
        for key in (*spec.output_keys(name), *spec.extra_keys(name)):
            if key in values and key not in ordered:
                ordered[key] = values[key]
    ordered.update((key, values[key]) for key in sorted(values) if key not in ordered)
    return ordered


class Row:
    """One step's numbers for a Tracker (``compute``, ``key_formats``, ``histograms``),
    gathered from Metrics (in :func:`in_order`) and dicts (as given), keys in the order added."""

    def __init__(self) -> None:
        self._values: dict[str, float] = {}
        self._formats: dict[str, str | None] = {}
        self._metrics: list[ms.Metrics] = []

    def add(self, source: ms.Metrics | Mapping[str, Any], first: Iterable[str] = ()) -> None:
        """Add a Metrics' values (with its formats), or a dict of numbers (adaptive format);
        a key added before takes the new value."""
        if isinstance(source, ms.Metrics):
            values = in_order(source, first)
            formats = source.key_formats()
            self._metrics.append(source)
        else:
            values, formats = dict(source), {}
        for key, value in values.items():
            self._values[key] = value
            self._formats[key] = formats.get(key)

    def extend(self, other: Row) -> None:
        """Add another row's keys, after this one's."""
        self._values.update(other._values)
        self._formats.update(other._formats)
        self._metrics.extend(other._metrics)

    def shares_keys(self, other: Row) -> bool:
        """Whether ``other`` holds a key this row holds."""
        return not self._values.keys().isdisjoint(other._values)

    def __len__(self) -> int:
        return len(self._values)

    def compute(self) -> dict[str, float]:
        """The values, in the row's order."""
        return dict(self._values)

    def key_formats(self) -> dict[str, str | None]:
        """Each key's format (None: adaptive), in the row's order."""
        return dict(self._formats)

    def histograms(self) -> dict[str, ms.Histogram]:
        """The histograms of the Metrics added (read only when a Tracker asks for them)."""
        out: dict[str, ms.Histogram] = {}
        for metrics in self._metrics:
            out.update(metrics.histograms())
        return out
