"""A single controller's step: workers' results merged on the driver, against the hand-rolled way.

Run: .venv/bin/python bench/merge.py [--workers 2 8] [--repeats 60]

Each of W workers records one step of ``bench/step.py``'s RL-shaped workload (131
output keys) and returns it to the driver, as verl's single controller gathers
its workers' outputs through Ray. Both sides run in one process, alternating,
and include what travels (pickling and unpickling each worker's result):

- **metricsync**: each worker's ``Metrics`` pickled and unpickled, then
  ``ms.merge`` of them and ``compute()``;
- **hand-rolled**: each worker's ``dict[str, list[float]]`` (``.item()`` on
  every tensor, as verl does) pickled and unpickled, the lists chained per key,
  then verl's key-name rule per key (``np.max``/``np.min``/``np.mean``) plus
  ``np.percentile`` for the length quantiles.

The workers' recording is not timed (each side records once); the table gives
the median per step and the ratio, the bytes a worker sends, and metricsync's step
in its phases (timed apart, after the alternating runs).
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import time
from collections import defaultdict
from typing import Any

import numpy as np
from step import SPECS, make_data, record_step

import metricsync as ms


def _ours(rank: int) -> ms.Metrics:
    m = ms.Metrics(SPECS)
    record_step(m, make_data(rank, 8))
    return m


def _twin(rank: int) -> dict[str, list[float]]:
    data = make_data(rank, 8)
    out: defaultdict[str, list[float]] = defaultdict(list)
    for mb in data["mbs"]:
        for name, t in mb["scalars"]:
            out[name].append(t.item())
        mask = mb["mask"]
        for name, t in mb["tokens"]:
            out[name].append(float((t * mask).sum() / mask.sum()))
        out["response_length"].extend(mb["resp_len"].tolist())
        out["prompt_length"].extend(mb["prompt_len"])
    for name, v in data["timing"]:
        out[name].append(v)
    for name, v in data["perf"]:
        out[name].append(v)
    out["actor/lr"].append(data["lr"])
    return dict(out)


def _reduce(lists: dict[str, list[float]]) -> dict[str, float]:
    result = {}
    for key, values in lists.items():
        if "max" in key:
            result[key] = float(np.max(values))
        elif "min" in key:
            result[key] = float(np.min(values))
        else:
            result[key] = float(np.mean(values))
    for key in ("response_length", "prompt_length"):
        result[f"{key}/p50"] = float(np.percentile(lists[key], 50))
    result["response_length/p99"] = float(np.percentile(lists["response_length"], 99))
    return result


def _time(workers: int, repeats: int) -> dict[str, Any]:
    ours = [_ours(r) for r in range(workers)]
    twins = [_twin(r) for r in range(workers)]
    for m in ours:
        m.compute()  # the workers fold before they return

    def metricsync_step() -> object:
        arrived = [pickle.loads(pickle.dumps(m)) for m in ours]
        return ms.merge(arrived).compute()

    def hand_rolled_step() -> object:
        arrived = [pickle.loads(pickle.dumps(d)) for d in twins]
        chained: defaultdict[str, list[float]] = defaultdict(list)
        for d in arrived:
            for key, values in d.items():
                chained[key].extend(values)
        return _reduce(chained)

    fns = {"metricsync": metricsync_step, "hand-rolled": hand_rolled_step}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for fn in fns.values():
        fn()  # once, untimed
    for r in range(repeats):
        for name in list(fns)[r % 2 :] + list(fns)[: r % 2]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    out: dict[str, Any] = {name: statistics.median(t) for name, t in times.items()}
    out |= _phases(ours, repeats)
    out["bytes_ours"] = len(pickle.dumps(ours[0]))
    out["bytes_twin"] = len(pickle.dumps(twins[0]))
    return out


def _phases(ours: list[ms.Metrics], repeats: int) -> dict[str, float]:
    """metricsync's step in its phases (medians): pickling, unpickling, merge, compute."""
    spans: dict[str, list[float]] = {"pickle": [], "unpickle": [], "merge": [], "compute": []}
    for _ in range(repeats):
        marks = [time.perf_counter()]
        blobs = [pickle.dumps(m) for m in ours]
        marks.append(time.perf_counter())
        arrived = [pickle.loads(b) for b in blobs]
        marks.append(time.perf_counter())
        merged = ms.merge(arrived)
        marks.append(time.perf_counter())
        merged.compute()
        marks.append(time.perf_counter())
        for span, start, end in zip(spans.values(), marks, marks[1:]):
            span.append(end - start)
    return {name: statistics.median(span) for name, span in spans.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--repeats", type=int, default=60)
    args = parser.parse_args()
    print(f"median of {args.repeats} alternating repeats; pickling, merge and compute per step")
    print(
        f"{'workers':>7} {'metricsync':>11} {'hand-rolled':>12} {'ratio':>6}"
        f" {'bytes/worker (ours)':>20} {'bytes/worker (lists)':>21}"
    )
    for workers in args.workers:
        row = _time(workers, args.repeats)
        ours, twin = row["metricsync"], row["hand-rolled"]
        print(
            f"{workers:>7} {ours * 1e3:>9.2f}ms {twin * 1e3:>10.2f}ms {ours / twin:>5.2f}x"
            f" {row['bytes_ours']:>20,} {row['bytes_twin']:>21,}"
            f"   (pickle {row['pickle'] * 1e3:.2f}, unpickle {row['unpickle'] * 1e3:.2f},"
            f" merge {row['merge'] * 1e3:.2f}, compute {row['compute'] * 1e3:.2f} ms)",
            flush=True,
        )


if __name__ == "__main__":
    main()
