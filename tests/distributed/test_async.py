"""Async syncs across 2-3 gloo ranks: snapshots, order, faults, mixing, the Tracker.

- the state is taken at the call: records and ``reset()`` after it go to the
  next sync (also when the snapshot is the store's own table, which an
  array large enough to fold at once leaves behind), none is lost or counted
  twice; results are checked against sums over the raw samples;
- syncs complete in the order they were started; blocking syncs on the main
  group run between them on the same Metrics; ranks may hold different names;
- a rank that starts its async syncs in another order, or one more of them,
  makes every rank raise ``SyncError`` (not a wrong merge), and the main
  group goes on working;
- a missing rank gives ``SyncError`` from ``wait()`` within the timeout, also
  when the bookkeeping group itself cannot be created;
- sub-groups need ``ms.bookkeeping_group(group)`` on their members first;
- the Tracker writes async and plain steps in order, with the right values;
- randomized scenarios (records of every kind, rank-only names, empty ranks,
  records and resets after the call): the async result equals the blocking
  sync of the same state on the main group, key for key;
- ``examples/async_logging.py`` runs and logs the steps it should.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _compare import same

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import metricsync as ms  # noqa: E402
from metricsync._log._logread import read_jsonl  # noqa: E402
from metricsync.testing import run_distributed  # noqa: E402

pytestmark = pytest.mark.distributed

TIMEOUT = 2.0  # seconds a sync waits for a missing rank
SLACK = 6.0  # what a SyncError may take beyond it
N_SCENARIOS = 18  # per world size
SPECS = {"n": ms.Spec(("sum", "count", "max")), "big": ms.Spec(("sum", "count"))}


def _n(values: list[float]) -> dict[str, float]:
    return {"n/sum": float(sum(values)), "n/count": float(len(values)), "n/max": max(values)}


# ------------------------------------------------ snapshots, order, mixing


def _snapshots_order_mixing(rank: int, world: int) -> list[str]:
    done = []
    m = ms.Metrics(SPECS)
    pre = [float(rank + i) for i in range(3)]
    m.record("n", pre[0])
    m.record("n", np.array([pre[1]]))
    m.record("n", torch.tensor(pre[2]))
    h1 = m.sync(timeout=30, async_op=True)
    m.record("n", 1000.0 + rank)  # after the call: the next sync's
    blocking = m.sync(timeout=30)  # on the main group, while h1 may still run
    h2 = m.sync(timeout=30, async_op=True)
    m.reset()
    m.record("n", -5.0)
    h3 = m.sync(timeout=30, async_op=True)
    everyone = [float(r + i) for r in range(world) for i in range(3)]
    later = [1000.0 + r for r in range(world)]
    assert h1.wait().compute() == _n(everyone)
    assert h2.wait().compute() == blocking.compute() == _n(everyone + later)
    assert h3.wait().compute() == _n([-5.0] * world)
    done.append("snapshot")

    big = ms.Metrics(SPECS)
    big.record("big", np.full(20_000, float(rank + 1)))  # folds into the table at once
    handle = big.sync(timeout=30, async_op=True)
    big.reset()
    big.record("big", np.full(20_000, 100.0))
    want = {"big/sum": 20_000.0 * sum(range(1, world + 1)), "big/count": 20_000.0 * world}
    assert handle.wait().compute() == want
    done.append("own table")

    several = [ms.Metrics() for _ in range(6)]
    for i, each in enumerate(several):
        each.record(f"k{i}", float(10 * rank + i))
        each.record(f"only{rank}", 1.0)  # ranks hold different names
    handles = [each.sync(timeout=30, async_op=True) for each in several]
    for k in (3, 5, 0, 4, 1, 2):
        handles[k].wait()
        assert all(h.done() for h in handles[:k]), k  # finished in the order started
    for i, h in enumerate(handles):
        got = h.wait().compute()
        assert got == {f"k{i}": np.mean([10.0 * r + i for r in range(world)])} | {
            f"only{r}": 1.0 for r in range(world)
        }
    done.append("order")

    # sub-groups: members create the bookkeeping group first
    groups = [dist.new_group([0, 1]), dist.new_group(list(range(2, world)))]
    mine = groups[0] if rank < 2 else groups[1]
    members = [0, 1] if rank < 2 else list(range(2, world))
    sub = ms.Metrics()
    sub.record("x", float(rank))
    with pytest.raises(RuntimeError, match="bookkeeping_group"):
        sub.sync(mine, timeout=30, async_op=True)
    ms.bookkeeping_group(mine, timeout=30)
    assert sub.sync(mine, timeout=30, async_op=True).wait().compute() == {
        "x": float(np.mean(members))
    }
    done.append("sub-group")
    return done


def test_snapshots_order_mixing_and_sub_groups() -> None:
    results = run_distributed(_snapshots_order_mixing, 3, timeout=120)
    assert results == [["snapshot", "own table", "order", "sub-group"]] * 3


# ------------------------------------------------------------------ faults


def _outcome(handle: ms.SyncHandle) -> str:
    try:
        handle.wait()
    except ms.SyncError as exc:
        return str(exc)
    return "ok"


def _misordered(rank: int, world: int) -> list[str]:
    a, b = ms.Metrics(), ms.Metrics()
    a.record("a", 1.0)
    b.record("b", 2.0)
    for each in (a, b):  # once in the same order everywhere
        assert _outcome(each.sync(timeout=30, async_op=True)) == "ok"
    first, second = (a, b) if rank == 0 else (b, a)
    out = [_outcome(first.sync(timeout=30, async_op=True))]
    out.append(_outcome(second.sync(timeout=30, async_op=True)))
    c = ms.Metrics()
    c.record("c", float(rank))
    assert c.sync(timeout=30).compute() == {"c": 0.5}  # the main group is not affected

    fresh = dist.new_group(backend="gloo")  # every rank: a new group, a new bookkeeping group
    order = [a, a, b] if rank == 0 else [a, b]  # rank 0 starts one sync more
    out += [_outcome(each.sync(fresh, timeout=30, async_op=True)) for each in order]
    return out


@pytest.mark.usefixtures("sync_path")
def test_ranks_that_start_async_syncs_in_another_order_raise_sync_error() -> None:
    r0, r1 = run_distributed(_misordered, 2, timeout=120)
    for res in (r0, r1):
        assert "different order" in res[0] and "rank 0: a Metrics last synced at #0" in res[0]
        assert "out of step" in res[1]
        assert res[2] == "ok" and "different order" in res[3], res
    assert "out of step" in r0[4]  # its extra sync fails at once


def _missing(rank: int, world: int) -> Any:
    m = ms.Metrics()
    m.record("x", 1.0)
    assert m.sync(timeout=30, async_op=True).wait().compute() == {"x": 1.0}
    later = dist.new_group(backend="gloo")  # every rank; rank 2 never syncs on it
    if rank == 2:
        time.sleep(2 * TIMEOUT + 2.0)
        return "absent"
    out = []
    for group in (None, None, later):
        start = time.monotonic()
        handle = m.sync(group, timeout=TIMEOUT, async_op=True)
        outcome = _outcome(handle)
        out.append((outcome[:60], time.monotonic() - start))
    return out


@pytest.mark.usefixtures("sync_path")
def test_a_missing_rank_gives_sync_error_from_wait_within_the_timeout() -> None:
    results = run_distributed(_missing, 3, timeout=60, allow_failures=True)
    assert results[2] == "absent"
    for rank in (0, 1):
        (first, _), (second, _), (creating, _) = results[rank]
        assert "did not complete" in first and "out of step" in second, results[rank]
        assert "no bookkeeping group" in creating, results[rank]
        assert all(seconds < TIMEOUT + SLACK for _, seconds in results[rank]), results[rank]


# ----------------------------------------------------------------- tracker


def _tracker(rank: int, world: int, run_dir: str) -> list[Any]:
    m = ms.Metrics({"n": ms.Spec(("sum", "count"))})
    pending_when_logged = []
    with ms.Tracker("jsonl", run_dir=run_dir, rank=rank) as tracker:
        for step in range(1, 9):
            m.record("n", float(rank + step))
            if step % 4 == 1:
                if rank == 1:
                    time.sleep(0.5)  # late: rank 0's handle is still pending
                handle = m.sync(timeout=30, async_op=True)
                tracker.log(handle, step)
                tracker.log({"plain": float(step + 1)}, step + 1)  # behind the pending step
                pending_when_logged.append(not handle.done())
            elif step % 4 == 3:
                tracker.log(m.sync(timeout=30), step)  # blocking, while others may pend
            elif step % 4 == 0:
                tracker.log(m.sync(timeout=30, async_op=True), step)
            m.reset()
        tracker.flush()
        written = read_jsonl(run_dir)[1] if rank == 0 else []
    return [written, pending_when_logged]


def test_the_tracker_writes_async_and_plain_steps_in_order(tmp_path: Path) -> None:
    results = run_distributed(_tracker, 2, timeout=120, args=(str(tmp_path),))
    written, pending = results[0]
    want = []
    for step in range(1, 9):
        if step % 4 == 2:
            want.append((step, {"plain": float(step)}))
            continue
        samples = [float(r + step) for r in range(2)]  # reset after every step
        want.append((step, {"n/sum": sum(samples), "n/count": float(len(samples))}))
    assert written == want
    assert any(pending), "no step was pending when the next was logged: nothing was ordered"


# ---------------------------------------------- randomized: async == blocking

SCENARIO_SPECS = (
    ms.Spec(),
    ms.Spec(("sum", "count", "min", "max")),
    ms.Spec(("mean", "std", "p50", "p99")),
    ms.Spec("last"),
    ms.Spec("sum", across="mean"),
    ms.Spec(("mean", "max"), across="max", nan="ignore"),
)


def _record_random(m: ms.Metrics, rng: np.random.Generator, rank: int) -> None:
    for _ in range(int(rng.integers(0, 6))):
        name = f"m{int(rng.integers(0, 6))}" if rng.random() < 0.8 else f"rank{rank}/x"
        kind = int(rng.integers(0, 4))
        n = int(rng.integers(0, 40))
        values = rng.normal(size=n) * 10
        if rng.random() < 0.1 and n:
            values[0] = math.nan
        if kind == 0:
            for v in values[:5].tolist():
                m.record(name, v)
        elif kind == 1:
            m.record(name, values, weight=rng.uniform(0, 2, size=n))
        elif kind == 2:
            mask = torch.from_numpy(rng.random(n) < 0.7)
            m.record(name, torch.from_numpy(values), mask=mask)
        else:
            m.record(name, torch.tensor(float(rng.normal())))


def _scenarios(rank: int, world: int, n: int) -> int:
    specs = {f"m{i}": SCENARIO_SPECS[i] for i in range(6)}
    kept = ms.Metrics(specs)  # reused across scenarios, reset in some
    checked = 0
    for scenario in range(n):
        rng = np.random.default_rng([scenario, rank, world])
        shared = np.random.default_rng([scenario, world])  # the same draw on every rank
        m = kept if shared.random() < 0.5 else ms.Metrics(specs)
        if shared.random() < 0.3:
            m.reset()
        _record_random(m, rng, rank)
        handle = m.sync(timeout=30, async_op=True)
        blocking = m.sync(timeout=30)
        _record_random(m, rng, rank)  # after both calls: in neither
        if shared.random() < 0.3:
            m.reset()
        got = handle.wait()
        assert same(got.compute(), blocking.compute()), scenario
        assert got.key_formats() == blocking.key_formats()
        checked += 1
    return checked


@pytest.mark.usefixtures("sync_path")
@pytest.mark.parametrize("world", [2, 3])
def test_randomized_async_syncs_equal_blocking_syncs(world: int) -> None:
    assert (
        run_distributed(_scenarios, world, timeout=120, args=(N_SCENARIOS,))
        == [N_SCENARIOS] * world
    )


# ----------------------------------------------------------------- example


def test_the_async_logging_example_runs(tmp_path: Path) -> None:
    examples = str(Path(__file__).resolve().parents[2] / "examples")
    sys.path.insert(0, examples)  # the ranks import it too
    try:
        import async_logging

        assert run_distributed(async_logging.train, 2, args=(9, 3, str(tmp_path))) == [3, 3]
    finally:
        sys.path.remove(examples)
    _, steps = read_jsonl(tmp_path)
    assert [step for step, _ in steps] == [3, 6, 9]
    keys = {"loss", "entropy", "response_length/mean", "response_length/max", "response_length/p50"}
    assert all(set(values) == keys for _, values in steps)
