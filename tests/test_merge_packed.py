"""A sync merges every rank's packed state column by column (``merge_packed``): the
oracle is the pairwise merge of the whole unpacked states, folded in rank order. A
table's merge skips the rules of the columns none of its metrics carries: the oracle
is the merge that runs every rule, in the columns some metric carries."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import metricsync as ms
from metricsync._state import _algebra as al
from metricsync._state._specinfo import spec_info
from metricsync._sync._layout import Layout

SPECS = [
    ms.Spec("mean"),
    ms.Spec("sum"),
    ms.Spec(("max", "min")),
    ms.Spec("last"),
    ms.Spec(("mean", "std")),
    ms.Spec(("var", "last"), nan="ignore"),
    ms.Spec(("max", "min"), argrank=True),
    ms.Spec(("mean", "std", "last", "max"), argrank=True),
    ms.Spec("mean", across="mean"),
]
# values that tie, sign their zeros, and are not finite
VALUES = [0.0, -0.0, 1.0, -1.0, 2.5, 1e300, -1e300, np.inf, -np.inf, np.nan, 3.0, 7.0]


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    same = (a == b) & (np.signbit(a) == np.signbit(b))
    return bool((same | (np.isnan(a) & np.isnan(b))).all())


@st.composite
def cases(draw: st.DrawFn) -> tuple[Layout, np.ndarray]:
    kinds = draw(st.lists(st.sampled_from(range(len(SPECS))), min_size=1, max_size=12))
    layout = Layout([(f"m{i:02d}", SPECS[kind]) for i, kind in enumerate(kinds)])
    world = draw(st.integers(1, 5))
    k = len(layout)
    states = np.repeat(al.identity(k)[None], world, axis=0)
    for rank in range(world):
        for col, positions in enumerate(layout.carried):
            for pos in positions.tolist():
                if col in (al.W, al.DROP, al.M2):  # sums of weights, counts, squares
                    value = draw(st.sampled_from([0.0, 1.0, 2.0, 3.0, 0.5, np.inf]))
                elif col in (al.MAXRANK, al.MINRANK):
                    value = draw(st.sampled_from([np.nan, 0.0, 1.0, 2.0, 3.0]))
                elif col == al.T:
                    value = draw(st.sampled_from([-np.inf, 1.0, 2.0, 3.0]))
                else:
                    value = draw(st.sampled_from(VALUES))
                states[rank, col, pos] = value
    return layout, states


@settings(max_examples=300, deadline=None)
@given(cases())
def test_packed_merge_equals_the_pairwise_merge_of_whole_states(
    case: tuple[Layout, np.ndarray],
) -> None:
    layout, states = case
    want = states[0]
    for other in states[1:]:
        want = al.merge(want, other, np)
    rows = states.reshape(len(states), -1)[:, layout.unpack_at]
    got = al.merge_packed(rows, layout.packed)
    assert got.shape == (layout.packed.size,)
    assert _bits_equal(got, want.reshape(-1)[layout.unpack_at])


def test_packed_merge_leaves_its_rows_alone() -> None:
    layout = Layout([("a", ms.Spec(("mean", "std", "last"))), ("b", ms.Spec("max"))])
    rows = np.arange(2 * layout.packed.size, dtype=np.float64).reshape(2, -1)
    before = rows.copy()
    merged = al.merge_packed(rows, layout.packed)
    assert np.array_equal(rows, before)
    w = layout.packed.span[al.W]
    assert merged[w].tolist() == (rows[0, w] + rows[1, w]).tolist()


def test_merging_a_range_of_slots_equals_merging_them_one_gather_at_a_time() -> None:
    # 600 slots in one range take the slice path of merge_state, the same slots shuffled
    # the gather path: both give every slot the pooled count, sum and max of its samples
    from metricsync._state._table import StateTable

    rng = np.random.default_rng(3)
    k = 600
    samples = rng.normal(size=(2, k, 3))
    spec = ms.Spec(("mean", "max"))

    def folded(order: np.ndarray) -> StateTable:
        table = StateTable()
        for i in range(k):
            table.slot(f"m{i:04d}", spec)
        for part in samples:  # two merges: the second one into a state that holds samples
            cols = al.identity(k)
            cols[al.W], cols[al.S], cols[al.MAX] = 3.0, part.sum(1), part.max(1)
            table.merge_state(order, cols[:, order])
        return table

    ranged, shuffled = folded(np.arange(k)), folded(rng.permutation(k))
    pooled = samples.transpose(1, 0, 2).reshape(k, -1)
    for table in (ranged, shuffled):
        got = table.compute()
        assert np.allclose([got[f"m{i:04d}/mean"] for i in range(k)], pooled.mean(1))
        assert [got[f"m{i:04d}/max"] for i in range(k)] == pooled.max(1).tolist()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(range(len(SPECS))),
            st.lists(st.sampled_from(VALUES), min_size=1, max_size=4),
            st.lists(st.sampled_from(VALUES), min_size=1, max_size=4),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_a_merge_skips_only_the_rules_of_columns_no_metric_carries(
    metrics: list[tuple[int, list[float], list[float]]],
) -> None:
    specs = {f"m{i}": SPECS[kind] for i, (kind, _, _) in enumerate(metrics)}
    a, b = ms.Metrics(specs), ms.Metrics(specs)
    for name, (_, xs, ys) in zip(specs, metrics):
        for side, values in ((a, xs), (b, ys)):
            for value in values:
                side.record(name, value)
    left, right = a._store.folded(), b._store.folded()
    assert left.names == right.names
    carried = spec_info(left.specs, left.token).need
    # a column no metric carries holds its identity on both sides and in their merge (the
    # rule a full merge runs may fill it: M2 from the weights and sums of means)
    others = sorted(set(range(al.NCOL_ALL)) - carried)
    got = al.merge(left.state, right.state, np, carried)
    for state in (left.state, right.state, got):
        assert _bits_equal(state[others], al.identity(len(left))[others])
    used = sorted(carried)
    assert _bits_equal(got[used], al.merge(left.state, right.state, np)[used])


def test_a_merge_of_means_runs_no_rule_beyond_the_sums() -> None:
    # the skip is real: a table of means carries neither extremes, nor last, nor M2
    m = ms.Metrics({"x": ms.Spec("mean")})
    m.record("x", 2.0)
    assert spec_info(m._store.folded().specs, m._store.folded().token).need == {al.W, al.S}
    merged = ms.merge([m, m, m]).compute()
    assert merged == {"x": 2.0}
