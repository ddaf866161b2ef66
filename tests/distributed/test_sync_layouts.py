"""Several ``Metrics`` synced on one group, over gloo: they share its layout.

A group agrees one layout, the union of the names its syncs have seen, so a
small ``Metrics`` synced in turn with a large one packs room for the large
one's names. What that must not cost is a rule lookup per name of the other
``Metrics`` at every sync, and a result must hold only names some rank holds.
Every result is compared with ``ms.merge`` of the per-rank parts.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

import metricsync as ms  # noqa: E402
from metricsync._state._rules import SpecTable  # noqa: E402
from metricsync.testing import count_collectives, run_distributed  # noqa: E402

pytestmark = pytest.mark.distributed

BIG = 3_000  # names of the large Metrics


def _train(rank: int) -> ms.Metrics:
    m = ms.Metrics({"train/len": ms.Spec(("mean", "p50")), "train/t*": ms.Spec("max")})
    for i in range(BIG):
        m.record(f"train/m{i:05d}", float(i + rank))
    m.record("train/len", [16 + rank, 300])
    m.record("train/time", 0.5 * rank)
    return m


def _val(rank: int) -> ms.Metrics:
    m = ms.Metrics({"val/acc": ms.Spec("max")})
    m.record("val/loss", 0.5 + rank)
    m.record("val/acc", 0.25 * (rank + 1))
    return m


def _alternating(rank: int, world: int) -> list[tuple[str, int, int, bool, list[str]]]:
    """Train and validation synced in turn, each object kept: per sync, which one, its
    collectives, the rule lookups it made, whether it equals ``ms.merge`` of every
    rank's part, and the keys of its result."""
    lookups = [0]
    original = SpecTable.explicit

    def counted(self: SpecTable, name: str) -> ms.Spec | None:
        lookups[0] += 1
        return original(self, name)

    SpecTable.explicit = counted  # type: ignore[method-assign]
    try:
        made: dict[str, Callable[[int], ms.Metrics]] = {"train": _train, "val": _val}
        objects = {which: make(rank) for which, make in made.items()}
        out = []
        for which in ["train", "val"] * 4:
            lookups[0] = 0
            with count_collectives() as seen:
                got = objects[which].sync().compute()
            during = lookups[0]
            want = ms.merge([made[which](r) for r in range(world)]).compute()
            out.append((which, seen.total, during, got == want, sorted(got)))
        return out
    finally:
        SpecTable.explicit = original  # type: ignore[method-assign]


def test_a_small_metrics_synced_in_turn_with_a_large_one_resolves_no_name_again(
    sync_path: str,
) -> None:
    for syncs in run_distributed(_alternating, 2):
        assert all(equal for _, _, _, equal, _ in syncs)
        assert all(keys == ["val/acc", "val/loss"] for which, *_, keys in syncs if which == "val")
        # from the second round on both are steady: one gather each; the validation sync
        # looks up no rule for the 3,002 training names it lacks (before: each of them,
        # every time), the training sync one for each of the 2 validation names
        for which, calls, lookups, _, _ in syncs[2:]:
            assert calls == (2 if sync_path == "reduce" else 1), which  # reduce: MAX, SUM
            assert lookups == (2 if which == "train" else 0), which


def _result_after_another(rank: int, world: int) -> tuple[bool, list[str], int]:
    """A validation result merged with a ``Metrics`` that gives one of the training names
    another spec, after the training ``Metrics`` was synced on the same group."""
    train = ms.Metrics({"x/*": ms.Spec("max")})
    train.record("x/a", 1.0 + rank)
    train.record("x/b", 2.0)
    train.sync()
    val = ms.Metrics()
    for i in range(100):
        val.record(f"v/{i:03d}", float(i))
    if rank == world - 1:
        val.record("x/b", 3.0)  # one training name, held by the last rank only
    synced = val.sync()
    local = ms.Metrics()
    local.record("x/a", 5.0)  # a plain mean here, a max in the training rules
    merged = synced.copy().merge(local).compute()
    return merged["x/a"] == 5.0 and merged["x/b"] == 3.0, sorted(synced.compute()), len(merged)


@pytest.mark.usefixtures("sync_path")
def test_a_result_holds_only_names_some_rank_holds() -> None:
    world = 3
    for ok, keys, count in run_distributed(_result_after_another, world):
        assert ok  # before: SpecMismatchError, the result holding x/a under Spec('max')
        assert keys == sorted([f"v/{i:03d}" for i in range(100)] + ["x/b"])
        assert count == 102


def _declared_later(rank: int, world: int) -> str:
    """After the validation syncs answered its rules for every training name, rank 0
    records one of those names and rank 1 declares it another spec."""
    _train(rank).sync()
    val = _val(rank)
    for _ in range(2):
        val.sync()
    if rank == 0:
        val.record("train/m00001", 1.0)
    else:
        val.define("train/m00001", ms.Spec("max"))
    try:
        val.sync()
    except ms.SpecMismatchError as exc:
        return str(exc)
    return "no error"


@pytest.mark.usefixtures("sync_path")
def test_a_rule_defined_after_the_answers_were_kept_is_seen() -> None:
    messages = run_distributed(_declared_later, 2)
    assert all("'train/m00001'" in message for message in messages)
    assert "Spec('max')" in messages[1]  # the rank that declared it


def _nothing_after_another(rank: int, world: int) -> list[object]:
    """A ``Metrics`` no rank records into (validation on a step without it), synced after
    one holding a quantile and an ``across`` metric, then that one again."""
    specs = {"len": ms.Spec(("mean", "p50")), "pg": ms.Spec("sum", across="mean")}

    def part(r: int) -> ms.Metrics:
        m = ms.Metrics(specs)
        m.record("len", [16.0 + r, 300.0])
        m.record("pg", 1.0 + r)
        return m

    train = part(rank)
    train.sync()
    empty = ms.Metrics().sync()
    again = train.sync().compute()
    return [
        empty.compute(),
        empty.names,
        again == ms.merge([part(r) for r in range(world)]).compute(),
    ]


@pytest.mark.usefixtures("sync_path")
@pytest.mark.parametrize("world", [1, 2])
def test_a_metrics_no_rank_records_into_syncs_to_nothing(world: int) -> None:
    # before the fix: IndexError on every rank (a result of no slot kept sketches and
    # aggregates), and then SyncError at every later sync on the group
    for got in run_distributed(_nothing_after_another, world):
        assert got == [{}, [], True]


ODD = ("a\x00b", "x\ud800")  # a name holding NUL, one holding a lone surrogate


def _odd_names(rank: int, world: int) -> tuple[dict[str, float], dict[str, float]]:
    m = ms.Metrics()
    m.record("y", float(rank))
    if rank == 0:  # one rank alone holds them: its peers must not wait on it
        for i, name in enumerate(ODD):
            m.record(name, [1.0 + i, 3.0 + i])
    return m.sync(timeout=20).compute(), m.sync(timeout=20).compute()


@pytest.mark.usefixtures("sync_path")
def test_any_name_record_takes_syncs() -> None:
    """A name ``record`` and ``compute`` take (NUL, a lone surrogate) syncs, on a group
    and without one, rather than raising on the rank holding it while its peers wait."""
    want = {"a\x00b": 2.0, "x\ud800": 3.0, "y": 0.5}
    for first, second in run_distributed(_odd_names, 2):
        assert first == second == want
    m = ms.Metrics()
    for name in ODD:
        m.record(name, 2.0)
    assert m.sync().compute() == m.compute() == {name: 2.0 for name in ODD}
