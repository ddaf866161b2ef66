"""The state table: names, specs and mergeable state of a set of metrics.

A :class:`StateTable` holds per slot a name, a spec, a state column, a sketch for quantile
metrics and ``across`` aggregates; tables merge with the merge algebra.

>>> from metricsync._state._spec import Spec
>>> a, b = StateTable(), StateTable()
>>> import numpy as np
>>> cols = identity(1); cols[[W, S], 0] = [2.0, 6.0]
>>> a.merge_state([a.slot("x", Spec())], cols)
>>> b.merge_state([b.slot("x", Spec())], cols)
>>> at = a.absorb(b); a.compute()
{'x': 3.0}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ._across import AGG_IDENTITY, empty_aggregate, fold_rank, merge_aggregates
from ._algebra import DROP, IDENTITY, MAX, NEGMIN, S, W, identity, merge
from ._errors import SpecMismatchError
from ._sketch import sketch_layout
from ._spec import Spec, canonical
from ._specinfo import spec_info
from ._stats import Plan, compute, local_values
from ._tokens import EMPTY_TABLE, kept, slot_token

__all__ = ["Parts", "StateTable", "identity"]


@dataclass
class Parts:
    """What a :class:`StateTable` is made of, for building one from existing state."""

    names: list[str]
    specs: list[Spec]
    cols: np.ndarray
    sketches: Mapping[int, np.ndarray] | None = None
    aggs: Mapping[int, np.ndarray] | None = None
    index: dict[str, int] | None = None
    plan: Plan | None = None  # the Plan of exactly these names and specs
    blank: bool = False  # every column holds the identity state
    token: object | None = None  # the token of the table these names come from
    complete: bool = False  # sketches and aggs hold every slot whose spec needs one


class StateTable:
    """Mergeable state of named metrics; see the module docstring."""

    def __init__(self, parts: Parts | None = None) -> None:
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.specs: list[Spec] = []
        self.cols = identity(8) if parts is None else parts.cols
        self.sketches: dict[int, np.ndarray] = {}
        self.aggs: dict[int, np.ndarray] = {}
        self._plan: Plan | None = None
        self._shared = False  # names/index/specs are shared with a copy or a sync layout
        # stands for these names and specs (see metricsync._state._tokens); replaced when they change
        self.token = EMPTY_TABLE if parts is None else object()
        self._blank = True  # every slot holds the identity state
        if parts is not None:
            self._adopt(parts)

    def _adopt(self, parts: Parts) -> None:
        names, specs = parts.names, parts.specs
        self.names, self.specs, self._plan = names, specs, parts.plan
        self.index = parts.index if parts.index is not None else {n: i for i, n in enumerate(names)}
        self.cols = parts.cols if parts.cols.shape[1] else identity(8)
        self.sketches = dict(parts.sketches or {})
        self.aggs = dict(parts.aggs or {})
        self._shared, self._blank = True, parts.blank
        if parts.token is not None:
            self.token = parts.token
        if parts.complete:  # a copy: nothing to add, and no loop over every slot
            return
        for slot, spec in enumerate(specs):
            if spec.needs_sketch and slot not in self.sketches:
                self.sketches[slot] = np.zeros(sketch_layout(spec.accuracy).n_cells)
            if spec.across != "exact" and slot not in self.aggs:
                self.aggs[slot] = empty_aggregate(len(spec.reduce))

    @classmethod
    def from_parts(
        cls,
        names: list[str],
        specs: list[Spec],
        cols: np.ndarray,
        sketches: Mapping[int, np.ndarray] | None = None,
        aggs: Mapping[int, np.ndarray] | None = None,
        index: dict[str, int] | None = None,
        plan: Plan | None = None,
        complete: bool = False,
        token: object | None = None,
    ) -> StateTable:
        """A table over given parts; the name lists are shared (copied before any change).

        ``plan``, if given, is the :class:`Plan` of exactly these names and specs;
        ``complete`` says ``sketches`` and ``aggs`` hold every slot whose spec needs one.
        """
        return cls(
            Parts(names, specs, cols, sketches, aggs, index, plan, token=token, complete=complete)
        )

    def __len__(self) -> int:
        return len(self.names)

    @property
    def state(self) -> np.ndarray:
        """``(NCOL_ALL, len(self))``: the state columns of every slot (a view)."""
        return self.cols[:, : len(self.names)]

    # ------------------------------------------------------------------ slots

    def slot(self, name: str, spec: Spec) -> int:
        """The slot of ``name``, created with ``spec`` if it has none."""
        slot = self.index.get(name)
        if slot is not None:
            return slot
        if self._shared:
            self._unshare()
        slot = len(self.names)
        if slot == self.cols.shape[1]:
            self.cols = np.concatenate([self.cols, identity(slot)], axis=1)
        spec = canonical(spec)
        self.names.append(name)
        self.specs.append(spec)
        self._configure(slot, spec)
        self.index[name] = slot  # published last: a reader that finds it finds its spec
        return slot

    def respec(self, slot: int, spec: Spec) -> None:
        """Give ``slot`` another spec; its state starts over."""
        self._unshare()
        spec = self.specs[slot] = canonical(spec)
        self.cols[:, slot] = IDENTITY
        self.sketches.pop(slot, None)
        self.aggs.pop(slot, None)
        self._configure(slot, spec)

    def _configure(self, slot: int, spec: Spec) -> None:
        """A new slot's, or a respecified one's, token, plan and parts (it has none)."""
        self._plan = None
        self.token = slot_token(self.token, slot, self.names[slot], spec)
        if spec.needs_sketch:
            self.sketches[slot] = np.zeros(sketch_layout(spec.accuracy).n_cells)
        if spec.across != "exact":
            self.aggs[slot] = empty_aggregate(len(spec.reduce))

    def _unshare(self) -> None:
        if self._shared:
            self.names, self.index, self.specs = (
                list(self.names),
                dict(self.index),
                list(self.specs),
            )
            self._shared = False

    def slots_of(self, names: Sequence[str], specs: Sequence[Spec]) -> list[int]:
        """Slots for ``names`` (created as needed), ``SpecMismatchError`` on a different spec."""
        out = []
        for name, spec in zip(names, specs):
            slot = self.index.get(name)
            if slot is None:
                slot = self.slot(name, spec)
            elif self.specs[slot] != spec:
                raise SpecMismatchError(
                    f"metric {name!r} is {self.specs[slot]!r} on one side and {spec!r} on the other"
                )
            out.append(slot)
        return out

    # ------------------------------------------------------------------ state

    def merge_state(self, slots: Sequence[int] | np.ndarray, cols: np.ndarray) -> None:
        """Merge state columns ``(NCOL_ALL, len(slots))`` into ``slots`` (distinct)."""
        at = np.asarray(slots, dtype=np.intp)
        if not (n := len(at)):  # nothing merged: a blank table stays blank (merging copies)
            return
        idx: np.ndarray | slice = at
        if n >= 512 and at[-1] - at[0] == n - 1 and (np.diff(at) == 1).all():
            idx = slice(int(at[0]), int(at[-1]) + 1)  # many slots of one range: no gather
        if self._blank:  # nothing merged since the start or a reset: the merge is ``cols``
            self.cols[:, idx] = cols
        else:
            carried = spec_info(self.specs, self.token).need  # a dict hit: folds ask it too
            self.cols[:, idx] = merge(self.cols[:, idx], cols, np, carried)
        self._blank = False

    def add_cells(self, slot: int, cells: np.ndarray, counts: np.ndarray) -> None:
        """Add ``counts`` to the distinct sketch ``cells`` of ``slot``."""
        with np.errstate(over="ignore"):  # weight sums beyond float64 are inf
            self.sketches[slot][cells] += counts

    def holds(self) -> np.ndarray:
        """Per slot: whether it holds samples (its own, or finished ranks of an aggregate)."""
        held = self.state[W] > 0
        for slot, agg in self.aggs.items():
            held[slot] |= bool(agg[:, 1].any())
        return held

    def holds_data(self, slot: int) -> bool:
        """Whether ``slot`` holds anything a respec would lose (samples, drops, a time)."""
        col = self.cols[:, slot]
        if col[W] > 0 or col[DROP] > 0 or col[4] > -np.inf:
            return True
        agg = self.aggs.get(slot)
        return agg is not None and bool(agg[:, 1].any())

    def absorb(self, other: StateTable, known: np.ndarray | None = None) -> np.ndarray:
        """Merge ``other`` in as one rank (specs already agreed): exact metrics pool samples,
        ``across`` metrics add ``other``'s own result as a rank after its finished ranks.
        Returns the slots of ``other``'s names here; ``known``: those an earlier merge of
        tables of the same two tokens returned (a single controller merges the same
        shapes every step), so that no name is looked up."""
        if not self.names and other.names:
            self._take_names_of(other)
        at = self._slots_for(other, known)
        mine = at.tolist()
        across, exact = other.plan().across, None
        if across:
            exact = np.ones(len(mine), dtype=bool)
            exact[across] = False
        if exact is None:
            self.merge_state(at, other.state)
        else:  # the exact metrics (none, if every metric is across: merge_state returns)
            self.merge_state(at[exact], other.state[:, exact])
        with np.errstate(over="ignore"):  # weight sums beyond float64 are inf
            for t, cells in other.sketches.items():
                if exact is None or exact[t]:
                    self.sketches[mine[t]] += cells
        if exact is None:
            return at
        own = other.own_values()
        for t in across:
            spec, m = other.specs[t], mine[t]
            first = spec.across == "first"
            agg = other.aggs[t]
            if other.cols[W, t] > 0:
                agg = fold_rank(agg, own[t], first, before=True)
            self.aggs[m] = merge_aggregates(self.aggs[m], agg, first)
            self.cols[DROP, m] += other.cols[DROP, t]
            self._blank = False
        return at

    def _take_names_of(self, other: StateTable) -> None:
        """Give this empty table ``other``'s names, specs and index, blank, as a copy
        would: shared until either side changes them (``other`` is marked so too)."""
        other._shared = True
        self.names, self.specs, self.index = other.names, other.specs, other.index
        self._shared, self.token, self._plan = True, other.token, other._current_plan()
        self.cols = identity(max(len(other.names), 8))  # room to grow, as a new table has
        self.sketches = {t: np.zeros_like(cells) for t, cells in other.sketches.items()}
        self.aggs = {t: empty_aggregate(len(agg)) for t, agg in other.aggs.items()}
        self._blank = True

    def _slots_for(self, other: StateTable, known: np.ndarray | None) -> np.ndarray:
        """:meth:`slots_of` ``other``'s names, or ``known`` (see :meth:`absorb`)."""
        if self.token is other.token:  # the same names and specs (a table that took them)
            return np.arange(len(other.names))
        if known is None:
            return np.array(self.slots_of(other.names, other.specs), dtype=np.intp)
        for t in np.flatnonzero(known >= len(self.names)).tolist():  # create what that
            self.slot(other.names[t], other.specs[t])  # merge created
        return known

    def own_values(self) -> dict[int, np.ndarray]:
        """Each ``across`` slot's statistics from its own samples (its rank's result)."""
        plan = self.plan()
        values = local_values(plan, self.specs, self.state, self.sketches)
        return {
            slot: values[plan.starts[slot] + np.arange(len(self.specs[slot].reduce))]
            for slot in plan.across
        }

    # -------------------------------------------------------------- lifecycle

    def copy(self) -> StateTable:
        """An independent copy."""
        self._shared = True  # the name lists are shared, copied on the first change on either side
        return StateTable(
            Parts(
                self.names,
                self.specs,
                self.state.copy(),
                {k: v.copy() for k, v in self.sketches.items()},
                {k: v.copy() for k, v in self.aggs.items()},
                self.index,
                self._current_plan(),  # built once for these names, not once per copy
                self._blank,
                self.token,
                complete=True,
            )
        )

    def subset(
        self,
        slots: np.ndarray,
        names: list[str],
        specs: list[Spec],
        index: dict[str, int],
        plan: Plan,
    ) -> StateTable:
        """A table of the slots ``slots`` (ascending) alone, named ``names`` with ``specs``,
        ``index`` and ``plan`` (theirs, shared); it shares their sketches and aggregates
        with this one.

        >>> from metricsync._state._spec import Spec
        >>> t = StateTable(); t.slot("a", Spec()); t.slot("b", Spec("max"))
        0
        1
        >>> t.subset(np.array([1]), ["b"], [Spec("max")], {"b": 0}, Plan(["b"], [Spec("max")])).names
        ['b']
        """

        def moved(parts: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
            if not len(slots):  # no slot kept (no rank held a name)
                return {}
            old = np.array(sorted(parts), dtype=np.intp)
            at = np.searchsorted(slots, old)
            inside = (at < len(slots)) & (slots[np.minimum(at, len(slots) - 1)] == old)
            return {int(a): parts[int(o)] for o, a in zip(old[inside], at[inside])}

        return StateTable.from_parts(
            names,
            specs,
            self.state[:, slots],
            moved(self.sketches) if self.sketches else None,
            moved(self.aggs) if self.aggs else None,
            index=index,
            plan=plan,
            complete=True,
        )

    def reset(self) -> None:
        """Forget every sample; keep names and specs."""
        self.cols[:] = IDENTITY[:, None]
        self._blank = True
        for cells in self.sketches.values():
            cells[:] = 0.0
        for agg in self.aggs.values():
            agg[:] = AGG_IDENTITY

    def plan(self) -> Plan:
        """The output keys of this table's metrics (cached until a slot changes, and shared
        by the tables of the same token: copies, and tables of the same names and specs,
        build it once between them)."""
        plan = self._current_plan()
        if plan is None:
            shared = kept(self.token)
            plan = shared.plan
            if plan is None or plan.n != len(self.names):
                plan = Plan(self.names, self.specs)
                shared.plan = plan  # copies are read on several threads (async syncs)
            self._plan = plan
        return plan

    def _current_plan(self) -> Plan | None:
        """The cached plan, if it still describes these names and specs."""
        plan = self._plan
        return plan if plan is not None and plan.n == len(self.names) else None

    def key_formats(self) -> dict[str, str | None]:
        """The format spec of every key ``compute()`` may report (None: adaptive)."""
        formats: dict[str, str | None] = {}
        for name, spec in zip(self.names, self.specs):
            formats.update(dict.fromkeys(spec.output_keys(name), spec.fmt))
            formats.update(dict.fromkeys(spec.extra_keys(name), ",.0f"))
        return formats

    def compute(self) -> dict[str, float]:
        """Every output key of the metrics holding samples, as Python floats."""
        return compute(self.plan(), self.specs, self.state, self.sketches, self.aggs)

    def extremes(self, slot: int) -> tuple[float, float]:
        """The smallest and largest sample of ``slot`` (``inf``/``-inf`` without samples)."""
        return float(-self.cols[NEGMIN, slot]), float(self.cols[MAX, slot])

    def sum_of(self, slot: int) -> float:
        """The weighted sum of ``slot``'s samples."""
        return float(self.cols[S, slot])
