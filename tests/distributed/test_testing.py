"""metricsync.testing.run_distributed: results by rank, failures reported at once."""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("torch")

from metricsync.testing import RankFailure, run_distributed

pytestmark = pytest.mark.distributed


def _rank_squared(rank: int, world: int) -> int:
    return rank * rank + world


def _rank_one_dies(rank: int, world: int) -> str:
    if rank == 1:
        os._exit(3)
    if rank == 2:
        raise RuntimeError("boom on rank 2")
    return "ok"


def test_results_come_back_by_rank() -> None:
    assert run_distributed(_rank_squared, 3) == [3, 4, 7]


def test_a_dead_or_failing_rank_is_reported_without_waiting_for_the_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(AssertionError) as err:
        run_distributed(_rank_one_dies, 3, timeout=120)
    assert time.monotonic() - start < 60
    assert "rank 1 exited with code 3" in str(err.value)
    assert "boom on rank 2" in str(err.value)

    results = run_distributed(_rank_one_dies, 3, timeout=120, allow_failures=True)
    assert results[0] == "ok"
    assert isinstance(results[1], RankFailure) and results[1].exitcode == 3
    assert isinstance(results[2], RankFailure) and "boom on rank 2" in str(results[2].traceback)


def _environ(rank: int, world: int, name: str) -> str | None:
    return os.environ.get(name)


def test_ranks_see_the_callers_environment_at_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    # The ranks fork from a server started by an earlier call, with that moment's environment.
    name = "METRICSYNC_TEST_MARK"
    monkeypatch.setenv(name, "before")
    assert run_distributed(_environ, 2, args=(name,)) == ["before", "before"]
    monkeypatch.setenv(name, "after")
    assert run_distributed(_environ, 2, args=(name,)) == ["after", "after"]
    monkeypatch.delenv(name)
    assert run_distributed(_environ, 2, args=(name,)) == [None, None]


_SEEN: list[int] = []


def _fresh(rank: int, world: int) -> tuple[int, list[int]]:
    before = list(_SEEN)
    _SEEN.append(rank)
    return os.getpid(), before


def test_every_call_runs_in_new_processes() -> None:
    first = run_distributed(_fresh, 2)
    second = run_distributed(_fresh, 2)
    assert [seen for _, seen in first + second] == [[]] * 4  # no state from an earlier call
    assert len({pid for pid, _ in first + second} | {os.getpid()}) == 5


def _collectives(rank: int, world: int) -> tuple[int, int, list[tuple[str, int]], bool]:
    import pickle

    import torch
    import torch.distributed as dist

    from metricsync.testing import count_collectives

    original = dist.all_reduce
    obj = {"loss": [1.0, 2.0], "rank": rank}
    with count_collectives() as seen:
        dist.all_reduce(torch.ones(10, dtype=torch.float64))
        dist.all_gather([torch.empty(3) for _ in range(world)], torch.ones(3))
        out: list[object] = [None] * world
        dist.all_gather_object(out, obj)  # all_gather inside: counted once, as this call
        dist.barrier()
        # an all-to-all: each rank receives one chunk, so the payload is one chunk's bytes
        dist.all_to_all_single(torch.empty(4 * world), torch.ones(4 * world))
    restored = dist.all_reduce is original
    return seen.total, seen.bytes - len(pickle.dumps(obj)), seen.log, restored


def test_count_collectives_counts_calls_and_payload_bytes() -> None:
    for total, tensor_bytes, log, restored in run_distributed(_collectives, 2):
        assert total == 5
        assert tensor_bytes == 80 + 12 + 16
        assert [name for name, _ in log] == [
            "all_reduce",
            "all_gather",
            "all_gather_object",
            "barrier",
            "all_to_all_single",
        ]
        assert log[4] == ("all_to_all_single", 16)
        assert log[0] == ("all_reduce", 80) and log[1] == ("all_gather", 12)
        assert restored


def test_a_rank_that_cannot_start_raises_its_own_error() -> None:
    """A function the ranks cannot import (a lambda) fails at the start of its rank's
    process: that error surfaces, not an ``AssertionError`` about joining a process
    that never started (raised while cleaning up, which hid it)."""
    with pytest.raises(Exception) as err:
        run_distributed(lambda rank, world: rank, 2)
    assert "can only join a started process" not in str(err.value)
    assert "pickle" in (type(err.value).__name__ + str(err.value)).lower()
