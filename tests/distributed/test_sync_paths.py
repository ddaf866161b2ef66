"""The gather path and the reduce path of a sync give the same results.

Each rank records the same random mix on both paths (every statistic, every
``across`` mode, ``last``, ``argrank``, quantiles, ``nan="ignore"``, weights,
ranks without samples, ties across ranks), syncs it once forced through the
gather and once through the reduce path, and the two results must agree within
1e-12 relative (quantiles: the same sketch cells, so the same values), be
identical on every rank, and match numpy over the pooled samples. The byte test
counts what each rank receives on 2 and 8 ranks with the path the group chooses.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pytest
from _compare import same

pytest.importorskip("torch")

import metricsync as ms
from metricsync._sync._allreduce import ENV, received_bytes, wire_bytes
from metricsync.testing import count_collectives, run_distributed

pytestmark = pytest.mark.distributed

SPECS = {
    "m/*": ms.Spec(("mean", "sum", "min", "max", "std", "var", "count")),
    "l/*": ms.Spec(("last", "mean")),
    "a/*": ms.Spec(("max", "min", "mean"), argrank=True),
    "q/*": ms.Spec(("p10", "p50", "p99", "mean")),
    "x/mean": ms.Spec(("mean", "max"), across="mean"),
    "x/sum": ms.Spec("sum", across="sum"),
    "x/min": ms.Spec("mean", across="min"),
    "x/max": ms.Spec("mean", across="max"),
    "x/first": ms.Spec(("mean", "last"), across="first"),
    "n/*": ms.Spec(("mean", "std"), nan="ignore"),
}


def _record(m: ms.Metrics, rng: np.random.Generator, rank: int, world: int, round_: int) -> None:
    skip = int(rng.integers(world))  # one rank holds no samples of some names
    for i in range(6):
        if rank != skip or i % 2:
            x = rng.normal(1e2 * (i + 1), 10.0 ** (i - 1), size=int(rng.integers(1, 40)))
            w = rng.uniform(0.1, 2.0, size=len(x))
            m.record(f"m/{i}", x, weight=w)
            m.record(f"q/{i}", rng.lognormal(i, 1.0, size=50))
        m.record(f"l/{i}", float(rng.normal()) if i < 3 else float(i))  # ties of value
        m.record(f"a/{i}", float(rng.integers(3)) if i < 3 else rng.normal(size=5))  # ties
        m.record(f"n/{i}", [float(rng.normal()), math.nan])
    if rank % 2 == 0 or round_:
        for name in ("x/mean", "x/sum", "x/min", "x/max", "x/first"):
            m.record(name, rng.normal(rank, 1.0, size=3))
    if round_ == 2 and rank == world - 1:  # a new name on one rank: the layout grows
        m.record("late/one", float(rank))


def _both_paths(rank: int, world: int, seed: int) -> list[tuple[dict[str, float], ...]]:
    out = []
    for round_ in range(4):
        rng = np.random.default_rng(seed + 1000 * round_ + rank)
        m = ms.Metrics(SPECS)
        _record(m, rng, rank, world, round_)
        pair = []
        for path in ("gather", "reduce", "gather"):  # the last: the layout both agreed on
            os.environ[ENV] = path
            with count_collectives() as seen:
                pair.append(m.sync(timeout=60).compute())
            assert ("all_reduce" in seen.calls) == (path == "reduce"), (path, seen.log)
        out.append(tuple(pair))
    os.environ.pop(ENV)
    return out


EXACT = {"p10", "p50", "p99", "max", "min", "last", "max_rank", "min_rank"}


def _exact(values: dict[str, float]) -> str:
    keep = {k: v for k, v in values.items() if k.rsplit("/", 1)[-1] in EXACT}
    return repr({k: v for k, v in keep.items() if not k.startswith("x/mean/")})  # means


@pytest.mark.parametrize("world", [2, 5])
def test_the_reduce_path_equals_the_gather_path(world: int) -> None:
    results = run_distributed(_both_paths, world, args=(7,), timeout=120)
    for rounds in results:
        for gathered, reduced, again in rounds:
            assert same(gathered, reduced, rel=1e-12), {
                k: (v, reduced.get(k))
                for k, v in gathered.items()
                if not same(v, reduced[k], rel=1e-12)
            }
            assert gathered == again
            assert _exact(reduced) == _exact(gathered)  # the same cells, extremes, ranks
    first = results[0]
    for rounds in results[1:]:  # identical on every rank, bit for bit
        assert repr(rounds) == repr(first)
    assert "late/one" in first[2][1] and "late/one" not in first[1][1]


def _received(rank: int, world: int) -> tuple[float, float, int, Any, Any]:
    m = ms.Metrics({"q/*": ms.Spec(("mean", "p50", "p90"))})
    rng = np.random.default_rng(rank)
    for i in range(2000):
        m.record(f"loss/{i}", float(rng.normal()))
    for i in range(20):
        m.record(f"q/{i}", rng.normal(5.0, 1.0, size=64))
    m.sync()  # agrees the layout
    m.sync()
    with count_collectives() as seen:
        got = m.sync().compute()
    received = sum(received_bytes(name, size, world) for name, size in seen.log)
    wire = sum(wire_bytes(name, size, world) for name, size in seen.log)
    os.environ[ENV] = "gather"
    gathered = m.sync().compute()
    os.environ.pop(ENV)
    return received, wire, seen.total, got, gathered


def test_eight_ranks_receive_at_most_one_and_a_half_times_what_two_do() -> None:
    """2,020 metrics, 20 of them quantiles: on 2 ranks the group gathers, on 8 it reduces.

    Received: what the collectives hand back (a gather: every rank's state). On the wire a
    ring all_reduce brings about twice its payload, so there the bound is 2x, whatever W.
    """
    two = run_distributed(_received, 2, timeout=120)
    eight = run_distributed(_received, 8, timeout=240)
    assert all(r[2] == 1 for r in two) and all(r[2] == 2 for r in eight)  # gather; reduce
    assert max(r[0] for r in eight) <= 1.5 * min(r[0] for r in two)
    assert max(r[1] for r in eight) <= 2.0 * min(r[1] for r in two)
    for _, _, _, got, gathered in eight:
        assert same(got, gathered, rel=1e-12) and got == eight[0][3]
