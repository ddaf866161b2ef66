"""From state columns to numbers: the ``compute()`` dict, vectorized over metrics.

A :class:`Plan` lists every output key with its slot and statistic, built once per layout;
:func:`compute` evaluates it over a table.

>>> import numpy as np
>>> from metricsync._state import _algebra as al
>>> from metricsync._state._spec import Spec
>>> cols = al.identity(1); cols[[al.W, al.S, al.MAX], 0] = [2.0, 4.0, 3.0]
>>> specs = [Spec(("mean", "max"))]
>>> compute(Plan(["x"], specs), specs, cols, {}, {})
{'x/mean': 2.0, 'x/max': 3.0}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from . import _algebra as al
from ._across import combine, fold_rank
from ._quantile import query, query_sketches
from ._sketch import sketch_layout
from ._spec import Spec, quantile_of

__all__ = ["Plan", "compute", "local_values"]

_PLAIN = ("mean", "sum", "count", "min", "max", "last", "var", "std")
_CODE = {stat: i for i, stat in enumerate(_PLAIN)}
_QUANTILE = len(_PLAIN)  # a quantile statistic, answered from the slot's sketch
_DROPPED, _MAX_RANK, _MIN_RANK = -1, -2, -3  # keys beyond the statistics
_RANK_COLUMNS = ((_MAX_RANK, al.MAXRANK), (_MIN_RANK, al.MINRANK))


def _code(stat: str) -> int:
    q = quantile_of(stat)
    if q == 0.0:
        return _CODE["min"]  # p0 and p100 are the exact extremes
    if q == 1.0:
        return _CODE["max"]
    return _QUANTILE if q is not None else _CODE[stat]


def _shape(spec: Spec) -> tuple[tuple[str, ...], tuple[int, ...], tuple[tuple[int, float], ...]]:
    """A spec's key suffixes, statistic codes and (offset, q) of its quantiles."""
    suffixes = [s[1:] for s in spec.output_keys("_")] + [s[1:] for s in spec.extra_keys("_")]
    codes = [_code(stat) for stat in spec.reduce]
    quantiles = tuple(
        (i, q)
        for i, (c, q) in enumerate(zip(codes, map(quantile_of, spec.reduce)))
        if c == _QUANTILE and q is not None
    )
    codes += ([_MAX_RANK, _MIN_RANK] if spec.argrank else []) + (
        [_DROPPED] if spec.nan == "ignore" else []
    )
    return tuple(suffixes), tuple(codes), quantiles


class Plan:
    """Every output key of ``(names, specs)`` with its slot and statistic code."""

    def __init__(
        self,
        names: Sequence[str],
        specs: Sequence[Spec],
        kinds: tuple[np.ndarray, list[Spec]] | None = None,
    ) -> None:
        ids, distinct = al.spec_kinds(specs) if kinds is None else kinds  # per distinct spec
        shapes = [_shape(spec) for spec in distinct]
        counts = np.array([len(shape[0]) for shape in shapes], dtype=np.intp)[ids]
        suffixes = [shape[0] for shape in shapes]
        if all(sfx == ("",) for sfx in suffixes):  # one key per name: the name
            self.keys = list(names)
        else:
            self.keys = [name + sfx for name, i in zip(names, ids.tolist()) for sfx in suffixes[i]]
        self.slots = np.repeat(np.arange(len(ids), dtype=np.intp), counts)
        self.starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.intp)
        width = max((len(shape[1]) for shape in shapes), default=0)
        table = np.zeros((len(shapes), width), dtype=np.intp)  # each spec's codes, padded
        for i, shape in enumerate(shapes):
            table[i, : len(shape[1])] = shape[1]
        kind = ids[self.slots]
        self.codes = table[kind, np.arange(len(kind)) - self.starts[self.slots]]
        across = np.array([spec.across != "exact" for spec in distinct], dtype=bool)
        self.across: list[int] = np.flatnonzero(across[ids]).tolist() if len(ids) else []
        quantiled = np.array([bool(shape[2]) for shape in shapes], dtype=bool)
        self.quantiles: dict[int, list[tuple[int, float]]] = {
            slot: [(int(self.starts[slot]) + i, q) for i, q in shapes[ids[slot]][2]]
            for slot in (np.flatnonzero(quantiled[ids]).tolist() if len(ids) else [])
        }  # slot -> (key position, q)
        self.n = len(names)
        self.ddof = np.array([spec.ddof for spec in distinct], dtype=np.float64)[ids]
        # what local_values and compute need of the codes, worked out once per plan
        codes = self.codes
        # each plain statistic asked for, with its keys and their slots
        self.by_code = [
            (code, at, self.slots[at])
            for code in range(len(_PLAIN))
            if len(at := np.flatnonzero(codes == code))
        ]
        self.dropped = np.flatnonzero(codes == _DROPPED)
        self.ranks = [(np.flatnonzero(codes == c), col) for c, col in _RANK_COLUMNS]
        self.ranks = [(at, col) for at, col in self.ranks if len(at)]
        self.quantile_at = np.flatnonzero(codes == _QUANTILE)
        self.template: dict[str, float] | None = None  # see compute
        self.stats_only = codes >= 0  # keys that are statistics (not ranks or drop counts)
        self._distinct: bool | None = None  # see keys_distinct

    def keys_distinct(self) -> bool:
        """Whether no two of the keys are the same (worked out once per plan: the results
        of a steady sync share theirs)."""
        if self._distinct is None:
            self._distinct = len(set(self.keys)) == len(self.keys)
        return self._distinct


def _statistic(code: int, cols: np.ndarray, slots: np.ndarray, ddof: np.ndarray) -> np.ndarray:
    """Plain statistic ``code`` of the metrics in ``slots`` (NaN without samples)."""
    if code == _CODE["sum"]:
        return cols[al.S, slots]
    if code == _CODE["last"]:
        return np.where(cols[al.T, slots] > -np.inf, cols[al.LAST, slots], np.nan)
    w = cols[al.W, slots]
    if code == _CODE["count"]:
        return w
    has = w > 0
    if code == _CODE["mean"]:
        return np.where(has, cols[al.S, slots] / np.where(has, w, 1.0), np.nan)
    if code == _CODE["min"]:
        return np.where(has, -cols[al.NEGMIN, slots], np.nan)
    if code == _CODE["max"]:
        return np.where(has, cols[al.MAX, slots], np.nan)
    # reliability weights: W - ddof * W2 / W, which is n - ddof for n unit weights
    correction = ddof[slots]
    dof = w - correction * np.where(correction > 0, cols[al.W2, slots], 0.0) / np.where(has, w, 1.0)
    m2 = cols[al.M2, slots]
    var = np.where(m2 < 0, 0.0, m2) / np.where(dof > 0, dof, 1.0)
    var = np.where(has & (dof > 0), var, np.nan)
    return var if code == _CODE["var"] else np.sqrt(var)


def _quantiles(
    plan: Plan, specs: Sequence[Spec], cols: np.ndarray, sketches: Mapping[int, np.ndarray]
) -> dict[int, float]:
    """Key position -> value of every quantile key (sketch slots with samples only)."""
    out: dict[int, float] = {}
    by_kind: dict[tuple[float, str], list[int]] = {}
    for slot in plan.quantiles:
        if cols[al.W, slot] > 0 and slot in sketches:
            spec = specs[slot]
            by_kind.setdefault((spec.accuracy, spec.quantile_method), []).append(slot)
    for (accuracy, method), slots in by_kind.items():
        qs = sorted({q for s in slots for _, q in plan.quantiles[s]})
        vmin, vmax = -cols[al.NEGMIN, slots], cols[al.MAX, slots]
        n = cols[al.N, slots] if method == "linear" else None  # the samples, for linear only
        layout = sketch_layout(accuracy)
        if np.isfinite(vmin).all() and np.isfinite(vmax).all() and (vmin <= vmax).all():
            held = [sketches[s] for s in slots]
            values = query_sketches(layout, held, qs, vmin, vmax, method, n)
        else:
            values = query(
                layout, np.stack([sketches[s] for s in slots]), qs, vmin, vmax, method, n
            )
        column = {q: j for j, q in enumerate(qs)}
        for row, slot in enumerate(slots):
            for position, q in plan.quantiles[slot]:
                out[position] = float(values[row, column[q]])
    return out


def local_values(
    plan: Plan, specs: Sequence[Spec], cols: np.ndarray, sketches: Mapping[int, np.ndarray]
) -> np.ndarray:
    """The value of every key of ``plan`` from the metrics' own samples (NaN where none)."""
    with np.errstate(all="ignore"):
        values = np.empty(len(plan.codes))  # keys of no plain statistic are set below
        for code, at, slots in plan.by_code:  # each statistic over the keys asking for it
            values[at] = _statistic(code, cols, slots, plan.ddof)
        if len(plan.dropped):
            values[plan.dropped] = cols[al.DROP, plan.slots[plan.dropped]]
        for at, col in plan.ranks:
            values[at] = cols[col, plan.slots[at]]
        if len(plan.quantile_at):
            values[plan.quantile_at] = np.nan
            for position, value in _quantiles(plan, specs, cols, sketches).items():
                values[position] = value
    return values


def compute(
    plan: Plan,
    specs: Sequence[Spec],
    cols: np.ndarray,
    sketches: Mapping[int, np.ndarray],
    aggs: Mapping[int, np.ndarray],
) -> dict[str, float]:
    """The ``compute()`` dict of a table's state: keys of metrics holding samples.

    ``aggs`` maps the slots of ``across`` metrics to their finished ranks; a
    metric's own samples count as the rank ahead of them.
    """
    values = local_values(plan, specs, cols, sketches)
    keep = cols[al.W, plan.slots] > 0
    dropped = plan.dropped
    if plan.ranks:  # ranks are known after a sync only
        unknown = np.isnan(values) & ~plan.stats_only
        unknown[dropped] = False
        keep &= ~unknown
    for slot in plan.across:
        spec = specs[slot]
        at = plan.starts[slot] + np.arange(len(spec.reduce))
        agg = aggs[slot]
        if cols[al.W, slot] > 0:
            agg = fold_rank(agg, values[at], spec.across == "first", before=True)
        combined = combine(spec.across, agg)
        keep[at] = combined is not None
        if combined is not None:
            values[at] = combined
    # a metric reports its dropped NaN count when it reports anything or dropped some
    if len(dropped):
        keep[dropped] = keep[plan.starts[plan.slots[dropped]]] | (values[dropped] > 0)
    if keep.all():
        # every key: a copy of the plan's first such dict, its values replaced (a copy
        # comes sized, where inserting the keys grows a dict step by step)
        if plan.template is None:
            out = dict(zip(plan.keys, values.tolist()))
            plan.template = out.copy()
            return out
        out = plan.template.copy()
        out.update(zip(plan.keys, values.tolist()))
        return out
    chosen = np.flatnonzero(keep)
    return dict(zip(map(plan.keys.__getitem__, chosen.tolist()), values[chosen].tolist()))
