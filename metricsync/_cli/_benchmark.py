"""The sync benchmark behind ``metricsync bench`` and ``bench/sync.py``.

K metrics on N gloo ranks, every approach interleaved in the same processes (metricsync's
steady sync, after a record, OLMo-core's reduce, the collectives' floor, ``gather_object``,
one ``all_reduce`` per metric, a layout change); reports the slowest rank's median time,
payload bytes and CPU per call.

>>> row = run(world_size=2, metrics=20, repeats=2)[0]
>>> row["collectives_metricsync"] <= 3, row["cpu_floor"] > 0, "CPU per call" in format_rows([row])
(True, True, True)
"""

from __future__ import annotations

import math
import os
import pickle
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ._baselines import OLMO_KIND, olmo_core_reduce
from ._progress import Progress

__all__ = ["format_rows", "main", "run"]

_KINDS = ("mean", "sum", "max", "std")
_RECORDS_PER_METRIC = 4


def _specs(k: int) -> dict[str, Any]:
    import metricsync as ms

    return {f"m{i:05d}": ms.Spec(_KINDS[i % len(_KINDS)]) for i in range(k)}


def _interleaved(
    fns: dict[str, Callable[[], object]],
    repeats: int,
    every: dict[str, int] | None = None,
    tick: Callable[[str], None] | None = None,
    cpu: dict[str, float] | None = None,
) -> dict[str, float]:
    """The slowest rank's median seconds per call of each function, run interleaved.

    Every rank calls them together: repeat ``r`` runs each function once (those
    in ``every`` only on every n-th repeat), in an order rotated by ``r``, each
    call after a barrier. Each function runs once first, untimed. ``cpu``, if
    given, gets each function's median CPU seconds per call of every rank's
    process together (their threads included).
    """
    import torch
    import torch.distributed as dist

    every = every or {}
    names = list(fns)
    for name in names:
        fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    used: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            if r % every.get(name, 1):
                continue
            dist.barrier()
            start, cpu_start = time.perf_counter(), time.process_time()
            fns[name]()
            times[name].append(time.perf_counter() - start)
            used[name].append(time.process_time() - cpu_start)
        if tick is not None:
            tick(f"repeat {r + 1}")
    out = {}
    for name in names:
        per_call = torch.tensor(times[name], dtype=torch.float64)
        dist.all_reduce(per_call, op=dist.ReduceOp.MAX)
        out[name] = float(statistics.median(per_call.tolist()))
        if cpu is not None:
            all_ranks = torch.tensor(used[name], dtype=torch.float64)
            dist.all_reduce(all_ranks)
            cpu[name] = float(statistics.median(all_ranks.tolist()))
    return out


def _quantile_bytes(rank: int) -> tuple[float, float]:
    """Payload bytes of a steady sync holding 10 and 20 quantile metrics spanning 16-4,096."""
    import metricsync as ms
    from metricsync.testing import count_collectives

    rng = np.random.default_rng(100 + rank)
    sizes = []
    for q in (10, 20):
        m = ms.Metrics({"len/*": ms.Spec(("mean", "p50", "p99"))})
        for i in range(q):
            m.record(f"len/{i}", rng.integers(16, 4097, size=1000))
        m.sync()  # the layout agreement
        with count_collectives() as seen:
            m.sync().compute()
        sizes.append(seen.bytes)
    return float(sizes[0]), float(sizes[1])


def _bench_rank(rank: int, world: int, k: int, repeats: int, progress: bool) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    import metricsync as ms
    from metricsync.testing import count_collectives

    rng = np.random.default_rng(rank)
    specs = _specs(k)
    names = list(specs)
    kinds = {name: specs[name].reduce[0] for name in names}
    values = rng.normal(size=(k, _RECORDS_PER_METRIC))
    metrics = ms.Metrics(specs)
    lists: dict[str, list[float]] = {}
    for name, row in zip(names, values):
        for v in row.tolist():
            metrics.record(name, v)
        lists[name] = row.tolist()

    def ours() -> object:
        return metrics.sync().compute()

    def after_record() -> object:
        metrics.record(names[0], 0.5)
        return metrics.sync().compute()

    # The floor: metricsync's own steady collectives, on buffers packed in advance.
    metrics.sync()
    with count_collectives() as steady:
        metrics.sync()
    buffers = [
        (fname, torch.from_numpy(rng.normal(size=max(1, size // 8)))) for fname, size in steady.log
    ]

    def floor() -> object:
        for fname, buf in buffers:
            if fname == "all_gather":
                dist.all_gather([torch.empty_like(buf) for _ in range(world)], buf)
            elif fname in ("all_gather_single", "all_gather_into_tensor"):
                dist.all_gather_single(torch.empty(world * buf.numel(), dtype=buf.dtype), buf)
            elif fname == "all_to_all_single":  # a gather on gloo (see metricsync._sync._comm)
                out = torch.empty(world * buf.numel(), dtype=buf.dtype)
                dist.all_to_all_single(out, buf.repeat(world))
            else:
                dist.all_reduce(buf, op=dist.ReduceOp.MAX)
        return None

    row_means = values.mean(axis=1)

    def floor_dict() -> object:  # the least a sync of these bytes returning that dict costs
        floor()
        return dict(zip(names, row_means.tolist()))

    local: dict[str, Callable[[np.ndarray], Any]] = {
        "mean": np.mean,
        "sum": np.sum,
        "max": np.max,
        "std": np.std,
    }
    olmo_metrics = {
        0: {
            name: torch.tensor(float(local[kinds[name]](row)), dtype=torch.float32)
            for name, row in zip(names, values)
        }
    }
    olmo_types = {name: OLMO_KIND[kinds[name]] for name in names}
    assert len(olmo_core_reduce(olmo_metrics, olmo_types)[0]) == k

    def gather_object() -> dict[str, Any]:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, lists)
        merged: dict[str, list[float]] = {}
        for part in gathered:
            for name, vals in part.items():
                merged.setdefault(name, []).extend(vals)
        return {name: local[kinds[name]](np.asarray(vals)) for name, vals in merged.items()}

    want = gather_object()  # the pooled samples of every rank, reduced by numpy
    got = metrics.sync().compute()
    assert got.keys() == want.keys()
    assert all(math.isclose(got[n], float(want[n]), rel_tol=1e-9, abs_tol=1e-9) for n in want)

    # One all_reduce per metric costs K collective latencies: timed on at most
    # 1,000 metrics and scaled to K.
    sample = min(k, 1000)
    per_metric_buffers = [
        torch.tensor([row.sum(), float(len(row))], dtype=torch.float64) for row in values[:sample]
    ]

    def per_metric() -> object:
        for buf in per_metric_buffers:
            dist.all_reduce(buf.clone())
        return None

    # Changed layout: before each such sync the odd ranks add a name no rank had.
    counter = iter(range(1_000_000))

    def changed() -> object:
        if rank % 2 == 1:
            metrics.record(f"new/{next(counter):06d}", 1.0)
        return metrics.sync().compute()

    def steady_recorded() -> object:
        if rank % 2 == 1:
            metrics.record(names[-1], 1.0)
        return metrics.sync().compute()

    changed_repeats = max(3, min(repeats, 30_000 // max(k, 1)))
    per_metric_repeats = max(3, min(repeats, 2000 // sample))
    steps = repeats + per_metric_repeats + changed_repeats + 1
    result: dict[str, float] = {"K": float(k), "world": float(world)}
    cpu: dict[str, float] = {}
    shown = progress and rank == 0  # only rank 0 draws: a total below `minimum` draws no bar
    with Progress(steps if shown else 0, f"{world} ranks, K={k:,}", unit="step", minimum=1) as bar:

        def tick(_: str) -> None:
            bar.update(1)

        t = _interleaved(
            {
                "metricsync": ours,
                "after_record": after_record,
                "sync_only": metrics.sync,
                "floor": floor,
                "floor_dict": floor_dict,
                "olmo_core": lambda: olmo_core_reduce(olmo_metrics, olmo_types),
                "gather_object": gather_object,
            },
            repeats,
            every={"gather_object": 4},
            tick=tick,
            cpu=cpu,
        )
        result |= {f"t_{name}": v for name, v in t.items()}
        result |= {f"cpu_{name}": v for name, v in cpu.items()}
        t_sample = _interleaved({"per_metric": per_metric}, per_metric_repeats, tick=tick)
        result["t_per_metric"] = t_sample["per_metric"] * k / sample
        # each changed sync is unique: its untimed first call is one more change
        t = _interleaved(
            {"changed": changed, "steady_recorded": steady_recorded, "steady_again": ours},
            changed_repeats,
            tick=tick,
        )
        result |= {f"t_{name}": v for name, v in t.items()}
        result["bytes_metricsync"] = float(steady.bytes)
        result["collectives_metricsync"] = float(steady.total)
        result["bytes_floor"] = float(sum(8 * b.numel() for _, b in buffers))
        result["bytes_gather_object"] = float(len(pickle.dumps(lists)))
        result["bytes_per_metric"] = float(16 * k)
        if rank % 2 == 1:
            metrics.record(f"new/{next(counter):06d}", 1.0)
        with count_collectives() as seen:
            metrics.sync()
        result["bytes_changed"] = float(seen.bytes)
        result["collectives_changed"] = float(seen.total)
        q10, q20 = _quantile_bytes(rank)
        result["bytes_quantile_marginal"] = (q20 - q10) / 10
        result["bytes_quantile_mean"] = q20 / 20
        tick("bytes")
    return result


def run(
    world_size: int = 2, metrics: int = 1000, repeats: int = 20, progress: bool = False
) -> list[dict[str, float]]:
    """Run the benchmark on ``world_size`` local gloo ranks; one result row (from rank 0)."""
    from ..testing import run_distributed

    rows = run_distributed(_bench_rank, world_size, args=(metrics, repeats, progress), timeout=900)
    return [rows[0]]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}ms"


def format_rows(rows: list[dict[str, float]]) -> str:
    """Three tables: times and ratios, changed layouts, bytes."""
    lines = [
        "sync + compute per call (slowest rank, median); targets: <= 0.7x olmo_core, "
        "<= 1.3x the floor at K=10k on 4 ranks",
        f"{'ranks':>5} {'K':>6} {'metricsync':>11} {'sync only':>10} {'olmo_core':>10}"
        f" {'floor':>9} {'floor+dict':>10} {'gather_obj':>11} {'per_metric':>11} {'vs olmo':>8}"
        f" {'vs floor':>9}"
        f" {'gather/ours':>11} {'per-metric/ours':>15} {'after a record':>15} {'vs olmo':>8}",
    ]
    for r in rows:
        ours = r["t_metricsync"]
        lines.append(
            f"{int(r['world']):>5} {int(r['K']):>6} {_ms(ours):>11} {_ms(r['t_sync_only']):>10}"
            f" {_ms(r['t_olmo_core']):>10} {_ms(r['t_floor']):>9} {_ms(r['t_floor_dict']):>10}"
            f" {_ms(r['t_gather_object']):>11}"
            f" {_ms(r['t_per_metric']):>11} {ours / r['t_olmo_core']:>7.2f}x"
            f" {ours / r['t_floor']:>8.2f}x {r['t_gather_object'] / ours:>10.1f}x"
            f" {r['t_per_metric'] / ours:>14.1f}x {_ms(r['t_after_record']):>15}"
            f" {r['t_after_record'] / r['t_olmo_core']:>7.2f}x"
        )
    lines += [
        "",
        "changed layout (odd ranks add a name before each sync) against a steady sync after the "
        "same records (odd ranks record a number to a known name); target <= 3x. Last columns: "
        "against a steady sync recording nothing",
        f"{'ranks':>5} {'K':>6} {'changed':>10} {'steady':>10} {'ratio':>7}"
        f" {'collectives':>11} {'bytes changed':>14} {'bytes steady':>13}"
        f" {'no record':>10} {'ratio':>7}",
    ]
    for r in rows:
        lines.append(
            f"{int(r['world']):>5} {int(r['K']):>6} {_ms(r['t_changed']):>10}"
            f" {_ms(r['t_steady_recorded']):>10}"
            f" {r['t_changed'] / r['t_steady_recorded']:>6.1f}x"
            f" {int(r['collectives_changed']):>5} vs {int(r['collectives_metricsync'])}"
            f" {int(r['bytes_changed']):>14,} {int(r['bytes_metricsync']):>13,}"
            f" {_ms(r['t_steady_again']):>10} {r['t_changed'] / r['t_steady_again']:>6.1f}x"
        )
    lines += [
        "",
        "payload bytes each rank hands to the collectives per steady sync; per quantile metric "
        "(16-4,096, 1%): target <= 4 KB",
        f"{'ranks':>5} {'K':>6} {'metricsync':>11} {'per metric':>10} {'gather_obj':>11}"
        f" {'per quantile metric':>20}",
    ]
    for r in rows:
        lines.append(
            f"{int(r['world']):>5} {int(r['K']):>6} {int(r['bytes_metricsync']):>11,}"
            f" {r['bytes_metricsync'] / r['K']:>10.1f} {int(r['bytes_gather_object']):>11,}"
            f" {int(r['bytes_quantile_marginal']):>20,}"
        )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines += [
        "",
        f"CPU per call, every rank's process together: a call takes at least this / {cores} cores",
        f"{'ranks':>5} {'K':>6} {'metricsync':>11} {'sync only':>10} {'floor':>9} {'ratio':>7}",
    ]
    for r in rows:
        lines.append(
            f"{int(r['world']):>5} {int(r['K']):>6} {_ms(r['cpu_metricsync']):>11}"
            f" {_ms(r['cpu_sync_only']):>10} {_ms(r['cpu_floor']):>9}"
            f" {r['cpu_metricsync'] / r['cpu_floor']:>6.1f}x"
        )
    return "\n".join(lines)


def main(world_size: int = 2, metrics: int = 1000, repeats: int = 20) -> int:
    """Entry point of ``metricsync bench``: print the tables for one configuration.

    A progress bar shows on stderr when it is a terminal and tqdm is installed.
    """
    rows = run(
        world_size=world_size, metrics=metrics, repeats=repeats, progress=sys.stderr.isatty()
    )
    print(format_rows(rows))
    return 0
