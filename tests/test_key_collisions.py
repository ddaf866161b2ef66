"""A metric named like another's derived key (``x/max`` beside ``x`` reporting ``x/max``).

``compute()`` would report one key for two metrics, one value silently replacing
the other. The name that makes the collision is refused where it appears (the
record or ``define`` that comes second, a merge, a sync, a decoded blob), with an
error naming both metrics and the key; nothing recorded is lost.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import metricsync as ms
from metricsync._state import _codec as codec

torch = pytest.importorskip("torch")

# (first metric and its spec, second name and its spec): each pair would share a key
PAIRS = [
    ("x", ms.Spec(("mean", "max")), "x/max", ms.Spec()),
    ("x", ms.Spec(("mean", "p50")), "x/p50", ms.Spec("max")),
    ("x", ms.Spec("mean", nan="ignore"), "x/nan_dropped", ms.Spec("sum")),
    ("x", ms.Spec("max", argrank=True), "x/max_rank", ms.Spec()),
    ("x", ms.Spec("max", argrank=True), "x/min_rank", ms.Spec()),
    ("a/b", ms.Spec(("sum", "count")), "a/b/count", ms.Spec("last")),
]
RECORDS: list[Callable[[ms.Metrics, str], None]] = [
    lambda m, name: m.record(name, 2.0),
    lambda m, name: m.record(name, 2),
    lambda m, name: m.record(name, [2.0, 3.0]),
    lambda m, name: m.record(name, np.array([2.0, 3.0])),
    lambda m, name: m.record(name, np.arange(500.0)),
    lambda m, name: m.record(name, torch.tensor(2.0)),
    lambda m, name: m.record(name, torch.ones(3), mask=torch.tensor([True, False, True])),
    lambda m, name: m.record(name, 2.0, weight=3.0),
    lambda m, name: m.update({name: 2.0}),
    lambda m, name: m.update({name: np.ones(2)}),
]


def _values(m: ms.Metrics) -> dict[str, float]:
    return {k: v for k, v in m.compute().items() if not math.isnan(v)}


@pytest.mark.parametrize("first, first_spec, second, second_spec", PAIRS)
@pytest.mark.parametrize("how", range(len(RECORDS)))
@pytest.mark.parametrize("order", ["derived first", "plain first"])
def test_the_second_record_making_a_collision_raises_naming_both(
    first: str, first_spec: ms.Spec, second: str, second_spec: ms.Spec, how: int, order: str
) -> None:
    m = ms.Metrics({first: first_spec, second: second_spec})
    a, b = (first, second) if order == "derived first" else (second, first)
    m.record(a, 1.0)
    before = m.compute()
    with pytest.raises(ms.SpecMismatchError) as info:
        RECORDS[how](m, b)
    assert f"'{first}'" in str(info.value) and f"'{second}'" in str(info.value)
    assert m.compute() == before and m.names == [a]  # nothing recorded, nothing lost
    m.record(a, 5.0)  # the first metric goes on


def test_one_update_opening_both_names_raises_and_records_nothing() -> None:
    m = ms.Metrics({"x": ms.Spec(("mean", "max"))})
    m.record("y", 1.0)
    with pytest.raises(ms.SpecMismatchError, match="'x/max'"):
        m.update({"x": 1.0, "y": 2.0, "x/max": 3.0})
    assert m.compute() == {"y": 1.0}


def test_the_issue_case_no_longer_replaces_max() -> None:
    """The oracle: x's max is the max of x's samples (it was x/max's value before)."""
    m = ms.Metrics({"x": ms.Spec(("mean", "max"))})
    m.record("x", [1.0, 9.0])
    with pytest.raises(ms.SpecMismatchError):
        m.record("x/max", 100.0)
    assert m.compute() == {"x/mean": 5.0, "x/max": float(np.max([1.0, 9.0]))}


def test_a_define_that_makes_a_collision_raises() -> None:
    m = ms.Metrics()
    m.record("x", 1.0)
    m.record("x/max", 2.0)
    m.reset()  # x holds no samples: its spec may change, but not into a collision
    for name in ("x", "[x]"):  # "x*" would respec x/max too: no collision
        with pytest.raises(ms.SpecMismatchError, match="'x/max'"):
            m.define(name, ms.Spec(("mean", "max")))
    assert m.spec("x") == ms.Spec()
    m.define("y", ms.Spec(("mean", "max")))  # no metric y: nothing collides yet
    m.record("y", 1.0)
    with pytest.raises(ms.SpecMismatchError, match="'y/mean'"):
        m.record("y/mean", 1.0)


@pytest.mark.parametrize("first, first_spec, second, second_spec", PAIRS)
def test_a_merge_whose_union_collides_raises_and_merges_nothing(
    first: str, first_spec: ms.Spec, second: str, second_spec: ms.Spec
) -> None:
    a = ms.Metrics({first: first_spec, second: second_spec})
    b = ms.Metrics({first: first_spec, second: second_spec})
    a.record(first, 1.0)
    b.record(second, 2.0)
    for left, right in ((a, b), (b, a)):
        before = left.to_bytes()
        with pytest.raises(ms.SpecMismatchError, match=f"'{second}'"):
            left.merge(right)
        assert left.to_bytes() == before
    with pytest.raises(ms.SpecMismatchError):
        ms.merge([a, b])


def test_a_blob_holding_both_names_is_a_codec_error() -> None:
    """No record, merge or sync makes such a table; a blob that holds one is malformed."""
    m = ms.Metrics({"x": ms.Spec(("mean", "max")), "y": ms.Spec()})
    m.record("x", 1.0)
    m.record("y", 2.0)
    head, body = codec.unframe(m.to_bytes())
    header = json.loads(head)
    header["slots"][1][0] = "x/max"  # y renamed to x's derived key
    blob = codec.frame(json.dumps(header).encode(), body)
    with pytest.raises(ms.CodecError, match="'x/max'"):
        ms.Metrics.from_bytes(blob)
    with pytest.raises(ms.CodecError, match="'x/max'"):
        ms.Metrics().load_state_dict({"metricsync": 1, "data": blob})


def _sync_collision(rank: int, world: int, async_op: bool) -> Any:
    m = ms.Metrics({"x": ms.Spec(("mean", "max"))})
    m.record("x" if rank == 0 else "x/max", float(rank))
    m.record("shared", 1.0)
    try:
        result = m.sync(timeout=30, async_op=async_op)
        if async_op:
            result = result.wait()
    except ms.SpecMismatchError as exc:
        try:
            m.sync(timeout=30)  # the group is still in step: the same error again
        except ms.SpecMismatchError as again:
            return str(exc), str(again)
        return str(exc), "synced again"
    return "no error", str(result.compute())


@pytest.mark.distributed
@pytest.mark.parametrize("async_op", [False, True])
def test_a_sync_whose_union_collides_raises_on_every_rank(async_op: bool) -> None:
    from metricsync.testing import run_distributed

    for message, again in run_distributed(_sync_collision, 2, args=(async_op,)):
        assert "'x'" in message and "'x/max'" in message, message
        assert again == message
