"""The merge algebra of metric states, declared once.

Every metric owns one column of float64 state per entry of :data:`COLUMNS`;
a table of metrics is a column-first array of shape ``(NCOL_ALL, n)``. Each
column names its merge rule (:class:`Op`), and everything that combines
states derives from this one table: :func:`merge` (recording folds, ``merge``,
the all-gather sync), the packed all-reduce sync, the binary format's column
list and :func:`needed_columns` (what a spec carries through a sync).

====== ================================================ ===========
column meaning                                          merge
====== ================================================ ===========
W      sum of weights (``count``)                       sum
S      sum of weight * value (``mean = S / W``)         sum
MAX    largest value with weight > 0                    max (0.0 > -0.0)
NEGMIN minus the smallest value with weight > 0         max
T      recording time (us) of the latest kept sample    max
LAST   that sample (equal times: the larger, NaN wins)  by T
M2     sum of w * (x - mean)^2                          Chan
DROP   non-finite samples dropped (``nan="ignore"``)    sum
MAXRNK rank that held MAX (NaN: this process)           by MAX
MINRNK rank that held the minimum                       by NEGMIN
====== ================================================ ===========

The first :data:`NCOL` columns are the persisted state rows of the binary
format; the two rank columns travel only for ``argrank`` specs.

>>> import numpy as np
>>> a = identity(1); a[[W, S, MAX, NEGMIN], 0] = [2.0, 3.0, 2.0, -1.0]
>>> b = identity(1); b[[W, S, MAX, NEGMIN], 0] = [1.0, 5.0, 5.0, -5.0]
>>> merge(a, b, np)[[W, S, MAX, NEGMIN, M2], 0].tolist()
[3.0, 8.0, 5.0, -1.0, 8.166666666666666]
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from ._spec import Spec

__all__ = [
    "COLUMNS",
    "DROP",
    "IDENTITY",
    "LAST",
    "M2",
    "MAX",
    "MAXRANK",
    "MINRANK",
    "NCOL",
    "NCOL_ALL",
    "NEGMIN",
    "S",
    "T",
    "W",
    "Column",
    "carries",
    "Op",
    "identity",
    "merge",
    "needed_columns",
    "now_us",
    "spec_kinds",
]


class Op(enum.Enum):
    """How two values of one column combine."""

    SUM = "sum"
    MAX = "max"
    LAST = "last"  # the value whose T is larger (ties: larger value, NaN wins)
    M2 = "m2"  # Chan's parallel formula over (W, S, M2)
    ARGMAX = "argmax"  # the rank beside the larger MAX (ties: the lower rank)
    ARGMIN = "argmin"  # the rank beside the larger NEGMIN (ties: the lower rank)


@dataclass(frozen=True)
class Column:
    """One state column: its name, merge rule and value for "no samples"."""

    name: str
    op: Op
    identity: float


COLUMNS = (
    Column("W", Op.SUM, 0.0),
    Column("S", Op.SUM, 0.0),
    Column("MAX", Op.MAX, -np.inf),
    Column("NEGMIN", Op.MAX, -np.inf),
    Column("T", Op.MAX, -np.inf),
    Column("LAST", Op.LAST, 0.0),
    Column("M2", Op.M2, 0.0),
    Column("DROP", Op.SUM, 0.0),
    Column("MAXRANK", Op.ARGMAX, np.nan),
    Column("MINRANK", Op.ARGMIN, np.nan),
)
W, S, MAX, NEGMIN, T, LAST, M2, DROP, MAXRANK, MINRANK = range(len(COLUMNS))
NCOL = 8  #: persisted columns (the binary format's state rows)
NCOL_ALL = len(COLUMNS)
IDENTITY = np.array([c.identity for c in COLUMNS])
_SUM = [i for i, c in enumerate(COLUMNS) if c.op is Op.SUM]
_MAX = [i for i, c in enumerate(COLUMNS) if c.op is Op.MAX]

_last_stamp = 0


def now_us() -> float:
    """Wall-clock microseconds, strictly increasing within this process.

    >>> now_us() < now_us()
    True
    """
    global _last_stamp
    stamp = time.time_ns() // 1000
    if stamp <= _last_stamp:
        stamp = _last_stamp + 1
    _last_stamp = stamp
    return float(stamp)


def identity(n: int) -> np.ndarray:
    """``(NCOL_ALL, n)`` states holding no samples."""
    return np.repeat(IDENTITY[:, None], n, axis=1)


@cache
def needed_columns(spec: Spec) -> tuple[int, ...]:
    """The columns a spec's statistics read (what its state carries through a sync).

    >>> needed_columns(Spec("mean")), needed_columns(Spec(("max", "last")))
    ((0, 1), (0, 2, 4, 5))
    """
    stats = set(spec.reduce)
    cols = {W, S} if stats & {"mean", "sum", "var", "std"} else {W}
    if stats & {"max"} or spec.quantiles or spec.argrank:
        cols.add(MAX)
    if stats & {"min"} or spec.quantiles or spec.argrank:
        cols.add(NEGMIN)
    if "last" in stats:
        cols |= {T, LAST}
    if stats & {"var", "std"}:
        cols.add(M2)
    if spec.nan == "ignore":
        cols.add(DROP)
    if spec.argrank:
        cols |= {MAXRANK, MINRANK}
    return tuple(sorted(cols))


@cache
def carries(spec: Spec) -> np.ndarray:
    """A read-only ``(NCOL_ALL,)`` mask of :func:`needed_columns`."""
    mask = np.zeros(NCOL_ALL, dtype=bool)
    mask[list(needed_columns(spec))] = True
    mask.flags.writeable = False
    return mask


def spec_kinds(specs: Sequence[Spec]) -> tuple[np.ndarray, list[Spec]]:
    """Each spec's index among the distinct ``specs`` (in first-seen order), and those:
    work per spec is done once per distinct spec, then spread with the indexes.

    >>> ids, kinds = spec_kinds([Spec("max"), Spec(), Spec("max")])
    >>> ids.tolist(), kinds
    ([0, 1, 0], [Spec('max'), Spec('mean')])
    """
    distinct: dict[Spec, int] = {}
    ids = np.array([distinct.setdefault(s, len(distinct)) for s in specs], dtype=np.intp)
    return ids, list(distinct)


def merge(a: Any, b: Any, xp: Any, carried: tuple[bool, bool, bool] = (True, True, True)) -> Any:
    """Merge two column-first state arrays elementwise; ``xp`` is ``numpy`` or ``torch``.

    Associative and commutative (``last`` and the ranks by a total order).
    ``carried`` says whether any metric carries ``LAST``, ``M2`` and the rank
    columns: a column no metric carries holds its identity on both sides, and
    stays so (``a + b``).
    """
    if xp is np:
        with np.errstate(all="ignore"):  # NaN and inf samples are data here
            return _merge(a, b, xp, carried)
    return _merge(a, b, xp, carried)


def _greater(x: Any, y: Any, xp: Any) -> Any:
    """``x > y`` in a total order where NaN is the largest value and ``0.0 > -0.0``."""
    signed_zero = (x == y) & xp.signbit(y) & ~xp.signbit(x)
    return (x > y) | (xp.isnan(x) & ~xp.isnan(y)) | signed_zero


def _rank_of(a: Any, b: Any, ra: Any, rb: Any, xp: Any) -> Any:
    """The rank beside the larger value; equal values: the lower rank (NaN ranks last)."""
    low = xp.where(xp.isnan(rb) | (ra <= rb), ra, rb)
    return xp.where(_greater(b, a, xp), rb, xp.where(_greater(a, b, xp), ra, low))


def _merge(a: Any, b: Any, xp: Any, carried: tuple[bool, bool, bool]) -> Any:
    out = a + b  # the SUM columns; every other column is overwritten below
    ma, mb = a[_MAX], b[_MAX]
    # NaN wins, as in maximum; of 0.0 and -0.0, 0.0 (so that merges commute)
    top = xp.maximum(ma, mb)
    out[_MAX] = xp.where(top == 0, xp.where(xp.signbit(ma) & xp.signbit(mb), -0.0, 0.0), top)
    last, m2, ranks = carried
    if last:
        ta, tb = a[T], b[T]
        take_b = (tb > ta) | ((tb == ta) & _greater(b[LAST], a[LAST], xp))
        out[LAST] = xp.where(take_b, b[LAST], a[LAST])
    if not m2:
        return _ranks(a, b, out, xp) if ranks else out
    wa, wb = a[W], b[W]
    total = wa + wb
    both = (wa > 0) & (wb > 0)
    delta = b[S] / xp.where(wb > 0, wb, 1.0) - a[S] / xp.where(wa > 0, wa, 1.0)
    correction = xp.where(both, wa * wb / xp.where(total > 0, total, 1.0) * delta * delta, 0.0)
    out[M2] = a[M2] + b[M2] + correction
    return _ranks(a, b, out, xp) if ranks else out


def _ranks(a: Any, b: Any, out: Any, xp: Any) -> Any:
    """``out`` with the rank columns of ``a`` and ``b`` merged."""
    if xp is np and np.isnan(a[MAXRANK:]).all() and np.isnan(b[MAXRANK:]).all():
        return out  # no ranks on either side (no argrank metric): NaN + NaN, as they are
    out[MAXRANK] = _rank_of(a[MAX], b[MAX], a[MAXRANK], b[MAXRANK], xp)
    out[MINRANK] = _rank_of(a[NEGMIN], b[NEGMIN], a[MINRANK], b[MINRANK], xp)
    return out
