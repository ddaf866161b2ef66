"""Async syncs over 2 gloo ranks: what the call captures, counted sample by sample.

The worker is held (a job queued ahead of the syncs) until the test has
recorded after the call, so the records after ``sync(async_op=True)`` surely
happen before the worker folds the captured samples:

- with a ``reset()`` after the call, every sample lands in exactly one of
  the two syncs (counts and sums over the raw samples of every rank);
- without one, the second sync holds both steps' samples, and each async
  result equals the blocking sync of the same state, key for key;
- a thread recording on the lock-free path while the syncs are called: each
  sync holds a prefix of its samples (none lost, none twice), the last all;
- device records (CPU tensors playing accelerator ones) are copied at the
  call; an invalid one raises ``ValueError`` on its rank and ``SyncError`` on
  the other from ``wait()``, and the next sync goes on without it;
- a fold that fails on one rank's worker fails that sync on every rank
  (none is left waiting in the collective), and the group stays in step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import metricsync as ms  # noqa: E402
from metricsync._record._pending import FAST_LIMIT  # noqa: E402
from metricsync._sync._async import SyncHandle, _running_worker  # noqa: E402
from metricsync.testing import run_distributed  # noqa: E402

pytestmark = pytest.mark.distributed

SPECS = {"x": ms.Spec(("sum", "count", "max")), "lr": ms.Spec("last")}


def _hold_worker() -> Callable[[], None]:
    """Queue a job that keeps the sync worker busy until the returned function is called."""
    gate = threading.Event()
    _running_worker().queue.put((SyncHandle(), gate.wait))
    return gate.set


def _record(m: ms.Metrics, values: list[float]) -> None:
    """``values`` as samples of "x", through every host record path."""
    k = len(values) // 5
    for v in values[:k]:
        m.record("x", v)  # a number: the lock-free buffer
    for v in values[k : 2 * k]:
        m.record("x", torch.tensor(v))  # a 0-d tensor
    m.record("x", np.array(values[2 * k : 3 * k]))  # buffered array samples
    m.record("x", torch.tensor(values[3 * k : 4 * k]), mask=torch.ones(k, dtype=torch.bool))
    m.record("x", values[4 * k :])  # a list


def _want(per_rank: list[list[float]]) -> dict[str, float]:
    every = [v for values in per_rank for v in values]
    return {"x/sum": float(sum(every)), "x/count": float(len(every)), "x/max": max(every)}


def _steps(rank: int, world: int) -> list[str]:
    done = []

    def values(step: int, r: int, n: int) -> list[float]:  # distinct integers: sums are exact
        return [float(1_000_000 * step + 1000 * r + i) for i in range(n)]

    n = FAST_LIMIT + 500  # enough that the records after the call fill a buffer and fold
    m = ms.Metrics(SPECS)
    _record(m, values(1, rank, 1000))
    m.record("lr", 1.0)
    release = _hold_worker()
    h1 = m.sync(timeout=30, async_op=True)
    m.reset()
    _record(m, values(2, rank, n))
    m.record("x", [float(v) for v in values(2, rank, n)[:5]])  # a few twice, on purpose
    m.record("lr", 2.0)
    release()
    first = h1.wait().compute()
    second = m.sync(timeout=30, async_op=True).wait().compute()
    assert {k: first[k] for k in first if k != "lr"} == _want(
        [values(1, r, 1000) for r in range(world)]
    )
    assert first["lr"] == 1.0 and second["lr"] == 2.0
    twice = [values(2, r, n) + values(2, r, n)[:5] for r in range(world)]
    assert {k: second[k] for k in second if k != "lr"} == _want(twice)
    done.append("reset: each sample in one sync")

    m = ms.Metrics(SPECS)
    _record(m, values(3, rank, 800))
    release = _hold_worker()
    h1 = m.sync(timeout=30, async_op=True)
    blocking1 = m.sync(timeout=30)  # the main group: it does not wait for the worker
    _record(m, values(4, rank, n))
    release()
    h2 = m.sync(timeout=30, async_op=True)
    blocking2 = m.sync(timeout=30)
    assert (
        h1.wait().compute()
        == blocking1.compute()
        == _want([values(3, r, 800) for r in range(world)])
    )
    both = [values(3, r, 800) + values(4, r, n) for r in range(world)]
    assert h2.wait().compute() == blocking2.compute() == _want(both)
    done.append("no reset: the second holds both")

    total = 3 * FAST_LIMIT + 77
    t = ms.Metrics({f"t{r}": ms.Spec(("sum", "count", "max")) for r in range(world)})
    name = f"t{rank}"
    t.record(name, 0.0)
    started = threading.Event()

    def recorder() -> None:
        started.set()
        for v in range(1, total):
            t.record(name, float(v))

    thread = threading.Thread(target=recorder)
    thread.start()
    started.wait()
    handles = [t.sync(timeout=30, async_op=True) for _ in range(5)]
    thread.join()
    handles.append(t.sync(timeout=30, async_op=True))
    for h in handles:
        got = h.wait().compute()
        for r in range(world):
            c = int(got[f"t{r}/count"])
            assert got[f"t{r}/sum"] == c * (c - 1) / 2 and got[f"t{r}/max"] == c - 1
    assert got[f"{name}/count"] == total
    done.append("recording thread: prefixes")
    return done


def test_every_sample_lands_in_exactly_one_sync() -> None:
    assert (
        run_distributed(_steps, 2, timeout=120)
        == [
            [
                "reset: each sample in one sync",
                "no reset: the second holds both",
                "recording thread: prefixes",
            ]
        ]
        * 2
    )


def _devices(rank: int, world: int) -> list[str]:
    import metricsync._record._convert

    metricsync._record._convert.HOST_DEVICE_TYPES = frozenset()  # CPU tensors as accelerator ones
    m = ms.Metrics({"d": ms.Spec(("sum", "count", "max", "p50")), "h": ms.Spec("sum")})
    m.record("d", torch.arange(4.0) + 10 * rank)
    m.record("h", 1.0)
    release = _hold_worker()
    h1 = m.sync(timeout=30, async_op=True)
    m.record("d", torch.full((3,), 100.0))  # after the call: the next sync's
    release()
    got = h1.wait().compute()
    everyone = np.concatenate([np.arange(4.0) + 10 * r for r in range(world)])
    assert got["d/count"] == len(everyone) and got["d/sum"] == everyone.sum()
    assert got["d/max"] == everyone.max() and got["h"] == world
    out = ["device copy at the call"]

    if rank == 1:
        m.record("d", torch.tensor([1.0, 2.0]), weight=torch.tensor([1.0, -1.0]))
    bad = m.sync(timeout=30, async_op=True)
    expected: Any = ValueError if rank == 1 else ms.SyncError
    with pytest.raises(expected, match="'d'" if rank == 1 else "another rank"):
        bad.wait()
    again = m.sync(timeout=30, async_op=True)  # the error stays until reset(), on every rank
    with pytest.raises(expected, match="'d'" if rank == 1 else "another rank"):
        again.wait()
    m.reset()
    m.record("d", torch.full((3,), 100.0))
    after = m.sync(timeout=30, async_op=True).wait().compute()  # the group is in step
    assert after["d/count"] == 3 * world and after["d/sum"] == 300.0 * world
    out.append("device error")
    return out


def test_device_states_are_taken_at_the_call_and_errors_reach_every_rank() -> None:
    assert (
        run_distributed(_devices, 2, timeout=120)
        == [["device copy at the call", "device error"]] * 2
    )


def _failing_fold(rank: int, world: int) -> list[str]:
    from metricsync._record._store import Store

    m = ms.Metrics()
    m.record("x", float(rank))
    original = Store._fold_into_table

    def boom(self: Any, batch: Any, table: Any = None) -> None:
        raise MemoryError("no room")

    if rank == 0:
        Store._fold_into_table = boom  # type: ignore[method-assign]
    try:
        handle = m.sync(timeout=30, async_op=True)
        expected: Any = ValueError if rank == 0 else ms.SyncError
        with pytest.raises(expected, match="folding" if rank == 0 else "another rank"):
            handle.wait()
    finally:
        Store._fold_into_table = original  # type: ignore[method-assign]
    got = m.sync(timeout=30, async_op=True).wait().compute()
    assert got == {"x": np.mean(range(world))}
    return ["raised on every rank", "in step"]


def test_a_fold_that_fails_on_one_rank_fails_the_sync_on_every_rank() -> None:
    assert (
        run_distributed(_failing_fold, 2, timeout=120) == [["raised on every rank", "in step"]] * 2
    )
