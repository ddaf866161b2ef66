"""The reduce path's pieces without a process group: keys, packed counts, the path rule."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from metricsync._state import _algebra as al
from metricsync._state._spec import Spec
from metricsync._sync._allreduce import ENV, choose, key, pack_counts, unkey, unpack_counts
from metricsync._sync._layout import Layout

SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 5e-324, -5e-324, 1.7976931348623157e308]
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(SPECIAL))


@given(st.lists(st.lists(floats, min_size=1, max_size=6), min_size=1, max_size=5))
def test_the_maximum_of_keys_is_the_merge_maximum(ranks: list[list[float]]) -> None:
    """Per column, the max of the keys over ranks is the merge algebra's MAX fold
    (NaN largest, 0.0 above -0.0), bit for bit (a NaN's payload aside)."""
    width = min(len(r) for r in ranks)
    rows = np.array([r[:width] for r in ranks])
    got = unkey(np.max(np.stack([key(row) for row in rows]), axis=0))
    states = []
    for row in rows:
        s = al.identity(width)
        s[al.MAX] = row
        states.append(s)
    want = states[0]
    for s in states[1:]:
        want = al.merge(want, s, np, frozenset({al.MAX}))
    want = want[al.MAX]
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert np.array_equal(got[ok].view(np.int64), want[ok].view(np.int64))


@pytest.mark.parametrize("world", [1, 2, 7, 64, 1023, 4096])
def test_packed_counts_sum_exactly_over_ranks(world: int) -> None:
    rng = np.random.default_rng(world)
    bits = rng.random((min(world, 50), 301)) < 0.5
    total = sum(pack_counts(b, world) for b in bits)
    extra = world - len(bits)  # ranks beyond the simulated ones: all holding every position
    if extra:
        total = total + extra * pack_counts(np.ones(301, dtype=bool), world)
    assert unpack_counts(total, world, 301).tolist() == (bits.sum(0) + extra).tolist()


def test_the_rule_and_the_forcing_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    big = Layout([(f"m{i}", Spec()) for i in range(2020)])
    small = Layout([(f"m{i}", Spec()) for i in range(20)])
    monkeypatch.delenv(ENV, raising=False)
    assert [choose(w, big, {}) for w in (2, 7, 8, 4096)] == [False, False, True, True]
    assert [choose(w, small, {}) for w in (8, 209, 210)] == [False, False, True]
    monkeypatch.setenv(ENV, "reduce")
    assert choose(2, small, {}) and not choose(1, small, {})  # a group of one: no collective
    monkeypatch.setenv(ENV, "gather")
    assert not choose(4096, big, {})
    monkeypatch.setenv(ENV, "fast")
    with pytest.raises(ValueError, match=ENV):
        choose(2, small, {})


def test_the_sum_round_carries_every_column_the_algebra_sums() -> None:
    # the sum round sends two ranges of columns, W..S and DROP..W2 (a column added to the
    # algebra with a SUM rule must join one of them)
    from metricsync._state import _algebra as al

    summed = {i for i, column in enumerate(al.COLUMNS) if column.op is al.Op.SUM}
    assert summed == {*range(al.W, al.S + 1), *range(al.DROP, al.W2 + 1)}
