"""Reliability of ``sync`` on 2, 3 and 4 gloo ranks: timeouts, deadlines, threads, meshes.

One group of processes per world size runs every phase in order (a spawn
costs seconds, a phase less), and each test checks one phase's results:

1. ``across="first"`` keeps the lowest-ranked holder's result;
2. ``across`` aggregates holding 1e308 and infinities sync under
   ``warnings.simplefilter("error")``;
3. a thread records (fast-path numbers and arrays) while the main thread
   syncs, with a switch interval of 1 us: the final sync counts every sample;
4. a timeout leaves a usable process: rank 0 syncs with ``timeout=1`` while
   the last rank is 3 s late; rank 0's next sync raises ``SyncError`` at
   once, naming the earlier failure, without entering a collective; the late
   rank gets a result or ``SyncError``, never a crash (gloo used to abort a
   process with SIGABRT here);
5. the recovery: a new process group syncs correctly, and so does a new
   default group (``destroy_process_group`` then ``init_process_group``),
   although it has the broken one's name;
6. ``timeout`` bounds the whole call: a peer 3.5 s late into each collective
   makes ``sync(timeout=4)`` raise within the timeout and a margin, where
   per-collective timeouts took 14 s without an error.

On 4 ranks, a 2-D CPU ``DeviceMesh``: ``sync(group=mesh["dp"])`` equals brute
force over that data-parallel group, and the 2-D mesh itself raises.
"""

from __future__ import annotations

import math
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import metricsync as ms  # noqa: E402
from metricsync._sync._allreduce import ENV  # noqa: E402
from metricsync.testing import RankFailure, free_port, run_distributed  # noqa: E402

# ranks that die, hang or time out: minutes of waiting, so make test-slow (CI) runs them
pytestmark = [pytest.mark.distributed, pytest.mark.slow]

LATE = 3.0  # how late the last rank arrives in phase 4
SLOW = 3.5  # how late the slow rank is into each collective in phase 6
DEADLINE = 4.0  # the timeout of phase 6
MARGIN = 6.0  # what a SyncError may take beyond its timeout on a loaded machine
SYNCS = 15  # while threads record
COLLECTIVES = (
    "all_gather_single",
    "all_gather_into_tensor",
    "all_gather",
    "all_reduce",
    "all_to_all_single",
)


def _wrap_collectives(before: Callable[[], None]) -> Callable[[], None]:
    """Call ``before`` ahead of every collective of this process; returns the undo."""
    saved = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
    for name, fn in saved.items():

        def wrapped(*args: Any, _fn: Any = fn, **kwargs: Any) -> Any:
            before()
            return _fn(*args, **kwargs)

        setattr(dist, name, wrapped)

    def undo() -> None:
        for name, fn in saved.items():
            setattr(dist, name, fn)

    return undo


def _attempt(m: ms.Metrics, **kwargs: Any) -> dict[str, Any]:
    """One sync: its outcome, values or message, collectives entered, seconds."""
    calls = [0]
    undo = _wrap_collectives(lambda: calls.__setitem__(0, calls[0] + 1))
    start = time.monotonic()
    try:
        out: dict[str, Any] = {"outcome": "ok", "values": m.sync(**kwargs).compute()}
    except ms.SyncError as exc:
        out = {"outcome": "SyncError", "message": str(exc)}
    finally:
        undo()
    return {**out, "collectives": calls[0], "seconds": time.monotonic() - start}


# ----------------------------------------------------------------- phases


def _first(rank: int, world: int) -> dict[str, float]:
    spec = ms.Spec(("last", "mean", "count"), across="first")
    m = ms.Metrics({"lr": spec, "step": ms.Spec("max", across="first")})
    if rank > 0:  # rank 0 holds no sample: rank 1 is the lowest-ranked holder
        m.record("lr", [10.0 * rank, 10.0 * rank + 2.0])
    m.record("step", float(100 + rank))
    return m.sync(timeout=30).compute()


def _extreme_metrics(rank: int) -> ms.Metrics:
    values = [[1e308, 1e308], [math.inf, 1.0], [-math.inf, -1e308], [1e308, -math.inf]][rank % 4]
    m = ms.Metrics(
        {
            "s": ms.Spec(("sum", "mean", "std"), across="sum"),
            "m": ms.Spec(("mean", "var", "max"), across="mean"),
            "lo": ms.Spec(("min", "sum"), across="min"),
            "hi": ms.Spec(("max", "mean"), across="max"),
            "f": ms.Spec(("sum", "std"), across="first"),
            "x": ms.Spec(("sum", "mean", "std", "p50")),
        }
    )
    for name in ("s", "m", "lo", "hi", "f", "x"):
        m.record(name, values)
        m.record(name, values[0], weight=1e308)
    return m


def _warnings(rank: int, world: int) -> tuple[dict[str, float], dict[str, float]]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        synced = _extreme_metrics(rank).sync(timeout=30).compute()
        merged = ms.merge(_extreme_metrics(r) for r in range(world)).compute()
    return synced, merged


def _thread_records_while_syncing(rank: int, world: int) -> tuple[int, int, float]:
    m = ms.Metrics({"n": ms.Spec(("sum", "count")), "a": ms.Spec(("sum", "count", "max"))})
    stop = threading.Event()
    recorded = [0, 0]
    errors: list[BaseException] = []

    def numbers() -> None:
        try:
            while not stop.is_set():
                for _ in range(100):
                    m.record("n", 1.0)
                recorded[0] += 100
        except BaseException as exc:  # collected and returned
            errors.append(exc)

    def arrays() -> None:
        try:
            ones = np.ones(4)
            while not stop.is_set():
                m.record("a", ones)
                recorded[1] += 4
        except BaseException as exc:
            errors.append(exc)

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    threads = [threading.Thread(target=numbers), threading.Thread(target=arrays)]
    try:
        for thread in threads:
            thread.start()
        for _ in range(SYNCS):
            got = m.sync(timeout=30).compute()
            assert got.get("n/sum", 0.0) == got.get("n/count", 0.0)
            for _ in range(5):  # more folds between syncs
                m.compute()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        sys.setswitchinterval(before)
    assert not errors, errors
    final = m.sync(timeout=30).compute()
    return recorded[0], recorded[1], final["n/count"] + 1e6 * final["a/count"]


def _late_rank(rank: int, world: int) -> dict[str, Any]:
    m = ms.Metrics({"x": ms.Spec(("sum", "count"))})
    m.record("x", float(rank))
    out: dict[str, Any] = {"warm": _attempt(m, timeout=30)}  # a steady layout first
    if rank == world - 1:
        time.sleep(LATE)
        if world == 2:
            m.record("late", 1.0)  # a new name: this rank asks for a new layout
        out["attempts"] = [_attempt(m, timeout=2.0), _attempt(m, timeout=2.0)]
    else:
        out["attempts"] = [_attempt(m, timeout=1.0), _attempt(m, timeout=1.0)]
    return out


def _recovery(rank: int, world: int, port: int) -> list[dict[str, float]]:
    m = ms.Metrics({"x": ms.Spec(("sum", "count"))})
    m.record("x", float(rank))
    group = dist.new_group(list(range(world)), backend="gloo")
    got = [m.sync(group=group, timeout=30).compute()]
    # or a new default group: the same name ("0") as the broken one, a new group
    dist.destroy_process_group()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    got.append(m.sync(timeout=30).compute())
    return got


def _deadline(rank: int, world: int) -> dict[str, Any]:
    group = dist.new_group(list(range(world)), backend="gloo")
    m = ms.Metrics({"q": ms.Spec(("p50", "mean"))})
    m.record("q", np.arange(10.0) + rank)
    m.record(f"only/{rank}", 1.0)  # every rank has new names: a sync of 4-5 collectives
    undo = _wrap_collectives(lambda: time.sleep(SLOW)) if rank == world - 1 else None
    try:
        return _attempt(m, group=group, timeout=DEADLINE)
    finally:
        if undo is not None:
            undo()


def _phases(rank: int, world: int, port: int) -> dict[str, Any]:
    return {
        "first": _first(rank, world),
        "warnings": _warnings(rank, world),
        "threads": _thread_records_while_syncing(rank, world),
        "late": _late_rank(rank, world),  # breaks the default group
        "recovery": _recovery(rank, world, port),  # and re-creates it
        "deadline": _deadline(rank, world),
    }


@pytest.fixture(
    scope="module",
    params=[(2, "gather"), (3, "gather"), pytest.param((3, "reduce"), marks=pytest.mark.slow)],
    ids=lambda p: f"{p[0]} ranks, {p[1]}",  # the reduce path's phases: make test-slow
)
def phases(request: pytest.FixtureRequest) -> tuple[int, list[Any]]:
    world, path = request.param
    with pytest.MonkeyPatch.context() as patch:  # the sync path the spawned ranks take
        patch.setenv(ENV, path)
        results = run_distributed(
            _phases, world, timeout=120, args=(free_port(),), allow_failures=True
        )
    return world, results


def _ranks(phases: tuple[int, list[Any]], key: str) -> Iterator[tuple[int, Any]]:
    _, results = phases
    for rank, result in enumerate(results):
        # a rank that aborted (SIGABRT) or raised: every phase's test fails with it
        assert not isinstance(result, RankFailure), str(result)
        assert result is not None, f"rank {rank} did not finish"
        yield rank, result[key]


# ------------------------------------------------------------------ tests


def test_first_keeps_the_lowest_ranked_holder(phases: tuple[int, list[Any]]) -> None:
    for _, got in _ranks(phases, "first"):
        assert got == {"lr/last": 12.0, "lr/mean": 11.0, "lr/count": 2.0, "step": 100.0}


def test_extreme_across_values_sync_under_warnings_as_errors(
    phases: tuple[int, list[Any]],
) -> None:
    for _, (synced, merged) in _ranks(phases, "warnings"):
        assert synced.keys() == merged.keys()
        for key, value in synced.items():
            assert value == merged[key] or (math.isnan(value) and math.isnan(merged[key])), key


def test_a_thread_records_while_the_main_thread_syncs(phases: tuple[int, list[Any]]) -> None:
    results = [r for _, r in _ranks(phases, "threads")]
    numbers = sum(r[0] for r in results)
    arrays = sum(r[1] for r in results)
    assert numbers > 0 and arrays > 0
    for _, _, final in results:  # every rank's final sync counts every sample of every rank
        assert final == numbers + 1e6 * arrays


def test_a_timeout_leaves_a_usable_process(phases: tuple[int, list[Any]]) -> None:
    world, _ = phases
    late = dict(_ranks(phases, "late"))
    for rank, res in late.items():
        assert res["warm"]["outcome"] == "ok", res
        first, second = res["attempts"]
        if rank < world - 1:  # timed out waiting for the late rank
            assert first["outcome"] == "SyncError", first
            assert first["seconds"] < 1.0 + MARGIN
            # at once, naming the earlier failure, and without entering a collective
            assert second["outcome"] == "SyncError" and second["collectives"] == 0, second
            assert "out of step" in second["message"]
            assert first["message"].split(": ", 1)[1] in second["message"]
            assert "new process group" in second["message"]
        else:  # the late rank: a correct result or SyncError, and then SyncError
            outcomes = [a["outcome"] for a in (first, second)]
            assert "SyncError" in outcomes, res
            if first["outcome"] == "ok":  # its peers' abandoned gather still delivered
                assert first["values"] == {
                    "x/sum": float(sum(range(world))),
                    "x/count": float(world),
                }
            assert second["outcome"] == "SyncError"
            assert all(a["seconds"] < 2.0 + MARGIN for a in (first, second))


def test_a_new_process_group_syncs_after_a_timeout(phases: tuple[int, list[Any]]) -> None:
    world, _ = phases
    want = {"x/sum": float(sum(range(world))), "x/count": float(world)}
    for _, (new_group, new_default_group) in _ranks(phases, "recovery"):
        assert new_group == want
        assert new_default_group == want  # not "out of step" because of the old one's name


def test_the_timeout_bounds_the_whole_sync(phases: tuple[int, list[Any]]) -> None:
    world, _ = phases
    for rank, res in _ranks(phases, "deadline"):
        assert res["outcome"] == "SyncError", res  # not a late success after 4 x 3.5 s
        if rank < world - 1:
            # one deadline: within 4 s + margin, where one timeout per collective took 14 s
            assert res["seconds"] < DEADLINE + MARGIN, res
            assert res["collectives"] >= 2, res  # it did get past the first collective
        else:  # the slow rank notices its deadline after its own second delay
            assert res["seconds"] < 2 * SLOW + MARGIN, res


# --------------------------------------------------------------- DeviceMesh


def _mesh(rank: int, world: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))

    def metrics(r: int) -> ms.Metrics:
        m = ms.Metrics({"loss": ms.Spec(("mean", "max", "count")), "lr": ms.Spec("last")})
        m.record("loss", [float(r), 10.0 * r + 1.0])
        m.record("g", float(r), weight=r + 1.0)
        return m

    mine = metrics(rank)
    out: dict[str, Any] = {}
    for dim in ("dp", "tp"):
        ranks = sorted(dist.get_process_group_ranks(mesh[dim].get_group()))
        out[dim] = (ranks, mine.sync(group=mesh[dim], timeout=30).compute())
        out[dim + " brute"] = ms.merge(metrics(r) for r in ranks).compute()
    try:
        mine.sync(group=mesh, timeout=30)
    except ValueError as exc:
        out["2-D"] = str(exc)
    return out


def test_sync_over_a_device_mesh_dimension() -> None:
    results = run_distributed(_mesh, 4, timeout=120)
    for rank, res in enumerate(results):
        # mesh [[0, 1], [2, 3]]: "dp" runs down the columns, "tp" along the rows
        assert res["dp"][0] == [rank % 2, rank % 2 + 2]
        assert res["tp"][0] == [rank - rank % 2, rank - rank % 2 + 1]
        for dim in ("dp", "tp"):
            assert res[dim][1] == res[dim + " brute"], (rank, dim)
        assert "1-D DeviceMesh" in res["2-D"] and "2 dims" in res["2-D"]
