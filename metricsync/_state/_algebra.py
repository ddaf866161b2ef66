"""The merge algebra of metric states, declared once.

Every metric owns one float64 column per entry of :data:`COLUMNS` (W, S, MAX, NEGMIN, T, LAST,
M2, DROP, N, W2, MAXRANK, MINRANK), each naming its merge rule (:class:`Op`); :func:`merge`, the
packed syncs, the binary format and :func:`needed_columns` all derive from that table, so a
sync equals a merge.

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
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
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
    "N",
    "NCOL",
    "NCOL_ALL",
    "NEGMIN",
    "S",
    "T",
    "W",
    "W2",
    "Column",
    "carries",
    "Op",
    "Packed",
    "identity",
    "merge",
    "merge_packed",
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
    Column("N", Op.SUM, 0.0),
    Column("W2", Op.SUM, 0.0),
    Column("MAXRANK", Op.ARGMAX, np.nan),
    Column("MINRANK", Op.ARGMIN, np.nan),
)
W, S, MAX, NEGMIN, T, LAST, M2, DROP, N, W2, MAXRANK, MINRANK = range(len(COLUMNS))
NCOL = 10  #: persisted columns (the binary format's state rows)
NCOL_ALL = len(COLUMNS)
IDENTITY = np.array([c.identity for c in COLUMNS])
#: the MAX columns (MAX, NEGMIN, T) are adjacent: a slice views them, where an index list
#: would be copied to the device first (a host synchronization on CUDA)
_MAX = slice(MAX, T + 1)
ALL_COLUMNS = frozenset(range(NCOL_ALL))  #: every column (see :func:`merge`)

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
    if spec.needs_sketch and spec.quantile_method == "linear":
        cols.add(N)
    if spec.ddof:
        cols.add(W2)
    if spec.argrank:
        cols |= {MAXRANK, MINRANK}
    return tuple(sorted(cols))


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
    # specs are canonical objects, so most equal specs are the same object: the distinct
    # objects first (C loops), then equal ones among those few
    objects = dict(zip(map(id, specs), specs))
    distinct: dict[Spec, int] = {}
    kind_of = {key: distinct.setdefault(s, len(distinct)) for key, s in objects.items()}
    ids = np.fromiter(map(kind_of.__getitem__, map(id, specs)), dtype=np.intp, count=len(specs))
    return ids, list(distinct)


def merge(a: Any, b: Any, xp: Any, carried: AbstractSet[int] = ALL_COLUMNS) -> Any:
    """Merge two column-first state arrays elementwise; ``xp`` is ``numpy`` or ``torch``.

    Associative and commutative (``last`` and the ranks by a total order).
    ``carried``: the columns some metric of ``a`` or ``b`` carries (see
    :func:`needed_columns`). A column none carries holds its identity on both sides
    (a fold sets it back), which the sum of the two keeps: its rule is skipped.
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


def _top(ma: Any, mb: Any, xp: Any) -> Any:
    """The larger of each pair: NaN wins, as in maximum; of 0.0 and -0.0, 0.0 (so that
    merges commute)."""
    top = xp.maximum(ma, mb)
    zero = top == 0
    if xp is np and not zero.any():  # no zero to sign (a check a device would wait on)
        return top
    return xp.where(zero, xp.where(xp.signbit(ma) & xp.signbit(mb), -0.0, 0.0), top)


def _last(ta: Any, tb: Any, la: Any, lb: Any, xp: Any) -> Any:
    """The ``last`` value of the later time (equal times: the larger value, NaN wins)."""
    return xp.where((tb > ta) | ((tb == ta) & _greater(lb, la, xp)), lb, la)


def _m2(wa: Any, wb: Any, sa: Any, sb: Any, m2a: Any, m2b: Any, xp: Any) -> Any:
    """Chan's parallel formula: ``M2`` of two sides from their weights and sums."""
    return m2a + m2b + _chan_correction(wa, wb, sa, sb, xp)


def _chan_correction(wa: Any, wb: Any, sa: Any, sb: Any, xp: Any) -> Any:
    """What merging two sides adds to the sum of their ``M2`` (Chan's correction): 0.0
    unless both sides hold weight. Where one does not, the quotients divide by zero
    and are thrown away, so a NumPy caller silences that in ``errstate``."""
    delta = sb / wb - sa / wa
    return xp.where((wa > 0) & (wb > 0), wa * wb / (wa + wb) * delta * delta, 0.0)


def _merge(a: Any, b: Any, xp: Any, carried: AbstractSet[int]) -> Any:
    out = a + b  # the SUM columns; every other column carried is overwritten below
    if not carried.isdisjoint((MAX, NEGMIN, T)):
        out[_MAX] = _top(a[_MAX], b[_MAX], xp)
    if LAST in carried:
        out[LAST] = _last(a[T], b[T], a[LAST], b[LAST], xp)
    if M2 in carried:
        out[M2] = _m2(a[W], b[W], a[S], b[S], a[M2], b[M2], xp)
    return _ranks(a, b, out, xp) if MAXRANK in carried else out


def _ranks(a: Any, b: Any, out: Any, xp: Any) -> Any:
    """``out`` with the rank columns of ``a`` and ``b`` merged."""
    if xp is np and np.isnan(a[MAXRANK:]).all() and np.isnan(b[MAXRANK:]).all():
        return out  # no ranks on either side (no argrank metric): NaN + NaN, as they are
    out[MAXRANK] = _rank_of(a[MAX], b[MAX], a[MAXRANK], b[MAXRANK], xp)
    out[MINRANK] = _rank_of(a[NEGMIN], b[NEGMIN], a[MINRANK], b[MINRANK], xp)
    return out


class Packed:
    """States packed by column: for each column ``c``, the values of positions
    ``carried[c]`` (sorted), column after column; the offsets of each column and,
    for the rules that read other columns, where those sit.

    >>> p = Packed([np.array([0, 1]), np.array([1])] + [np.array([], dtype=int)] * 10)
    >>> p.offsets.tolist()
    [0, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]
    """

    def __init__(self, carried: Sequence[np.ndarray]) -> None:
        sizes = [len(c) for c in carried]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.intp)
        off = self.offsets.tolist()
        self.size = off[-1]

        def at(col: int, of: int) -> np.ndarray:  # where column col holds the positions of of
            return (off[col] + np.searchsorted(carried[col], carried[of])).astype(np.intp)

        self.span = {c: slice(off[c], off[c + 1]) for c in range(len(carried))}
        self.last_t = at(T, LAST) if sizes[LAST] else None
        self.m2_ws = (at(W, M2), at(S, M2)) if sizes[M2] else None
        self.rank_of = (at(MAX, MAXRANK), at(NEGMIN, MINRANK)) if sizes[MAXRANK] else None


def merge_packed(rows: np.ndarray, packed: Packed) -> np.ndarray:
    """Merge packed states (the rows of ``rows``, in order) into one packed state: bit
    for bit the carried values :func:`merge` gives, folding the rows left to right (a
    NaN's sign and payload aside), with each rule evaluated only where a position
    carries its column.

    The sums and ``M2`` fold rank by rank (``M2`` reads the sums to its left). The MAX
    columns take one maximum over every rank; the rules that read them (``last``,
    the ranks) read running maxima, so neither waits for the other.
    """
    out = rows[0].copy()
    span = packed.span
    tops = slice(span[MAX].start, span[T].stop)  # the MAX columns: MAX, NEGMIN, T
    with np.errstate(all="ignore"):  # NaN and inf samples are data here
        if packed.rank_of is not None:
            for col, at in zip((MAXRANK, MINRANK), packed.rank_of):
                out[span[col]] = _fold_beside(_rank_of, rows[:, at], rows[:, span[col]])
        if packed.last_t is not None:
            out[span[LAST]] = _fold_beside(_last, rows[:, packed.last_t], rows[:, span[LAST]])
        for b in rows[1:]:
            if packed.m2_ws is not None:  # first, while ``out`` holds the left side's sums
                (w, s), m2 = packed.m2_ws, span[M2]
                out[m2] = _m2(out[w], b[w], out[s], b[s], out[m2], b[m2], np)
            sums = slice(span[W].start, span[S].stop), slice(span[DROP].start, span[W2].stop)
            for part in sums:  # the SUM columns
                out[part] += b[part]
        if len(rows) > 1:
            out[tops] = _running_top(rows[:, tops], running=False)
    return out


def _running_top(x: np.ndarray, running: bool = True) -> np.ndarray:
    """:func:`_top` folded down the rows of ``x``: row ``j`` holds the fold of rows
    0..j (with ``running``), else the one row of the fold of them all. The maximum
    alone gives every value but a zero's sign, which is -0.0 only where every value
    folded in has its sign bit set."""
    if running:
        top, negative = _running(np.maximum, x), _running(np.logical_and, np.signbit(x))
    else:
        top, negative = np.maximum.reduce(x, axis=0), np.signbit(x).all(axis=0)
    return np.where(top == 0, np.where(negative, -0.0, 0.0), top)


def _running(op: np.ufunc, x: np.ndarray) -> np.ndarray:
    """``op`` folded down the rows of ``x``, left to right: row ``j`` holds the fold of
    rows 0..j (``op.accumulate`` does the same, much slower down the first axis)."""
    out = x.copy()
    for j in range(1, len(x)):
        op(out[j - 1], x[j], out=out[j])
    return out


def _fold_beside(rule: Any, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``rule`` (:func:`_last` or :func:`_rank_of`) folded down the rows of ``values``,
    left to right: each step reads the running top of ``keys`` (the times, the values
    ranked) to its left, so the fold does not wait for that of the keys."""
    before = _running_top(keys)
    out = values[0]
    for j in range(1, len(values)):
        out = rule(before[j - 1], keys[j], out, values[j], np)
    return out
