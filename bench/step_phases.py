"""Where the RL-shaped step's time goes, on one gloo rank, without other ranks' noise.

Run: .venv/bin/python bench/step_phases.py [--steps 200] [--warmup 20]

The workload and both sides are those of ``bench/step.py`` (imported from
it). On a single rank the collectives cost almost nothing and no rank waits
for another, so what remains is each side's own CPU work per phase:
recording, then sync (gather) and compute (reduce). Steps of the sides
alternate; the table gives per-phase medians in microseconds and the ratio
of the whole step, and what that ratio would be if metricsync's sync and
compute cost nothing at all (its recording alone against the whole
hand-rolled step): a floor no tuning of the sync can go below.

A third side makes a new ``Metrics`` every step, as code that builds its
metrics inside the step does (verl's ``update_policy`` starts from an empty
dict each call): every name is opened again, and the sync starts from a
table it has not seen.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from step import SPECS, hand_rolled_step, make_data, metricsync_step

import metricsync as ms
from metricsync.testing import run_distributed


def _anew_step(data: dict[str, Any], times: dict[str, float]) -> None:
    """metricsync's step with a ``Metrics`` made for it (counted as recording)."""
    start = time.perf_counter()
    metrics = ms.Metrics(SPECS)
    made = time.perf_counter() - start
    metricsync_step(metrics, data, times)
    times["record"] += made


def _phases(rank: int, world: int, steps: int, warmup: int) -> dict[str, float]:
    data = make_data(1, 8)  # an odd rank's data: every name
    metrics = ms.Metrics(SPECS)
    ours: list[dict[str, float]] = []
    fresh: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    for step in range(warmup + steps):
        a: dict[str, float] = {}
        b: dict[str, float] = {}
        c: dict[str, float] = {}
        sides: list[Callable[[], object]] = [
            partial(metricsync_step, metrics, data, a),
            partial(_anew_step, data, c),
            partial(hand_rolled_step, data, b),
        ]
        for side in sides[step % 3 :] + sides[: step % 3]:  # each side first in turn
            side()
        if step >= warmup:
            ours.append(a)
            fresh.append(c)
            theirs.append(b)

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows) * 1e6

    total = [sum(a.values()) / sum(b.values()) for a, b in zip(ours, theirs)]
    anew = [sum(c.values()) / sum(b.values()) for c, b in zip(fresh, theirs)]
    floor = [a["record"] / sum(b.values()) for a, b in zip(ours, theirs)]
    return {
        "ours_record": med(ours, "record"),
        "ours_sync": med(ours, "sync"),
        "ours_compute": med(ours, "compute"),
        "fresh_record": med(fresh, "record"),
        "fresh_sync": med(fresh, "sync"),
        "fresh_compute": med(fresh, "compute"),
        "fresh_ratio": statistics.median(anew),
        "theirs_record": med(theirs, "record"),
        "theirs_sync": med(theirs, "sync"),
        "ratio": statistics.median(total),
        "floor": statistics.median(floor),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    r: Any = run_distributed(_phases, 1, args=(args.steps, args.warmup), timeout=600)[0]
    print(f"1 gloo rank, {args.steps} steps of bench/step.py's workload, medians in us")
    print(
        f"metricsync:  record {r['ours_record']:.0f}  sync {r['ours_sync']:.0f}  "
        f"compute+reset {r['ours_compute']:.0f}"
    )
    print(
        f"metricsync, a new Metrics each step:  record {r['fresh_record']:.0f}  "
        f"sync {r['fresh_sync']:.0f}  compute+reset {r['fresh_compute']:.0f}"
    )
    print(f"hand-rolled: record {r['theirs_record']:.0f}  gather+reduce {r['theirs_sync']:.0f}")
    print(f"metricsync/hand-rolled, whole step: {r['ratio']:.2f}x (target <= 0.5x)")
    print(f"the same with a new Metrics each step: {r['fresh_ratio']:.2f}x")
    print(f"metricsync's recording alone / the whole hand-rolled step: {r['floor']:.2f}x")


if __name__ == "__main__":
    main()
