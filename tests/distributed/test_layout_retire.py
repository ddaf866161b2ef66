"""Bounded layouts over gloo: names no rank held for ``RETIRE_AFTER`` syncs leave the layout.

A name that changes every step (``req/{i}``) used to stay in the group's
agreed layout for ever, so every later sync packed, sent and merged it (and
its quantile cells). Every rank drops the same names after the same sync,
with no collective of its own: the layout's size stays bounded, a steady sync
stays one gather of a bounded size, and a retired name that comes back syncs
right. Results are checked against numpy over every rank's samples; sizes are
counts (names, bytes), never times.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402

import metricsync as ms  # noqa: E402
from metricsync._sync._allreduce import ENV  # noqa: E402
from metricsync._sync._group import resolve  # noqa: E402
from metricsync._sync._retire import RETIRE_AFTER  # noqa: E402
from metricsync.testing import count_collectives, run_distributed  # noqa: E402

pytestmark = pytest.mark.distributed

STEPS = 3 * RETIRE_AFTER + 10
SPECS = {"req/*": ms.Spec(("mean", "p0", "p100")), "loss": ms.Spec("mean")}


def _values(step: int, rank: int) -> list[float]:
    return [float(step + rank), float(10 * step - rank)]


def _churn(rank: int, world: int) -> dict[str, Any]:
    group = dist.new_group(backend="gloo")
    state = resolve(dist, group).state
    sizes, sent, wrong = [], [], []
    for step in range(STEPS):
        kept = ms.Metrics(SPECS)  # a new one each step (reset() keeps a Metrics' names)
        kept.record("loss", float(rank))
        kept.record(f"req/{step}", _values(step, rank))
        if step % 7 == rank:  # ragged: one rank at a time holds an extra name
            kept.record(f"only/{step}", 1.0)
        with count_collectives() as seen:
            got = kept.sync(group, timeout=30).compute()
        sent.append(seen.bytes)
        everyone = np.concatenate([_values(step, r) for r in range(world)])
        want = {
            "loss": (world - 1) / 2,
            f"req/{step}/mean": float(everyone.mean()),
            f"req/{step}/p0": float(everyone.min()),
            f"req/{step}/p100": float(everyone.max()),
        }
        if any(step % 7 == r for r in range(world)):
            want[f"only/{step}"] = 1.0
        if got != want:
            wrong.append((step, got, want))
        sizes.append(len(state.layout))
    # a retired name that comes back: exchanged again, its window agreed anew
    kept = ms.Metrics(SPECS)
    kept.record("req/0", _values(0, rank))
    back = kept.sync(group, timeout=30).compute()
    # no new name: one gather
    kept.record("loss", 2.0)
    with count_collectives() as steady:
        kept.sync(group, timeout=30)
    return {
        "sizes": sizes,
        "sent": sent,
        "wrong": wrong,
        "back": back,
        "steady": sum(steady.calls.values()),
        "windows": len(state.windows),
    }


def test_names_that_change_every_step_keep_the_layout_bounded(sync_path: str) -> None:
    results = run_distributed(_churn, 2, timeout=300)
    for r in results:
        assert r["wrong"] == [], r["wrong"][:2]
        # at most: "loss", and the req/ and only/ names of the last RETIRE_AFTER syncs
        # (before: every name ever synced, 1 + STEPS + 2 * STEPS / 7)
        assert max(r["sizes"]) <= 1 + RETIRE_AFTER + 2 * (RETIRE_AFTER // 7 + 1), r["sizes"]
        assert r["windows"] <= RETIRE_AFTER + 1
        # what a sync sends stops growing (before: 3x from step RETIRE_AFTER to the end)
        assert max(r["sent"][-10:]) <= 1.25 * max(r["sent"][RETIRE_AFTER : RETIRE_AFTER + 10])
        everyone = np.concatenate([_values(0, rank) for rank in range(2)])
        assert r["back"] == {
            "req/0/mean": float(everyone.mean()),
            "req/0/p0": float(everyone.min()),
            "req/0/p100": float(everyone.max()),
        }
        assert r["steady"] == (1 if sync_path == "gather" else 2)  # the path's steady sync
    assert results[0]["sizes"] == results[1]["sizes"]


def _rarely(rank: int, world: int) -> dict[str, Any]:
    """A large Metrics synced once every 2 * RETIRE_AFTER syncs of a small one."""
    group = dist.new_group(backend="gloo")
    state = resolve(dist, group).state
    small = ms.Metrics()
    results, sizes = [], []
    for round_ in range(3):
        big = ms.Metrics({"big/q": ms.Spec(("p50", "max"))})
        for i in range(200):
            big.record(f"big/{i:03d}", float(i * (rank + 1) + round_))
        big.record("big/q", [float(rank), 100.0 + round_])
        results.append(big.sync(group, timeout=30).compute())
        for _ in range(2 * RETIRE_AFTER):
            small.record("s", float(rank))
            assert small.sync(group, timeout=30).compute() == {"s": (world - 1) / 2}
            small.reset()
        sizes.append(len(state.layout))
    return {"results": results, "sizes": sizes}


@pytest.mark.usefixtures("sync_path")  # both paths
def test_a_metrics_synced_rarely_comes_back_right() -> None:
    world = 2
    results = run_distributed(_rarely, world, timeout=300)
    for r in results:
        for round_, got in enumerate(r["results"]):
            want = {
                f"big/{i:03d}": float(np.mean([i * (k + 1) + round_ for k in range(world)]))
                for i in range(200)
            }
            assert {k: v for k, v in got.items() if not k.startswith("big/q")} == want
            assert got["big/q/max"] == 100.0 + round_
        assert r["sizes"] == [1, 1, 1]  # the big names left while only "s" was synced


def _alternating(rank: int, world: int) -> dict[str, Any]:
    """The churn of ``_churn`` with the path switched every sync (the same on every rank)."""
    group = dist.new_group(backend="gloo")
    state = resolve(dist, group).state
    names, wrong = [], []
    for step in range(2 * RETIRE_AFTER + 5):
        os.environ[ENV] = ("gather", "reduce", "reduce")[step % 3]
        kept = ms.Metrics(SPECS)
        kept.record("loss", float(rank))
        kept.record(f"req/{step}", _values(step, rank))
        if step % 7 == rank:
            kept.record(f"only/{step}", 1.0)
        got = kept.sync(group, timeout=30).compute()
        everyone = np.concatenate([_values(step, r) for r in range(world)])
        if got[f"req/{step}/p100"] != float(everyone.max()) or len(got) != 4 + (step % 7 < world):
            wrong.append((step, got))
        names.append(sorted(state.layout.names))
    return {"names": names, "wrong": wrong}


def test_names_retire_at_the_same_sync_whichever_path_each_sync_takes() -> None:
    world = 2
    results = run_distributed(_alternating, world, timeout=300)
    for r in results:
        assert r["wrong"] == [], r["wrong"][:2]
        for seq, names in enumerate(r["names"]):
            # held at some sync t of the last RETIRE_AFTER (t > seq - RETIRE_AFTER)
            live = range(max(seq - RETIRE_AFTER + 1, 0), seq + 1)
            want = {"loss", *(f"req/{t}" for t in live)}
            want |= {f"only/{t}" for t in live if t % 7 < world}
            assert names == sorted(want), (seq, names)
