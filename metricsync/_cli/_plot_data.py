"""What ``metricsync plot`` draws, before any drawing: series, panels, smoothing, downsampling.

numpy only; matplotlib lives in :mod:`metricsync._cli._plot_draw`.

>>> make_panels(["loss", "len/mean", "len/max", "len/p99", "actor/lr"])
[Panel('', 'loss', {'': 'loss'}), Panel('len', 'len', {'mean': 'len/mean', 'max': 'len/max', 'p99': 'len/p99'}), Panel('actor', 'lr', {'': 'actor/lr'})]
"""

from __future__ import annotations

import os
import re
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .._log._logfile import Formats, match_keys
from .._log._logread import read_timeline, scan
from ._progress import Progress
from ._show import log_file

__all__ = ["Panel", "Run", "envelope", "ema", "load_runs", "make_panels"]

FAMILY_STATS = ("mean", "last", "min", "max")
"""Statistics that share a panel (with any ``pNN``): they are in the metric's own unit."""
_QUANTILE = re.compile(r"p\d+(\.\d+)?")
_PROGRESS_BYTES = 16 << 20


@dataclass
class Run:
    """One log's curves: ``series[key] = (steps, values)``, float64 arrays in step order."""

    label: str
    path: Path
    formats: Formats
    series: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)  # every key of the log, in order
    repeats: int = 0  # records superseded or overwritten by a later one


def _labels(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Short, distinct names for runs: the directory name, or more of the path when needed."""
    parts = []
    for raw in paths:
        p = Path(raw)
        p = p.parent if p.name == "metrics.jsonl" else p
        parts.append(p.parts or (str(p),))
    for depth in range(1, max(len(x) for x in parts) + 1):
        labels = ["/".join(x[-depth:]) for x in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [f"{label} ({i})" for i, label in enumerate(labels, 1)]


def load_runs(
    paths: Sequence[str | os.PathLike[str]], keys: str | None
) -> tuple[list[Run], list[str]]:
    """Read every run; return them and the keys to plot (``keys`` globs over the union).

    A progress bar (on a terminal, for large files) follows the reading.
    """
    files = [log_file(p) for p in paths]
    total = sum(f.stat().st_size for f in files)
    runs: list[Run] = []
    with Progress(2 * total, "reading", minimum=2 * _PROGRESS_BYTES) as bar:
        found = [scan(f, None, bar.update) for f in files]
        available = list(dict.fromkeys(k for s in found for k in s.keys))
        chosen = match_keys(available, keys)
        wanted = set(chosen)
        for path, label, timeline in zip(files, _labels(paths), found):
            xs: dict[str, array[float]] = {}  # 8 bytes a value, no Python object
            ys: dict[str, array[float]] = {}
            for step, values in read_timeline(path, timeline, None, bar.update):
                x = float(step)
                for key, value in values.items():
                    if key in wanted:
                        if key not in xs:
                            xs[key], ys[key] = array("d"), array("d")
                        xs[key].append(x)
                        ys[key].append(value)
            run = Run(label, path, timeline.formats, keys=list(timeline.keys))
            run.repeats = timeline.superseded + timeline.overwritten
            for key in xs:
                run.series[key] = (
                    np.frombuffer(xs[key], dtype=np.float64),
                    np.frombuffer(ys[key], dtype=np.float64),
                )
            runs.append(run)
    if not any(run.series for run in runs):
        raise ValueError(f"{', '.join(str(f) for f in files)}: no steps logged yet")
    return runs, chosen


@dataclass
class Panel:
    """One axes: ``members`` maps a statistic (``""`` for a lone metric) to its key."""

    group: str
    title: str
    members: dict[str, str]

    def __repr__(self) -> str:
        return f"Panel({self.group!r}, {self.title!r}, {self.members!r})"

    @property
    def family(self) -> bool:
        """Whether this panel draws several statistics of one metric."""
        return "" not in self.members


def _family_stat(stat: str) -> bool:
    return stat in FAMILY_STATS or _QUANTILE.fullmatch(stat) is not None


def make_panels(keys: Sequence[str]) -> list[Panel]:
    """Panels for ``keys``: statistics families merged, grouped by prefix, in order of appearance.

    A key ``x/s`` joins the family ``x`` when ``s`` is ``mean``, ``last``,
    ``min``, ``max`` or a quantile ``pNN`` and ``x`` has at least two of them;
    other statistics (``std``, ``count``, ``sum``...) keep their own panel.
    A panel's group is the first part of its name (``actor`` for
    ``actor/pg_loss``), or ``""`` for a name without ``/``.

    >>> [p.title for p in make_panels(["a/x/mean", "b", "a/x/p50", "a/y", "b/std"])]
    ['x', 'y', 'b', 'std']
    """
    families: dict[str, dict[str, str]] = {}
    for key in keys:
        base, _, stat = key.rpartition("/")
        if base and _family_stat(stat):
            families.setdefault(base, {})[stat] = key
    ordered: dict[str, dict[str, str]] = {}  # panel name -> members, in order of first key
    for key in keys:
        base, _, stat = key.rpartition("/")
        if base and len(families.get(base, ())) >= 2 and _family_stat(stat):
            ordered.setdefault(base, {})[stat] = key
        else:
            ordered[key] = {"": key}
    by_group: dict[str, list[Panel]] = {}
    for name, members in ordered.items():
        group = name.split("/", 1)[0] if "/" in name or "" not in members else ""
        title = name[len(group) + 1 :] if name.startswith(group + "/") else name
        by_group.setdefault(group, []).append(Panel(group, title, members))
    return [panel for panels in by_group.values() for panel in panels]


_CHUNK = 256


def ema(values: np.ndarray, weight: float) -> np.ndarray:
    """Debiased exponential moving average: ``z = w*z + (1-w)*y``, divided by ``1 - w**(t+1)``.

    The same curve TensorBoard's smoothing slider draws; ``weight=0`` returns
    the values. Vectorized in chunks of 256 (a matrix product per chunk and
    a carry between chunks), so 100k points take milliseconds.

    >>> ema(np.array([1.0, 1.0, 1.0]), 0.9).round(12).tolist()   # debiasing: no ramp from 0
    [1.0, 1.0, 1.0]
    >>> ema(np.array([0.0, 2.0]), 0.5).tolist()
    [0.0, 1.3333333333333333]
    """
    values = np.asarray(values, dtype=np.float64)
    n = values.size
    if weight <= 0.0 or n == 0:
        return values.copy()
    chunks = -(-n // _CHUNK)
    padded = np.zeros(chunks * _CHUNK)
    padded[:n] = values
    index = np.arange(_CHUNK)
    lag = index[:, None] - index[None, :]
    kernel = np.where(lag >= 0, (1.0 - weight) * weight ** np.maximum(lag, 0), 0.0)
    local = padded.reshape(chunks, _CHUNK) @ kernel.T  # each chunk from a zero start
    decay = weight ** (index + 1.0)
    carry = 0.0
    for row in local:  # add what the previous chunks carry into this one
        row += decay * carry
        carry = row[-1]
    raw = local.reshape(-1)[:n]
    return raw / (1.0 - weight ** (np.arange(n) + 1.0))


def envelope(x: np.ndarray, y: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``4 * bins`` points of the curve ``(x, y)`` (x increasing) that draw like all of it.

    ``x``'s range is cut into ``bins`` equal bins; each keeps its first,
    last, lowest and highest point, in x order, so every spike stays visible
    and the line's extent in each pixel column is exact.

    >>> x = np.arange(1000.0); y = np.zeros(1000); y[500] = 9.0
    >>> ex, ey = envelope(x, y, 10)
    >>> len(ex) <= 40, float(ey.max()), bool(np.all(np.diff(ex) > 0))
    (True, 9.0, True)
    """
    n = x.size
    if n <= 4 * bins:
        return x, y
    span = x[-1] - x[0]
    which = np.minimum(((x - x[0]) / span * bins).astype(np.int64), bins - 1)
    starts = np.flatnonzero(np.r_[True, which[1:] != which[:-1]])
    ends = np.r_[starts[1:], n] - 1
    order = np.lexsort((y, which))  # by bin, then by value: a bin's lowest first
    keep = np.unique(np.concatenate([starts, ends, order[starts], order[ends]]))
    return x[keep], y[keep]


def band(
    x: np.ndarray, low: np.ndarray, high: np.ndarray, bins: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A min-max band reduced to ``bins`` bins (each bin's lowest low and highest high).

    >>> x = np.arange(10.0)
    >>> [a.tolist() for a in band(x, x - 1, x + 1, 100)][1][:3]
    [-1.0, 0.0, 1.0]
    """
    n = x.size
    if n <= 2 * bins:
        return x, low, high
    which = np.minimum(((x - x[0]) / (x[-1] - x[0]) * bins).astype(np.int64), bins - 1)
    starts = np.flatnonzero(np.r_[True, which[1:] != which[:-1]])
    ends = np.r_[starts[1:], n] - 1
    lows = np.minimum.reduceat(low, starts)
    highs = np.maximum.reduceat(high, starts)
    xs = np.column_stack([x[starts], x[ends]]).reshape(-1)
    return xs, np.repeat(lows, 2), np.repeat(highs, 2)
