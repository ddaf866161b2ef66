"""What a fold asks of each slot's spec (``_specinfo.spec_info``), cached and extended as a
table grows, and what a fold leaves in the columns a slot's spec does not carry."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import metricsync as ms
from metricsync._state import _algebra as al
from metricsync._state._specinfo import SpecInfo, spec_info

POOL = [
    ms.Spec("mean"),
    ms.Spec(("mean", "last"), nan="ignore"),
    ms.Spec(("p50", "max")),
    ms.Spec("sum", across="mean"),
    ms.Spec(("std", "min")),
]


def _same(a: SpecInfo, b: SpecInfo) -> None:
    assert np.array_equal(a.carried, b.carried)
    assert np.array_equal(a.uncarried, b.uncarried)
    assert np.array_equal(a.ignore, b.ignore)
    assert np.array_equal(a.sketch, b.sketch)
    assert a.need == b.need
    assert a.keep == b.keep


@pytest.mark.parametrize("seed", range(5))
def test_info_of_a_grown_spec_list_equals_one_built_from_scratch(seed: int) -> None:
    rng = np.random.default_rng(seed)
    specs = [POOL[i] for i in rng.integers(0, len(POOL), size=50)]
    cut = int(rng.integers(0, 50))
    spec_info(specs[:cut], key=object())  # the latest info: a prefix of the next list
    grown = spec_info(specs, key=object())
    _same(grown, SpecInfo(specs))
    shuffled = [specs[i] for i in rng.permutation(len(specs))]  # not a prefix of it
    _same(spec_info(shuffled, key=object()), SpecInfo(shuffled))


def test_an_extended_info_covers_specs_the_prefix_never_had() -> None:
    spec_info([POOL[0]] * 3, key=object())
    grown = spec_info([POOL[0]] * 3 + [POOL[2], POOL[1]], key=object())
    assert grown.sketch.tolist() == [False, False, False, True, False]
    assert grown.ignore.tolist() == [False, False, False, False, True]


def test_a_table_of_the_same_specs_takes_the_latest_info_as_it_is() -> None:
    specs = [POOL[i % len(POOL)] for i in range(20)]
    first = spec_info(specs, key=object())
    assert spec_info(list(specs), key=object()) is first  # another table, the same specs
    other = [*specs[:-1], POOL[0] if specs[-1] is not POOL[0] else POOL[1]]
    changed = spec_info(other, key=object())
    assert changed is not first
    _same(changed, SpecInfo(other))


def test_an_info_cached_by_identity_keeps_its_own_specs_alive() -> None:
    """Without a key the cache is keyed by the specs' ids, so the info must hold those
    very objects: an equal list of other objects that took the latest info would leave
    its ids free for other specs, which would then find the wrong info under them."""
    first = [ms.Spec("max"), ms.Spec("min", nan="ignore")]  # not the canonical objects
    spec_info(first)
    again = [ms.Spec("max"), ms.Spec("min", nan="ignore")]
    info = spec_info(again)
    assert all(kept is spec for kept, spec in zip(info.keep, again, strict=True))
    _same(info, SpecInfo(again))


def test_a_table_of_the_same_names_and_specs_takes_the_latest_plan() -> None:
    """A ``Metrics`` made anew each step: its table, made by the same changes, has the
    same token and takes the plan the last one built; a table whose last spec differs gets
    its own, with its own keys."""
    from metricsync._state._table import StateTable

    names = [f"m{i}" for i in range(12)]
    specs = [POOL[i % len(POOL)] for i in range(12)]

    def table(specs: list[ms.Spec]) -> StateTable:
        t = StateTable()
        t.slots_of(names, specs)
        return t

    first = table(specs).plan()
    assert table(list(specs)).plan() is first
    other = [*specs[:-1], ms.Spec(("p50", "count"))]
    changed = table(other).plan()
    assert changed is not first
    assert changed.keys[-2:] == ["m11/p50", "m11/count"] and first.keys[-1] != "m11/count"


FOLDED = [
    ms.Spec("max"),
    ms.Spec("min"),
    ms.Spec("last"),
    ms.Spec("mean"),
    ms.Spec("std"),
    ms.Spec(("mean", "last"), nan="ignore"),
    ms.Spec(("p50", "max")),
    ms.Spec("sum"),
]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(range(len(FOLDED))),
            st.lists(st.sampled_from([0.0, -0.0, 1.5, -2.0, 7.0, np.nan]), min_size=1, max_size=4),
            st.sampled_from(["numbers", "large array", "both"]),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_a_fold_leaves_the_identity_in_each_column_a_metric_does_not_carry(
    metrics: list[tuple[int, list[float], str]],
) -> None:
    # a metric's state depends on its own records alone: what a fold computes for every
    # run of a batch (the columns some metric needs), or a record reduced on arrival
    # (a large array), is set back in the slots whose specs do not carry it
    specs = {f"m{i}": FOLDED[kind] for i, (kind, _, _) in enumerate(metrics)}
    m = ms.Metrics(specs)
    for name, (_, values, how) in zip(specs, metrics):
        if how != "large array":
            for value in values:
                m.record(name, value)
        if how != "numbers":
            m.record(name, np.array(values * 200))  # reduced on arrival
    _assert_identity_where_not_carried(m)


def test_a_fold_of_many_slots_leaves_the_identity_in_each_column_a_metric_does_not_carry() -> None:
    # 600 slots folded at once (a range of slots, read without a gather), and every other
    # one of a second table: one number each, every kind of spec in turn
    specs = {f"m{i:03d}": FOLDED[i % len(FOLDED)] for i in range(600)}
    whole, every_other = ms.Metrics(specs), ms.Metrics(specs)
    for i, name in enumerate(specs):
        whole.record(name, -0.0 if i % 3 else 2.5)
        every_other.record(name, 1.5)  # opens every slot
    _assert_identity_where_not_carried(whole)
    every_other.reset()
    for name in list(specs)[::2]:
        every_other.record(name, -2.0)
    _assert_identity_where_not_carried(every_other)
    # distinct slots from 0 to 599, out of order: numbers first, then two arrays
    every_other.reset()
    for i, name in enumerate(specs):
        if i not in (1, 599):
            every_other.record(name, -1.0)
    every_other.record("m001", np.full(100, 3.0))
    every_other.record("m599", np.full(100, -3.0))
    _assert_identity_where_not_carried(every_other)


def _assert_identity_where_not_carried(m: ms.Metrics) -> None:
    table = m._store.folded()
    carried = spec_info(table.specs, table.token).carried
    state = table.state
    for slot in range(len(table)):
        for col in range(al.NCOL):
            if not carried[col, slot]:
                want = al.IDENTITY[col]
                got = state[col, slot]
                assert got == want and np.signbit(got) == np.signbit(want), (
                    table.names[slot],
                    table.specs[slot],
                    al.COLUMNS[col],
                    got,
                )
