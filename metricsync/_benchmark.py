"""The sync benchmark behind ``metricsync bench`` and ``bench/sync.py``.

For K metrics (a mix of mean, sum, max and std) on N gloo ranks, it times in
one run, in the same processes:

- ``metricsync``: ``Metrics.sync()`` in steady state;
- ``gather_object``: ``all_gather_object`` of each rank's ``dict[str, list]``,
  then a merge on every rank (the pattern verl uses today);
- ``per_metric``: one ``all_reduce`` per metric (OpenRLHF / Megatron style);
- ``floor``: the raw ``all_reduce`` calls metricsync makes, on pre-packed
  float64 buffers of the same sizes.

It prints seconds per sync, bytes each rank sends per sync, and ratios.

>>> row = run(world_size=2, metrics=20, repeats=2)[0]
>>> sorted(row)[:3]
['K', 'bytes_floor', 'bytes_gather_object']
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["main", "run"]

_KINDS = ("mean", "sum", "max", "std")
_RECORDS_PER_METRIC = 4


def _specs(k: int) -> dict[str, Any]:
    import metricsync as ms

    return {f"m{i:05d}": ms.Spec(_KINDS[i % len(_KINDS)]) for i in range(k)}


def _timed(fn: Callable[[], object], repeats: int) -> float:
    import torch
    import torch.distributed as dist

    fn()  # warm-up (and, for metricsync, the one-time layout agreement)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    elapsed = torch.tensor([(time.perf_counter() - start) / repeats], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def _bench_rank(rank: int, world: int, k: int, repeats: int) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    import metricsync as ms

    rng = np.random.default_rng(rank)
    specs = _specs(k)
    names = list(specs)
    values = rng.normal(size=(k, _RECORDS_PER_METRIC))
    metrics = ms.Metrics(specs)
    lists: dict[str, list[float]] = {}
    for name, row in zip(names, values):
        for v in row.tolist():
            metrics.record(name, v)
        lists[name] = row.tolist()

    def ours() -> object:
        return metrics.sync()

    def gather_object() -> object:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, lists)
        merged: dict[str, list[float]] = {}
        for part in gathered:
            for name, vals in part.items():
                merged.setdefault(name, []).extend(vals)
        reducers: dict[str, Callable[[np.ndarray], Any]] = {
            "mean": np.mean,
            "sum": np.sum,
            "max": np.max,
            "std": np.std,
        }
        return {
            name: reducers[specs[name].reduce[0]](np.asarray(vals)) for name, vals in merged.items()
        }

    per_metric_buffers = [
        torch.tensor([row.sum(), float(len(row))], dtype=torch.float64) for row in values
    ]

    def per_metric() -> object:
        for buf in per_metric_buffers:
            dist.all_reduce(buf.clone())
        return None

    # The floor: the same collectives metricsync makes, on buffers packed in advance.
    n_cols_max, n_cols_sum = 4, 7
    check = torch.zeros(5, dtype=torch.int64)
    max_buf = torch.from_numpy(rng.normal(size=k * n_cols_max))
    sum_buf = torch.from_numpy(rng.normal(size=k * n_cols_sum))

    def floor() -> object:
        dist.all_reduce(check, op=dist.ReduceOp.MAX)
        dist.all_reduce(max_buf, op=dist.ReduceOp.MAX)
        dist.all_reduce(sum_buf)
        return None

    per_metric_repeats = max(1, min(repeats, 2000 // max(k, 1)))
    result = {
        "K": float(k),
        "world": float(world),
        "t_metricsync": _timed(ours, repeats),
        "t_floor": _timed(floor, repeats),
        "t_gather_object": _timed(gather_object, max(1, repeats // 4)),
        "t_per_metric": _timed(per_metric, per_metric_repeats),
        "bytes_metricsync": float(8 * (5 + k * (n_cols_max + n_cols_sum))),
        "bytes_floor": float(8 * (5 + k * (n_cols_max + n_cols_sum))),
        "bytes_gather_object": float(len(pickle.dumps(lists)) * (world - 1)),
        "bytes_per_metric": float(16 * k),
    }
    assert metrics.sync().compute().keys() == metrics.compute().keys()
    return result


def run(world_size: int = 2, metrics: int = 1000, repeats: int = 20) -> list[dict[str, float]]:
    """Run the benchmark on ``world_size`` local gloo ranks; one result row (from rank 0)."""
    from .testing import run_distributed

    rows = run_distributed(_bench_rank, world_size, args=(metrics, repeats), timeout=600)
    return [rows[0]]


def format_rows(rows: list[dict[str, float]]) -> str:
    """A table of times, bytes and ratios."""
    head = (
        f"{'ranks':>5} {'K':>6} {'metricsync':>11} {'floor':>9} {'gather_obj':>11} {'per_metric':>11}"
        f" {'vs floor':>9} {'gather/ours':>12} {'per-metric/ours':>16} {'bytes ours':>11} {'bytes gather':>13}"
    )
    lines = [head]
    for r in rows:
        ours = r["t_metricsync"]
        lines.append(
            f"{int(r['world']):>5} {int(r['K']):>6} {ours * 1e3:>9.2f}ms {r['t_floor'] * 1e3:>7.2f}ms"
            f" {r['t_gather_object'] * 1e3:>9.2f}ms {r['t_per_metric'] * 1e3:>9.1f}ms"
            f" {ours / r['t_floor']:>8.2f}x {r['t_gather_object'] / ours:>11.1f}x"
            f" {r['t_per_metric'] / ours:>15.1f}x {int(r['bytes_metricsync']):>11,} {int(r['bytes_gather_object']):>13,}"
        )
    return "\n".join(lines)


def main(world_size: int = 2, metrics: int = 1000, repeats: int = 20) -> int:
    """Entry point of ``metricsync bench``: print the table for one configuration."""
    rows = run(world_size=world_size, metrics=metrics, repeats=repeats)
    print(format_rows(rows))
    return 0
