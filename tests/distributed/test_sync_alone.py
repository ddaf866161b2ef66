"""A sync without a process group returns what one rank's sync returns.

The oracle is a real sync over gloo: on one rank, the result's keys, values and
encoded state equal those of ``sync()`` without ``torch.distributed`` (``across``
aggregates and ``argrank`` ranks included); on two ranks, the keys come in the same
order. Names are opened out of name order, so insertion order is not the answer.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

import metricsync as ms  # noqa: E402
from metricsync.testing import run_distributed  # noqa: E402

pytestmark = pytest.mark.distributed

SPECS = {
    "z/lr": ms.Spec("last"),
    "y/pg_loss": ms.Spec("sum", across="mean"),
    "x/first": ms.Spec(("mean", "max"), across="first"),
    "w/ranked": ms.Spec(("max", "min"), argrank=True),
    "v/q": ms.Spec(("p50", "mean", "max")),
    "u/across_q": ms.Spec(("p90", "mean"), across="max"),
    "t/count": ms.Spec(("sum", "count")),
}


def _metrics(rank: int) -> ms.Metrics:
    m = ms.Metrics(SPECS)
    rng = np.random.default_rng(rank)
    m.record("zeta", 1.0 + rank)  # a default (mean) name, after every other in name order
    for name in SPECS:
        m.record(name, rng.normal(size=5))
    m.record("alpha", [2.0, float(rank)])
    m.record("z/lr", 0.5)
    return m


def _observe(m: ms.Metrics) -> tuple[list[tuple[str, float]], list[tuple[str, float]], bytes]:
    synced = m.sync()
    handle = m.sync(async_op=True).wait()
    return list(synced.compute().items()), list(handle.compute().items()), synced.to_bytes()


def _ranked(rank: int, world: int) -> Any:
    return _observe(_metrics(rank))


def _one_rank_then_alone(rank: int, world: int) -> Any:
    """One rank's sync of a ``Metrics``, then the same ``Metrics``' sync without the group
    (the same object: the same record times, which its ``last`` state holds)."""
    m = _metrics(rank)
    one = _observe(m)
    dist.destroy_process_group()
    return one, _observe(m)


def test_a_sync_without_a_process_group_is_one_ranks_sync() -> None:
    [(one, alone)] = run_distributed(_one_rank_then_alone, 1)
    assert alone[0] == one[0] and alone[1] == one[1] == one[0]  # keys, their order, values
    assert alone[2] == one[2]  # the state itself: aggregates, ranks, sketches
    assert ("w/ranked/max_rank", 0.0) in alone[0]  # argrank: the one rank is rank 0
    here = _observe(_metrics(0))  # this process never made a process group
    assert here[0] == here[1] == one[0]


@pytest.mark.usefixtures("sync_path")
def test_the_keys_of_a_sync_without_a_process_group_come_in_the_order_of_two_ranks() -> None:
    alone = [k for k, _ in _observe(_metrics(0))[0]]
    for synced, synced_async, _ in run_distributed(_ranked, 2):
        assert [k for k, _ in synced] == alone
        assert [k for k, _ in synced_async] == alone
    assert next(iter(_metrics(0).compute())) == "zeta" != alone[0]  # compute(): insertion order
