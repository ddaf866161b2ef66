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
