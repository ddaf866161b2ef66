"""How ``metricsync plot`` tells the statistics of one panel apart: a line style and a marker each.

The same style per statistic in every panel and run (color says the run): mean solid, last
solid with circles, min and max dotted with triangles (a band when both), quantiles dashed
then dash-dot with squares, diamonds...; within a panel no two statistics share both line
style and marker, and the legend shows each as drawn.

>>> styles = stat_styles(["mean", "max", "p99", "p50"])
>>> [(s, styles[s].linestyle, styles[s].marker) for s in ("mean", "max", "p50", "p99")]
[('mean', '-', None), ('max', ':', '^'), ('p50', '--', None), ('p99', '-.', None)]
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

__all__ = ["MARKS", "Style", "is_quantile", "stat_order", "stat_styles"]

MARKS = 12
"""Markers per curve: a style's marker sits on about this many of a curve's points."""

_QUANTILE = re.compile(r"p\d+(\.\d+)?")
Marker: TypeAlias = "str | tuple[int, int, int] | None"
_FIXED: dict[str, tuple[str, Marker]] = {
    "mean": ("-", None),
    "last": ("-", "o"),
    "min": (":", "v"),
    "max": (":", "^"),
}
_QUANTILE_PAIRS: tuple[tuple[str, Marker], ...] = tuple(
    (line, marker)
    for marker in (None, "s", "D", "p", "h", "*", "P", "X", "d", "H", "8")
    for line in ("--", "-.")
)
_OTHER_PAIRS: tuple[tuple[str, Marker], ...] = tuple(
    (line, marker) for line in (":", "-") for marker in ("+", "x", "1", "2", "3", "4", "|", "_")
)


@dataclass(frozen=True)
class Style:
    """A statistic's line: matplotlib ``linestyle`` and ``marker`` (None: no marker)."""

    linestyle: str
    marker: Marker


def is_quantile(stat: str) -> bool:
    """Whether ``stat`` names a quantile (``p50``, ``p99.9``).

    >>> is_quantile("p99.9"), is_quantile("pos")
    (True, False)
    """
    return _QUANTILE.fullmatch(stat) is not None


def stat_order(stats: Sequence[str]) -> list[str]:
    """``stats`` in drawing and legend order: mean, last, min, max, quantiles by q, the rest.

    >>> stat_order(["p99", "max", "std", "p5", "mean"])
    ['mean', 'max', 'p5', 'p99', 'std']
    """
    fixed = [s for s in _FIXED if s in stats]
    quantiles = sorted((s for s in stats if is_quantile(s)), key=lambda s: float(s[1:]))
    others = [s for s in stats if s not in _FIXED and not is_quantile(s)]
    return [*fixed, *quantiles, *others]


def stat_styles(stats: Sequence[str]) -> dict[str, Style]:
    """A distinct :class:`Style` for each statistic of one panel (see the table above).

    >>> many = stat_styles([f"p{q}" for q in range(1, 100)] + ["std", "sum", "count"])
    >>> len({(s.linestyle, s.marker) for s in many.values()}) == len(many)
    True
    """
    styles: dict[str, Style] = {}
    quantiles = others = 0
    for stat in stat_order(stats):
        if stat in _FIXED:
            styles[stat] = Style(*_FIXED[stat])
        elif is_quantile(stat):
            styles[stat] = _pick(quantiles, _QUANTILE_PAIRS, "--")
            quantiles += 1
        else:
            styles[stat] = _pick(others, _OTHER_PAIRS, ":")
            others += 1
    return styles


def _pick(index: int, pairs: tuple[tuple[str, Marker], ...], line: str) -> Style:
    """The ``index``-th pair; past them, ``line`` with a star of its own number of points."""
    if index < len(pairs):
        return Style(*pairs[index])
    return Style(line, (5 + index - len(pairs), 1, 0))
