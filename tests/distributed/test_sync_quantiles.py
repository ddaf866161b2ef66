"""Quantiles after a multi-rank gloo sync, against numpy over the union of raw samples."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

import metricsync as ms
from metricsync.testing import run_distributed

pytestmark = pytest.mark.distributed

QS = {"p0": 0.0, "p1": 0.01, "p50": 0.5, "p90": 0.9, "p99": 0.99, "p99.9": 0.999, "p100": 1.0}
SPEC = ms.Spec(tuple(QS))


def _samples(name: str, rank: int) -> np.ndarray:
    rng = np.random.default_rng([7, rank, len(name)])
    n = 3000 + 2000 * rank
    if name == "lognormal":
        return rng.lognormal(0.0, 2.0, n)
    if name == "uniform":
        return rng.uniform(-5.0, 10.0, n)
    if name == "exponential":
        return rng.exponential(3.0, n)
    mixed = rng.normal(0.0, 100.0, n)  # mixed signs with exact zeros
    mixed[rng.random(n) < 0.1] = 0.0
    return mixed


NAMES = ("lognormal", "uniform", "exponential", "mixed")


def _rank(rank: int, world: int) -> dict[str, float]:
    import torch

    m = ms.Metrics({name: SPEC for name in NAMES})
    for name in NAMES:
        values = _samples(name, rank)
        half = len(values) // 2
        m.record(name, values[:half])  # numpy on the host
        m.record(name, torch.as_tensor(values[half:]))  # a tensor on its device
    return m.sync(timeout=60).compute()


def _within(result: float, ordered: np.ndarray, q: float, accuracy: float = 0.01) -> bool:
    lo = ordered[int(np.floor(q * (len(ordered) - 1)))]
    hi = ordered[int(np.ceil(q * (len(ordered) - 1)))]
    slack = accuracy * max(abs(lo), abs(hi)) + 1e-12
    return min(lo, hi) - slack <= result <= max(lo, hi) + slack


@pytest.mark.parametrize("world", [3])
def test_quantiles_after_sync_are_within_accuracy(world: int) -> None:
    results = run_distributed(_rank, world)
    assert all(r == results[0] for r in results)  # identical on every rank
    got = results[0]
    for name in NAMES:
        ordered = np.sort(np.concatenate([_samples(name, r) for r in range(world)]))
        for stat, q in QS.items():
            value = got[f"{name}/{stat}"]
            if q in (0.0, 1.0):
                assert value == (ordered[0] if q == 0.0 else ordered[-1]), (name, stat)
            else:
                assert _within(value, ordered, q), (name, stat, value)
