"""Several ``Metrics`` synced on one group in a different order on different ranks, over gloo.

Each sync's header carries a tag naming the ``Metrics`` it merges: where that
object last synced on the group (blocking syncs here, async ones on their
bookkeeping group). A rank that syncs another ``Metrics`` than its peers at a
sync number, one last synced at another sync number, makes every rank raise
``SyncError`` instead of merging different objects. Two objects swapped from
their first sync on, with the same rules and no spec conflict, cannot be told
apart (the README says so); these tests pin what can. The oracle is the
per-rank values each object records, known on every rank.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

import metricsync as ms  # noqa: E402
from metricsync.testing import run_distributed  # noqa: E402

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("sync_path")]  # both paths


def _pair(rank: int) -> tuple[ms.Metrics, ms.Metrics]:
    a, b = ms.Metrics(), ms.Metrics({"q": ms.Spec("sum")})
    a.record("p", 1.0)
    b.record("q", 1000.0 * (rank + 1))
    return a, b


def _want(world: int) -> tuple[dict[str, float], dict[str, float]]:
    return {"p": 1.0}, {"q": 1000.0 * sum(range(1, world + 1))}


def _outcome(sync: Any) -> Any:
    try:
        result = sync()
        if isinstance(result, ms.SyncHandle):
            result = result.wait()
        return result.compute()
    except ms.SyncError as exc:
        return f"SyncError: {exc}"


def _blocking(m: ms.Metrics, group: Any) -> Any:
    return _outcome(lambda: m.sync(group, timeout=30))


def _steady_swap(rank: int, world: int) -> list[Any]:
    """Synced in one order once, then in opposite orders on rank 0 and the others."""
    group = dist.new_group(backend="gloo")
    a, b = _pair(rank)
    out = [_blocking(a, group), _blocking(b, group)]  # the same order everywhere
    first, second = (a, b) if rank == 0 else (b, a)
    out += [_blocking(first, group), _blocking(second, group)]
    c = ms.Metrics()
    c.record("c", float(rank))
    out.append(_blocking(c, group))  # the group is still usable
    out += [_blocking(a, group), _blocking(b, group)]  # and the right order works again
    return out


def test_a_steady_blocking_swap_raises_sync_error_on_every_rank() -> None:
    for world in (2, 3):
        a, b = _want(world)
        for r in run_distributed(_steady_swap, world, timeout=120):
            assert r[:2] == [a, b], r
            for res in r[2:4]:  # before: no error, and a result mixing a and b
                assert isinstance(res, str) and "different order" in res, r
                assert "a Metrics last synced at #0" in res and "#1" in res, res
            assert r[4] == {"c": (world - 1) / 2}
            assert r[5:] == [a, b], r


def _changed_swap(rank: int, world: int, async_op: bool) -> list[Any]:
    """Swapped from their first syncs on (undetectable), then the order changes."""
    group = dist.new_group(backend="gloo")
    if async_op:
        ms.bookkeeping_group(group, timeout=30)
    a, b = _pair(rank)
    order = [a, b, a, b] if rank == 0 else [b, a, a, b]

    def sync(m: ms.Metrics) -> Any:
        return _outcome(lambda: m.sync(group, timeout=30, async_op=async_op))

    return [sync(m) for m in order]


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_a_swap_that_changes_order_raises_sync_error_on_every_rank(async_op: bool) -> None:
    r0, r1 = run_distributed(_changed_swap, 2, timeout=120, args=(async_op,))
    # the first two syncs merge a with b on the other rank: that cannot be told apart
    # (same rules for p and q, no name in common); the README lists the case
    mixed = {"p": 1.0, "q": 1000.0}
    assert r0[:2] == [{**mixed, "q": 2000.0}, mixed] and r1[:2] == r0[:2], (r0, r1)
    # sync #2: rank 0 syncs a (last synced at #0), rank 1 a (last synced at #1)
    for r in (r0, r1):
        assert isinstance(r[2], str) and "different order" in r[2], r
        assert "a Metrics last synced at #0" in r[2] and "last synced at #1" in r[2], r[2]
    # sync #3: b, whose history is swapped too (last synced at #1 on rank 0, #0 on rank 1);
    # async syncs queued in another order leave the group out of step from sync #2 on
    for r in (r0, r1):
        assert "out of step" in r[3] if async_op else "different order" in r[3], r


def _fresh_each_step(rank: int, world: int) -> list[Any]:
    """A new Metrics each step, a kept one reset, a checkpoint restored on every rank."""
    group = dist.new_group(backend="gloo")
    kept = ms.Metrics()
    out = []
    for step in range(3):
        m = ms.Metrics()
        m.record("x", float(rank + step))
        kept.record("k", float(rank))
        out += [_blocking(m, group), _blocking(kept, group)]
        kept.reset()
    kept.load_state_dict(kept.state_dict())  # a new state on every rank: a first sync again
    kept.record("k", 1.0)
    out.append(_blocking(kept, group))
    return out


def test_syncs_in_the_same_order_never_raise() -> None:
    results = run_distributed(_fresh_each_step, 2, timeout=120)
    want = []
    for step in range(3):
        want += [{"x": 0.5 + step}, {"k": 0.5}]
    assert results == [[*want, {"k": 1.0}]] * 2
