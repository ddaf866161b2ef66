"""What a changed layout costs a sync on one gloo rank, without other ranks' noise.

Run: .venv/bin/python bench/relayout.py [--metrics 100 1000 10000] [--groups 20] [--syncs 15]

For each K, every group (a fresh process group and a fresh ``Metrics`` of K
metrics, 4 records each, synced once) runs ``--syncs`` pairs, interleaved:
a steady sync plus ``compute()`` right after recording one number into a
name the layout holds, then the same right after recording a name no sync
has seen, which changes the layout. Both fold the same records; the changed
one also exchanges the new entry, extends the layout and places the table
in it. On one rank the collectives cost almost nothing, so the ratio of the
medians is the CPU work of a layout change (``bench/sync.py`` measures it on
2 and 4 ranks, collectives included; target there: at most 3x).

``--churn STEPS``: names that change every step, on 2 gloo ranks. Each step
a new ``Metrics`` records 20 steady names (one a quantile metric) and one
quantile name of its own (``req/{step}``), then syncs and computes. Printed:
the median sync of the last 20 steps over that of the first 20, and rank 0's
resident memory growth from step 20 to the end (target: at most 2x and 8 MB
over 300 steps; names no rank holds for ``_retire.RETIRE_AFTER`` syncs leave
the layout).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from typing import Any

import numpy as np

import metricsync as ms
from metricsync._cli._benchmark import _specs
from metricsync.testing import run_distributed


def _pairs(rank: int, world: int, k: int, groups: int, syncs: int) -> dict[str, float]:
    import torch.distributed as dist

    specs = _specs(k)
    names = list(specs)
    new = (f"new/{i:06d}" for i in itertools.count())
    steady: list[float] = []
    changed: list[float] = []
    for _ in range(groups):
        group = dist.new_group([0])  # its own agreed layout: K names, not those of earlier groups
        metrics = ms.Metrics(specs)
        for name, row in zip(names, np.random.default_rng(0).normal(size=(k, 4)).tolist()):
            for v in row:
                metrics.record(name, v)
        metrics.sync(group).compute()
        for _ in range(syncs):
            for name, times in ((names[-1], steady), (next(new), changed)):
                metrics.record(name, 1.0)
                start = time.perf_counter()
                metrics.sync(group).compute()
                times.append(time.perf_counter() - start)
    return {"steady": statistics.median(steady), "changed": statistics.median(changed)}


def _rss() -> int:
    """This process's resident memory now, in bytes (Linux)."""
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _churn(rank: int, world: int, steps: int) -> dict[str, float]:
    rng = np.random.default_rng(rank)
    specs = {"steady/len": ms.Spec(("mean", "p50", "p90")), "req/*": ms.Spec(("mean", "p90"))}
    times: list[float] = []
    rss = 0
    for step in range(steps):
        if step == 20:
            rss = _rss()
        metrics = ms.Metrics(specs)
        for i in range(19):
            metrics.record(f"steady/{i:02d}", float(rng.normal()))
        metrics.record("steady/len", rng.integers(16, 4096, 64).astype(float))
        metrics.record(f"req/{step}", rng.exponential(100.0, 32))
        start = time.perf_counter()
        metrics.sync().compute()
        times.append(time.perf_counter() - start)
    return {
        "first": statistics.median(times[:20]),
        "last": statistics.median(times[-20:]),
        "rss": (_rss() - rss) / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--syncs", type=int, default=15)
    parser.add_argument("--churn", type=int, default=0, help="steps of names that change")
    args = parser.parse_args()
    if args.churn:
        r = run_distributed(_churn, 2, args=(args.churn,), timeout=600)[0]
        print(f"2 gloo ranks, {args.churn} steps, a new req/{{step}} quantile name each step")
        print(
            f"sync + compute(), median of the first 20: {r['first'] * 1e6:.0f}us, "
            f"of the last 20: {r['last'] * 1e6:.0f}us, ratio {r['last'] / r['first']:.2f}x; "
            f"rank 0 RSS growth from step 20: {r['rss']:.1f} MB"
        )
        return
    print("1 gloo rank; sync + compute() after one record, medians")
    print(f"{'K':>6} {'steady':>10} {'changed':>10} {'ratio':>6}")
    for k in args.metrics:
        r: Any = run_distributed(_pairs, 1, args=(k, args.groups, args.syncs), timeout=600)[0]
        print(
            f"{k:>6} {r['steady'] * 1e6:>8.0f}us {r['changed'] * 1e6:>8.0f}us "
            f"{r['changed'] / r['steady']:>5.2f}x"
        )


if __name__ == "__main__":
    main()
