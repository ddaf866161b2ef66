"""Metrics returned by Ray tasks and actors, merged on the driver, against brute force.

One local Ray cluster bound to 127.0.0.1 serves the whole module. The raw
samples are generated on the driver and handed to the workers, so the oracle
(numpy over every raw sample) never goes through metricsync.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from _ray import local_ray

import metricsync as ms
from metricsync._facade._collect import collect

ray: Any
try:
    import ray
except ImportError:  # pragma: no cover - exercised where ray is absent
    ray = None

SPECS = {
    "loss": ms.Spec("mean"),  # weighted by token counts
    "tokens": ms.Spec("sum"),
    "reward": ms.Spec(("max", "std", "mean")),
    "pg_loss": ms.Spec("sum", across="mean"),  # sum over micro-batches, mean over ranks
    "lr": ms.Spec("last", fmt=".2e"),
}
LR = 3e-4

Samples = dict[str, Any]


# ---------------------------------------------------------------- data and oracle


def make_samples(seed: int, worker: int) -> Samples:
    """One worker's raw samples; workers hold different amounts of everything."""
    rng = np.random.default_rng([seed, worker])
    n = int(rng.integers(5, 40))
    return {
        "loss": rng.normal(2.0, 1.0, n),
        "loss_w": rng.integers(0, 50, n).astype(float),
        "tokens": rng.integers(10, 500, n).astype(float),
        "reward": rng.normal(0.0, 3.0, int(rng.integers(1, 30))),
        "pg_loss": rng.normal(0.5, 0.2, int(rng.integers(1, 6))),  # micro-batches
    }


def record(metrics: ms.Metrics, s: Samples) -> None:
    metrics.record("loss", s["loss"], weight=s["loss_w"])
    metrics.record("tokens", s["tokens"])
    metrics.record("reward", s["reward"])
    for micro_batch_loss in s["pg_loss"]:
        metrics.record("pg_loss", float(micro_batch_loss))
    metrics.record("lr", LR)


def brute_force(ranks: list[Samples]) -> dict[str, float]:
    loss = np.concatenate([s["loss"] for s in ranks])
    loss_w = np.concatenate([s["loss_w"] for s in ranks])
    reward = np.concatenate([s["reward"] for s in ranks])
    return {
        "loss": float((loss * loss_w).sum() / loss_w.sum()),
        "tokens": float(sum(s["tokens"].sum() for s in ranks)),
        "reward/max": float(reward.max()),
        "reward/std": float(reward.std()),
        "reward/mean": float(reward.mean()),
        "pg_loss": float(np.mean([s["pg_loss"].sum() for s in ranks])),
        "lr": LR,
    }


def assert_matches(got: dict[str, float], want: dict[str, float]) -> None:
    assert set(got) == set(want)
    for key, value in want.items():
        assert math.isclose(got[key], value, rel_tol=1e-9, abs_tol=1e-9), (key, got[key], value)


# ---------------------------------------------------------------- worker code


def record_task(s: Samples) -> ms.Metrics:
    metrics = ms.Metrics(SPECS)
    record(metrics, s)
    return metrics


class Recorder:
    """An actor that records over several calls and returns its Metrics on request."""

    def __init__(self) -> None:
        self.metrics = ms.Metrics(SPECS)

    def step(self, s: Samples) -> None:
        record(self.metrics, s)

    def result(self) -> ms.Metrics:
        return self.metrics


class DPWorker:
    """One rank of a gloo process group living inside a Ray actor."""

    def __init__(self, rank: int, world_size: int, port: int) -> None:
        self.rank, self.world_size, self.port = rank, world_size, port
        self.metrics = ms.Metrics(SPECS)

    def setup(self) -> int:
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # gloo traffic stays on loopback
        import torch.distributed as dist

        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{self.port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=60),
        )
        return int(dist.get_rank())

    def step(self, s: Samples) -> ms.Metrics | None:
        self.metrics.reset()
        record(self.metrics, s)
        synced = self.metrics.sync(timeout=30.0)
        return synced if self.rank == 0 else None

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# ---------------------------------------------------------------- the cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    if ray is None:
        pytest.skip("ray is not installed")
    # Workers cannot import this test module by name; ship its functions by value.
    with local_ray(by_value=sys.modules[__name__]) as started:
        yield started


# ---------------------------------------------------------------- tests without Ray


def test_collect_plain_metrics_and_none() -> None:
    ranks = [make_samples(0, w) for w in range(3)]
    results = [record_task(s) for s in ranks]
    merged = collect([results[0], None, results[1], results[2]])
    assert_matches(merged.compute(), brute_force(ranks))
    assert_matches(results[0].compute(), brute_force(ranks[:1]))  # inputs unchanged
    assert collect([]).compute() == {}


def test_collect_rejects_other_things() -> None:
    with pytest.raises(TypeError, match="item 1"):
        collect([ms.Metrics(), {"loss": 1.0}])
    with pytest.raises(TypeError, match="list"):
        collect(ms.Metrics())


def test_collect_does_not_import_ray_for_plain_metrics() -> None:
    code = (
        "import sys, metricsync as ms\n"
        "from metricsync._facade._collect import collect\n"
        "m = ms.Metrics(); m.record('x', 1.0)\n"
        "assert collect([m]).compute() == {'x': 1.0}\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ---------------------------------------------------------------- tests with Ray


@pytest.mark.ray
def test_task_results_merge_to_brute_force(cluster: Any) -> None:
    task = cluster.remote(num_cpus=0.5)(record_task)
    ranks = [make_samples(1, w) for w in range(4)]
    refs = [task.remote(s) for s in ranks]
    want = brute_force(ranks)
    assert_matches(collect(refs, timeout=60).compute(), want)
    fetched = cluster.get(refs)
    assert all(isinstance(m, ms.Metrics) for m in fetched)
    assert_matches(ms.merge(fetched).compute(), want)
    mixed = [fetched[0], refs[1], None, fetched[2], refs[3]]  # values and refs together
    assert_matches(collect(mixed).compute(), want)
    # each operand counts as one rank: the across="mean" metric is not a pooled sum
    pooled = float(sum(s["pg_loss"].sum() for s in ranks))
    assert not math.isclose(collect(refs).compute()["pg_loss"], pooled)


@pytest.mark.ray
def test_actor_results_merge_to_brute_force(cluster: Any) -> None:
    actor_cls = cluster.remote(num_cpus=0.5)(Recorder)
    actors = [actor_cls.remote() for _ in range(2)]
    try:
        per_actor: list[list[Samples]] = [[], []]
        for step in range(3):
            for i, actor in enumerate(actors):
                s = make_samples(10 + step, i)
                per_actor[i].append(s)
                actor.step.remote(s)
        merged = collect([actor.result.remote() for actor in actors], timeout=60)
        # An actor is one rank: its samples pool over its calls, pg_loss sums over all of them.
        actor_ranks = [
            {k: np.concatenate([s[k] for s in calls]) for k in calls[0]} for calls in per_actor
        ]
        assert_matches(merged.compute(), brute_force(actor_ranks))
    finally:
        for actor in actors:
            cluster.kill(actor)


@pytest.mark.ray
def test_collect_timeout_raises_sync_error(cluster: Any) -> None:
    @cluster.remote(num_cpus=0.5)
    def slow() -> ms.Metrics:
        import time

        time.sleep(30)
        return ms.Metrics()

    ref = slow.remote()
    try:
        with pytest.raises(ms.SyncError, match="within"):
            collect([ref], timeout=0.5)
    finally:
        cluster.cancel(ref, force=True)


@pytest.mark.ray
@pytest.mark.slow  # gloo groups inside Ray actors: make test-slow (CI) runs it
def test_dp_groups_inside_ray_sync_then_merge(cluster: Any) -> None:
    pytest.importorskip("metricsync._sync._sync")
    pytest.importorskip("torch.distributed")
    groups, world = 2, 2
    worker_cls = cluster.remote(num_cpus=0.5)(DPWorker)
    workers = [
        [worker_cls.remote(rank, world, port) for rank in range(world)]
        for port in (free_port() for _ in range(groups))
    ]
    flat = [w for group in workers for w in group]
    try:
        assert cluster.get([w.setup.remote() for w in flat], timeout=120) == [0, 1] * groups
        for step in range(2):
            samples = [
                [make_samples(100 + step, g * world + r) for r in range(world)]
                for g in range(groups)
            ]
            refs = [
                w.step.remote(s) for group, ss in zip(workers, samples) for w, s in zip(group, ss)
            ]
            results = cluster.get(refs, timeout=120)
            # only rank 0 of each group returns its (group-synced) metrics
            assert [r is None for r in results] == [False, True] * groups
            for g in range(groups):
                assert_matches(results[g * world].compute(), brute_force(samples[g]))
            merged = collect(refs)
            every_rank = [s for group_samples in samples for s in group_samples]
            assert_matches(merged.compute(), brute_force(every_rank))
    finally:
        try:
            cluster.get([w.close.remote() for w in flat], timeout=30)
        finally:
            for w in flat:
                cluster.kill(w)
