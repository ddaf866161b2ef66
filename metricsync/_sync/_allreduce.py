"""The reduce path of a sync: every rank's packed state combined by ``all_reduce``.

For large groups, where a gather's bytes grow with the ranks: round A, a MAX of int64
total-order keys (header, flags, extremes, rank means); round B, a SUM of float64 (sums,
sketch cells in an agreed window, M2 by Chan about an agreed shift); round C only on ties.
The group picks this path by :func:`choose`.

>>> key(np.array([-0.0, 0.0, -1.0, np.nan])).argsort().tolist()
[2, 0, 1, 3]
>>> unkey(key(np.array([1.5, -np.inf]))).tolist()
[1.5, -inf]
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from .._state import _algebra as al
from .._state._across import ACOL
from .._state._spec import Spec
from .._state._table import StateTable
from ._comm import Comm
from ._layout import NO_WINDOW, Layout, Window
from ._reduce import Word, merge_ranks, pack_cells, sum_cells, widened

__all__ = [
    "ENV",
    "NONE",
    "SWITCH_BYTES",
    "Reduced",
    "choose",
    "gather_words",
    "key",
    "received_bytes",
    "unkey",
    "wire_bytes",
]

#: the environment variable that forces a path: ``gather``, ``reduce`` or ``auto`` (default)
ENV = "METRICSYNC_SYNC_PATH"
#: the latency of the reduce path's second collective, valued in bytes received (see choose)
SWITCH_BYTES = 64 * 1024
NONE = np.iinfo(np.int64).min  #: a key below every float's: "no value from this rank"
_FLIP = np.int64(0x7FFF_FFFF_FFFF_FFFF)
#: the header words round A checks every rank agrees on, each sent as ``x`` and ``-x``
PAIRED = (Word.MAGIC, Word.SEQ, Word.LAYOUT, Word.TAG)
_FLAG_BITS = 6  # one word per flag bit (metricsync._sync._sync's flags)
_A_FLAGS = 2 * len(PAIRED)  # where round A's header words go, after the pairs
_A_CLASH = _A_FLAGS + _FLAG_BITS
_A_BLOB = _A_CLASH + 1
_A_TAGS = _A_BLOB + 1  # ranks 0..7's tags
HEAD = _A_TAGS + 8  #: int64 words of round A's header (see :meth:`Reduced.round_a`)


def key(x: np.ndarray) -> np.ndarray:
    """``int64`` keys whose order is the merge's total order of ``x`` (NaN largest,
    ``0.0 > -0.0``): the maximum of keys is :func:`metricsync._state._algebra.merge`'s ``max``."""
    x = np.where(np.isnan(x), np.nan, x)  # one NaN, positive: above +inf
    bits = x.view(np.int64)
    return np.where(bits < 0, bits ^ _FLIP, bits)


def unkey(k: np.ndarray) -> np.ndarray:
    """The floats of :func:`key`'s keys."""
    bits = np.where(k < 0, k ^ _FLIP, k).astype(np.int64)
    return bits.view(np.float64)


def gather_words(layout: Layout, windows: Mapping[tuple[str, Spec], Window]) -> int:
    """The float64 words of one rank's state in the gather path (header aside), with
    each quantile metric's cells in its agreed window (``windows``)."""
    cells = 0
    for entry in layout.sketch_entries:
        win = windows.get(entry, NO_WINDOW)
        cells += win.hi - win.lo + 2
    return layout.data_size + cells


def choose(world: int, layout: Layout, windows: Mapping[tuple[str, Spec], Window]) -> bool:
    """Whether a sync of ``world`` ranks in the agreed ``layout`` takes the reduce path.

    The rule, from facts every rank agrees on: the gather path has a rank receive
    ``(W - 1) * G`` bytes (``G``: a rank's packed state, :func:`gather_words`); the
    reduce path about ``4 * G`` (two ring ``all_reduce``s of about ``G`` together,
    each bringing twice its payload, and a margin), plus its second collective's
    latency, valued at :data:`SWITCH_BYTES`. Reduce when ``(W - 5) * G > SWITCH_BYTES``:
    for 2,020 means (a state of 32 KB) from 8 ranks on, for 20 from 210.
    ``METRICSYNC_SYNC_PATH=gather`` or ``reduce`` forces a path (every rank must set
    the same).

    >>> from metricsync._state._spec import Spec
    >>> layout = Layout([(f"m{i}", Spec()) for i in range(2020)])
    >>> [choose(w, layout, {}) for w in (2, 7, 8, 1024)]
    [False, False, True, True]
    """
    forced = os.environ.get(ENV)
    if forced is None or forced == "auto":
        return world > 5 and (world - 5) * 8 * gather_words(layout, windows) > SWITCH_BYTES
    if forced not in ("gather", "reduce"):
        raise ValueError(f"{ENV} must be 'gather', 'reduce' or 'auto', not {forced!r}")
    return forced == "reduce" and world > 1


def received_bytes(name: str, payload: int, world: int) -> float:
    """The bytes one collective hands back to a rank, from ``payload`` bytes of input (for
    an all-to-all, one destination's chunk) on ``world`` ranks: a gather or all-to-all
    fills a buffer with every rank's (``world * payload``), an ``all_reduce`` one of its
    payload. (On the wire, see :func:`wire_bytes`.)

    >>> received_bytes("all_reduce", 800, 8), received_bytes("all_to_all_single", 800, 8)
    (800.0, 6400.0)
    """
    return float(payload if name == "all_reduce" else world * payload)


def wire_bytes(name: str, payload: int, world: int) -> float:
    """The bytes a rank takes off the wire in that collective: every other rank's for a
    gather, about twice the payload for a ring ``all_reduce`` (its reduce-scatter, then
    its all-gather, each bringing ``(world - 1) / world`` of it).

    >>> wire_bytes("all_reduce", 800, 8), wire_bytes("all_to_all_single", 800, 8)
    (1400.0, 5600.0)
    """
    if world < 2:
        return 0.0
    if name == "all_reduce":
        return 2.0 * (world - 1) / world * payload
    return float((world - 1) * payload)


def _base_digits(world: int) -> int:
    """How many counts of at most ``world`` fit one float64 exactly, in base ``world + 1``."""
    n = max(int(53 * math.log(2) / math.log(world + 1)), 1)
    while (world + 1) ** n > 2**53:
        n -= 1
    return n


def pack_counts(bits: np.ndarray, world: int) -> np.ndarray:
    """Booleans as float64 words of base-``world + 1`` digits: their sum over ranks holds
    each position's count of ranks, exactly.

    >>> unpack_counts(pack_counts(np.array([True, False, True]), 4) * 3, 4, 3).tolist()
    [3, 0, 3]
    """
    per = _base_digits(world)
    padded = np.zeros(-(-len(bits) // per) * per)
    padded[: len(bits)] = bits
    powers = float(world + 1) ** np.arange(per)
    out: np.ndarray = padded.reshape(-1, per) @ powers
    return out


def unpack_counts(words: np.ndarray, world: int, n: int) -> np.ndarray:
    """The counts of :func:`pack_counts`' summed words (``n`` positions)."""
    per, base = _base_digits(world), world + 1
    v = words.astype(np.int64)
    digits = np.empty((len(v), per), dtype=np.int64)
    for j in range(per):
        v, digits[:, j] = np.divmod(v, base)
    return digits.reshape(-1)[:n]


class Head(NamedTuple):
    """Round A's header, reduced: every rank's words agree where ``low == high``."""

    high: np.ndarray  # the PAIRED words' maxima
    low: np.ndarray  # ... their minima
    flags: int  # the OR of every rank's flags
    clash: int  # the largest clash word
    blob: int  # the largest new-entries size
    tags: list[int]  # the tags of ranks 0..7 (those in the group)

    def agree(self, *words: Word) -> bool:
        """Whether every rank sent the same value of each of ``words`` (of PAIRED)."""
        at = [PAIRED.index(w) for w in words]
        return bool((self.high[at] == self.low[at]).all())


class Reduced:
    """One rank's side of a reduce-path sync in a layout (see the module docstring)."""

    def __init__(self, comm: Comm, layout: Layout) -> None:
        self.comm, self.layout = comm, layout
        self.rank, self.world = comm.ctx.rank, comm.ctx.world
        packed = layout.packed
        span = packed.span
        self.carried = packed.size
        self.tops = slice(span[al.MAX].start, span[al.T].stop)
        self.m2 = packed.m2_ws  # where W and S sit for the M2 positions
        self.a: np.ndarray | None = None

    def round_a(self, head: np.ndarray, data: np.ndarray | None) -> Head:
        """The MAX round: ``head`` (the gather path's header, :class:`Word`) and, where this
        rank could pack its state, ``data`` (:func:`metricsync._sync._reduce.pack`)."""
        h = head.tolist()
        words = np.empty(HEAD, dtype=np.int64)
        words[:_A_FLAGS:2] = [h[w] for w in PAIRED]
        words[1:_A_FLAGS:2] = [-h[w] for w in PAIRED]
        flags = h[Word.FLAGS]
        words[_A_FLAGS:_A_CLASH] = [(flags >> b) & 1 for b in range(_FLAG_BITS)]
        words[_A_CLASH], words[_A_BLOB] = h[Word.CLASH], h[Word.BLOB]
        words[_A_TAGS:] = NONE  # ranks 0..7's tags (a blocking sync's is negative)
        if self.rank < 8:
            words[_A_TAGS + self.rank] = h[Word.TAG]
        if data is None:
            body = np.full(self._a_size(), NONE, dtype=np.int64)
        else:
            body = np.concatenate(self._a_body(data))
        out = self.comm.all_reduce(np.concatenate([words, body]), _op("MAX"), "the max reduce")
        self.a = out[HEAD:]
        bits = out[_A_FLAGS:_A_CLASH].tolist()
        return Head(
            out[:_A_FLAGS:2],
            -out[1:_A_FLAGS:2],
            sum(1 << b for b, on in enumerate(bits) if on > 0),
            int(out[_A_CLASH]),
            int(out[_A_BLOB]),
            out[_A_TAGS : _A_TAGS + min(self.world, 8)].tolist(),
        )

    def _a_size(self) -> int:
        layout = self.layout
        rows = sum(layout.agg_rows)
        m2 = 0 if self.m2 is None else len(self.m2[0])
        return self.tops.stop - self.tops.start + 3 * rows + 2 * m2

    def _a_body(self, data: np.ndarray) -> list[np.ndarray]:
        aggs = data[self.carried :].reshape(-1, ACOL)
        holder = np.where(aggs[:, 1] > 0, -self.rank, NONE).astype(np.int64)
        parts = [key(data[self.tops]), key(aggs[:, 2:]).reshape(-1), holder]
        if self.m2 is not None:
            w, s = data[self.m2[0]], data[self.m2[1]]
            with np.errstate(all="ignore"):
                mean = s / np.where(w > 0, w, 1.0)
            held = w > 0
            parts += [np.where(held, key(mean), NONE), np.where(held, key(-mean), NONE)]
        return parts

    def extremes_table(self) -> StateTable:
        """A table holding round A's MAX columns (for :func:`widened`)."""
        assert self.a is not None
        layout = self.layout
        rows = np.repeat(np.arange(al.NCOL_ALL), [len(c) for c in layout.carried])
        flat = np.concatenate([al.IDENTITY[rows], np.zeros(ACOL * sum(layout.agg_rows))])
        flat[self.tops] = unkey(self.a[: self.tops.stop - self.tops.start])
        return merge_ranks(layout, flat[None, :])

    def round_b(
        self,
        data: np.ndarray,
        table: StateTable,
        where: np.ndarray,
        windows: list[Window],
        held: np.ndarray | None,
        declared: np.ndarray | None,
    ) -> tuple[StateTable, np.ndarray | None, np.ndarray | None]:
        """The SUM round (and round C on ties): the merged table, with the cells of
        ``windows``; and, when asked for (``held``, ``declared`` given), per layout
        position whether some rank holds it, and whether some rank declares it otherwise."""
        assert self.a is not None
        layout, packed, a = self.layout, self.layout.packed, self.a
        span = packed.span
        ntop = self.tops.stop - self.tops.start
        nagg = sum(layout.agg_rows)
        tops = a[:ntop]
        ext = a[ntop : ntop + 2 * nagg]
        holder = a[ntop + 2 * nagg : ntop + 3 * nagg]
        means = a[ntop + 3 * nagg :]
        sums = slice(span[al.W].start, span[al.S].stop)
        counts = slice(span[al.DROP].start, span[al.W2].stop)  # DROP, N, W2: merged by sum
        parts = [data[sums], data[counts]]
        # last: the ranks at the latest time send their value, the others -0.0
        t0 = self.tops.start
        last_c = None
        if packed.last_t is not None:
            last = data[span[al.LAST]]
            last_c = key(data[packed.last_t]) == tops[packed.last_t - t0]
            zero = last_c & (key(last) == 0)
            parts += [last_c.astype(float), np.where(last_c, last, -0.0), zero.astype(float)]
        rank_c = []
        if packed.rank_of is not None:
            for col, of in zip((al.MAXRANK, al.MINRANK), packed.rank_of):
                ranks = data[span[col]]
                c = (key(data[of]) == tops[of - t0]) & ~np.isnan(ranks)
                rank_c.append(c)
                parts += [c.astype(float), np.where(c, ranks, 0.0)]
        shift = None
        if self.m2 is not None:
            n = len(self.m2[0])
            hi, lo = unkey(means[:n]), -unkey(means[n:])
            with np.errstate(all="ignore"):
                shift = np.where(means[:n] == NONE, 0.0, hi / 2 + lo / 2)
                w, s = data[self.m2[0]], data[self.m2[1]]
                d = np.where(w > 0, s / np.where(w > 0, w, 1.0) - shift, 0.0)
                parts += [data[span[al.M2]], w * d * d, w * d]
        aggs = data[self.carried :].reshape(-1, ACOL)
        if nagg:
            first = np.repeat(layout.first, layout.agg_rows)
            mine = holder == -self.rank
            parts += [np.where(first & ~mine, -0.0, aggs[:, 0]), aggs[:, 1]]
        k = len(layout)
        if held is not None:
            parts.append(pack_counts(held, self.world))
        if declared is not None:
            parts.append(pack_counts(declared, self.world))
        parts.append(pack_cells(table, layout, where, windows))
        b = self.comm.all_reduce(np.concatenate(parts), _op("SUM"), "the sum reduce")

        out = np.empty(self.carried + ACOL * nagg)
        out[self.tops] = unkey(tops)
        at = 0

        def take(n: int) -> np.ndarray:
            nonlocal at
            at += n
            return b[at - n : at]

        out[sums] = take(sums.stop - sums.start)
        out[counts] = take(counts.stop - counts.start)
        ties: list[tuple[int, np.ndarray, np.ndarray]] = []  # (column, tied, candidate keys)
        if last_c is not None:
            n = len(last_c)
            count, total, zeros = take(n), take(n), take(n)
            value = np.where(count == zeros, 0.0, total)
            tied = (count > 1) & (count != zeros)
            out[span[al.LAST]] = value
            ties.append((al.LAST, tied, np.where(last_c, key(data[span[al.LAST]]), NONE)))
        for col, c in zip((al.MAXRANK, al.MINRANK), rank_c):
            count, total = take(len(c)), take(len(c))
            out[span[col]] = np.where(count == 0, np.nan, total)
            ranks = -np.nan_to_num(data[span[col]]).astype(np.int64)
            ties.append((col, count > 1, np.where(c, ranks, NONE)))
        if shift is not None:
            assert self.m2 is not None
            n = len(shift)
            m2, q, p = take(n), take(n), take(n)
            wt = out[self.m2[0]]
            with np.errstate(all="ignore"):
                between = np.maximum(q - p * p / np.where(wt > 0, wt, 1.0), 0.0)
            out[span[al.M2]] = m2 + np.where(wt > 0, between, 0.0)
        if nagg:
            agg_out = out[self.carried :].reshape(-1, ACOL)
            agg_out[:, 0], agg_out[:, 1] = take(nagg), take(nagg)
            agg_out[:, 2:] = unkey(ext).reshape(-1, 2)
        held_any = declared_any = None
        if held is not None:
            held_any = unpack_counts(take(-(-k // _base_digits(self.world))), self.world, k) > 0
        if declared is not None:
            words = take(-(-k // _base_digits(self.world)))
            declared_any = unpack_counts(words, self.world, k) > 0
        if any(t.any() for _, t, _ in ties):
            self._round_c(out, ties)
        merged = merge_ranks(layout, out[None, :])
        if layout.sketch:
            sum_cells(merged, layout, windows, b[None, at:])
        return merged, held_any, declared_any

    def _round_c(self, out: np.ndarray, ties: list[tuple[int, np.ndarray, np.ndarray]]) -> None:
        """The tied ``last`` values and ``argrank`` ranks: one small MAX of their keys
        (a rank's as ``-rank``, so the lowest wins, as in the merge)."""
        send = np.concatenate([keys[tied] for _, tied, keys in ties])
        got = self.comm.all_reduce(send, _op("MAX"), "the tie reduce")
        span, at = self.layout.packed.span, 0
        for col, tied, _ in ties:
            n = int(tied.sum())
            view = out[span[col]]  # a view: a slice of out
            view[tied] = unkey(got[at : at + n]) if col == al.LAST else -got[at : at + n]
            at += n


def widen(reduced: Reduced, layout: Layout, agreed: list[Window]) -> list[Window]:
    """The windows the gather path would send cells in after its first gather."""
    return widened(layout, agreed, reduced.extremes_table())


def _op(name: str) -> Any:
    import torch.distributed as dist

    return getattr(dist.ReduceOp, name)
