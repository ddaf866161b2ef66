"""An extended layout inserts new names into the agreed one: the oracle is the layout
built from scratch on the union of the entries."""

from __future__ import annotations

from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import metricsync as ms
from metricsync._state._table import StateTable
from metricsync._sync import _placement
from metricsync._sync._layout import (
    GroupState,
    Layout,
    Placement,
    decode_entries,
    encode_entries,
)
from metricsync._sync._placement import place

SPECS = [
    ms.Spec("mean"),
    ms.Spec(("max", "min")),
    ms.Spec(("mean", "p50", "p99")),
    ms.Spec(("mean", "std"), nan="ignore"),
    ms.Spec("max", argrank=True),
    ms.Spec(("mean", "last"), across="first"),
    ms.Spec("sum", across="mean"),
]
NAMES = st.text(alphabet="abcXY/_é0", min_size=1, max_size=6)


def _same(a: Layout, b: Layout) -> None:
    assert a.entries == b.entries and a.names == b.names and a.specs == b.specs
    assert a.index == b.index
    for x, y in [
        (a.exact, b.exact),
        (a.across, b.across),
        (a.first, b.first),
        (a.sketch_at, b.sketch_at),
        (a.unpack_at, b.unpack_at),
        (a.blank, b.blank),
        (a.packed.offsets, b.packed.offsets),
        *zip(a.carried, b.carried),
    ]:
        assert np.array_equal(x, y, equal_nan=True)
    assert a.agg_rows == b.agg_rows and a.sketch == b.sketch and a.sketched == b.sketched
    assert a.sketch_entries == b.sketch_entries and a.data_size == b.data_size
    assert [a.kinds[1][i] for i in a.kinds[0]] == a.specs
    pa, pb = a.plan, b.plan
    assert pa.keys == pb.keys and pa.across == pb.across and pa.quantiles == pb.quantiles
    for x, y in [(pa.codes, pb.codes), (pa.slots, pb.slots), (pa.ddof, pb.ddof)]:
        assert np.array_equal(x, y, equal_nan=True)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(NAMES, st.sampled_from(SPECS), max_size=12),
    st.lists(st.dictionaries(NAMES, st.sampled_from(SPECS), max_size=5), max_size=3),
)
def test_extending_equals_building_the_union(
    start: dict[str, ms.Spec], steps: list[dict[str, ms.Spec]]
) -> None:
    layout = Layout(start.items())
    union = dict(start)
    for step in steps:
        before = layout.fingerprint
        changed = any(union.get(name) != spec for name, spec in step.items())
        layout = layout.extended(step.items())
        union.update(step)
        _same(layout, Layout(union.items()))
        assert (layout.fingerprint != before) == changed


def test_every_rank_extending_alike_agrees_on_the_fingerprint() -> None:
    base = [(f"m{i}", SPECS[i % len(SPECS)]) for i in range(50)]
    one = Layout(base).extended([("zz", SPECS[0]), ("aa", SPECS[2])])
    two = Layout(reversed(base)).extended([("aa", SPECS[2]), ("zz", SPECS[0])])
    assert one.fingerprint == two.fingerprint
    other = Layout(base).extended([("zz", SPECS[1]), ("aa", SPECS[2])])
    assert other.fingerprint != one.fingerprint


def _table(entries: dict[str, ms.Spec]) -> StateTable:
    table = StateTable()
    table.slots_of(list(entries), list(entries.values()))
    return table


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(NAMES, st.sampled_from(SPECS), max_size=10),
    st.dictionaries(NAMES, st.sampled_from(SPECS), max_size=10),
    st.dictionaries(NAMES, st.sampled_from(SPECS), max_size=6),
)
def test_a_table_placed_in_a_grown_layout_is_placed_as_from_scratch(
    start: dict[str, ms.Spec], held: dict[str, ms.Spec], added: dict[str, ms.Spec]
) -> None:
    """The oracle: placing the table in the extended layout afresh, every name looked up."""
    table, old = _table(held), Layout(start.items())
    new = old.extended(added.items())
    before = place(GroupState(), table, old)
    # new names only grow a layout; a replaced spec rebuilds it (placed afresh)
    grew = new.grown is not None and new.grown[0] == old.fingerprint
    replaced = any(start.get(name, spec) != spec for name, spec in added.items())
    assert grew == (new is not old and not replaced)
    short = grew and _placement.shortcut(len(new) - len(old), len(new))
    lookup = mock.patch.object(_placement, "_fresh", side_effect=AssertionError("looked up all"))
    with lookup if short else mock.patch.object(_placement, "_grown", side_effect=AssertionError):
        grown = place(GroupState(), table, new, before)
    _same_placement(grown, place(GroupState(), table, new))
    assert grown.fingerprint == new.fingerprint


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(NAMES, st.sampled_from(SPECS), max_size=10),
    st.dictionaries(NAMES, st.sampled_from(SPECS), min_size=1, max_size=8),
    st.dictionaries(NAMES, st.sampled_from(SPECS), min_size=1, max_size=6),
)
def test_a_table_placed_again_after_new_slots_is_placed_as_from_scratch(
    entries: dict[str, ms.Spec], held: dict[str, ms.Spec], more: dict[str, ms.Spec]
) -> None:
    """A table that gained slots since its last placement in a layout starts from that
    placement; the oracle places it afresh. A respec is not an append: placed afresh."""
    layout, table, state = Layout(entries.items()), _table(held), GroupState()
    place(state, table, layout)
    first = sorted(held)[0]
    respec = first in more and more[first] != held[first]
    for name, spec in more.items():
        if name not in held:
            table.slot(name, spec)
    if respec:
        table.respec(table.index[first], more[first])
    appended = len(table) > len(held) and not respec
    appended &= _placement.shortcut(len(table) - len(held), len(layout))
    fresh = mock.patch.object(_placement, "_fresh", side_effect=AssertionError("looked up all"))
    with (
        fresh
        if appended
        else mock.patch.object(_placement, "_appended", side_effect=AssertionError)
    ):
        again = place(state, table, layout)
    _same_placement(again, place(GroupState(), table, layout))


def _same_placement(a: Placement, b: Placement) -> None:
    for x, y in [(a.where, b.where), (a.mine, b.mine), (a.held, b.held)]:
        assert x.dtype == y.dtype and np.array_equal(x, y)
    assert a.covered == b.covered and a.names == b.names and a.specs == b.specs
    assert len(a.index) == len(b.index)
    for x, y in zip(a.index, b.index):  # the identities of absent slots hold NaN
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f")


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(NAMES, st.sampled_from(SPECS), max_size=10),
    st.dictionaries(NAMES, st.sampled_from(SPECS), min_size=1, max_size=8),
    st.sampled_from(SPECS),
)
def test_a_table_of_the_same_slots_takes_the_cached_placement(
    entries: dict[str, ms.Spec], held: dict[str, ms.Spec], other: ms.Spec
) -> None:
    """A ``Metrics`` made anew with the same names and specs: another table, the same
    placement, nothing looked up. The oracle places it afresh; a table whose last
    slot has another spec is not the same, and gets its own placement."""
    layout, state = Layout(entries.items()), GroupState()
    first = place(state, _table(held), layout)
    nothing = mock.patch.object(_placement, "_fresh", side_effect=AssertionError("looked up"))
    with nothing, mock.patch.object(_placement, "_appended", side_effect=AssertionError):
        again = place(state, _table(held), layout)
    assert again is first
    _same_placement(again, place(GroupState(), _table(held), layout))
    last = list(held)[-1]
    changed = _table({**held, last: other})
    _same_placement(place(state, changed, layout), place(GroupState(), changed, layout))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.text(min_size=1, max_size=5), st.sampled_from(SPECS)),
        max_size=6,
        unique_by=lambda entry: entry[0],
    )
)
def test_any_name_a_metric_takes_survives_the_layout_encoding(
    entries: list[tuple[str, ms.Spec]],
) -> None:
    """Any non-empty str names a metric (NUL and lone surrogates too): the encoding every
    sync sends its new names in gives them back, else a sync of such a name fails."""
    assert decode_entries(encode_entries(entries)) == entries
