"""The OLMo-core contender of the sync benchmark computes what OLMo-core's algorithm does."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("torch")

from metricsync._cli._baselines import olmo_core_reduce
from metricsync.testing import count_collectives, run_distributed

pytestmark = pytest.mark.distributed

TYPES = {
    "loss": "mean",
    "tokens": "sum",
    "grad_norm": "l2_norm",
    "peak_mem": "max",
    "only_2": "mean",
}


def _local(rank: int) -> dict[int, dict[str, float]]:
    """Rank values by step; step 2 holds fewer names (padded rows in the packed tensors)."""
    out = {
        1: {name: float(rank + i + 1) * 1.5 for i, name in enumerate(TYPES) if name != "only_2"},
        2: {"loss": rank * 0.25, "only_2": 10.0 + rank, "peak_mem": -float(rank)},
    }
    return out


def _olmo(rank: int, world: int) -> tuple[dict[int, dict[str, float]], int, int]:
    import torch

    metrics = {
        step: {name: torch.tensor(v, dtype=torch.float32) for name, v in values.items()}
        for step, values in _local(rank).items()
    }
    with count_collectives() as seen:
        out = olmo_core_reduce(metrics, TYPES)
    return dict(out), seen.total, seen.bytes


def test_olmo_core_contender_against_brute_force() -> None:
    world = 3
    results = run_distributed(_olmo, world)
    parts = [_local(r) for r in range(world)]
    for step in (1, 2):
        want = {}
        for name in parts[0][step]:
            vals = np.array([p[step][name] for p in parts])
            kind = TYPES[name]
            want[name] = {
                "mean": vals.mean(),
                "sum": vals.sum(),
                "max": vals.max(),
                "l2_norm": math.sqrt((vals**2).sum()),
            }[kind]
        for got, collectives, nbytes in results:
            assert set(got[step]) == set(want)
            for name, v in want.items():
                assert math.isclose(got[step][name], v, rel_tol=1e-6), (
                    step,
                    name,
                    got[step][name],
                    v,
                )
            assert collectives == 2  # one packed SUM, one packed MAX
            assert nbytes == 4 * (2 * 3 + 2 * 1)  # float32 rows of the longest step, 2 steps
