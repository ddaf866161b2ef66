"""Two revisions of metricsync in one process: sync, compute and the RL step, interleaved.

Run: .venv/bin/python bench/ab.py [--base REV] [--repeats R] [--metrics 100 1000 10000]

On a shared machine the speed of the host drifts by up to 2x within minutes,
so timing one revision and then the other compares the host as much as the
code. This script exports the package of ``--base`` (default ``HEAD``) with
``git archive`` into a temporary directory as ``metricsync_base`` (the core
imports itself relatively, so the copy is self-contained), imports it beside
the working tree's ``metricsync``, and times the same cases on both in one
process, on a one-rank gloo group (127.0.0.1), alternating which goes first:

- ``sync+compute K=...``: ``sync()`` then ``compute()`` of K metrics (mean,
  sum, max and std in turn, 4 numbers each), unchanged between syncs;
- ``compute K=...``: ``compute()`` of the synced ``Metrics``;
- ``record/fold+compute/reset K=...``: a step of the same K metrics without a
  sync: one float recorded to each, ``compute()`` (which folds them), ``reset()``;
- ``step ...``: one rank's RL step of ``bench/step.py`` (its data, specs and
  step function), by phase: recording, ``sync()``, ``compute()`` plus ``reset()``.

Each line gives both medians and the median of the pairwise ratios (working
tree / base). With nothing changed (an A/A run: ``git stash`` the package)
the sync and compute ratios read 1.00 within about 1.5%, the step's phases
within about 7%.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import step as rl  # bench/step.py: the RL step's data and specs
import torch.distributed as dist

import metricsync as work
from metricsync._cli._benchmark import _specs as sync_specs

Case = Callable[[], dict[str, float]]


def export(rev: str, into: Path) -> ModuleType:
    """The package of ``rev`` as the module ``metricsync_base``, from a copy under ``into``."""
    root = Path(__file__).resolve().parent.parent
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", rev, "metricsync"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    shutil.move(str(into / "metricsync"), str(into / "metricsync_base"))
    sys.path.insert(0, str(into))
    import metricsync_base

    return metricsync_base


def specs_of(ms: Any, specs: dict[str, Any]) -> dict[str, Any]:
    """``specs`` (the working tree's) as ``ms``'s own ``Spec`` objects."""
    return {name: ms.Spec.from_json(spec.to_json()) for name, spec in specs.items()}


def sync_case(ms: Any, k: int, calls: int) -> Case:
    specs = specs_of(ms, sync_specs(k))  # bench/sync.py's metrics
    metrics = ms.Metrics(specs)
    for name, row in zip(specs, np.random.default_rng(0).normal(size=(k, 4))):
        for v in row.tolist():
            metrics.record(name, v)
    group = dist.new_group([0])  # a layout of its own
    synced = metrics.sync(group=group)

    def run() -> dict[str, float]:
        t0 = time.perf_counter()
        for _ in range(calls):
            metrics.sync(group=group).compute()
        t1 = time.perf_counter()
        for _ in range(calls):
            synced.compute()
        t2 = time.perf_counter()
        return {f"sync+compute K={k}": (t1 - t0) / calls, f"compute K={k}": (t2 - t1) / calls}

    return run


def cycle_case(ms: Any, k: int) -> Case:
    specs = specs_of(ms, sync_specs(k))
    metrics = ms.Metrics(specs)
    values = list(zip(specs, np.random.default_rng(1).normal(size=k).tolist()))

    def run() -> dict[str, float]:
        t0 = time.perf_counter()
        for name, v in values:
            metrics.record(name, v)
        t1 = time.perf_counter()
        metrics.compute()
        t2 = time.perf_counter()
        metrics.reset()
        t3 = time.perf_counter()
        return {f"record K={k}": t1 - t0, f"fold+compute K={k}": t2 - t1, f"reset K={k}": t3 - t2}

    return run


def step_case(ms: Any, data: dict[str, Any]) -> Case:
    """bench/step.py's step on one rank (on the default group: each package keeps its own
    layouts), by phase."""
    metrics = ms.Metrics(specs_of(ms, rl.SPECS))

    def run() -> dict[str, float]:
        times: dict[str, float] = {}
        rl.metricsync_step(metrics, data, times)
        return {f"step {phase}": times[phase] for phase in ("record", "sync", "compute")}

    return run


def compare(cases: dict[str, dict[str, Case]], repeats: int) -> list[str]:
    """Run every case on both sides ``repeats`` times (2 more first, untimed); one line per
    timed quantity."""
    seen: dict[str, dict[str, list[float]]] = {}
    for r in range(repeats + 2):
        for sides in cases.values():
            for side in ("base", "work") if r % 2 == 0 else ("work", "base"):
                for key, seconds in sides[side]().items():
                    if r >= 2:
                        seen.setdefault(key, {}).setdefault(side, []).append(seconds)
    lines = []
    for key, by in seen.items():
        ratio = statistics.median(w / b for w, b in zip(by["work"], by["base"]))
        base, mine = statistics.median(by["base"]) * 1e6, statistics.median(by["work"]) * 1e6
        lines.append(f"{key:22s} base {base:9.1f} us  work {mine:9.1f} us  work/base {ratio:.3f}")
    return lines


@contextmanager
def one_rank_group() -> Iterator[None]:
    """A one-rank gloo default group on a free loopback port, destroyed after."""
    with socket.socket() as s:  # a free port on the loopback
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="the git revision to compare against")
    parser.add_argument("--repeats", type=int, default=25)
    parser.add_argument("--metrics", type=int, nargs="+", default=[100, 1000, 10000])
    args = parser.parse_args()
    with one_rank_group(), tempfile.TemporaryDirectory() as tmp:
        base = export(args.base, Path(tmp))
        data = rl.make_data(1, 8)  # an odd rank's (it records the extra names too), shared
        cases = {"step": {"base": step_case(base, data), "work": step_case(work, data)}}
        for k in args.metrics:
            calls = max(1, 5000 // k)
            cases[f"K={k}"] = {
                side: sync_case(ms, k, calls) for side, ms in (("base", base), ("work", work))
            }
            cases[f"cycle K={k}"] = {
                side: cycle_case(ms, k) for side, ms in (("base", base), ("work", work))
            }
        print(f"base {args.base} against the working tree; medians of {args.repeats} repeats")
        print("\n".join(compare(cases, args.repeats)))


if __name__ == "__main__":
    main()
